//! The block table of `stitch`: blocks by address and by index, and the exact-size cache.
//!
//! A free finds its block with one hash of the address; the exact-size cache lists and the
//! pending list name blocks by slab index, and every block knows its size's list, so a
//! cached allocate+free pair costs two hash lookups in all (the address at the free, the
//! size at the allocation) and a synchronization moves pending blocks into the cache
//! without any.

use crate::ALIGN;
use crate::device::{EventId, Stream};
use crate::fxhash::FxMap;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BState {
    Live,
    Pending,
    Cached,
    /// an empty slab slot
    Vacant,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Block {
    pub addr: u64,
    pub size: u64,
    pub req: u64,
    pub map: u32,
    pub off: u64,
    pub stream: Stream,
    pub state: BState,
    pub free_stream: Stream,
    pub event: Option<EventId>,
    pub epoch: u64,
    pub seq: u64,
    /// this size's list in [`SizeLists`]
    pub list: u32,
}

/// Blocks (live, pending or cached) in a slab, indexed by address.
#[derive(Default)]
pub(crate) struct Blocks {
    slab: Vec<Block>,
    vacant: Vec<u32>,
    index: FxMap<u64, u32>,
}

impl Blocks {
    #[inline]
    pub fn id(&self, addr: u64) -> Option<u32> {
        self.index.get(&addr).copied()
    }

    #[inline]
    pub fn get(&self, addr: u64) -> Option<&Block> {
        self.id(addr).map(|i| &self.slab[i as usize])
    }

    #[inline]
    pub fn at(&self, id: u32) -> &Block {
        &self.slab[id as usize]
    }

    #[inline]
    pub fn at_mut(&mut self, id: u32) -> &mut Block {
        &mut self.slab[id as usize]
    }

    pub fn insert(&mut self, b: Block) -> u32 {
        let id = match self.vacant.pop() {
            Some(id) => {
                self.slab[id as usize] = b;
                id
            }
            None => {
                self.slab.push(b);
                (self.slab.len() - 1) as u32
            }
        };
        let old = self.index.insert(b.addr, id);
        debug_assert!(old.is_none(), "two blocks at one address");
        id
    }

    /// Indices of the cached blocks (freed and kept formed), in no particular order.
    pub fn cached_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.slab
            .iter()
            .enumerate()
            .filter(|(_, b)| b.state == BState::Cached)
            .map(|(i, _)| i as u32)
    }

    /// Remove the block at `addr`: `(its former index, the block)`.
    pub fn remove(&mut self, addr: u64) -> Option<(u32, Block)> {
        let id = self.index.remove(&addr)?;
        let slot = &mut self.slab[id as usize];
        let b = *slot;
        slot.state = BState::Vacant;
        self.vacant.push(id);
        Some((id, b))
    }
}

/// One size of the exact-size cache.
pub(crate) struct SizeList {
    /// cached blocks of this size (slab indices), in free order
    pub cached: Vec<u32>,
    /// pending (`cudaFree`d, waiting for a synchronization) blocks of this size
    pub pending: u32,
    /// allocations of this size since the tight pool's round began (see `stitch::rounds`)
    pub allocs: u32,
    /// the rank (value of `allocs`) of the next allocation of this size that the previous
    /// round placed on its slow path (`u32::MAX`: none): the fast path leaves it to the
    /// slow path, which takes the previous round's place
    pub replay_next: u32,
    /// index, in the tight pool's places of this size, of the first place of a rank not
    /// served yet in this round
    pub replay_at: u32,
}

impl Default for SizeList {
    fn default() -> Self {
        SizeList {
            cached: Vec::new(),
            pending: 0,
            allocs: 0,
            replay_next: u32::MAX,
            replay_at: 0,
        }
    }
}

/// Sizes up to this many `ALIGN` units (32 MiB) find their list by direct indexing, larger
/// ones by hash.
const DIRECT_UNITS: u64 = 1 << 16;
const NO_LIST: u32 = u32::MAX;

/// The exact-size cache: size -> list. Lists stay once made (a workload uses a bounded set
/// of sizes), so a block can name its list by index for its whole life.
#[derive(Default)]
pub(crate) struct SizeLists {
    /// list of the size `u * ALIGN` at `u` (`NO_LIST`: none yet); grown to the largest
    /// such size seen
    direct: Vec<u32>,
    /// lists of the other sizes
    index: FxMap<u64, u32>,
    lists: Vec<SizeList>,
}

impl SizeLists {
    #[inline]
    fn unit(size: u64) -> Option<usize> {
        (size.is_multiple_of(ALIGN) && size / ALIGN < DIRECT_UNITS)
            .then_some((size / ALIGN) as usize)
    }

    #[inline]
    pub fn find(&self, size: u64) -> Option<u32> {
        match Self::unit(size) {
            Some(u) => self.direct.get(u).copied().filter(|&l| l != NO_LIST),
            None => self.index.get(&size).copied(),
        }
    }

    /// The list of `size`, made if new.
    pub fn intern(&mut self, size: u64) -> u32 {
        if let Some(l) = self.find(size) {
            return l;
        }
        let l = self.lists.len() as u32;
        self.lists.push(SizeList::default());
        match Self::unit(size) {
            Some(u) => {
                if self.direct.len() <= u {
                    self.direct.resize(u + 1, NO_LIST);
                }
                self.direct[u] = l;
            }
            None => {
                self.index.insert(size, l);
            }
        }
        l
    }

    #[inline]
    pub fn at(&self, l: u32) -> &SizeList {
        &self.lists[l as usize]
    }

    #[inline]
    pub fn at_mut(&mut self, l: u32) -> &mut SizeList {
        &mut self.lists[l as usize]
    }

    /// Start counting the allocations of every size afresh, with nothing to replay.
    pub fn reset_allocs(&mut self) {
        for l in &mut self.lists {
            l.allocs = 0;
            l.replay_next = u32::MAX;
            l.replay_at = 0;
        }
    }

    /// Does a block of `size` wait for a synchronization?
    pub fn has_pending(&self, size: u64) -> bool {
        self.find(size).is_some_and(|l| self.at(l).pending > 0)
    }
}
