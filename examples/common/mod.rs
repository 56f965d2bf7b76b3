//! Statistics and units shared by the benchmark programs.
#![allow(dead_code)] // each benchmark uses a different part

use std::time::Duration;

/// Median; the mean of the two middle values for an even count.
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// [`median`] of durations.
pub fn median_d(values: &[Duration]) -> Duration {
    let secs: Vec<f64> = values.iter().map(Duration::as_secs_f64).collect();
    Duration::from_secs_f64(median(&secs))
}

/// Nearest-rank percentile (`p` in 0..=100).
pub fn percentile_d(values: &[Duration], p: f64) -> Duration {
    let mut v = values.to_vec();
    v.sort();
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

/// Milliseconds, for reports.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Mebibytes, for reports.
pub fn mib(bytes: i64) -> f64 {
    bytes as f64 / 1048576.0
}
