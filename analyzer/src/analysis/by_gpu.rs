//! Several traces lined up by physical GPU: processes whose traces name the same device UUID
//! shared that GPU, so their in-use bytes add up on one card. On the wall clock (each trace's
//! monotonic times moved by its header's start), this finds the moment they held the most
//! together, and for every allocation one of them was refused, what each of the others held
//! at that instant: the answer to "my job ran out of memory, but it was not using much".

use serde::Serialize;

use super::report::TraceReport;
use super::steps::StepLog;

/// One GPU that at least two of the traces used.
#[derive(Clone, Debug, Serialize)]
pub struct GpuGroup {
    pub uuid: String,
    pub name: String,
    pub total_bytes: Option<u64>,
    pub processes: Vec<Member>,
    pub combined_peak: CombinedPeak,
    pub failures: Vec<FailureContext>,
    /// Per process, its in-use bytes over wall-clock time (for charts).
    #[serde(skip)]
    pub series: Vec<Series>,
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

/// One process's in-use bytes over wall-clock time: its trace's steps moved by `offset`,
/// then 0 at `end` (the driver frees what a process leaves at exit).
#[derive(Clone, Debug)]
pub struct Series {
    log: StepLog,
    /// wall = monotonic + offset.
    offset: i128,
    end: Option<u64>,
}

impl Series {
    fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let off = self.offset;
        self.log
            .iter()
            .map(move |(t, b)| ((t as i128 + off).clamp(0, u64::MAX as i128) as u64, b))
            .chain(self.end.map(|e| (e, 0)))
    }
}

/// Walks the steps of every series in wall-clock order without gathering them (each series
/// is in time order: a k-way merge), calling `visit(instant, bytes per series)` once per
/// instant, after every change at that instant is applied.
fn sweep(series: &[Series], mut visit: impl FnMut(u64, &[u64])) {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let mut its: Vec<_> = series.iter().map(|s| s.iter().peekable()).collect();
    let mut heap: BinaryHeap<Reverse<(u64, usize)>> = its
        .iter_mut()
        .enumerate()
        .filter_map(|(k, it)| it.peek().map(|&(w, _)| Reverse((w, k))))
        .collect();
    let mut cur = vec![0u64; series.len()];
    while let Some(&Reverse((w, _))) = heap.peek() {
        while let Some(&Reverse((w2, k))) = heap.peek() {
            if w2 != w {
                break;
            }
            heap.pop();
            while let Some(&(w3, b)) = its[k].peek() {
                if w3 != w {
                    break;
                }
                cur[k] = b;
                its[k].next();
            }
            if let Some(&(w3, _)) = its[k].peek() {
                heap.push(Reverse((w3, k)));
            }
        }
        visit(w, &cur);
    }
}

impl GpuGroup {
    /// Up to `n` samples of the processes' bytes over the group's wall-clock span: in each
    /// of `n` equal slices, the state at the instant they held the most together (so no peak
    /// falls between samples). The slice's length in ns, and per slice that has a change
    /// (slice start wall ns, bytes per process); a slice without one keeps the state before.
    pub fn samples(&self, n: usize) -> (u64, Vec<(u64, Vec<u64>)>) {
        let mut first = None;
        let mut last = 0;
        sweep(&self.series, |w, _| {
            first.get_or_insert(w);
            last = w;
        });
        let Some(t0) = first else {
            return (1, Vec::new());
        };
        let span = last - t0;
        let n = n.max(1) as u64;
        let slice = |w: u64| ((w - t0) as u128 * n as u128 / (span as u128 + 1)) as u64;
        let start = |k: u64| t0 + (k as u128 * (span as u128 + 1) / n as u128) as u64;
        let mut out: Vec<(u64, Vec<u64>)> = Vec::new();
        let mut best: Option<(u64, u64, Vec<u64>)> = None; // (slice, total, state)
        sweep(&self.series, |w, cur| {
            let (k, total) = (slice(w), cur.iter().sum::<u64>());
            match &mut best {
                Some((bk, bt, bs)) if *bk == k => {
                    if total > *bt {
                        *bt = total;
                        bs.clear();
                        bs.extend_from_slice(cur);
                    }
                }
                _ => {
                    if let Some((bk, _, bs)) = best.take() {
                        out.push((start(bk), bs));
                    }
                    best = Some((k, total, cur.to_vec()));
                }
            }
        });
        if let Some((bk, _, bs)) = best {
            out.push((start(bk), bs));
        }
        ((span + 1).div_ceil(n).max(1), out)
    }
}

fn wall_offset(r: &TraceReport) -> i128 {
    r.process.start_wall_ns as i128 - r.start_mono_ns as i128
}

fn wall(r: &TraceReport, t_ns: u64) -> u64 {
    (t_ns as i128 + wall_offset(r)).clamp(0, u64::MAX as i128) as u64
}

/// Groups the devices of `reports` by UUID; only GPUs seen by two traces or more. The
/// reports need their in-use steps (`Options::steps`), which the groups take over; devices
/// without a UUID (older traces, imported logs) are left out.
pub fn by_gpu(reports: &mut [TraceReport]) -> Vec<GpuGroup> {
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

fn group(reports: &mut [TraceReport], uuid: String, members: &[(usize, usize)]) -> GpuGroup {
    let series: Vec<Series> = members
        .iter()
        .map(|&(ri, di)| {
            let r = &mut reports[ri];
            let dev = r.devices[di].device;
            let log = r
                .steps
                .iter_mut()
                .find(|s| s.0 == dev)
                .map(|s| std::mem::take(&mut s.1))
                .unwrap_or_default();
            let r = &reports[ri];
            let end = match (log.last(), r.last_ns) {
                (Some((t, b)), Some(last)) if b > 0 => Some(wall(r, last.max(t)) + 1),
                _ => None,
            };
            Series {
                log,
                offset: wall_offset(r),
                end,
            }
        })
        .collect();

    // Refusals in wall-clock order; each gets the state in force at its instant.
    let mut failures = Vec::new();
    for (m, &(ri, di)) in members.iter().enumerate() {
        let r = &reports[ri];
        for pm in &r.devices[di].post_mortems {
            failures.push((
                FailureContext {
                    process: m,
                    wall_ns: wall(r, pm.t_ns),
                    cause: pm.cause.clone(),
                    size: pm.size,
                    held: vec![0; members.len()],
                },
                pm.in_use,
            ));
        }
    }
    failures.sort_by_key(|f| f.0.wall_ns);

    let mut peak = CombinedPeak {
        bytes: 0,
        wall_ns: 0,
        held: vec![0; members.len()],
    };
    // The state at instant w holds until the next instant: a refusal at wf takes the state
    // of the last instant <= wf, so refusals are settled one instant late.
    let mut next_f = 0;
    let mut prev: Option<(u64, Vec<u64>)> = None;
    let settle = |upto: u64, state: &[u64], fs: &mut [(FailureContext, u64)], i: &mut usize| {
        while *i < fs.len() && fs[*i].0.wall_ns < upto {
            fs[*i].0.held.copy_from_slice(state);
            *i += 1;
        }
    };
    sweep(&series, |w, cur| {
        if let Some((_, st)) = &prev {
            settle(w, st, &mut failures, &mut next_f);
        } else {
            // Refusals before any step: nobody held anything.
            settle(w, &vec![0; cur.len()], &mut failures, &mut next_f);
        }
        let total: u64 = cur.iter().sum();
        if total > peak.bytes {
            peak = CombinedPeak {
                bytes: total,
                wall_ns: w,
                held: cur.to_vec(),
            };
        }
        match &mut prev {
            Some((pw, st)) => {
                *pw = w;
                st.copy_from_slice(cur);
            }
            None => prev = Some((w, cur.to_vec())),
        }
    });
    if let Some((_, st)) = &prev {
        settle(u64::MAX, st, &mut failures, &mut next_f);
    }
    let failures = failures
        .into_iter()
        .map(|(mut f, own)| {
            // The refused process's own figure comes from its post-mortem (exact at the
            // request, whatever else happened in the same nanosecond).
            f.held[f.process] = own;
            f
        })
        .collect();

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
        series,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(steps: &[(u64, u64)]) -> Series {
        let mut log = StepLog::default();
        for &(t, b) in steps {
            log.push(t, b);
        }
        Series {
            log,
            offset: 0,
            end: None,
        }
    }

    fn group(series: Vec<Series>) -> GpuGroup {
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
            series(&[(0, 5), (1_000, 0)]),
            series(&[(10, 2), (437, 90), (438, 3), (999, 0)]),
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

    #[test]
    fn the_sweep_applies_one_instant_at_a_time_in_order() {
        let s = vec![
            series(&[(5, 1), (5, 2), (9, 0)]),
            series(&[(1, 7), (5, 3), (20, 1)]),
        ];
        let mut seen = Vec::new();
        sweep(&s, |w, cur| seen.push((w, cur.to_vec())));
        assert_eq!(
            seen,
            [
                (1, vec![0, 7]),
                (5, vec![2, 3]),
                (9, vec![0, 3]),
                (20, vec![0, 1])
            ]
        );
    }
}
