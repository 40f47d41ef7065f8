//! The tensor level of a trace (`Torch`, `PyCode`, `PyStack` records: PyTorch's caching
//! allocator seen through its trace tracker). Per device it follows the live tensor blocks
//! and PyTorch's segments, keeps running totals per Python stack and per segment, and takes
//! snapshots at PyTorch's peak of allocated bytes (lazily, when that peak is left, like the
//! device-level peak) and at each PyTorch out-of-memory error. Python stacks are named at the
//! end (their records may follow the events that use them), as `function (file.py:line)` of
//! the innermost frame in user code (not in an installed package or the standard library).

use std::collections::BTreeMap;

use serde::Serialize;
use vramshim_trace::{PyFrame, TorchOp, torch_action as act};

use crate::fastmap::FastMap;
pub use crate::symbols::{is_user_file, short_function};

/// One live tensor block.
#[derive(Clone, Copy)]
struct Block {
    size: u64,
    segment: u64,
    stack: u32,
}

/// (stack, bytes, tensors).
type StackBytes = (u32, u64, u64);
/// (segment start, size, live bytes, what lies in it).
type SegmentSnap = (u64, u64, u64, Vec<StackBytes>);

/// The tensor state of one device at one moment: totals, bytes per Python stack, and the
/// segments with their live bytes per stack.
#[derive(Clone, Debug, Default)]
pub(crate) struct TorchSnap {
    pub t_ns: u64,
    pub allocated: u64,
    pub reserved: u64,
    pub tensors: u64,
    /// (stack, bytes, tensors), largest first.
    pub by_stack: Vec<StackBytes>,
    /// (segment start, size, live bytes, [(stack, bytes, tensors)]), largest segment first.
    pub segments: Vec<SegmentSnap>,
    pub segment_count: u64,
    /// The request PyTorch could not serve: (size, stack, device free bytes).
    pub failed: Option<(u64, u32, u64)>,
}

#[derive(Default)]
struct Dev {
    device: i32,
    live: FastMap<u64, Block>,
    segments: BTreeMap<u64, u64>,
    by_stack: FastMap<u32, (u64, u64)>,
    by_seg_stack: FastMap<(u64, u32), (u64, u64)>,
    allocated: u64,
    reserved: u64,
    peak: u64,
    peak_t: u64,
    peak_pending: bool,
    peak_snap: Option<TorchSnap>,
}

impl Dev {
    fn snap(&self, t_ns: u64, top: usize) -> TorchSnap {
        let mut by_stack: Vec<(u32, u64, u64)> = self
            .by_stack
            .iter()
            .filter(|(_, v)| v.0 > 0)
            .map(|(k, v)| (*k, v.0, v.1))
            .collect();
        by_stack.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        by_stack.truncate(top);
        let mut segs: Vec<(u64, u64)> = self.segments.iter().map(|(a, s)| (*a, *s)).collect();
        segs.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        segs.truncate(top);
        let mut per: FastMap<u64, (u64, Vec<StackBytes>)> =
            segs.iter().map(|(a, _)| (*a, (0, Vec::new()))).collect();
        for ((seg, stack), (bytes, n)) in &self.by_seg_stack {
            if *bytes == 0 {
                continue;
            }
            if let Some(e) = per.get_mut(seg) {
                e.0 += bytes;
                e.1.push((*stack, *bytes, *n));
            }
        }
        let segments = segs
            .into_iter()
            .map(|(a, s)| {
                let (live, mut holders) = per.remove(&a).unwrap_or_default();
                holders.sort_unstable_by(|x, y| y.1.cmp(&x.1).then(x.0.cmp(&y.0)));
                holders.truncate(top);
                (a, s, live, holders)
            })
            .collect();
        TorchSnap {
            t_ns,
            allocated: self.allocated,
            reserved: self.reserved,
            tensors: self.live.len() as u64,
            by_stack,
            segments,
            segment_count: self.segments.len() as u64,
            failed: None,
        }
    }

    fn add(&mut self, b: Block, sign: bool) {
        let e = self.by_stack.entry(b.stack).or_default();
        let s = self.by_seg_stack.entry((b.segment, b.stack)).or_default();
        if sign {
            e.0 += b.size;
            e.1 += 1;
            s.0 += b.size;
            s.1 += 1;
            self.allocated += b.size;
        } else {
            e.0 = e.0.saturating_sub(b.size);
            e.1 = e.1.saturating_sub(1);
            s.0 = s.0.saturating_sub(b.size);
            s.1 = s.1.saturating_sub(1);
            self.allocated = self.allocated.saturating_sub(b.size);
        }
    }
}

/// The tensor level of one trace.
#[derive(Default)]
pub(crate) struct TorchState {
    devs: Vec<Dev>,
    codes: FastMap<u32, (String, String)>,
    stacks: FastMap<u32, Vec<PyFrame>>,
    pub events: u64,
}

impl TorchState {
    fn dev(&mut self, device: i32) -> &mut Dev {
        if let Some(i) = self.devs.iter().position(|d| d.device == device) {
            return &mut self.devs[i];
        }
        self.devs.push(Dev {
            device,
            ..Dev::default()
        });
        self.devs.last_mut().expect("just pushed")
    }

    pub fn code(&mut self, id: u32, file: String, function: String) {
        self.codes.insert(id, (file, function));
    }

    pub fn stack(&mut self, id: u32, frames: Vec<PyFrame>) {
        self.stacks.insert(id, frames);
    }

    /// Feeds one tensor-level event. For an out-of-memory error, returns the snapshot of the
    /// device at that moment (the failed request in `failed`).
    pub fn op(&mut self, op: &TorchOp, top: usize) -> Option<TorchSnap> {
        self.events += 1;
        let d = self.dev(op.device);
        match op.action {
            act::ALLOC => {
                let segment = if op.segment != 0 {
                    op.segment
                } else {
                    d.segments
                        .range(..=op.addr)
                        .next_back()
                        .filter(|(s, len)| op.addr < s.saturating_add(**len))
                        .map_or(0, |(s, _)| *s)
                };
                let b = Block {
                    size: op.size,
                    segment,
                    stack: op.stack,
                };
                if let Some(old) = d.live.insert(op.addr, b) {
                    d.add(old, false);
                }
                d.add(b, true);
                if d.allocated > d.peak {
                    d.peak = d.allocated;
                    d.peak_t = op.t_ns;
                    d.peak_pending = true;
                }
            }
            act::FREE_COMPLETED => {
                if let Some(b) = d.live.get(&op.addr).copied() {
                    if d.peak_pending {
                        d.peak_snap = Some(d.snap(d.peak_t, top));
                        d.peak_pending = false;
                    }
                    d.live.remove(&op.addr);
                    d.add(b, false);
                }
            }
            act::SEGMENT_ALLOC | act::SEGMENT_MAP
                if d.segments.insert(op.addr, op.size).is_none() =>
            {
                d.reserved += op.size;
            }
            act::SEGMENT_FREE | act::SEGMENT_UNMAP => {
                if let Some(s) = d.segments.remove(&op.addr) {
                    d.reserved = d.reserved.saturating_sub(s);
                }
            }
            act::OOM => {
                let mut s = d.snap(op.t_ns, top);
                s.failed = Some((op.size, op.stack, op.addr));
                return Some(s);
            }
            _ => {}
        }
        None
    }

    /// Ends the pass: peaks still pending are taken now.
    pub fn finish(&mut self, top: usize) {
        for d in &mut self.devs {
            if d.peak_pending {
                d.peak_snap = Some(d.snap(d.peak_t, top));
                d.peak_pending = false;
            }
        }
    }

    pub fn peak(&mut self, device: i32) -> Option<TorchSnap> {
        let d = self.devs.iter_mut().find(|d| d.device == device)?;
        d.peak_snap.take()
    }

    /// A frame as `function (path:line)`.
    fn frame_text(&self, f: &PyFrame) -> String {
        match self.codes.get(&f.code) {
            Some((file, func)) => format!("{func} ({file}:{})", f.line),
            None => format!("<code {}> (line {})", f.code, f.line),
        }
    }

    /// The stack's frames, innermost first (at most `max`).
    pub fn frames(&self, stack: u32, max: usize) -> Vec<String> {
        self.stacks
            .get(&stack)
            .map(|fs| fs.iter().take(max).map(|f| self.frame_text(f)).collect())
            .unwrap_or_default()
    }

    /// The stack's name: `function (file.py:line)` of its innermost frame in user code (else
    /// its innermost frame); "(no Python stack)" for stack 0; "(Python stack N, not named)"
    /// when the trace ends before the stack's record.
    pub fn site(&self, stack: u32) -> String {
        if stack == 0 {
            return "(no Python stack)".into();
        }
        let Some(fs) = self.stacks.get(&stack) else {
            return format!("(Python stack {stack}, not named)");
        };
        let codes = &self.codes;
        let named = |f: &'_ PyFrame| codes.get(&f.code).map(|c| (f.line, c));
        let pick = fs
            .iter()
            .filter_map(named)
            .find(|(_, (file, _))| is_user_file(file))
            .or_else(|| fs.iter().find_map(named));
        match pick {
            Some((line, (file, func))) => {
                let base = file.rsplit('/').next().unwrap_or(file);
                format!("{} ({base}:{line})", short_function(func))
            }
            None => format!("(Python stack {stack}, not named)"),
        }
    }

    /// The report's form of a snapshot.
    pub fn view(&self, s: &TorchSnap, t0: u64, max_frames: usize) -> TorchView {
        let holder = |&(stack, bytes, tensors): &(u32, u64, u64)| PyHolder {
            site: self.site(stack),
            stack,
            bytes,
            tensors,
            frames: Vec::new(),
        };
        TorchView {
            t_ns: s.t_ns,
            offset_ns: s.t_ns.saturating_sub(t0),
            allocated: s.allocated,
            reserved: s.reserved,
            cached: s.reserved.saturating_sub(s.allocated),
            tensors: s.tensors,
            segments_total: s.segment_count,
            failed: s.failed.map(|(size, stack, free)| FailedRequest {
                size,
                device_free: free,
                site: self.site(stack),
                frames: self.frames(stack, max_frames),
            }),
            holders: s
                .by_stack
                .iter()
                .map(|h| PyHolder {
                    frames: self.frames(h.0, max_frames),
                    ..holder(h)
                })
                .collect(),
            segments: s
                .segments
                .iter()
                .map(|(addr, size, live, hs)| SegmentView {
                    addr: format!("{addr:#x}"),
                    size: *size,
                    allocated: *live,
                    cached: size.saturating_sub(*live),
                    holders: hs.iter().map(holder).collect(),
                })
                .collect(),
        }
    }
}

/// PyTorch's tensors at one moment (the failure of a post-mortem, or PyTorch's peak of
/// allocated bytes): who held them, by Python location, and the segments they lay in.
#[derive(Clone, Debug, Serialize)]
pub struct TorchView {
    pub t_ns: u64,
    pub offset_ns: u64,
    /// Bytes in live tensor blocks (PyTorch's `memory_allocated`, block sizes).
    pub allocated: u64,
    /// Bytes of PyTorch's segments (its `memory_reserved`).
    pub reserved: u64,
    /// Reserved but free inside the segments (PyTorch's cache).
    pub cached: u64,
    pub tensors: u64,
    pub segments_total: u64,
    /// The request PyTorch could not serve (a post-mortem of its out-of-memory error).
    pub failed: Option<FailedRequest>,
    /// Live bytes by Python stack, largest first.
    pub holders: Vec<PyHolder>,
    /// The largest segments, with what lies in them.
    pub segments: Vec<SegmentView>,
}

#[derive(Clone, Debug, Serialize)]
pub struct FailedRequest {
    pub size: u64,
    pub device_free: u64,
    pub site: String,
    pub frames: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct PyHolder {
    /// `function (file.py:line)`: the innermost frame in user code.
    pub site: String,
    pub stack: u32,
    pub bytes: u64,
    pub tensors: u64,
    /// `function (path:line)`, innermost first (empty inside a segment's list).
    pub frames: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct SegmentView {
    pub addr: String,
    pub size: u64,
    pub allocated: u64,
    /// Free inside the segment (cached by PyTorch).
    pub cached: u64,
    pub holders: Vec<PyHolder>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_files_and_names() {
        assert!(is_user_file("/home/me/train.py"));
        assert!(!is_user_file(
            "/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py"
        ));
        assert!(!is_user_file("/usr/lib/python3.12/threading.py"));
        assert!(!is_user_file("<frozen runpy>"));
        assert_eq!(short_function("make.<locals>.<listcomp>"), "make");
        assert_eq!(short_function("Model.forward"), "Model.forward");
    }

    fn op(action: u8, addr: u64, size: u64, segment: u64, stack: u32) -> TorchOp {
        TorchOp {
            action,
            addr,
            size,
            segment,
            stack,
            ..TorchOp::default()
        }
    }

    /// Blocks of a segment another function created are held by the function that
    /// allocated them; what is free inside the segment is cached, not live; the peak is the
    /// state before the first free after it.
    #[test]
    fn holders_segments_and_peak() {
        let mut t = TorchState::default();
        t.code(1, "/w/job.py".into(), "warmup".into());
        t.code(2, "/w/job.py".into(), "use".into());
        t.code(
            3,
            "/venv/lib/python3.11/site-packages/torch/x.py".into(),
            "inner".into(),
        );
        t.stack(1, vec![PyFrame { code: 1, line: 4 }]);
        t.stack(
            2,
            vec![PyFrame { code: 3, line: 9 }, PyFrame { code: 2, line: 8 }],
        );
        t.op(&op(act::SEGMENT_ALLOC, 0x1000, 4096, 0x1000, 0), 10);
        t.op(&op(act::ALLOC, 0x1000, 1024, 0x1000, 1), 10);
        t.op(&op(act::FREE_COMPLETED, 0x1000, 1024, 0x1000, 0), 10);
        t.op(&op(act::ALLOC, 0x1000, 1024, 0, 2), 10);
        t.op(&op(act::ALLOC, 0x1400, 2048, 0x1000, 2), 10);
        let oom = t
            .op(&op(act::OOM, 1 << 20, 8192, 0, 2), 10)
            .expect("snapshot");
        let v = t.view(&oom, 0, 8);
        assert_eq!(
            (v.allocated, v.reserved, v.cached, v.tensors),
            (3072, 4096, 1024, 2)
        );
        assert_eq!(v.holders.len(), 1);
        assert_eq!(v.holders[0].site, "use (job.py:8)");
        assert_eq!(v.holders[0].bytes, 3072);
        assert_eq!(v.holders[0].frames[1], "use (/w/job.py:8)");
        assert_eq!(v.segments[0].holders[0].site, "use (job.py:8)");
        assert_eq!(v.segments[0].cached, 1024);
        assert_eq!(v.failed.as_ref().unwrap().site, "use (job.py:8)");
        t.op(&op(act::FREE_COMPLETED, 0x1400, 2048, 0x1000, 0), 10);
        t.finish(10);
        let p = t.peak(0).expect("peak");
        assert_eq!(p.allocated, 3072);
        assert_eq!(t.site(7), "(Python stack 7, not named)");
        assert_eq!(t.site(0), "(no Python stack)");
    }
}
