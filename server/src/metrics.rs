//! Process-wide metrics in the Prometheus text exposition format (`GET /metrics`).
//!
//! Metrics are registered once (at start-up or on first use) and updated with relaxed
//! atomics, so the hot path never takes a lock or hashes a label. Labels are fixed at
//! registration and must be low-cardinality — method names, results, transports — never
//! ids, paths, commands or peer addresses.
//!
//! ```ignore
//! static STARTED: LazyLock<Counter> = LazyLock::new(|| {
//!     metrics::counter("exec_server_processes_started_total", "Processes started.", &[])
//! });
//! STARTED.inc();
//! ```

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// Upper bounds (seconds) of the request-duration histogram buckets.
pub const DURATION_BUCKETS: [f64; 12] = [
    0.000_1, 0.000_5, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 300.0,
];

/// A monotonically increasing count.
#[derive(Clone, Default)]
pub struct Counter(Arc<AtomicU64>);

impl Counter {
    pub fn inc(&self) {
        self.add(1);
    }

    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A value that goes up and down.
#[derive(Clone, Default)]
pub struct Gauge(Arc<AtomicI64>);

impl Gauge {
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    pub fn dec(&self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }

    pub fn set(&self, value: i64) {
        self.0.store(value, Ordering::Relaxed);
    }

    pub fn add(&self, delta: i64) {
        self.0.fetch_add(delta, Ordering::Relaxed);
    }

    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A cumulative histogram of durations.
#[derive(Clone)]
pub struct Histogram(Arc<HistogramCells>);

struct HistogramCells {
    /// One count per bucket of [`DURATION_BUCKETS`] (non-cumulative; summed when rendered).
    buckets: [AtomicU64; DURATION_BUCKETS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    fn new() -> Self {
        Self(Arc::new(HistogramCells {
            buckets: Default::default(),
            count: AtomicU64::new(0),
            sum_micros: AtomicU64::new(0),
        }))
    }

    pub fn observe(&self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        if let Some(i) = DURATION_BUCKETS.iter().position(|&le| seconds <= le) {
            self.0.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.0.count.fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        self.0.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }
}

enum Value {
    Counter(Counter),
    Gauge(Gauge),
    Histogram(Histogram),
}

struct Series {
    name: &'static str,
    help: &'static str,
    labels: String,
    value: Value,
}

fn registry() -> &'static Mutex<Vec<Series>> {
    static REGISTRY: OnceLock<Mutex<Vec<Series>>> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(Vec::new()))
}

fn render_labels(labels: &[(&str, &str)]) -> String {
    if labels.is_empty() {
        return String::new();
    }
    let inner: Vec<String> = labels
        .iter()
        .map(|(k, v)| {
            let escaped = v
                .replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n");
            format!("{k}=\"{escaped}\"")
        })
        .collect();
    format!("{{{}}}", inner.join(","))
}

fn register<T: Clone>(
    name: &'static str,
    help: &'static str,
    labels: &[(&str, &str)],
    make: impl FnOnce() -> T,
    wrap: fn(T) -> Value,
    unwrap: fn(&Value) -> Option<T>,
) -> T {
    let labels = render_labels(labels);
    let mut series = registry().lock().expect("metrics registry lock");
    if let Some(existing) = series.iter().find(|s| s.name == name && s.labels == labels) {
        return unwrap(&existing.value)
            .unwrap_or_else(|| panic!("metric {name} registered with two different types"));
    }
    let metric = make();
    series.push(Series {
        name,
        help,
        labels,
        value: wrap(metric.clone()),
    });
    metric
}

/// The counter `name{labels}`, registering it on first use.
pub fn counter(name: &'static str, help: &'static str, labels: &[(&str, &str)]) -> Counter {
    register(
        name,
        help,
        labels,
        Counter::default,
        Value::Counter,
        |v| match v {
            Value::Counter(c) => Some(c.clone()),
            _ => None,
        },
    )
}

/// The gauge `name{labels}`, registering it on first use.
pub fn gauge(name: &'static str, help: &'static str, labels: &[(&str, &str)]) -> Gauge {
    register(
        name,
        help,
        labels,
        Gauge::default,
        Value::Gauge,
        |v| match v {
            Value::Gauge(g) => Some(g.clone()),
            _ => None,
        },
    )
}

/// The duration histogram `name{labels}` (seconds), registering it on first use.
pub fn histogram(name: &'static str, help: &'static str, labels: &[(&str, &str)]) -> Histogram {
    register(
        name,
        help,
        labels,
        Histogram::new,
        Value::Histogram,
        |v| match v {
            Value::Histogram(h) => Some(h.clone()),
            _ => None,
        },
    )
}

/// Every registered series in the text exposition format (version 0.0.4).
pub fn render() -> String {
    let series = registry().lock().expect("metrics registry lock");
    let mut names: Vec<&'static str> = Vec::new();
    for s in series.iter() {
        if !names.contains(&s.name) {
            names.push(s.name);
        }
    }
    names.sort_unstable();
    let mut out = String::new();
    for name in names {
        let members: Vec<&Series> = series.iter().filter(|s| s.name == name).collect();
        let kind = match members[0].value {
            Value::Counter(_) => "counter",
            Value::Gauge(_) => "gauge",
            Value::Histogram(_) => "histogram",
        };
        let _ = writeln!(out, "# HELP {name} {}", members[0].help);
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for s in members {
            match &s.value {
                Value::Counter(c) => {
                    let _ = writeln!(out, "{name}{} {}", s.labels, c.get());
                }
                Value::Gauge(g) => {
                    let _ = writeln!(out, "{name}{} {}", s.labels, g.get());
                }
                Value::Histogram(h) => render_histogram(&mut out, name, &s.labels, h),
            }
        }
    }
    out
}

fn render_histogram(out: &mut String, name: &str, labels: &str, h: &Histogram) {
    let with_le = |le: &str| {
        if labels.is_empty() {
            format!("{{le=\"{le}\"}}")
        } else {
            format!("{},le=\"{le}\"}}", &labels[..labels.len() - 1])
        }
    };
    let mut cumulative = 0;
    for (i, le) in DURATION_BUCKETS.iter().enumerate() {
        cumulative += h.0.buckets[i].load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "{name}_bucket{} {cumulative}",
            with_le(&le.to_string())
        );
    }
    let count = h.0.count.load(Ordering::Relaxed);
    let _ = writeln!(out, "{name}_bucket{} {count}", with_le("+Inf"));
    let sum = h.0.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
    let _ = writeln!(out, "{name}_sum{labels} {sum}");
    let _ = writeln!(out, "{name}_count{labels} {count}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_the_text_format() {
        let c = counter("test_render_total", "A test counter.", &[("kind", "a\"b")]);
        c.add(3);
        let again = counter("test_render_total", "A test counter.", &[("kind", "a\"b")]);
        again.inc();
        let h = histogram("test_render_seconds", "A test histogram.", &[("m", "x")]);
        h.observe(Duration::from_micros(300));
        h.observe(Duration::from_secs(2));
        let text = render();
        assert!(
            text.contains("# TYPE test_render_total counter\n"),
            "{text}"
        );
        assert!(
            text.contains("test_render_total{kind=\"a\\\"b\"} 4\n"),
            "{text}"
        );
        assert!(
            text.contains("test_render_seconds_bucket{m=\"x\",le=\"0.0001\"} 0\n"),
            "{text}"
        );
        assert!(
            text.contains("test_render_seconds_bucket{m=\"x\",le=\"0.0005\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("test_render_seconds_bucket{m=\"x\",le=\"+Inf\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("test_render_seconds_count{m=\"x\"} 2\n"),
            "{text}"
        );
    }
}
