//! `analyze`'s fast path for `.vramtrace` files whose timed events are already in time order
//! (one writing thread, or threads that never overlapped): the events go from the decoder
//! straight into the analysis, a frame at a time, with no reorder window.
//!
//! The result is exactly what the windowed path (`formats::vramtrace`) gives. With sorted input
//! the window releases the timed events in file order, so only the *numbering* differs: the
//! window releases a batch's untimed records (Module, Stack, Device) ahead of the timed events
//! it still holds, and event numbers (`peak_index`, the post-mortems' `event_index` /
//! `alloc_index`, which `whatif` cuts the stream at) count those. Timed event number `o` (0-based
//! among timed events), decoded in batch `b`, is released by the first batch `k >= b` whose
//! limit (its newest time minus the window) reaches its time, or by the last batch; its number
//! in the windowed stream is `o` plus the untimed records of batches `0..=k`. This pass records
//! each batch's limit and untimed count and renumbers the few stored numbers at the end.
//!
//! It gives up (the caller runs the windowed path) when the file turns out not to be in time
//! order, when the window's memory bound could have forced an early release, or when a
//! `Device` record arrives after a post-mortem read a device's size (its position would then
//! matter).

use std::path::Path;

use vramshim_trace::{DecodeErrorKind, Event, MemOp, TraceReader, Visitor};

use super::Analysis;
use crate::error::InputError;
use crate::formats::vramtrace::{BATCH, MAX_HELD, WINDOW_NS};
use crate::progress::Progress;

/// One closed batch of the emulated window.
#[derive(Clone, Copy)]
struct Batch {
    /// Events up to this time are released at the end of the batch.
    limit: u64,
    /// Newest time seen by the end of the batch.
    max_t: u64,
    /// Untimed records and timed events decoded through this batch.
    untimed: u64,
    timed: u64,
}

struct Fast<'a> {
    a: &'a mut Analysis,
    /// Events delivered (timed and untimed): batch boundaries.
    n: u64,
    untimed: u64,
    /// Newest time so far (the file is in order while no event is older).
    max_t: u64,
    unsorted: bool,
    device_late: bool,
    batches: Vec<Batch>,
}

impl Fast<'_> {
    #[inline(always)]
    fn tick(&mut self) {
        self.n += 1;
        if self.n.is_multiple_of(BATCH as u64) {
            self.close();
        }
    }

    #[cold]
    fn close(&mut self) {
        self.batches.push(Batch {
            limit: self.max_t.saturating_sub(WINDOW_NS),
            max_t: self.max_t,
            untimed: self.untimed,
            timed: self.a.index,
        });
        self.a.batch = self.batches.len() as u64;
    }

    #[inline(always)]
    fn timed(&mut self, t: u64) {
        if t < self.max_t {
            self.unsorted = true;
        }
        self.max_t = t;
    }

    /// The windowed path's number of timed event `o` (time `t`, decoded in batch `b`).
    fn renumber(&self, o: u64, t: u64, b: u64) -> u64 {
        let from = (b as usize).min(self.batches.len());
        let rest = &self.batches[from..];
        let k = rest.partition_point(|x| x.limit < t);
        o + rest.get(k).map_or(self.untimed, |x| x.untimed)
    }

    /// Whether the window could have held more than `MAX_HELD` events after a batch (it then
    /// releases the oldest regardless of time, which this pass does not model).
    fn could_overflow(&self) -> bool {
        self.batches.iter().any(|k| {
            // Every event of a batch whose newest time is within the limit was released.
            let m = self.batches.partition_point(|x| x.max_t <= k.limit);
            let released = if m == 0 { 0 } else { self.batches[m - 1].timed };
            k.timed - released > MAX_HELD as u64
        })
    }
}

impl Visitor for Fast<'_> {
    #[inline(always)]
    fn memop(&mut self, alloc: bool, m: &MemOp) {
        self.timed(m.t_ns);
        let a = &mut *self.a;
        // `Analysis::clock` without its order check: while the file is in order (else this
        // pass is dropped) its newest time is `max_t`, written back at the end.
        if a.first_t.is_none() {
            a.first_t = Some(m.t_ns);
        }
        a.thread(m.tid);
        if alloc {
            a.alloc(m);
        } else {
            a.free(m);
        }
        a.index += 1;
        self.tick();
    }

    fn event(&mut self, ev: Event) {
        match ev.t_ns() {
            Some(t) => {
                self.timed(t);
                self.a.other(ev);
                self.a.index += 1;
            }
            None => {
                if matches!(ev, Event::Device(_))
                    && self.a.devices.iter().any(|d| d.ooms > 0 || d.refusals > 0)
                {
                    self.device_late = true;
                }
                self.untimed += 1;
                self.a.other(ev);
            }
        }
        self.tick();
    }
}

/// Runs the in-order pass over `path`: (warnings, torn, cut off). `Ok(None)`: the file needs
/// the windowed path.
pub(super) fn analyze(
    path: &Path,
    a: &mut Analysis,
    progress: &mut Progress,
    show_progress: bool,
) -> Result<Option<(Vec<String>, bool, bool)>, InputError> {
    let err = |e: &vramshim_trace::DecodeError| InputError::new(path, None, e.to_string());
    let mut reader = TraceReader::open(path).map_err(|e| match &e.kind {
        DecodeErrorKind::Io(std::io::ErrorKind::NotFound, _) => {
            InputError::new(path, None, "no such file")
        }
        _ => err(&e),
    })?;
    let mut f = Fast {
        a,
        n: 0,
        untimed: 0,
        max_t: 0,
        unsorted: false,
        device_late: false,
        batches: Vec::new(),
    };
    let mut warnings = Vec::new();
    // A skipped corrupt frame or a torn last one: the output is made, then exit 3.
    let mut torn = false;
    loop {
        match reader.visit_frame(&mut f) {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) if e.is_recoverable() => {
                warnings.push(format!("{}: {e}", path.display()));
                torn = true;
            }
            Err(e) => return Err(err(&e)),
        }
        if f.unsorted || f.device_late {
            return Ok(None);
        }
        if show_progress {
            progress.update(reader.position());
        }
    }
    if f.unsorted || f.device_late || f.could_overflow() {
        return Ok(None);
    }
    let cut_off = reader.truncation().is_some();
    if let Some(t) = reader.truncation() {
        warnings.push(format!("{}: {t}", path.display()));
        torn |= t.is_damage();
    }
    let mut devices = std::mem::take(&mut f.a.devices);
    for d in &mut devices {
        if d.peak > 0 {
            d.peak_index = f.renumber(d.peak_index, d.peak_t, d.peak_batch);
        }
        for p in &mut d.post_mortems {
            p.pm.event_index = f.renumber(p.pm.event_index, p.pm.t_ns, p.batch);
            if let Some(i) = p.pm.alloc_index {
                p.pm.alloc_index = Some(f.renumber(i, p.alloc_at.0, p.alloc_at.1));
            }
        }
    }
    f.a.devices = devices;
    f.a.index += f.untimed;
    f.a.last_t = f.a.last_t.max(f.max_t);
    Ok(Some((warnings, torn, cut_off)))
}
