//! A group member's own cap. With `VRAMSHIM_SHARED` the group's budget is the region's cap
//! (set by the process that created the region). A member with a cap of its own that differs
//! (its `VRAMSHIM_CAP`, or another tool's limit) keeps it as well: the region's cap bounds the
//! group's total and the member's own cap bounds the member's bytes, so whichever is stricter
//! binds. A user who gives a job 2 GiB and adds it to a group of 8 GiB expects neither to be
//! passed; replacing the smaller by the larger would lift a limit the user set.
//!
//! The member's bytes are counted in the process's private counter (which a member of a group
//! does not use otherwise), reserved before the group's total and given back with it, so the
//! two stay in step: every charge of the group's total made by this process is in it.

use std::sync::atomic::Ordering::Relaxed;

use vramshim_region::{CapSpec, CapValue, Check, MAX_BYTES};

use super::{Cap, Refusal, UNRESOLVED};

impl Cap {
    /// What set the process's own cap, as messages name it: its `VRAMSHIM_CAP`, else the
    /// other tools' variables that gave it one (None: it has no cap of its own).
    pub(super) fn own_cap_source(&self) -> Option<String> {
        if let Some(t) = &self.settings.cap_text {
            return Some(format!("VRAMSHIM_CAP=\"{}\"", t.escape_debug()));
        }
        let mut o: Vec<&str> = Vec::new();
        for x in self.settings.origin.iter().flatten() {
            if !o.contains(&x.as_str()) {
                o.push(x);
            }
        }
        (!o.is_empty()).then(|| o.join(", "))
    }

    /// At set-up in the group `name`, whose region has the caps `group` (written as
    /// `group_text`): keeps the process's own caps where they differ, with one line.
    pub(super) fn keep_member_cap(&self, name: &str, group: &CapSpec, group_text: &str) {
        let own = &self.settings.spec;
        if own.devices.iter().all(Option::is_none) || own == group {
            return;
        }
        let Some(source) = self.own_cap_source() else {
            return;
        };
        let _ = self.member.set(own.clone());
        (self.log)(&format!(
            "vramshim: {source} differs from the cap of the shared region VRAMSHIM_SHARED=\"{}\" (\"{}\", set by the process that created it); both apply and the stricter binds: the region's cap bounds the group's total, {source} this process's own bytes",
            name.escape_debug(),
            group_text.escape_debug()
        ));
    }

    /// The member's own cap on device `d` in bytes where it is stricter than the group's
    /// (`MAX_BYTES`: none, not stricter, or a share of a total not known yet).
    #[inline]
    pub(super) fn member_cap(&self, d: usize) -> u64 {
        if self.member.get().is_none() {
            return MAX_BYTES;
        }
        match self.member_resolved[d].load(Relaxed) {
            UNRESOLVED => self.resolve_member(d),
            v => v,
        }
    }

    #[cold]
    fn resolve_member(&self, d: usize) -> u64 {
        let Some(own) = self.member.get() else {
            return MAX_BYTES;
        };
        let v = match own.devices[d] {
            None => MAX_BYTES,
            Some(CapValue::Bytes(b)) => b.min(MAX_BYTES),
            Some(c @ CapValue::Fraction(_)) => match (self.queries().total)(d as i32) {
                Some(t) if t > 0 => c.resolve(t).min(MAX_BYTES),
                // Asked again on the next charge; the group's cap bounds it meanwhile.
                _ => return MAX_BYTES,
            },
        };
        // Only a stricter own cap is one of its own: a larger one could never refuse before
        // the group's, and refusals then name the group's.
        let v = if v < self.cap_bytes(d) { v } else { MAX_BYTES };
        self.member_resolved[d].store(v, Relaxed);
        v
    }

    /// Reserves `want` bytes of the member's own on device `d`, before the group's total:
    /// Err (what it holds, its cap) when its own cap has no room.
    #[inline]
    pub(super) fn member_reserve(&self, d: usize, want: u64) -> Result<(), Refusal> {
        if self.member.get().is_none() {
            return Ok(());
        }
        let cap = self.member_cap(d);
        let r = match self.check() {
            Check::Atomic => vramshim_region::reserve(&self.private_used[d], want, cap),
            Check::Racy => vramshim_region::reserve_racy(&self.private_used[d], want, cap),
        };
        r.map(|_| ()).map_err(|in_use| Refusal { in_use, cap })
    }

    /// Gives back what [`Cap::member_reserve`] reserved.
    #[inline]
    pub(super) fn member_release(&self, d: usize, bytes: u64) {
        if self.member.get().is_some() {
            vramshim_region::release(&self.private_used[d], bytes);
        }
    }

    /// A memory query's `(total, free)` under the group's cap, bounded by the member's own:
    /// total at most its cap, free at most what its cap leaves it.
    pub(super) fn member_view(&self, d: usize, total: u64, free: u64) -> (u64, u64) {
        let cap = self.member_cap(d);
        if cap >= MAX_BYTES {
            return (total, free);
        }
        let own = vramshim_region::total_bytes(&self.private_used[d])
            .saturating_add(self.ctx_pending[d].load(Relaxed));
        (total.min(cap), free.min(cap.saturating_sub(own)))
    }

    /// Whether a refusal on `d` under `cap` came from the member's own cap.
    pub(super) fn member_binds(&self, d: usize, cap: u64) -> bool {
        let m = self.member_cap(d);
        m < MAX_BYTES && m == cap
    }
}
