//! What changed between two runs: peaks, calls by API, size mix, call sites.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{DeviceReport, TraceReport};

pub const DIFF_SCHEMA: &str = "vramshim.diff/1";

#[derive(Clone, Debug, Serialize)]
pub struct Change {
    pub what: String,
    pub a: i128,
    pub b: i128,
    pub delta: i128,
    /// delta / a (null when a is 0).
    pub relative: Option<f64>,
}

impl Change {
    fn new(what: &str, a: i128, b: i128) -> Change {
        Change {
            what: what.to_string(),
            a,
            b,
            delta: b - a,
            relative: if a != 0 {
                Some((b - a) as f64 / a as f64)
            } else {
                None
            },
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct DeviceDiff {
    pub device: i32,
    pub metrics: Vec<Change>,
    pub calls: Vec<Change>,
    pub sizes: Vec<Change>,
    pub sites: Vec<Change>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Diff {
    pub schema: &'static str,
    pub a: String,
    pub b: String,
    pub devices: Vec<DeviceDiff>,
}

fn metrics(a: Option<&DeviceReport>, b: Option<&DeviceReport>) -> Vec<Change> {
    let f = |d: Option<&DeviceReport>, k: &str| -> i128 {
        let Some(d) = d else { return 0 };
        (match k {
            "peak_in_use" => d.peak_in_use.bytes,
            "peak_reserved" => d.peak_reserved.as_ref().map(|p| p.bytes).unwrap_or(0),
            "allocs" => d.allocs,
            "bytes_allocated" => d.bytes_allocated,
            "failed_allocs" => d.failed_allocs,
            "refusals" => d.refusals,
            "ooms" => d.ooms,
            "live_at_exit" => d.leaks.bytes,
            "short_lived" => d.short_lived.count,
            "temporary" => d.temporary.count,
            _ => 0,
        }) as i128
    };
    [
        "peak_in_use",
        "peak_reserved",
        "allocs",
        "bytes_allocated",
        "failed_allocs",
        "refusals",
        "ooms",
        "live_at_exit",
        "short_lived",
        "temporary",
    ]
    .iter()
    .map(|k| Change::new(k, f(a, k), f(b, k)))
    .collect()
}

fn keyed(a: BTreeMap<String, i128>, b: BTreeMap<String, i128>, only_changed: bool) -> Vec<Change> {
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut v: Vec<Change> = keys
        .into_iter()
        .map(|k| Change::new(k, *a.get(k).unwrap_or(&0), *b.get(k).unwrap_or(&0)))
        .filter(|c| !only_changed || c.delta != 0)
        .collect();
    v.sort_by(|x, y| y.delta.abs().cmp(&x.delta.abs()).then(x.what.cmp(&y.what)));
    v
}

pub fn diff(a: &TraceReport, b: &TraceReport, top: usize) -> Diff {
    let mut devs: Vec<i32> = a
        .devices
        .iter()
        .chain(&b.devices)
        .map(|d| d.device)
        .collect();
    devs.sort();
    devs.dedup();
    let mut devices = Vec::new();
    for dev in devs {
        let da = a.devices.iter().find(|d| d.device == dev);
        let db = b.devices.iter().find(|d| d.device == dev);
        let calls = |d: Option<&DeviceReport>| -> BTreeMap<String, i128> {
            d.map(|d| {
                d.calls
                    .iter()
                    .map(|c| (format!("{} {} ({})", c.api, c.op, c.kind), c.count as i128))
                    .collect()
            })
            .unwrap_or_default()
        };
        let sizes = |d: Option<&DeviceReport>| -> BTreeMap<String, i128> {
            d.map(|d| {
                d.size_histogram
                    .iter()
                    .map(|s| {
                        (
                            format!("{:>20}..{}", s.min, s.max.saturating_add(1)),
                            s.count as i128,
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
        };
        let sites = |d: Option<&DeviceReport>| -> BTreeMap<String, i128> {
            let mut m = BTreeMap::new();
            if let Some(d) = d {
                for s in &d.top_sites {
                    let key = if s.frames.is_empty() {
                        s.site.clone()
                    } else {
                        s.frames.join(" < ")
                    };
                    *m.entry(key).or_insert(0) += s.bytes as i128;
                }
            }
            m
        };
        let mut sz = keyed(sizes(da), sizes(db), false);
        sz.sort_by(|x, y| x.what.cmp(&y.what));
        for c in &mut sz {
            c.what = c.what.trim_start().to_string();
        }
        let mut st = keyed(sites(da), sites(db), true);
        st.truncate(top);
        devices.push(DeviceDiff {
            device: dev,
            metrics: metrics(da, db),
            calls: keyed(calls(da), calls(db), false),
            sizes: sz,
            sites: st,
        });
    }
    Diff {
        schema: DIFF_SCHEMA,
        a: a.file.clone(),
        b: b.file.clone(),
        devices,
    }
}
