//! Address ranges for stitched mappings, carved out of large reservations the pool keeps.
//!
//! Why: a stitched mapping with a reservation of its own costs `cuMemAddressReserve` and,
//! when dropped, `cuMemAddressFree`: two driver calls on top of its maps and its access, for
//! address space, which costs no device memory. A shape-varying stream stitches a new
//! mapping for each shape the held ranges do not fit, so those calls add up
//! (docs/benchmarks.md, "Stitched mappings without reservations of their own"). Here a mapping takes its range
//! from a chunk of address space reserved once (`CHUNK_PAGES` pages, or the mapping's length
//! if longer) and gives it back to the chunk when it is dropped; a chunk goes back to the
//! device only when nothing uses it and another unused one is kept (or at `trim`).
//!
//! Every range is followed by one unused page of its chunk: an access running past a
//! mapping's end falls on an unmapped address, as it did when each mapping had its own
//! reservation (the checking device puts a page between reservations for the same reason).
//!
//! Safety is that of dropping a mapping: a range goes back to its chunk only when its
//! mapping is unmapped, which happens only when no block uses it and no stream may still
//! touch its addresses (`map_busy`); a new mapping then takes those addresses as it would
//! have taken a new reservation's.

use super::*;

/// Pages of address space a chunk reserves, at least (2 GiB at a 2 MiB granularity: the
/// arena's first reservation is as long).
const CHUNK_PAGES: u64 = 1 << 10;

/// The chunks reserved and their free ranges.
#[derive(Default)]
pub(super) struct VaSpace {
    /// chunk start -> (length, ranges handed out)
    chunks: BTreeMap<u64, (u64, u32)>,
    /// free ranges of the chunks: start -> end (coalesced, never across chunks)
    free: BTreeMap<u64, u64>,
}

impl VaSpace {
    /// The chunk that `va` lies in: (start, length).
    fn chunk_of(&self, va: u64) -> Option<(u64, u64)> {
        self.chunks
            .range(..=va)
            .next_back()
            .filter(|(s, (l, _))| va < *s + *l)
            .map(|(&s, &(l, _))| (s, l))
    }

    /// A free range of `len` bytes (the lowest of the tightest), taken.
    fn take(&mut self, len: u64) -> Option<u64> {
        let (&s, &e) = self
            .free
            .iter()
            .filter(|(s, e)| *e - *s >= len)
            .min_by_key(|(s, e)| (*e - *s, **s))?;
        self.free.remove(&s);
        if s + len < e {
            self.free.insert(s + len, e);
        }
        let (c, _) = self.chunk_of(s)?;
        if let Some(x) = self.chunks.get_mut(&c) {
            x.1 += 1;
        }
        Some(s)
    }

    /// Give `[va, va + len)` back to its chunk, coalesced with its free neighbours within
    /// the chunk. Returns the chunk when nothing of it is handed out any more.
    fn put(&mut self, va: u64, len: u64) -> Option<(u64, u64)> {
        let (c, cl) = self.chunk_of(va)?;
        let (mut s, mut e) = (va, va + len);
        if let Some((&ps, &pe)) = self.free.range(..s).next_back()
            && pe == s
            && ps >= c
        {
            self.free.remove(&ps);
            s = ps;
        }
        if let Some(&ne) = self.free.get(&e)
            && ne <= c + cl
        {
            self.free.remove(&e);
            e = ne;
        }
        self.free.insert(s, e);
        let x = self.chunks.get_mut(&c)?;
        x.1 -= 1;
        (x.1 == 0).then_some((c, cl))
    }

    /// Forget an unused chunk (its single free range).
    fn remove_chunk(&mut self, c: u64) {
        self.chunks.remove(&c);
        self.free.remove(&c);
    }

    fn unused_chunks(&self) -> Vec<(u64, u64)> {
        self.chunks
            .iter()
            .filter(|(_, (_, n))| *n == 0)
            .map(|(&s, &(l, _))| (s, l))
            .collect()
    }
}

impl Stitch {
    /// An address range for a stitched mapping of `len` bytes: carved from a chunk the pool
    /// reserved, a new chunk reserved when none has room.
    pub(super) fn va_take(&mut self, dev: &mut dyn Device, len: u64) -> Result<u64, DeviceError> {
        let g = if self.faults.va_no_guard {
            0
        } else {
            self.gran
        };
        // the range and the unused page after it
        let need = len + g;
        if let Some(va) = self.vas.take(need) {
            return Ok(va);
        }
        // mappings that grow in place carve their room too (see `grow`)
        let chunk = need.max(self.grow_room(CHUNK_PAGES * self.gran));
        let c = dev.reserve(chunk)?;
        self.vas.chunks.insert(c, (chunk, 0));
        self.vas.free.insert(c, c + chunk);
        Ok(self
            .vas
            .take(need)
            .expect("a new chunk fits the range it was reserved for"))
    }

    /// Give back the address range of a dropped mapping of `len` bytes. A chunk left unused
    /// goes back to the device while another unused one is kept.
    pub(super) fn va_put(&mut self, dev: &mut dyn Device, va: u64, len: u64) {
        let g = if self.faults.va_no_guard {
            0
        } else {
            self.gran
        };
        if self.vas.put(va, len + g).is_none() {
            return;
        }
        let unused = self.vas.unused_chunks();
        if unused.len() > 1 {
            // keep the lowest; give the others back
            for &(c, cl) in &unused[1..] {
                if dev.unreserve(c, cl).is_ok() {
                    self.vas.remove_chunk(c);
                }
            }
        }
    }

    /// Give every unused chunk back (`trim`).
    pub(super) fn va_trim(&mut self, dev: &mut dyn Device) {
        for (c, cl) in self.vas.unused_chunks() {
            if dev.unreserve(c, cl).is_ok() {
                self.vas.remove_chunk(c);
            }
        }
    }
}
