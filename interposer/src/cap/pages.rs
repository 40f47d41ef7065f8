//! The pool's pages under the cap (`VRAMSHIM_POOL=stitch`).
//!
//! The pool holds device memory in whole pages of its own (`cuMemCreate` handles), cached or
//! live, whatever its requests' sizes: those pages are what the device holds for it. So the
//! pool's pages are charged where the pool creates them and given back where it releases
//! them (`pool::cuda_device`), and the requests it serves are charged nothing more. A page
//! the cap refuses makes the pool dissolve its cached blocks and try again, as a device
//! refusal does; when it still cannot place the request, the request is refused with the
//! out-of-memory code and [`take_pool_refusal`] tells the dispatcher it was the cap.
//!
//! The charge is the same as any allocation's (the process's counter, or its slot in the
//! shared region), so the context's charge, allocations the pool did not serve and other
//! members of a group all count against the pool's pages and the other way round.

use std::cell::Cell;

use vramshim_trace::Api;

use super::{Cap, Fault, Refusal, device_index, global};

thread_local! {
    /// The cap refused a page of the pool request this thread is serving.
    static PAGE_REFUSAL: Cell<Option<Refusal>> = const { Cell::new(None) };
}

impl Cap {
    /// Whether the pool's pages are charged (and pooled requests charged nothing). False only
    /// under `VRAMSHIM_CAP_FAULT=pool-live-bytes`: requests are charged their live bytes and
    /// the pages are bounded by the process's own capped total alone.
    /// Bytes the cap still lets this process take on `device`, as a memory query would say
    /// (None: uncapped there): the group's room bounded by a member's own (its own cap less
    /// its own bytes, not less the group's).
    pub(crate) fn pool_headroom(&self, device: i32) -> Option<u64> {
        let total = self.capped_total(device, 0)?;
        Some(self.cap_view(device, total).1)
    }

    pub(crate) fn charges_pool_pages(&self) -> bool {
        self.settings.fault != Fault::PoolLiveBytes
    }

    /// Reserves one page of `bytes` the pool is about to create on `device` (`stream`: the
    /// request's driver stream, for the capture check before the driver's pools are emptied).
    /// Says nothing when refused: the pool may still place the request by dissolving cached
    /// blocks.
    pub(crate) fn charge_page(&self, device: i32, bytes: u64, stream: u64) -> Result<(), Refusal> {
        if !self.ready() {
            return Ok(());
        }
        let Some(d) = device_index(device) else {
            return Ok(());
        };
        self.reserve_checked(d, bytes, stream, false)
    }

    /// A pool request of `bytes` through `api` was refused because the cap refused the pages
    /// it needed (`r`): say so as for any refusal (the first one prints its line).
    pub(crate) fn pool_refused(&self, device: i32, bytes: u64, r: Refusal, api: Api) {
        if let Some(d) = device_index(device) {
            let _ = self.refused(d, bytes, r.in_use, r.cap, api);
        }
    }
}

/// Whether the pool charges its pages to the cap (no cap: nothing to charge).
pub(crate) fn charges_pool_pages() -> bool {
    global().is_some_and(Cap::charges_pool_pages)
}

/// Charges a page of `bytes` the pool is about to create on `device`; false: refused (the
/// refusal is kept for [`take_pool_refusal`]).
pub(crate) fn charge_pool_page(device: i32, bytes: u64, stream: u64) -> bool {
    let Some(c) = global() else {
        return true;
    };
    match c.charge_page(device, bytes, stream) {
        Ok(()) => true,
        Err(r) => {
            PAGE_REFUSAL.with(|p| p.set(Some(r)));
            false
        }
    }
}

/// Bytes the cap still lets the process take on `device` (None: no cap binds it there): the
/// pool's `Device::room`, so that near the cap it takes the tightest layout.
pub(crate) fn pool_headroom(device: i32) -> Option<u64> {
    global()?.pool_headroom(device)
}

/// Gives back a page the pool released (or failed to create after its charge).
pub(crate) fn uncharge_pool_page(device: i32, bytes: u64) {
    if let Some(c) = global() {
        c.uncharge(device, bytes);
    }
}

/// A new pool request begins on this thread: forget an earlier request's refused page.
#[inline]
pub(crate) fn clear_pool_refusal() {
    PAGE_REFUSAL.with(|p| p.set(None));
}

/// The pool refused the request of `bytes` through `api` on `device`: `Some` when a page of
/// it was refused by the cap (the refusal is then reported as the cap's).
pub(crate) fn take_pool_refusal(device: i32, bytes: u64, api: Api) -> Option<Refusal> {
    let r = PAGE_REFUSAL.with(|p| p.take())?;
    if let Some(c) = global() {
        c.pool_refused(device, bytes, r, api);
    }
    Some(r)
}
