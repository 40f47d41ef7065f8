//! The arena's two ends told each block's lifetime class (`Stitch::set_ends_class`), read
//! from the whole stream (an oracle), and one checked pass of a stream with them. Shared by
//! `tests/arena_ends.rs` and `examples/pool_ends.rs` (which includes this file by path).

use std::collections::HashMap;
use vramshim_pool::replay::{self, Event};
use vramshim_pool::stitch::{Faults, Stitch};
use vramshim_pool::{AccountingDevice, Policy, Request};

/// Each event's two-ends class (by event index): for an allocation, whether it lives at least
/// `t` ticks (one tick per allocation or free; a block never freed lives long); `None` for
/// frees and synchronizations.
pub fn classes(events: &[Event], t: usize) -> Vec<Option<bool>> {
    let mut out = vec![None; events.len()];
    let mut open: HashMap<u64, (usize, usize)> = HashMap::new();
    let mut tick = 0usize;
    for (i, ev) in events.iter().enumerate() {
        match *ev {
            Event::Alloc { id, .. } => {
                out[i] = Some(true);
                open.insert(id, (i, tick));
                tick += 1;
            }
            Event::Free { id, .. } => {
                if let Some((j, born)) = open.remove(&id) {
                    out[j] = Some(tick - born >= t);
                }
                tick += 1;
            }
            Event::ProcessSync | Event::StreamRetired { .. } => {}
        }
    }
    out
}

/// What one pass did: driver calls, those of the second half of the allocations, peak bytes
/// reserved, and the checking device's violations and leaks.
pub struct Pass {
    pub calls: u64,
    pub second_half: u64,
    pub allocs: usize,
    pub peak_reserved: u64,
    pub violations: Vec<String>,
    pub leaks: Vec<String>,
}

/// One pass of `events` through `pool` on a checking device of `cap` bytes, each allocation
/// told its class from `class` (none: the arena's own choice); every block still live at
/// the end freed and the pool trimmed. Panics if an allocation fails.
pub fn pass(
    events: &[Event],
    class: Option<&[Option<bool>]>,
    mut pool: Stitch,
    faults: Faults,
    cap: u64,
) -> Pass {
    let mut dev = AccountingDevice::new(cap);
    dev.set_checking(true);
    pool.set_faults(faults);
    let allocs = events
        .iter()
        .filter(|e| matches!(e, Event::Alloc { .. }))
        .count();
    let mut ids: HashMap<u64, (u64, u64)> = HashMap::new();
    let (mut n, mut before) = (0usize, 0u64);
    for (i, ev) in events.iter().enumerate() {
        match *ev {
            Event::Alloc { id, size, stream } => {
                n += 1;
                if n == allocs / 2 + 1 {
                    before = dev.calls().driver_calls();
                }
                pool.set_ends_class(class.and_then(|c| c[i]));
                let a = pool
                    .alloc(&mut dev, Request { size, stream })
                    .unwrap_or_else(|e| panic!("allocation {n} ({size} bytes): {e:?}"));
                dev.check_alloc(a.addr, a.size, stream);
                ids.insert(id, (a.addr, stream));
            }
            Event::Free { id, mode } => {
                if let Some((a, _)) = ids.remove(&id) {
                    dev.check_free(a, mode);
                    let _ = pool.free(&mut dev, a, mode);
                }
            }
            Event::ProcessSync => replay::process_sync(&mut pool, &mut dev),
            Event::StreamRetired { stream } => replay::retire_stream(&mut pool, &mut dev, stream),
        }
    }
    let (calls, peak_reserved) = (dev.calls().driver_calls(), pool.stats().peak_reserved);
    for (_, (a, _)) in ids.drain() {
        let mode = vramshim_pool::FreeMode::Sync;
        dev.check_free(a, mode);
        let _ = pool.free(&mut dev, a, mode);
    }
    let _ = pool.trim(&mut dev);
    Pass {
        calls,
        second_half: calls - before,
        allocs,
        peak_reserved,
        violations: dev.violations().to_vec(),
        leaks: dev.leaks(),
    }
}
