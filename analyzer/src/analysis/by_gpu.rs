//! Several traces lined up by physical GPU: processes whose traces name the same device UUID
//! shared that GPU, so their in-use bytes add up on one card. On the wall clock (each trace's
//! monotonic times moved by its header's start), this finds the moment they held the most
//! together, and for every allocation one of them was refused, what each of the others held
//! at that instant: the answer to "my job ran out of memory, but it was not using much".

use serde::Serialize;

use super::report::TraceReport;

/// One GPU that at least two of the traces used.
#[derive(Clone, Debug, Serialize)]
pub struct GpuGroup {
    pub uuid: String,
    pub name: String,
    pub total_bytes: Option<u64>,
    pub processes: Vec<Member>,
    pub combined_peak: CombinedPeak,
    pub failures: Vec<FailureContext>,
    /// Per process, its in-use bytes over wall-clock time: sorted (wall ns, bytes) steps,
    /// ending with 0 after its last event (for charts).
    #[serde(skip)]
    pub series: Vec<Vec<(u64, u64)>>,
}

impl GpuGroup {
    /// Up to `n` samples of the processes' bytes over the group's wall-clock span: in each
    /// of `n` equal slices, the state at the instant they held the most together (so no peak
    /// falls between samples). The slice's length in ns, and per slice that has a change
    /// (slice start wall ns, bytes per process); a slice without one keeps the state before.
    pub fn samples(&self, n: usize) -> (u64, Vec<(u64, Vec<u64>)>) {
        let mut all: Vec<(u64, usize, u64)> = self
            .series
            .iter()
            .enumerate()
            .flat_map(|(m, s)| s.iter().map(move |&(w, b)| (w, m, b)))
            .collect();
        all.sort_by_key(|s| s.0);
        let (Some(first), Some(last)) = (all.first(), all.last()) else {
            return (1, Vec::new());
        };
        let (t0, span) = (first.0, (last.0 - first.0).max(1));
        let n = n.max(1) as u64;
        let slice = |w: u64| ((w - t0) as u128 * n as u128 / (span as u128 + 1)) as u64;
        let mut cur = vec![0u64; self.series.len()];
        let mut out: Vec<(u64, Vec<u64>)> = Vec::new();
        let mut best: Option<(u64, u64, Vec<u64>)> = None; // (slice, total, state)
        let mut i = 0;
        while i < all.len() {
            let w = all[i].0;
            while i < all.len() && all[i].0 == w {
                cur[all[i].1] = all[i].2;
                i += 1;
            }
            let (k, total) = (slice(w), cur.iter().sum::<u64>());
            match &mut best {
                Some((bk, bt, bs)) if *bk == k => {
                    if total > *bt {
                        *bt = total;
                        bs.clone_from(&cur);
                    }
                }
                _ => {
                    if let Some((bk, _, bs)) = best.take() {
                        out.push((
                            t0 + (bk as u128 * (span as u128 + 1) / n as u128) as u64,
                            bs,
                        ));
                    }
                    best = Some((k, total, cur.clone()));
                }
            }
        }
        if let Some((bk, _, bs)) = best {
            out.push((
                t0 + (bk as u128 * (span as u128 + 1) / n as u128) as u64,
                bs,
            ));
        }
        ((span + 1).div_ceil(n).max(1), out)
    }
}

/// One process's use of the GPU (a trace and the device ordinal it knew the GPU by).
#[derive(Clone, Debug, Serialize)]
pub struct Member {
    pub trace: String,
    pub pid: u32,
    pub device: i32,
    pub peak_in_use: u64,
}

/// The most the processes held together, when, and who held what then.
#[derive(Clone, Debug, Serialize)]
pub struct CombinedPeak {
    pub bytes: u64,
    /// Wall-clock time, ns since the Unix epoch.
    pub wall_ns: u64,
    /// In-use bytes per process (the order of `processes`).
    pub held: Vec<u64>,
}

/// A refused allocation (cap or device) of one process, and what every process held then.
#[derive(Clone, Debug, Serialize)]
pub struct FailureContext {
    /// Index into `processes`.
    pub process: usize,
    pub wall_ns: u64,
    /// "cap" or "device", as in the trace's post-mortem.
    pub cause: String,
    pub size: u64,
    /// In-use bytes per process at that instant (the order of `processes`).
    pub held: Vec<u64>,
}

/// In-use bytes of one process over wall-clock time: sorted (wall ns, bytes) steps, ending
/// with 0 after its trace's last event (the driver frees what a process leaves at exit).
struct Series {
    steps: Vec<(u64, u64)>,
}

impl Series {
    /// Bytes held at wall time `w` (0 before the first step).
    fn at(&self, w: u64) -> u64 {
        match self.steps.partition_point(|s| s.0 <= w) {
            0 => 0,
            i => self.steps[i - 1].1,
        }
    }
}

fn wall(r: &TraceReport, t_ns: u64) -> u64 {
    let w = r.process.start_wall_ns as i128 + t_ns as i128 - r.start_mono_ns as i128;
    w.clamp(0, u64::MAX as i128) as u64
}

/// Groups the devices of `reports` by UUID; only GPUs seen by two traces or more. The
/// reports need their in-use steps (`Options::steps`); devices without a UUID (older traces,
/// imported logs) are left out.
pub fn by_gpu(reports: &[TraceReport]) -> Vec<GpuGroup> {
    // uuid -> [(report, device index in report.devices)]
    let mut groups: Vec<(String, Vec<(usize, usize)>)> = Vec::new();
    for (ri, r) in reports.iter().enumerate() {
        for (di, d) in r.devices.iter().enumerate() {
            let Some(u) = &d.uuid else { continue };
            match groups.iter_mut().find(|g| &g.0 == u) {
                Some(g) => g.1.push((ri, di)),
                None => groups.push((u.clone(), vec![(ri, di)])),
            }
        }
    }
    groups
        .into_iter()
        .filter(|g| g.1.len() >= 2)
        .map(|(uuid, members)| group(reports, uuid, &members))
        .collect()
}

fn group(reports: &[TraceReport], uuid: String, members: &[(usize, usize)]) -> GpuGroup {
    let series: Vec<Series> = members
        .iter()
        .map(|&(ri, di)| {
            let r = &reports[ri];
            let dev = r.devices[di].device;
            let raw = r
                .steps
                .iter()
                .find(|s| s.0 == dev)
                .map(|s| s.1.as_slice())
                .unwrap_or(&[]);
            let mut steps: Vec<(u64, u64)> = raw.iter().map(|&(t, b)| (wall(r, t), b)).collect();
            // Events of one trace are in time order except for rare reordering the reader
            // reports; the sweep below needs the order.
            steps.sort_by_key(|s| s.0);
            if let (Some(&(_, b)), Some(last)) = (steps.last(), r.last_ns)
                && b > 0
            {
                let end = wall(r, last).max(steps.last().map_or(0, |s| s.0)) + 1;
                steps.push((end, 0));
            }
            Series { steps }
        })
        .collect();

    // Sweep every step of every process in wall-clock order, keeping each one's bytes.
    let mut all: Vec<(u64, usize, u64)> = series
        .iter()
        .enumerate()
        .flat_map(|(m, s)| s.steps.iter().map(move |&(w, b)| (w, m, b)))
        .collect();
    all.sort_by_key(|s| s.0);
    let mut cur = vec![0u64; series.len()];
    let mut total = 0u64;
    let mut peak = CombinedPeak {
        bytes: 0,
        wall_ns: 0,
        held: vec![0; series.len()],
    };
    let mut i = 0;
    while i < all.len() {
        // Apply every step at one instant before judging it: two processes changing at the
        // same nanosecond are one state.
        let w = all[i].0;
        while i < all.len() && all[i].0 == w {
            let (_, m, b) = all[i];
            total = total - cur[m] + b;
            cur[m] = b;
            i += 1;
        }
        if total > peak.bytes {
            peak = CombinedPeak {
                bytes: total,
                wall_ns: w,
                held: cur.clone(),
            };
        }
    }

    let mut failures = Vec::new();
    for (m, &(ri, di)) in members.iter().enumerate() {
        let r = &reports[ri];
        for pm in &r.devices[di].post_mortems {
            let w = wall(r, pm.t_ns);
            let held = series
                .iter()
                .enumerate()
                .map(|(k, s)| if k == m { pm.in_use } else { s.at(w) })
                .collect();
            failures.push(FailureContext {
                process: m,
                wall_ns: w,
                cause: pm.cause.clone(),
                size: pm.size,
                held,
            });
        }
    }
    failures.sort_by_key(|f| f.wall_ns);

    let (r0, d0) = members[0];
    let first = &reports[r0].devices[d0];
    GpuGroup {
        uuid,
        name: first.name.clone(),
        total_bytes: members
            .iter()
            .find_map(|&(ri, di)| reports[ri].devices[di].total_bytes),
        processes: members
            .iter()
            .map(|&(ri, di)| Member {
                trace: reports[ri].file.clone(),
                pid: reports[ri].process.pid,
                device: reports[ri].devices[di].device,
                peak_in_use: reports[ri].devices[di].peak_in_use.bytes,
            })
            .collect(),
        combined_peak: peak,
        failures,
        series: series.into_iter().map(|s| s.steps).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(series: Vec<Vec<(u64, u64)>>) -> GpuGroup {
        GpuGroup {
            uuid: "GPU-x".into(),
            name: "x".into(),
            total_bytes: None,
            processes: Vec::new(),
            combined_peak: CombinedPeak {
                bytes: 0,
                wall_ns: 0,
                held: Vec::new(),
            },
            failures: Vec::new(),
            series,
        }
    }

    #[test]
    fn samples_keep_every_peak() {
        // A 1 ns spike of process 1 inside one of 10 slices, while process 0 holds 5.
        let g = group(vec![
            vec![(0, 5), (1_000, 0)],
            vec![(10, 2), (437, 90), (438, 3), (999, 0)],
        ]);
        let (slice, s) = g.samples(10);
        assert_eq!(slice, 101);
        let best = s.iter().map(|x| x.1.iter().sum::<u64>()).max().unwrap();
        assert_eq!(best, 95, "{s:?}");
        assert!(s.iter().any(|x| x.1 == [5, 90]), "{s:?}");
        // Slices are in time order, one per slice with a change.
        assert!(s.windows(2).all(|w| w[0].0 < w[1].0));
        // The last slice (999..1000) shows its maximum, [5, 0], not the final drop: the
        // chart is an envelope of the maxima.
        assert_eq!(s.last().unwrap().1, [5, 0]);
    }
}
