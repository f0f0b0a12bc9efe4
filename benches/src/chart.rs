//! The scaling curve as an SVG chart (`--svg PATH`): one panel per scaling row group —
//! requests/s and p99 against concurrent websocket clients, memory per idle connection
//! against open connections, requests/s against relay streams — each series beside its
//! floor (and codex where measured). Written by hand: three small line charts do not need
//! a plotting library.

use std::fmt::Write as _;

use crate::report::Row;

/// One panel: a title, x labels (one per row key) and which numbers of the rows to draw.
struct Panel {
    title: &'static str,
    unit: &'static str,
    keys: &'static [(&'static str, &'static str)],
    /// Draw the p99 (µs) instead of the median.
    p99: bool,
}

const PANELS: [Panel; 4] = [
    Panel {
        title: "requests/s vs websocket clients",
        unit: "req/s",
        keys: &[
            ("rps_ws_1", "1"),
            ("rps_ws_8", "8"),
            ("rps_ws_64", "64"),
            ("rps_ws_512", "512"),
        ],
        p99: false,
    },
    Panel {
        title: "p99 round trip (µs) vs websocket clients",
        unit: "µs",
        keys: &[
            ("rps_ws_1", "1"),
            ("rps_ws_8", "8"),
            ("rps_ws_64", "64"),
            ("rps_ws_512", "512"),
        ],
        p99: true,
    },
    Panel {
        title: "KiB per idle connection vs connections",
        unit: "KiB",
        keys: &[
            ("rss_conn_100", "100"),
            ("rss_per_conn", "1,000"),
            ("rss_conn_10k", "10,000"),
        ],
        p99: false,
    },
    Panel {
        title: "requests/s vs relay streams (hybrid suite)",
        unit: "req/s",
        keys: &[
            ("relay_rps_1", "1"),
            ("relay_rps_16", "16"),
            ("relay_rps_128", "128"),
        ],
        p99: false,
    },
];

const PANEL_W: f64 = 420.0;
const PANEL_H: f64 = 260.0;
const MARGIN_L: f64 = 70.0;
const MARGIN_T: f64 = 40.0;
const PLOT_W: f64 = PANEL_W - MARGIN_L - 20.0;
const PLOT_H: f64 = PANEL_H - MARGIN_T - 50.0;

/// Reads a series' value from a row; `true`: the panel draws p99s.
type Reading = fn(&Row, bool) -> Option<f64>;

/// The series of a panel: name, colour, and how to read a row.
const SERIES: [(&str, &str, Reading); 3] = [
    ("exec-server", "#1f77b4", |r, p99| {
        if p99 {
            r.p99
        } else {
            Some(r.median)
        }
    }),
    (
        "floor",
        "#7f7f7f",
        |r, p99| if p99 { None } else { r.floor },
    ),
    ("codex", "#d62728", |r, p99| if p99 { None } else { r.peer }),
];

/// The chart for the scaling rows among `rows`; panels without rows are left out.
pub fn scaling_svg(rows: &[Row], machine: &str) -> String {
    let panels: Vec<(&Panel, Vec<Option<&Row>>)> = PANELS
        .iter()
        .map(|p| {
            let found = p
                .keys
                .iter()
                .map(|(k, _)| rows.iter().find(|r| r.key == *k))
                .collect::<Vec<_>>();
            (p, found)
        })
        .filter(|(_, found)| found.iter().any(Option::is_some))
        .collect();
    let columns = 2usize;
    let height = PANEL_H * panels.len().div_ceil(columns) as f64 + 30.0;
    let width = PANEL_W * columns as f64;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" \
         font-family=\"sans-serif\" font-size=\"11\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"10\" y=\"18\" font-size=\"12\">exec-server scaling — {}</text>\n",
        escape(machine)
    );
    for (i, (panel, found)) in panels.iter().enumerate() {
        let x0 = PANEL_W * (i % columns) as f64;
        let y0 = 30.0 + PANEL_H * (i / columns) as f64;
        draw_panel(&mut svg, panel, found, x0, y0);
    }
    svg.push_str("</svg>\n");
    svg
}

fn draw_panel(svg: &mut String, panel: &Panel, rows: &[Option<&Row>], x0: f64, y0: f64) {
    let values: Vec<Vec<Option<f64>>> = SERIES
        .iter()
        .map(|(_, _, read)| {
            rows.iter()
                .map(|r| r.and_then(|r| read(r, panel.p99)))
                .collect()
        })
        .collect();
    let top = values
        .iter()
        .flatten()
        .flatten()
        .fold(0.0f64, |a, b| a.max(*b))
        .max(1e-9)
        * 1.1;
    let left = x0 + MARGIN_L;
    let bottom = y0 + MARGIN_T + PLOT_H;
    let _ = writeln!(
        svg,
        "<text x=\"{}\" y=\"{}\" font-size=\"12\">{}</text>",
        left,
        y0 + 20.0,
        escape(panel.title)
    );
    let _ = writeln!(
        svg,
        "<rect x=\"{left}\" y=\"{}\" width=\"{PLOT_W}\" height=\"{PLOT_H}\" fill=\"none\" stroke=\"#ccc\"/>",
        y0 + MARGIN_T
    );
    for tick in 0..=4 {
        let value = top * tick as f64 / 4.0;
        let y = bottom - PLOT_H * tick as f64 / 4.0;
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            left - 4.0,
            y + 4.0,
            short(value)
        );
    }
    let _ = writeln!(
        svg,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>",
        left - 4.0,
        y0 + MARGIN_T - 8.0,
        escape(panel.unit)
    );
    let step = PLOT_W / panel.keys.len() as f64;
    let x_at = |i: usize| left + step * (i as f64 + 0.5);
    for (i, (_, label)) in panel.keys.iter().enumerate() {
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{label}</text>",
            x_at(i),
            bottom + 14.0
        );
    }
    for (s, (name, colour, _)) in SERIES.iter().enumerate() {
        let points: Vec<String> = values[s]
            .iter()
            .enumerate()
            .filter_map(|(i, v)| {
                v.map(|v| format!("{:.1},{:.1}", x_at(i), bottom - PLOT_H * v / top))
            })
            .collect();
        if points.is_empty() {
            continue;
        }
        let _ = writeln!(
            svg,
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\"/>",
            points.join(" ")
        );
        for point in &points {
            let (x, y) = point.split_once(',').unwrap_or(("0", "0"));
            let _ = writeln!(
                svg,
                "<circle cx=\"{x}\" cy=\"{y}\" r=\"3\" fill=\"{colour}\"/>"
            );
        }
        let legend_x = left + 90.0 * s as f64;
        let _ = writeln!(
            svg,
            "<rect x=\"{legend_x}\" y=\"{}\" width=\"10\" height=\"10\" fill=\"{colour}\"/>\
             <text x=\"{}\" y=\"{}\">{name}</text>",
            bottom + 24.0,
            legend_x + 14.0,
            bottom + 33.0
        );
    }
}

/// 123456 → `123k`, 1.5 → `1.5`.
fn short(value: f64) -> String {
    if value >= 10_000.0 {
        format!("{:.0}k", value / 1_000.0)
    } else if value >= 100.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.1}")
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
