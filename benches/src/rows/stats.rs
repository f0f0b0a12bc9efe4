//! Percentiles over samples.

use std::time::Duration;

/// Median and 99th percentile, in microseconds.
pub fn median_p99(samples: &mut [Duration]) -> (f64, f64) {
    samples.sort_unstable();
    let at = |q: f64| {
        let index = ((samples.len() as f64 - 1.0) * q).round() as usize;
        samples[index].as_secs_f64() * 1e6
    };
    (at(0.5), at(0.99))
}
