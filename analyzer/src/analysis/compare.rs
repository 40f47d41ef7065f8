//! Several traces (one per rank or process) side by side, with the outliers named.

use serde::Serialize;

use super::TraceReport;

/// A value more than this far from the median (relative) is an outlier.
pub const OUTLIER_FRACTION: f64 = 0.10;

#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    pub rows: Vec<Row>,
    pub median_peak_in_use: u64,
    pub median_peak_reserved: Option<u64>,
    pub median_bytes_allocated: u64,
    pub outliers: Vec<Outlier>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub file: String,
    pub pid: u32,
    pub duration_ns: u64,
    pub allocs: u64,
    pub bytes_allocated: u64,
    pub peak_in_use: u64,
    pub peak_reserved: Option<u64>,
    pub refusals: u64,
    pub ooms: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Outlier {
    pub file: String,
    pub metric: String,
    pub value: u64,
    pub median: u64,
    /// (value - median) / median.
    pub deviation: f64,
}

fn median(mut v: Vec<u64>) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        v[n / 2 - 1] / 2 + v[n / 2] / 2 + (v[n / 2 - 1] % 2 + v[n / 2] % 2) / 2
    }
}

pub fn compare(reports: &[TraceReport]) -> Comparison {
    let rows: Vec<Row> = reports
        .iter()
        .map(|r| Row {
            file: r.file.clone(),
            pid: r.process.pid,
            duration_ns: r.duration_ns,
            allocs: r.allocs(),
            bytes_allocated: r.bytes_allocated(),
            peak_in_use: r.peak_in_use(),
            peak_reserved: r.peak_reserved(),
            refusals: r.devices.iter().map(|d| d.refusals).sum(),
            ooms: r.devices.iter().map(|d| d.ooms).sum(),
        })
        .collect();
    let m_peak = median(rows.iter().map(|r| r.peak_in_use).collect());
    let reserved: Vec<u64> = rows.iter().filter_map(|r| r.peak_reserved).collect();
    let m_res = if reserved.is_empty() {
        None
    } else {
        Some(median(reserved))
    };
    let m_bytes = median(rows.iter().map(|r| r.bytes_allocated).collect());
    let mut outliers = Vec::new();
    if rows.len() >= 3 {
        for r in &rows {
            let mut check = |metric: &str, value: u64, med: u64| {
                if med == 0 {
                    return;
                }
                let dev = (value as f64 - med as f64) / med as f64;
                if dev.abs() > OUTLIER_FRACTION {
                    outliers.push(Outlier {
                        file: r.file.clone(),
                        metric: metric.to_string(),
                        value,
                        median: med,
                        deviation: dev,
                    });
                }
            };
            check("peak_in_use", r.peak_in_use, m_peak);
            if let (Some(v), Some(m)) = (r.peak_reserved, m_res) {
                check("peak_reserved", v, m);
            }
            check("bytes_allocated", r.bytes_allocated, m_bytes);
        }
    }
    Comparison {
        rows,
        median_peak_in_use: m_peak,
        median_peak_reserved: m_res,
        median_bytes_allocated: m_bytes,
        outliers,
    }
}
