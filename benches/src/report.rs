//! Rows and their presentation: the table and the JSON object.

use serde_json::{json, Map, Value};

/// What a row's numbers mean, which decides how the ratio and the target read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// A duration in microseconds; lower is better; ratio = measured / floor.
    Micros,
    /// Requests per second; higher is better; ratio = measured / floor.
    PerSecond,
    /// Bytes per second; higher is better; ratio = measured / floor.
    BytesPerSecond,
    /// Kibibytes of memory; lower is better; no floor.
    KiB,
}

/// One measured row.
#[derive(Debug, Clone)]
pub struct Row {
    pub key: &'static str,
    pub what: &'static str,
    pub unit: Unit,
    pub median: f64,
    pub p99: Option<f64>,
    pub floor: Option<f64>,
    /// The target, as text (e.g. `≤ 1.5× floor`).
    pub target: &'static str,
    /// Whether the target is met.
    pub met: bool,
    /// The same row measured against `codex exec-server` with the same client, when codex
    /// is installed (see [`crate::peer`]).
    pub peer: Option<f64>,
}

impl Row {
    pub fn ratio(&self) -> Option<f64> {
        self.floor.filter(|f| *f > 0.0).map(|f| self.median / f)
    }

    /// The unit of the p99 column: a throughput row's p99 is its requests' round trip.
    pub fn p99_unit(&self) -> Unit {
        match self.unit {
            Unit::PerSecond => Unit::Micros,
            unit => unit,
        }
    }

    /// Ours / codex's, read like [`Row::ratio`].
    pub fn peer_ratio(&self) -> Option<f64> {
        self.peer.filter(|p| *p > 0.0).map(|p| self.median / p)
    }
}

fn format_value(unit: Unit, value: f64) -> String {
    match unit {
        Unit::Micros => format!("{value:.1} µs"),
        Unit::PerSecond => format!("{value:.0}/s"),
        Unit::BytesPerSecond => format!("{:.0} MiB/s", value / (1024.0 * 1024.0)),
        Unit::KiB => format!("{value:.1} KiB"),
    }
}

/// The human-readable table.
pub fn table(rows: &[Row], machine: &str) -> String {
    let mut out = format!("exec-server benchmark — {machine}\n\n");
    out.push_str(&format!(
        "| {:<13} | {:<58} | {:>12} | {:>12} | {:>12} | {:>6} | {:>12} | {:>6} | {:<20} | {:<4} |\n",
        "row", "what", "median", "p99", "floor", "ratio", "codex", "÷codex", "target", "met"
    ));
    out.push_str(&format!(
        "|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|\n",
        "-".repeat(15),
        "-".repeat(60),
        "-".repeat(14),
        "-".repeat(14),
        "-".repeat(14),
        "-".repeat(8),
        "-".repeat(14),
        "-".repeat(8),
        "-".repeat(22),
        "-".repeat(6)
    ));
    for row in rows {
        out.push_str(&format!(
            "| {:<13} | {:<58} | {:>12} | {:>12} | {:>12} | {:>6} | {:>12} | {:>6} | {:<20} | {:<4} |\n",
            row.key,
            row.what,
            format_value(row.unit, row.median),
            row.p99
                .map(|v| format_value(row.p99_unit(), v))
                .unwrap_or_else(|| "—".into()),
            row.floor
                .map(|v| format_value(row.unit, v))
                .unwrap_or_else(|| "—".into()),
            row.ratio()
                .map(|r| format!("{r:.2}"))
                .unwrap_or_else(|| "—".into()),
            row.peer
                .map(|v| format_value(row.unit, v))
                .unwrap_or_else(|| "—".into()),
            row.peer_ratio()
                .map(|r| format!("{r:.2}"))
                .unwrap_or_else(|| "—".into()),
            row.target,
            if row.met { "yes" } else { "NO" }
        ));
    }
    out
}

/// One JSON object with a key per row: `median`, `p99` where it applies, `floor`, `ratio`,
/// and `codex` / `codex_ratio` where codex was measured too.
pub fn to_json(rows: &[Row]) -> Value {
    let mut map = Map::new();
    for row in rows {
        map.insert(
            row.key.to_owned(),
            json!({
                "median": row.median,
                "p99": row.p99,
                "floor": row.floor,
                "ratio": row.ratio(),
                "codex": row.peer,
                "codex_ratio": row.peer_ratio(),
                "unit": match row.unit {
                    Unit::Micros => "us",
                    Unit::PerSecond => "per_s",
                    Unit::BytesPerSecond => "bytes_per_s",
                    Unit::KiB => "KiB",
                },
                "target": row.target,
                "met": row.met,
            }),
        );
    }
    Value::Object(map)
}
