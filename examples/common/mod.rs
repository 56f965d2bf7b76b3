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

/// CPU time used so far (user + system) by this process and by every process named `postgres`
/// on the machine (the server: its backends, WAL writer, checkpointer…), from /proc, in
/// seconds. /proc counts in USER_HZ ticks, 100 per second on every Linux ABI: 10 ms
/// resolution, fine over rounds of seconds. `None` where /proc is not Linux's.
pub fn cpu_seconds() -> Option<(f64, f64)> {
    fn ticks(stat: &str) -> Option<(String, u64)> {
        // comm is in parentheses and may hold spaces; the fields after it are space-separated.
        let open = stat.find('(')?;
        let close = stat.rfind(')')?;
        let comm = stat[open + 1..close].to_owned();
        let fields: Vec<&str> = stat[close + 2..].split(' ').collect();
        let utime: u64 = fields.get(11)?.parse().ok()?;
        let stime: u64 = fields.get(12)?.parse().ok()?;
        Some((comm, utime + stime))
    }
    const USER_HZ: f64 = 100.0;
    let own = ticks(&std::fs::read_to_string("/proc/self/stat").ok()?)?.1;
    let mut server = 0;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        if let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) {
            if let Some((comm, t)) = ticks(&stat) {
                if comm == "postgres" {
                    server += t;
                }
            }
        }
    }
    Some((own as f64 / USER_HZ, server as f64 / USER_HZ))
}
