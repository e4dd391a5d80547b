//! The process' memory as Linux reports it in /proc/self/status, for the benchmarks' tables.

/// Resident memory now (VmRSS) and its peak so far (VmHWM), in MiB; NaN where /proc is not there.
#[derive(Clone, Copy, Debug)]
pub struct Memory {
    pub resident_mib: f64,
    pub peak_mib: f64,
}

impl Memory {
    pub fn now() -> Self {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
                .map_or(f64::NAN, |kib| kib / 1024.0)
        };
        Self { resident_mib: field("VmRSS:"), peak_mib: field("VmHWM:") }
    }
}
