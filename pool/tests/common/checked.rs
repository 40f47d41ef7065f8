//! A replay of an event stream through a stitch pool on a checking device, the caller saying
//! how each allocation is served (told its lifetime class, the interposer's fast path first,
//! ...): frees and process syncs go to the pool and the device as the interposer sends them.

use std::collections::HashMap;

use vramshim_pool::replay::{self, Event};
use vramshim_pool::stitch::Stitch;
use vramshim_pool::{AccountingDevice, Policy, Request};

/// Replays `events` through `p` on `dev`: `alloc(p, dev, i, request)` serves the allocation at
/// event `i` and returns the block's address and the size the device checks it with, or the
/// error that ends the replay; the device checks every block handed out and freed; `after`
/// runs after each event.
pub fn replay_checked<E>(
    events: &[Event],
    p: &mut Stitch,
    dev: &mut AccountingDevice,
    mut alloc: impl FnMut(&mut Stitch, &mut AccountingDevice, usize, Request) -> Result<(u64, u64), E>,
    mut after: impl FnMut(&AccountingDevice),
) -> Result<(), E> {
    let mut ids: HashMap<u64, u64> = HashMap::new();
    for (i, ev) in events.iter().enumerate() {
        match *ev {
            Event::Alloc { id, size, stream } => {
                let (addr, checked) = alloc(p, dev, i, Request { size, stream })?;
                dev.check_alloc(addr, checked, stream);
                ids.insert(id, addr);
            }
            Event::Free { id, mode } => {
                if let Some(a) = ids.remove(&id) {
                    dev.check_free(a, mode);
                    p.free(dev, a, mode).unwrap();
                }
            }
            Event::ProcessSync => replay::process_sync(p, dev),
            Event::StreamRetired { stream } => replay::retire_stream(p, dev, stream),
        }
        after(dev);
    }
    Ok(())
}
