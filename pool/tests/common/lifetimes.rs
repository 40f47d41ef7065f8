//! Each allocation's lifetime class, read from the whole stream (an oracle: it knows when each
//! block dies): 1 for an allocation freed before the stream's peak of live bytes, else 0, as
//! `Stitch::set_lifetime_class` takes it. Shared by `tests/lifetime_limit.rs` and
//! `examples/pool_lifetimes.rs` (which includes this file by path).

use std::collections::HashMap;
use vramshim_pool::replay::Event;

/// The class of each event's allocation (by event index; 0 for frees and syncs), and the
/// stream's peak of live bytes.
pub fn classes(events: &[Event]) -> (Vec<u8>, u64) {
    let (mut live, mut peak, mut at) = (0u64, 0u64, 0usize);
    let mut open: HashMap<u64, (usize, u64)> = HashMap::new();
    let mut death = vec![usize::MAX; events.len()];
    for (i, ev) in events.iter().enumerate() {
        match *ev {
            Event::Alloc { id, size, .. } => {
                if let Some((j, s)) = open.insert(id, (i, size)) {
                    death[j] = i;
                    live -= s;
                }
                live += size;
                if live > peak {
                    (peak, at) = (live, i);
                }
            }
            Event::Free { id, .. } => {
                if let Some((j, s)) = open.remove(&id) {
                    death[j] = i;
                    live -= s;
                }
            }
            Event::ProcessSync | Event::StreamRetired { .. } => {}
        }
    }
    (death.iter().map(|&d| u8::from(d < at)).collect(), peak)
}
