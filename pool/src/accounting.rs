//! An accounting device: no memory, deterministic. It counts pages, mappings and calls by
//! kind, enforces a device capacity and an optional cap, models events and synchronization
//! (an event completes at the next device synchronization, or when the process waited for its
//! stream: [`AccountingDevice::stream_sync`]), injects faults, and (when
//! checking is on) verifies what a policy hands out:
//! - two live blocks never share a PHYSICAL byte (handle, offset), whatever their addresses;
//! - every live byte is backed (mapped or malloc'd) and every pointer is 512-B aligned;
//! - a block freed with `FreeMode::Sync` is handed out again only after a synchronization;
//!   one freed with `FreeMode::Async { stream: s }` only on `s`, after a synchronization,
//!   after an event recorded on `s` after the free was seen complete, or on a stream that
//!   waited on such an event;
//! - nothing is unmapped or released while a stream may still use it, nothing is released
//!   while mapped, no range is mapped twice;
//! - a handle (a run of pages) is mapped whole, unmapped whole and released whole, as CUDA
//!   requires.
//!
//! The harness (e.g. [`crate::replay`]) reports each allocation and free with
//! [`AccountingDevice::check_alloc`] / [`AccountingDevice::check_free`].

use crate::device::{CallCounts, Device, DeviceError, EventId, Handle, Stream};
use crate::{ALIGN, FreeMode};
use std::collections::{BTreeMap, HashMap};

/// Which call a fault applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CallKind {
    Reserve,
    Create,
    Map,
    SetAccess,
    Malloc,
}

#[derive(Clone, Copy, Debug)]
struct FreeRec {
    seq: u64,
    /// `None`: freed with `FreeMode::Sync`.
    stream: Option<Stream>,
}

const MALLOC_PHYS: u64 = 1 << 62;
/// Ids of retired streams (see [`AccountingDevice::retire_stream`]): this mark and a count,
/// never a stream handle.
const RETIRED_STREAMS: Stream = 0xdead << 48;
/// Physical page ids of handles: `handle << PHYS_IDX_BITS | page index in the handle`.
const PHYS_IDX_BITS: u32 = 24;

fn phys(h: Handle, idx: u64) -> u64 {
    (h << PHYS_IDX_BITS) | idx
}

/// (physical page id, start, end)
type Piece = (u64, u64, u64);

/// See the module documentation.
pub struct AccountingDevice {
    gran: u64,
    capacity_pages: u64,
    cap_pages: Option<u64>,
    used_pages: u64,
    peak_used_pages: u64,
    calls: CallCounts,
    capturing: bool,
    next_va: u64,
    reservations: BTreeMap<u64, u64>,
    next_handle: Handle,
    /// handle -> (its pages, how many times it is mapped)
    handles: HashMap<Handle, (u64, u32)>,
    /// va page index -> (handle, page index in the handle)
    mapped: HashMap<u64, (Handle, u64)>,
    // plain face
    next_malloc_va: u64,
    /// large allocations and small pages: start -> len
    malloc_regions: BTreeMap<u64, u64>,
    /// small pages: page va -> free ranges (start -> end, absolute)
    small_pages: BTreeMap<u64, BTreeMap<u64, u64>>,
    /// live mallocs: ptr -> (rounded size, small)
    mallocs: HashMap<u64, (u64, bool)>,
    // ordering
    seq: u64,
    last_sync_seq: u64,
    next_event: EventId,
    events: HashMap<EventId, (Stream, u64)>,
    completed: HashMap<Stream, u64>,
    /// per stream: the sequence number of the process's last wait for it (`stream_sync`)
    stream_done: HashMap<Stream, u64>,
    waited: HashMap<(Stream, Stream), u64>,
    /// (kind, calls left before the failing one, error)
    faults: Vec<(CallKind, u64, DeviceError)>,
    fault_counts: HashMap<CallKind, u64>,
    // checking
    checking: bool,
    violations: Vec<String>,
    live: BTreeMap<u64, (u64, Vec<Piece>)>,
    phys_live: HashMap<u64, BTreeMap<u64, (u64, u64)>>,
    phys_freed: HashMap<u64, BTreeMap<u64, (u64, FreeRec)>>,
    /// freed address ranges (a stream may still access them through this address)
    va_freed: BTreeMap<u64, (u64, FreeRec)>,
    /// per physical page: the sequence number of the last free of bytes in it (kept when
    /// the bytes are handed out again; see `releasable_pages`)
    last_free: HashMap<u64, u64>,
    /// streams retired so far
    retired: u64,
}

impl AccountingDevice {
    /// A device of `capacity` bytes (rounded down to whole pages) with 2 MiB granularity.
    pub fn new(capacity: u64) -> Self {
        Self::with_granularity(capacity, 2 << 20)
    }

    pub fn with_granularity(capacity: u64, gran: u64) -> Self {
        assert!(gran >= ALIGN && gran.is_power_of_two());
        AccountingDevice {
            gran,
            capacity_pages: capacity / gran,
            cap_pages: None,
            used_pages: 0,
            peak_used_pages: 0,
            calls: CallCounts::default(),
            capturing: false,
            next_va: 0x7f00_0000_0000,
            reservations: BTreeMap::new(),
            next_handle: 1,
            handles: HashMap::new(),
            mapped: HashMap::new(),
            next_malloc_va: 0x2000_0000_0000,
            malloc_regions: BTreeMap::new(),
            small_pages: BTreeMap::new(),
            mallocs: HashMap::new(),
            seq: 1,
            last_sync_seq: 0,
            next_event: 1,
            events: HashMap::new(),
            completed: HashMap::new(),
            stream_done: HashMap::new(),
            waited: HashMap::new(),
            faults: Vec::new(),
            fault_counts: HashMap::new(),
            checking: false,
            violations: Vec::new(),
            live: BTreeMap::new(),
            phys_live: HashMap::new(),
            phys_freed: HashMap::new(),
            va_freed: BTreeMap::new(),
            last_free: HashMap::new(),
            retired: 0,
        }
    }

    /// Also refuse growth beyond `cap` bytes (rounded down to pages) with `CapExceeded`.
    pub fn set_cap(&mut self, cap: Option<u64>) {
        self.cap_pages = cap.map(|c| c / self.gran);
    }

    /// Turn the checker on (before the first call).
    pub fn set_checking(&mut self, on: bool) {
        self.checking = on;
    }

    /// Pretend a stream capture is (or is no longer) in progress.
    pub fn set_capturing(&mut self, on: bool) {
        self.capturing = on;
    }

    /// The `nth` (1-based, counted from now) call of `kind` fails with `err`.
    pub fn fail_nth(&mut self, kind: CallKind, nth: u64, err: DeviceError) {
        self.faults.push((kind, nth, err));
    }

    /// The process synchronized the device itself (e.g. `cudaDeviceSynchronize`).
    pub fn process_sync(&mut self) {
        self.sync_point();
    }

    /// The process waited for `stream` alone (`cudaStreamSynchronize`, a synchronous copy on
    /// it): everything enqueued on it so far is done, so every event recorded on it so far is
    /// complete when queried, and its frees so far are past. Not a device synchronization:
    /// a policy is told of none, and other streams may still be behind.
    pub fn stream_sync(&mut self, stream: Stream) {
        self.seq += 1;
        let c = self.completed.entry(stream).or_insert(0);
        *c = (*c).max(self.seq);
        let d = self.stream_done.entry(stream).or_insert(0);
        *d = (*d).max(self.seq);
        self.seq += 1;
    }

    /// The process destroyed `stream` (after the policy was told: `Policy::retire_stream`):
    /// its handle value may name a new stream from now on, which is not ordered after
    /// anything the old one was given. Everything this device knows of the old stream (its
    /// frees, events, completions and waits) moves to an id of its own, so that the checks see
    /// a request on the new stream as on another stream.
    pub fn retire_stream(&mut self, stream: Stream) {
        self.retired += 1;
        let r = RETIRED_STREAMS | self.retired;
        let re = |s: &mut Stream| {
            if *s == stream {
                *s = r;
            }
        };
        for (s, _) in self.events.values_mut() {
            re(s);
        }
        for m in [&mut self.completed, &mut self.stream_done] {
            if let Some(v) = m.remove(&stream) {
                m.insert(r, v);
            }
        }
        self.waited = std::mem::take(&mut self.waited)
            .into_iter()
            .map(|((mut a, mut b), v)| {
                re(&mut a);
                re(&mut b);
                ((a, b), v)
            })
            .collect();
        let recs = self
            .phys_freed
            .values_mut()
            .flat_map(|m| m.values_mut())
            .chain(self.va_freed.values_mut());
        for (_, rec) in recs {
            if let Some(s) = &mut rec.stream {
                re(s);
            }
        }
    }

    pub fn calls(&self) -> CallCounts {
        self.calls
    }
    /// Bytes in use on the device (whole pages).
    pub fn used(&self) -> u64 {
        self.used_pages * self.gran
    }
    pub fn peak_used(&self) -> u64 {
        self.peak_used_pages * self.gran
    }
    pub fn capacity(&self) -> u64 {
        self.capacity_pages * self.gran
    }
    pub fn handles(&self) -> usize {
        self.handles.len()
    }
    /// Whether the page holding address `va` is mapped.
    pub fn is_mapped(&self, va: u64) -> bool {
        self.mapped.contains_key(&(va / self.gran))
    }
    /// Mapped pages.
    pub fn mapped_pages(&self) -> usize {
        self.mapped.len()
    }
    pub fn reservations(&self) -> usize {
        self.reservations.len()
    }
    pub fn mallocs(&self) -> usize {
        self.mallocs.len()
    }
    pub fn live_events(&self) -> usize {
        self.events.len()
    }
    /// Everything the checker found wrong so far.
    pub fn violations(&self) -> &[String] {
        &self.violations
    }

    /// What is still held: handles, mapped pages, reservations, mallocs, events.
    pub fn leaks(&self) -> Vec<String> {
        let mut v = Vec::new();
        if !self.handles.is_empty() {
            v.push(format!(
                "{} physical handles not released",
                self.handles.len()
            ));
        }
        if !self.mapped.is_empty() {
            v.push(format!("{} pages still mapped", self.mapped.len()));
        }
        if !self.reservations.is_empty() {
            v.push(format!(
                "{} address reservations not freed",
                self.reservations.len()
            ));
        }
        if !self.mallocs.is_empty() {
            v.push(format!("{} mallocs not freed", self.mallocs.len()));
        }
        if !self.events.is_empty() {
            v.push(format!("{} events not destroyed", self.events.len()));
        }
        if self.used_pages != 0 {
            v.push(format!("{} pages still charged", self.used_pages));
        }
        v
    }

    fn violation(&mut self, msg: String) {
        if self.violations.len() < 1000 {
            self.violations.push(msg);
        }
    }

    fn fault(&mut self, kind: CallKind) -> Result<(), DeviceError> {
        if self.faults.is_empty() {
            return Ok(());
        }
        let n = self.fault_counts.entry(kind).or_insert(0);
        *n += 1;
        let n = *n;
        let _ = n;
        let mut hit = None;
        for (i, f) in self.faults.iter_mut().enumerate() {
            if f.0 == kind {
                f.1 -= 1;
                if f.1 == 0 {
                    hit = Some((i, f.2));
                    break;
                }
            }
        }
        if let Some((i, e)) = hit {
            self.faults.remove(i);
            return Err(e);
        }
        Ok(())
    }

    fn charge(&mut self, pages: u64) -> Result<(), DeviceError> {
        if self.used_pages + pages > self.capacity_pages {
            return Err(DeviceError::OutOfMemory);
        }
        if let Some(c) = self.cap_pages
            && self.used_pages + pages > c
        {
            return Err(DeviceError::CapExceeded);
        }
        self.used_pages += pages;
        self.peak_used_pages = self.peak_used_pages.max(self.used_pages);
        Ok(())
    }

    fn sync_point(&mut self) {
        self.seq += 1;
        self.last_sync_seq = self.seq;
        self.seq += 1;
    }

    // ------------------------------------------------------------------ checking

    /// Physical pieces `(phys, start, end)` behind `[addr, addr + size)`, or the first
    /// unbacked address.
    fn translate(&self, addr: u64, size: u64) -> Result<Vec<(u64, u64, u64)>, u64> {
        let g = self.gran;
        let mut out = Vec::new();
        let mut a = addr;
        let end = addr + size;
        while a < end {
            let page = a / g;
            let off = a % g;
            let take = (g - off).min(end - a);
            if let Some(&(h, i)) = self.mapped.get(&page) {
                out.push((phys(h, i), off, off + take));
            } else if let Some((&s, &l)) = self.malloc_regions.range(..=a).next_back()
                && a < s + l
            {
                out.push((MALLOC_PHYS | page, off, off + take));
            } else {
                return Err(a);
            }
            a += take;
        }
        Ok(out)
    }

    fn safe_for(&self, rec: &FreeRec, stream: Stream) -> bool {
        if rec.seq < self.last_sync_seq {
            return true;
        }
        match rec.stream {
            None => false,
            Some(s) => {
                s == stream
                    || self.completed.get(&s).is_some_and(|&c| c > rec.seq)
                    || self.waited.get(&(stream, s)).is_some_and(|&w| w > rec.seq)
            }
        }
    }

    fn host_safe(&self, rec: &FreeRec) -> bool {
        rec.seq < self.last_sync_seq
            || rec
                .stream
                .is_some_and(|s| self.completed.get(&s).is_some_and(|&c| c > rec.seq))
    }

    /// The policy handed out `[addr, addr + size)` for use on `stream`.
    pub fn check_alloc(&mut self, addr: u64, size: u64, stream: Stream) {
        if !self.checking {
            return;
        }
        self.seq += 1;
        if !addr.is_multiple_of(ALIGN) {
            self.violation(format!("pointer {addr:#x} not {ALIGN}-byte aligned"));
        }
        if self.live.contains_key(&addr) {
            self.violation(format!("pointer {addr:#x} handed out twice"));
            return;
        }
        let pieces = match self.translate(addr, size.max(1)) {
            Ok(p) => p,
            Err(a) => {
                self.violation(format!(
                    "block {addr:#x}+{size} not backed at {a:#x} (unmapped)"
                ));
                return;
            }
        };
        for &(ph, s, e) in &pieces {
            if let Some(m) = self.phys_live.get(&ph)
                && let Some((&os, &(oe, other))) = m.range(..e).next_back()
                && oe > s
            {
                let msg = format!(
                    "physical overlap: block {addr:#x}+{size} and live block {other:#x} share bytes {:#x}..{:#x} of physical page {ph:#x}",
                    s.max(os),
                    e.min(oe)
                );
                self.violation(msg);
            }
            let mut bad = None;
            if let Some(m) = self.phys_freed.get(&ph) {
                for (&fs, &(fe, rec)) in m.range(..e) {
                    if fe > s && !self.safe_for(&rec, stream) {
                        bad = Some((fs, fe, rec));
                        break;
                    }
                }
            }
            if let Some((fs, fe, rec)) = bad {
                let how = match rec.stream {
                    None => "cudaFree'd (no synchronization since)".to_string(),
                    Some(s) => {
                        format!("freed on stream {s:#x} (not ordered before stream {stream:#x})")
                    }
                };
                self.violation(format!(
                    "early reuse: block {addr:#x}+{size} on stream {stream:#x} takes bytes {fs:#x}..{fe:#x} of physical page {ph:#x} {how}"
                ));
            }
            if let Some(m) = self.phys_freed.get_mut(&ph) {
                remove_range(m, s, e);
            }
            self.phys_live.entry(ph).or_default().insert(s, (e, addr));
        }
        remove_range(&mut self.va_freed, addr, addr + size.max(1));
        self.live.insert(addr, (size, pieces));
    }

    /// The process freed `addr` (previously reported with `check_alloc`).
    pub fn check_free(&mut self, addr: u64, mode: FreeMode) {
        if !self.checking {
            return;
        }
        self.seq += 1;
        let Some((size, pieces)) = self.live.remove(&addr) else {
            self.violation(format!("free of {addr:#x}, not a live block"));
            return;
        };
        let rec = FreeRec {
            seq: self.seq,
            stream: match mode {
                FreeMode::Sync => None,
                FreeMode::Async { stream } => Some(stream),
            },
        };
        self.seq += 1;
        remove_range(&mut self.va_freed, addr, addr + size.max(1));
        self.va_freed.insert(addr, (addr + size.max(1), rec));
        for (ph, s, e) in pieces {
            if let Some(m) = self.phys_live.get_mut(&ph) {
                m.remove(&s);
                if m.is_empty() {
                    self.phys_live.remove(&ph);
                }
            }
            let f = self.phys_freed.entry(ph).or_default();
            remove_range(f, s, e);
            f.insert(s, (e, rec));
            self.last_free.insert(ph, rec.seq);
        }
    }

    /// The physical handles (each a run of pages, given back whole) a policy could give back
    /// now, if it first dissolved every freed block it keeps, by this device's own record
    /// (checking on), not the policy's: a handle qualifies when each of its pages does:
    /// - no live block has a byte in it;
    /// - none of its freed bytes may still be in use by a stream (freed with no
    ///   synchronization or completed event since) and, with `sync_frees_pin`, none was
    ///   freed with `FreeMode::Sync` (a policy keeps such a block pending until it sees a
    ///   synchronization: the caller says when it cannot have seen one yet);
    /// - no byte of it was freed since the last synchronization;
    ///
    /// and every reservation it is mapped in holds no live block and no such freed bytes, and
    /// no page mapped there had bytes freed since the last synchronization (the whole mapping
    /// must go before the handle can; a page whose freed bytes a stream may still use keeps
    /// every mapping it is in, even where those bytes were handed out again since: coarser
    /// than unmapping needs, which is about the addresses the stream uses, and than the
    /// stitch pool's rule, which keeps only the mapping the freed block was in; a handle this
    /// finds releasable is releasable by the finer rule too, so the budget check holds a pool
    /// to at least this).
    ///
    /// The budget check of the property tests compares this with what a policy holds above
    /// its budget, so that a policy's own opinion of what it could give back is not trusted.
    pub fn releasable_pages(&self, sync_frees_pin: bool) -> Vec<Handle> {
        let g = self.gran;
        let pins = |rec: &FreeRec| !self.host_safe(rec) || (sync_frees_pin && rec.stream.is_none());
        // `ph`: a physical page id
        let fenced = |ph: u64| {
            self.last_free
                .get(&ph)
                .is_some_and(|&seq| seq > self.last_sync_seq)
                || self
                    .phys_freed
                    .get(&ph)
                    .is_some_and(|m| m.values().any(|(_, rec)| !self.host_safe(rec)))
        };
        let page_pinned = |ph: u64| {
            fenced(ph)
                || self.phys_live.get(&ph).is_some_and(|m| !m.is_empty())
                || self
                    .phys_freed
                    .get(&ph)
                    .is_some_and(|m| m.values().any(|(_, rec)| pins(rec)))
        };
        // reservations that cannot go: a live block or a pinning freed range in them, or a
        // mapped page of theirs freed into since the last synchronization
        let res_pinned = |va: u64, len: u64| {
            let end = va + len;
            self.live.range(va..end).next().is_some()
                || self
                    .va_freed
                    .range(..end)
                    .any(|(&s, &(e, rec))| e > va && s < end && pins(&rec))
                || (va / g..end / g).any(|p| {
                    self.mapped
                        .get(&p)
                        .is_some_and(|&(h, i)| fenced(phys(h, i)))
                })
        };
        let mut maps_of: HashMap<Handle, Vec<u64>> = HashMap::new();
        for (&p, &(h, _)) in &self.mapped {
            let va = p * g;
            if let Some((&s, _)) = self.reservations.range(..=va).next_back() {
                let v = maps_of.entry(h).or_default();
                if !v.contains(&s) {
                    v.push(s);
                }
            }
        }
        let mut pinned_res: HashMap<u64, bool> = HashMap::new();
        let mut out: Vec<Handle> = self
            .handles
            .iter()
            .filter(|&(&h, &(k, _))| {
                (0..k).all(|i| !page_pinned(phys(h, i)))
                    && maps_of.get(&h).is_none_or(|rs| {
                        rs.iter().all(|&s| {
                            !*pinned_res
                                .entry(s)
                                .or_insert_with(|| res_pinned(s, self.reservations[&s]))
                        })
                    })
            })
            .map(|(&h, _)| h)
            .collect();
        out.sort_unstable();
        out
    }

    fn check_host_safe_phys(&mut self, ph: u64, what: &str) {
        if !self.checking {
            return;
        }
        let mut bad = None;
        if let Some(m) = self.phys_live.get(&ph)
            && let Some((_, &(_, a))) = m.iter().next()
        {
            bad = Some(format!(
                "{what} of physical page {ph:#x} while live block {a:#x} uses it"
            ));
        }
        if bad.is_none()
            && let Some(m) = self.phys_freed.get(&ph)
        {
            for (&s, &(e, rec)) in m {
                if !self.host_safe(&rec) {
                    bad = Some(format!(
                        "{what} of physical page {ph:#x}: bytes {s:#x}..{e:#x} freed without a synchronization (a stream may still use them)"
                    ));
                    break;
                }
            }
        }
        if let Some(b) = bad {
            self.violation(b);
        }
    }
}

/// Remove `[s, e)` from an interval map, splitting entries.
fn remove_range<T: Copy>(m: &mut BTreeMap<u64, (u64, T)>, s: u64, e: u64) {
    let keys: Vec<u64> = m
        .range(..e)
        .rev()
        .take_while(|(_, (ee, _))| *ee > s)
        .map(|(k, _)| *k)
        .collect();
    // `take_while` on a reverse range can stop early on a non-overlapping entry that is
    // followed (to the left) by overlapping ones only if entries overlap each other, which
    // they never do here.
    for k in keys {
        let (ke, t) = m.remove(&k).unwrap();
        if k < s {
            m.insert(k, (s, t));
        }
        if ke > e {
            m.insert(e, (ke, t));
        }
    }
}

impl Device for AccountingDevice {
    fn granularity(&self) -> u64 {
        self.gran
    }

    fn reserve(&mut self, size: u64) -> Result<u64, DeviceError> {
        self.calls.reserve += 1;
        self.fault(CallKind::Reserve)?;
        if size == 0 || !size.is_multiple_of(self.gran) {
            return Err(DeviceError::Driver(1));
        }
        let va = self.next_va;
        // a guard page between reservations so that an overrun is never "backed"
        self.next_va += size + self.gran;
        self.reservations.insert(va, size);
        Ok(va)
    }

    fn unreserve(&mut self, va: u64, size: u64) -> Result<(), DeviceError> {
        self.calls.unreserve += 1;
        if self.reservations.get(&va) != Some(&size) {
            self.violation(format!("unreserve of {va:#x}+{size}: not a reservation"));
            return Err(DeviceError::Driver(1));
        }
        let g = self.gran;
        if (va / g..(va + size) / g).any(|p| self.mapped.contains_key(&p)) {
            self.violation(format!(
                "unreserve of {va:#x}+{size} while pages are mapped"
            ));
            return Err(DeviceError::Driver(1));
        }
        self.reservations.remove(&va);
        Ok(())
    }

    fn create(&mut self, pages: u64) -> Result<Handle, DeviceError> {
        if pages == 0 || pages >= 1 << PHYS_IDX_BITS {
            return Err(DeviceError::Driver(1));
        }
        // vramshim's cap refuses a new page before the driver is called (the interposer's
        // device does), so such a refusal is no driver call
        if let Some(c) = self.cap_pages
            && self.used_pages + pages > c
            && self.used_pages + pages <= self.capacity_pages
        {
            return Err(DeviceError::CapExceeded);
        }
        self.calls.create += 1;
        self.fault(CallKind::Create)?;
        self.charge(pages)?;
        let h = self.next_handle;
        self.next_handle += 1;
        self.handles.insert(h, (pages, 0));
        Ok(h)
    }

    fn release(&mut self, handle: Handle, pages: u64) -> Result<(), DeviceError> {
        self.calls.release += 1;
        match self.handles.get(&handle) {
            None => {
                self.violation(format!("release of unknown handle {handle}"));
                Err(DeviceError::Driver(1))
            }
            Some(&(_, n)) if n > 0 => {
                self.violation(format!("release of handle {handle} while mapped {n} times"));
                Err(DeviceError::Driver(1))
            }
            Some(&(k, _)) if k != pages => {
                self.violation(format!(
                    "release of handle {handle} as {pages} pages: it has {k}"
                ));
                Err(DeviceError::Driver(1))
            }
            Some(&(k, _)) => {
                for i in 0..k {
                    self.check_host_safe_phys(phys(handle, i), "release");
                    self.phys_freed.remove(&phys(handle, i));
                    self.last_free.remove(&phys(handle, i));
                }
                self.handles.remove(&handle);
                self.used_pages -= k;
                Ok(())
            }
        }
    }

    fn map(&mut self, va: u64, handle: Handle, pages: u64) -> Result<(), DeviceError> {
        self.calls.map += 1;
        self.fault(CallKind::Map)?;
        let g = self.gran;
        if !va.is_multiple_of(g) {
            return Err(DeviceError::Driver(1));
        }
        let Some(&(k, _)) = self.handles.get(&handle) else {
            self.violation(format!("map of unknown handle {handle}"));
            return Err(DeviceError::Driver(1));
        };
        if k != pages {
            self.violation(format!(
                "map of handle {handle} as {pages} pages at {va:#x}: it has {k} (a handle is mapped whole)"
            ));
            return Err(DeviceError::Driver(1));
        }
        let len = k * g;
        let inside = self
            .reservations
            .range(..=va)
            .next_back()
            .is_some_and(|(&s, &l)| va + len <= s + l);
        if !inside {
            self.violation(format!("map at {va:#x}+{len} outside any reservation"));
            return Err(DeviceError::Driver(1));
        }
        if (va / g..va / g + k).any(|p| self.mapped.contains_key(&p)) {
            self.violation(format!("map at {va:#x}+{len}: already mapped"));
            return Err(DeviceError::Driver(1));
        }
        if let Some(e) = self.handles.get_mut(&handle) {
            e.1 += 1;
        }
        for i in 0..k {
            self.mapped.insert(va / g + i, (handle, i));
        }
        Ok(())
    }

    fn unmap(&mut self, va: u64, size: u64) -> Result<(), DeviceError> {
        self.calls.unmap += 1;
        let g = self.gran;
        if !va.is_multiple_of(g) || !size.is_multiple_of(g) {
            return Err(DeviceError::Driver(1));
        }
        if self.checking
            && let Some((&a, &(s, _))) = self.live.range(..va + size).next_back()
            && a + s > va
        {
            self.violation(format!(
                "unmap of {va:#x}+{size} while live block {a:#x}+{s} is in it"
            ));
        }
        if self.checking {
            let mut bad = None;
            for (&s, &(e, rec)) in self.va_freed.range(..va + size) {
                if e > va && !self.host_safe(&rec) {
                    bad = Some(format!(
                        "unmap of {va:#x}+{size}: freed range {s:#x}..{e:#x} may still be in use by a stream (no synchronization or completed event since its free)"
                    ));
                    break;
                }
            }
            if let Some(b) = bad {
                self.violation(b);
            }
            remove_range(&mut self.va_freed, va, va + size);
        }
        let (first, end) = (va / g, (va + size) / g);
        // The mapping last said to be cut (its handle and first page): one call cuts a
        // mapping once, however many of its pages it names.
        let mut cut = None;
        for p in first..end {
            match self.mapped.remove(&p) {
                Some((h, i)) => {
                    let k = self.handles.get(&h).map_or(1, |e| e.0);
                    // a mapping of handle h spans [p - i, p - i + k)
                    if (p - i < first || p - i + k > end)
                        && cut.replace((h, p - i)) != Some((h, p - i))
                    {
                        self.violation(format!(
                            "unmap of {va:#x}+{size} cuts through the mapping of handle {h} ({k} pages at {:#x})",
                            (p - i) * g
                        ));
                    }
                    if i == 0
                        && let Some(e) = self.handles.get_mut(&h)
                    {
                        e.1 -= 1;
                    }
                }
                None => {
                    self.violation(format!("unmap of {:#x}: not mapped", p * g));
                }
            }
        }
        Ok(())
    }

    fn set_access(&mut self, va: u64, size: u64) -> Result<(), DeviceError> {
        self.calls.set_access += 1;
        self.fault(CallKind::SetAccess)?;
        let g = self.gran;
        if (va / g..(va + size).div_ceil(g)).any(|p| !self.mapped.contains_key(&p)) {
            self.violation(format!("set_access on {va:#x}+{size}: not all mapped"));
            return Err(DeviceError::Driver(1));
        }
        Ok(())
    }

    fn malloc(&mut self, size: u64) -> Result<u64, DeviceError> {
        self.calls.malloc += 1;
        self.fault(CallKind::Malloc)?;
        let g = self.gran;
        let size = size.max(1);
        if size < g {
            let sz = size.div_ceil(ALIGN) * ALIGN;
            // first fit in an existing small page
            let mut found = None;
            for (&pv, fr) in &self.small_pages {
                if let Some((&s, &e)) = fr.iter().find(|(s, e)| **e - **s >= sz) {
                    found = Some((pv, s, e));
                    break;
                }
            }
            let (pv, s, e) = match found {
                Some(f) => f,
                None => {
                    self.charge(1)?;
                    let pv = self.next_malloc_va;
                    self.next_malloc_va += 2 * g;
                    self.small_pages.insert(pv, BTreeMap::from([(pv, pv + g)]));
                    self.malloc_regions.insert(pv, g);
                    (pv, pv, pv + g)
                }
            };
            let fr = self.small_pages.get_mut(&pv).unwrap();
            fr.remove(&s);
            if s + sz < e {
                fr.insert(s + sz, e);
            }
            self.mallocs.insert(s, (sz, true));
            Ok(s)
        } else {
            let pages = size.div_ceil(g);
            self.charge(pages)?;
            let va = self.next_malloc_va;
            self.next_malloc_va += (pages + 1) * g;
            self.malloc_regions.insert(va, pages * g);
            self.mallocs.insert(va, (pages * g, false));
            Ok(va)
        }
    }

    fn free(&mut self, ptr: u64) -> Result<(), DeviceError> {
        self.calls.free += 1;
        self.calls.implicit_syncs += 1;
        self.sync_point();
        let Some((sz, small)) = self.mallocs.remove(&ptr) else {
            self.violation(format!("free of {ptr:#x}: not a malloc"));
            return Err(DeviceError::Driver(1));
        };
        let g = self.gran;
        if small {
            let pv = ptr / g * g;
            let fr = self.small_pages.get_mut(&pv).unwrap();
            let (mut s, mut e) = (ptr, ptr + sz);
            if let Some((&ps, &pe)) = fr.range(..s).next_back()
                && pe == s
            {
                fr.remove(&ps);
                s = ps;
            }
            if let Some(&ne) = fr.get(&e) {
                fr.remove(&e);
                e = ne;
            }
            fr.insert(s, e);
            if s == pv && e == pv + g {
                self.small_pages.remove(&pv);
                self.malloc_regions.remove(&pv);
                self.used_pages -= 1;
                self.check_host_safe_phys(MALLOC_PHYS | (pv / g), "free");
                self.phys_freed.remove(&(MALLOC_PHYS | (pv / g)));
            }
        } else {
            self.malloc_regions.remove(&ptr);
            self.used_pages -= sz / g;
            for p in ptr / g..(ptr + sz) / g {
                self.phys_freed.remove(&(MALLOC_PHYS | p));
            }
        }
        Ok(())
    }

    fn synchronize(&mut self) -> Result<(), DeviceError> {
        self.calls.synchronize += 1;
        if self.capturing {
            self.violation("device synchronization during stream capture".to_string());
            return Err(DeviceError::NotPermitted);
        }
        self.sync_point();
        Ok(())
    }

    fn is_capturing(&self) -> bool {
        self.capturing
    }

    fn room(&self) -> Option<u64> {
        let limit = self
            .cap_pages
            .map_or(self.capacity_pages, |c| c.min(self.capacity_pages));
        Some(limit.saturating_sub(self.used_pages) * self.gran)
    }

    fn record_event(&mut self, stream: Stream) -> Result<EventId, DeviceError> {
        self.calls.event_record += 1;
        self.seq += 1;
        let e = self.next_event;
        self.next_event += 1;
        self.events.insert(e, (stream, self.seq));
        self.seq += 1;
        Ok(e)
    }

    fn event_done(&mut self, event: EventId) -> bool {
        self.calls.event_query += 1;
        let Some(&(s, seq)) = self.events.get(&event) else {
            self.violation(format!("query of unknown event {event}"));
            return false;
        };
        if seq < self.last_sync_seq || self.stream_done.get(&s).is_some_and(|&d| seq < d) {
            let c = self.completed.entry(s).or_insert(0);
            *c = (*c).max(seq);
            true
        } else {
            false
        }
    }

    fn stream_wait_event(&mut self, stream: Stream, event: EventId) -> Result<(), DeviceError> {
        self.calls.stream_wait += 1;
        let Some(&(s, seq)) = self.events.get(&event) else {
            self.violation(format!("wait on unknown event {event}"));
            return Err(DeviceError::Driver(1));
        };
        let w = self.waited.entry((stream, s)).or_insert(0);
        *w = (*w).max(seq);
        Ok(())
    }

    fn destroy_event(&mut self, event: EventId) {
        self.calls.event_destroy += 1;
        if self.events.remove(&event).is_none() {
            self.violation(format!("destroy of unknown event {event}"));
        }
    }
}
