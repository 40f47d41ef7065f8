//! `stitch`: virtual-memory stitching with packed page tails.
//!
//! Physical memory is held in granularity-sized pages (one handle each, or runs of pages under
//! one handle: see `pages`, "Runs"). A block is a byte
//! range `[off, off + size)` of a *mapping*: an address range (the arena's reservation, or a
//! range of the pool's reserved chunks: see `vas`) with a list of pages mapped one after
//! another. Any free page can back any block, so there is no external
//! fragmentation above a page. Page tails are packed: every page has a byte-range
//! sub-allocator (512-B units), a block may take a shared page's free *suffix* as its head,
//! whole free pages in the middle and another shared page's free *prefix* as its tail, and
//! blocks under a page go into any free range of a shared page. One physical page may be
//! mapped in several mappings (at several addresses); blocks own *physical* byte ranges, so
//! two blocks never overlap physically whatever their addresses.
//!
//! Speed: a freed block stays formed (mapping and bytes kept) in a cache keyed by size, so a
//! repeated request of the same size is a hash lookup; mappings stay cached and are reused
//! when their pages' needed bytes are free, so a repeating workload makes no driver calls.
//! Formed free blocks are dissolved (bytes given back to their pages, least recently freed
//! first) only when a request cannot be placed otherwise; physical growth comes last.
//!
//! Stream rules: a `FreeMode::Sync` block waits in `pending` until a synchronization (one
//! device sync releases every pending block; the process's own syncs count). The pool
//! synchronizes when a request misses the cache while its exact-size twin is pending (and at
//! least `SYNC_BATCH` blocks are), before it would grow for such a twin, once pending bytes
//! reach an eighth of the pool, and at the cap before dissolving cached blocks: exact reuse is
//! what keeps a `cudaMalloc`/`cudaFree` workload within 5% of its peak live bytes. A
//! `FreeMode::Async { stream: s }` block is reusable at once on `s`; on another stream after a
//! synchronization, or by making that stream wait on an event recorded on `s` when the block
//! changes streams (it covers the free; `cudaStreamWaitEvent`, no host synchronization, and
//! no event at all on the same-stream fast path). Bytes of dissolved blocks carry the same
//! condition as a per-page fence, and the mapping such a block was in stays mapped, until a
//! synchronization, or until an event recorded on the stream after the free is seen complete
//! (the mapping's addresses are what the stream may still use; the other mappings of its pages
//! are not held for it: see `fences`). No synchronization during capture.

use crate::blocks::{BState, Block, Blocks, SizeLists};
use crate::device::{Device, DeviceError, EventId, Handle, Stream};
use crate::fxhash::FxMap;
use crate::{ALIGN, Alloc, FreeMode, Policy, PoolError, Request, Stats, round_up};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

use fences::{Reuse, is_retired};

pub use budget::Budget;
#[doc(hidden)]
pub use layers::LayerPlace;
#[doc(hidden)]
pub use pages::{HandleView, PageView};

mod arena;
mod aside;
mod budget;
mod cache;
mod ends;
mod fences;
mod grow;
mod guard;
mod kept;
mod layers;
mod mappings;
mod pages;
mod placement;
mod pressure;
mod quiet;
mod rounds;
mod slow_path;
mod vas;

/// The arena grows by a run of pages (see `pages`, "Runs") while the pool would hold at
/// most 1 / RUN_ROOM of what the device could give it.
const RUN_ROOM: u64 = 4;
/// How many cached blocks of one size the fast path looks at.
const FAST_SCAN: usize = 8;
/// Pending (cudaFree'd) blocks worth a synchronization when one of them is the exact size a
/// request misses.
const SYNC_BATCH: usize = 8;
/// How many cached mappings of one length a placement looks at.
const MAP_SCAN: usize = 64;
/// How many mappings of one length a carve looks at.
const CARVE_SCAN: usize = 64;
/// Page classes: blocks up to half a page are "small" and share pages with each other;
/// larger blocks share their heads and tails with each other. A class takes the other's
/// free bytes only before the pool would otherwise grow or fail (keeps long-lived small
/// blocks from pinning the pages that large blocks need).
const SMALL: usize = 0;
const LARGE: usize = 1;

#[derive(Clone, Copy, Debug)]
struct Fence {
    stream: Stream,
    event: Option<EventId>,
    epoch: u64,
    /// free order: of two fences on one stream the later free covers the earlier
    seq: u64,
}

struct Page {
    handle: Handle,
    /// pages of its handle (1: a handle of its own; more: a run, see `runs`), and its index
    /// in the run
    run: u32,
    idx: u32,
    /// free byte ranges start -> end
    free: BTreeMap<u64, u64>,
    used: u64,
    /// blocks (live, pending or cached) holding bytes here: start -> (end, block address)
    occ: BTreeMap<u64, (u64, u64)>,
    /// SMALL or LARGE: which blocks this page was first used for (while partly used)
    class: usize,
    /// lifetime class of the blocks in this page while it is used (see `set_lifetime_class`)
    life: u8,
    maps: Vec<u32>,
    fences: Vec<Fence>,
}

struct Mapping {
    va: u64,
    /// bytes of address space reserved at `va` (the arena reserves beyond its pages; with
    /// `grow` on, a stitched mapping's range has room after its pages to grow into)
    reserved: u64,
    /// `va` is a reservation of its own (the arena's); else a range of the pool's chunks
    /// (see `vas`)
    own_va: bool,
    pages: Vec<u32>,
    /// blocks (live, pending or cached) placed in this mapping
    users: u32,
    /// a block freed through this mapping stream-ordered was given back to its pages in an
    /// epoch before this one: until a synchronization covers it (the epoch reaches this), a
    /// stream may still use this mapping's addresses, which therefore stay mapped (see
    /// `fences`)
    busy_until: u64,
    /// the streams of those frees and the newest free's number on each (see `fences`, "Busy
    /// mappings"): once an event recorded on each after that free is complete, no stream uses
    /// the mapping's addresses any more and it is no longer busy, with no synchronization
    busy_on: Vec<(Stream, u64)>,
    /// a free through it was on no particular stream or during a capture: only a
    /// synchronization ends its busy state
    busy_sync_only: bool,
}

/// How the pool cuts new physical memory into handles (`Stitch::with_shapes`). CUDA maps a
/// handle only whole, one `cuMemMap` per handle, so a new mapping over pages of one handle
/// each costs a map per page; a handle of several pages costs one map, but is then mapped,
/// and given back, only whole (see `pages`, "Runs").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Shapes {
    /// One handle per page (the arena's runs aside, `Stitch::with_runs`).
    #[default]
    Pages,
    /// The pages a large request grows the pool by (the arena's growth, or the fresh pages
    /// of a new mapping) as one handle.
    Request,
    /// The same pages as handles of power-of-two pages, largest first (23 pages: 16, 4, 2
    /// and 1): a later request of another length takes whole handles that add up to its
    /// pages.
    Pow2,
}

/// What the slow path found: a cached block (after a synchronization released it), or a
/// new block's place `(mapping, offset)`.
enum Slot {
    Hit(u64),
    New(u32, u64),
}

/// Where a new block goes: an existing mapping, or new pages to map.
enum Plan {
    Existing { map: u32, off: u64 },
    New { pages: Vec<u32>, off: u64 },
}

/// Testing switches that break a safety rule on purpose (to prove the checks can fail).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    /// Hand out blocks freed with `cudaFree` at once, without waiting for a sync.
    pub reuse_sync_frees_early: bool,
    /// Reuse stream-ordered frees on any stream without waiting on their event.
    pub ignore_streams: bool,
    /// Do not mark a new block's bytes used (the next block may overlap it).
    pub skip_take: bool,
    /// The old, lazier synchronization: never synchronize for a freed twin of the request
    /// (place it elsewhere while the twin waits) and dissolve cached blocks before
    /// synchronizing at the cap. Not a safety fault: it proves the tightness tests can fail.
    pub lazy_sync: bool,
    /// Grow and cache as if there were no budget (while still publishing it): proves the
    /// budget test can fail.
    pub ignore_budget: bool,
    /// Give back at once the pages the pool was forced to take past its budget (not a
    /// safety fault: it proves the test of keeping them can fail).
    pub release_forced: bool,
    /// Let a page of a run be stitched into new mappings like a page with a handle of its
    /// own, mapped alone (proves the check that a handle is mapped whole can fail).
    pub stitch_run_pages: bool,
    /// Grow the arena one handle per page, without runs (not a safety fault: it proves
    /// the test that growth by a run costs one create and one map can fail).
    pub page_handles: bool,
    /// Re-form only mappings that blocks still use for a new block (remapping some of their
    /// pages: the bytes of those blocks move under them).
    pub repair_used: bool,
    /// Keep the layout (cached blocks, earlier places) when nothing is live (not a safety
    /// fault: it proves the test that the tight pool does not creep over passes can fail).
    pub keep_layout: bool,
    /// Do not replay the previous round's places (not a safety fault: it proves the test
    /// that a repeated workload's later rounds make no driver call can fail).
    pub forget_rounds: bool,
    /// Take the previous round's place (and, with layers on, the place of a period or two
    /// before: see `layers`) even where a live block is (the new block overlaps it): proves
    /// the safety checks of replayed places can fail.
    pub replay_over_live: bool,
    /// Place blocks of different lifetime classes in the same pages (proves the test of
    /// `Stitch::set_lifetime_class` can fail).
    pub mix_lifetimes: bool,
    /// The tight pool's round replay takes a remembered place that blocks freed with
    /// `cudaFree` still hold without the synchronization that releases them (proves the
    /// test that a replayed place is never reused early can fail).
    pub replay_unsynced: bool,
    /// Above the budget, dissolve the cache even when no page could be given back (not a
    /// safety fault: it proves the test that a pool stuck above its budget keeps caching
    /// can fail).
    pub dissolve_when_stuck: bool,
    /// Never look at the device's room, so never take the near-the-limit choices of
    /// `pressure` (not a safety fault: it proves the tests of the smallest devices they
    /// reach can fail).
    pub pressure_off: bool,
    /// Under pressure, re-form a round's mapping even while blocks use it or a stream may
    /// still touch it (their bytes move under them): proves the checks of re-forming under
    /// pressure can fail.
    pub pressure_reform_used: bool,
    /// Carve a smaller block out of a kept range even where a live block lies (the new
    /// block overlaps it): proves the checks of carving from kept ranges can fail.
    pub kept_over_live: bool,
    /// Count a caller's hits (`Stitch::note_aside_hits`) as the pool's own allocations (its
    /// statistics and round watch then count allocations it never served): proves the
    /// property test of hits interleaved with the pool's own traffic can fail.
    pub hits_as_allocs: bool,
    /// End a budget window that a caller's hits complete without keeping the budget (no
    /// budget recomputed, nothing given back): proves the budget check of such windows can
    /// fail.
    pub hits_roll_unkept: bool,
    /// Near the device's limit, keep placing large blocks of a pool told lifetime classes in
    /// the arena, across classes (not a safety fault: it proves the test that the classes
    /// reach 1.03 x peak live only with the arena set aside can fail).
    pub arena_mixes_lifetimes: bool,
    /// Unmap a mapping (drop it, re-form it, or give its pages back) while a stream may still
    /// use its addresses (a block freed through it stream-ordered, with no synchronization
    /// since): proves the checks of the per-mapping stream condition can fail.
    pub unmap_busy: bool,
    /// Keep every mapping of a page freed into stream-ordered mapped until a
    /// synchronization, as the per-page condition did (not a safety fault: it proves the
    /// test that the per-mapping condition gives pages back can fail).
    pub page_fenced_maps: bool,
    /// The round watch (`Stitch::round_end_watch`) is never 0 above the budget and the pages
    /// the pool keeps past it: a caller keeps frees aside there too, and they reach the pool
    /// late (not a safety fault: it proves the test of that half of the watch can fail).
    pub watch_never_zero: bool,
    /// Near the device's limit, place blocks of more than a page the usual way (their twins'
    /// places, the arena, held mappings) instead of on page ends (see `ends`; not a safety
    /// fault: it proves the test of the smallest device that rule reaches can fail).
    pub ends_off: bool,
    /// Near the device's limit, release the `cudaFree`d blocks into the bytes a block of more
    /// than a page is placed in without the synchronization (see `ends`): proves the checks
    /// of that rule's early reuse can fail.
    pub ends_unsynced: bool,
    /// Near the device's limit, a block of the page-ends rule skips its rank's place of the
    /// previous round too (see `ends`, "Rounds first"; not a safety fault: it proves the test
    /// that repeated passes complete on the device one pass needs can fail).
    pub ends_skip_rounds: bool,
    /// An allocation served at its rank's place of the previous round skips the
    /// synchronization the others make once the pending frees reach their limit (see
    /// `rounds`, "Hits"; not a safety fault: it proves the tests that a later pass repeats
    /// the first one's places can fail).
    pub replay_skips_sync: bool,
    /// Near the limit, re-form a round's mappings whenever the device's room is short, not
    /// counting the free pages the pool holds (see `pressure::reform_pressure`; not a safety
    /// fault: it proves the test that repeated passes complete on the device one pass needs
    /// can fail).
    pub reform_without_held: bool,
    /// Carve stitched mappings' address ranges out of the pool's chunks with no unused page
    /// after each (an access past a mapping's end then lands in the next mapping's memory):
    /// proves the test that such an access finds no memory can fail.
    pub va_no_guard: bool,
    /// Keep a mapping busy until a synchronization even when the events recorded after the
    /// frees through it are complete (the rule without those events; not a safety fault: it
    /// proves the test that mappings do not pile up without synchronizations can fail).
    pub busy_until_sync: bool,
    /// Take a busy mapping's events for complete without asking the device (the mapping may
    /// then be unmapped while its stream still uses it): proves the check of ending the busy
    /// state by an event can fail.
    pub busy_done_unasked: bool,
    /// Take no notice of a stream's retirement (`Stitch::retire_stream`): blocks and bytes
    /// freed on it stay reusable at once on a request that names its handle, which may be a
    /// new stream with no order to the old one's work: proves the checks of retired streams
    /// can fail.
    pub ignore_retired: bool,
    /// Grow a mapping in place (see `grow`) over the live or pending blocks in its pages,
    /// as if they were cached (the new block overlaps them): proves the checks of growing
    /// in place can fail.
    pub grow_over_live: bool,
    /// Keep the page fences of dissolved stream-ordered bytes (and the busy marks of frees
    /// whose stream is known past them) until a synchronization, whatever the events recorded
    /// on their streams say (not a safety fault: it proves the test that such pages go back
    /// without a synchronization can fail).
    pub fences_until_sync: bool,
    /// Place the allocation the layer replay holds places for (see `layers`, "Holds") at its
    /// place one period back, over the live block there (the new block overlaps it): proves
    /// the checks of placing while places are held can fail.
    pub hold_over_live: bool,
    /// A short-lived block the arena places at the top of a window (`Stitch::set_ends_class`)
    /// goes one `ALIGN` higher, over the block above the window: proves the checks of that
    /// placement can fail.
    pub ends_over_live: bool,
    /// Growth for a new mapping creates a page for the request's remainder even where a
    /// partly used page's free end holds it, as if `Stitch::fresh_pages_for` counted every page
    /// of the request (not a
    /// safety fault: it proves the test that growth gives back no page it created can fail).
    pub remainder_page: bool,
    /// With handles sized per request, a block whose new mapping starts in a handle's free
    /// end starts one `ALIGN` lower, over the byte before that end (a block there then
    /// overlaps the new one): proves the checks of that placement can fail.
    pub run_end_over_live: bool,
    /// With the shape guard on (`Stitch::with_shape_guard`), a block the arena places at the
    /// end of a window, where the guard looks there, goes one `ALIGN` higher, over the block
    /// after the window: proves the checks of that placement can fail.
    pub guard_over_live: bool,

    /// With handles sized per request, plan new mappings over handles' free ends (and grow
    /// for such plans) near the device's limit too (not a safety fault: it proves the test
    /// that three passes complete on the device of 1.03 x peak live can fail).
    pub run_ends_near_limit: bool,
    /// With handles sized per request, size a new handle by the request while the pool with
    /// that handle alone would hold at most a quarter of what the device could give, however
    /// near its limit the pool will grow (not a safety fault: it proves the test that three
    /// passes complete on the device of 1.03 x peak live can fail).
    pub shapes_near_limit: bool,
}

impl Faults {
    /// Any switch the fast path must see: the early release of `cudaFree`d blocks acts
    /// before an allocation looks at the cache (it moves the epoch, which decides what may be
    /// handed out at once). Every other switch acts on what the fast path never decides (the
    /// slow path, placement, replay, frees, the budget, lifetime classes, which turn the fast
    /// path off themselves), so it leaves the fast path on: a switch changes only what it
    /// names (the general path takes the block the fast path would, but records it as a
    /// place of the round, which the fast path does not).
    fn any(&self) -> bool {
        self.reuse_sync_frees_early
    }
}

/// See the module documentation.
pub struct Stitch {
    gran: u64,
    pages: Vec<Option<Page>>,
    free_slots: Vec<u32>,
    npages: u64,
    /// pages with no used byte that have a handle of their own (any mapping may take them)
    free_pages: BTreeSet<u32>,
    /// pages with no used byte that are part of a run (mapped only with their whole run)
    bound_free: BTreeSet<u32>,
    /// handles of more than one page: their pages in order (see `pages`, "Runs")
    runs: FxMap<Handle, Vec<u32>>,
    /// the arena grows by runs (see `with_runs`)
    grow_runs: bool,
    /// new physical memory for a large request comes as handles sized by the request (see
    /// `with_shapes`)
    shapes: Shapes,
    /// partly or fully used pages of the small class
    small_pages: BTreeSet<u32>,
    /// free ranges of partly used pages, per page class: (len, page, start)
    ranges: [BTreeSet<(u64, u32, u64)>; 2],
    /// partly used pages with a free prefix, per class: (len, page)
    prefix: [BTreeSet<(u64, u32)>; 2],
    /// partly used pages with a free suffix, per class: (len, page)
    suffix: [BTreeSet<(u64, u32)>; 2],
    maps: Vec<Option<Mapping>>,
    /// slots of dropped mappings, with the address their last mapping had
    free_map_slots: Vec<(u32, u64)>,
    nmaps: u64,
    maps_by_len: FxMap<usize, Vec<u32>>,
    maps_by_va: BTreeMap<u64, u32>,
    blocks: Blocks,
    /// the exact-size cache (and pending blocks counted by size)
    sizes: SizeLists,
    /// cached blocks in free order, per class (stale entries skipped)
    lru: [VecDeque<(u64, u64)>; 2],
    ncached: usize,
    /// `cudaFree`d blocks waiting for a synchronization (block indices)
    pending: Vec<u32>,
    epoch: u64,
    flushed_epoch: u64,
    /// bytes of `pending` blocks
    pending_bytes: u64,
    seq: u64,
    frees_since_sync: bool,
    events: FxMap<EventId, u32>,
    /// per stream: the event in flight on it for busy mappings and `seq` when it was
    /// recorded (it covers every free numbered up to that; see `fences`, "Busy mappings")
    marks: FxMap<Stream, (EventId, u64)>,
    /// some mapping is busy on a stream (see `settle_busy`)
    busy_unsettled: bool,
    /// streams retired so far (see `fences`, "Retired streams"): the next retired id
    retired: u64,
    /// per stream: the newest free it is known to have passed (an event recorded after it
    /// seen complete, see `fences`, "Page fences"), in this epoch
    passed: FxMap<Stream, u64>,
    /// busy mappings ended and fences passed by events so far (what may leave a page
    /// releasable within an epoch besides `budget::release_possible`'s key)
    settled: u64,
    /// the count of allocations and frees at which the budget next asks about them (see
    /// `keep_budget`)
    next_settle: u64,
    /// above the budget, ask the streams' events (throttled) whether they passed the frees
    /// of busy mappings and page fences (`with_event_settles`)
    event_settles: bool,
    faults: Faults,
    /// `faults.any()`, kept for the fast path
    faults_on: bool,
    /// (address, mapping, offset) of the block the exact-size cache handed out last (see
    /// `rounds`: the place of a slow-path hit is recorded without a lookup)
    last_taken: Option<(u64, u32, u64)>,
    /// where blocks of each size were placed last (mapping, its address, offset), most
    /// recent last: a repeating pattern takes the same places again
    ghosts: FxMap<u64, Vec<(u32, u64, u64)>>,
    /// the places large blocks were given, carved best fit by smaller ones (see `kept`)
    kept: Vec<kept::Kept>,
    kept_on: bool,
    /// `vramshim replay` runs the live library's thread caches in front (see
    /// `with_thread_caches`)
    tcaches: bool,
    /// blocks carved out of kept ranges
    kept_carves: u64,
    /// the places of this round's and the previous round's cache misses (see `rounds`)
    rounds: rounds::Rounds,
    /// the recent large allocations' places, replayed two periods later (see `layers`)
    layers: layers::Layers,
    layers_on: bool,
    /// a large allocation the layer replay could not place keeps out of the places the next
    /// allocations of the sequence will take (see `layers`, "Holds")
    holds_on: bool,
    /// the layer replay asked holds for the allocation being served: (its number among the
    /// pool's allocations, the period)
    hold_ask: Option<(u64, usize)>,
    /// the places held for the allocation being served (placeholder blocks' addresses)
    held: Vec<u64>,
    /// `Faults::hold_over_live`: the place (mapping, offset) it puts that allocation at
    held_over: Option<(u32, u64)>,
    /// stitched mappings keep address room after their pages and a larger request extends
    /// one in place (see `grow`)
    grow_on: bool,
    /// blocks placed in mappings grown in place
    grows: u64,
    /// large blocks keep out of the latest places of much larger ones (see `guard`)
    guard_on: bool,
    /// the guard acts for the allocation under way: on, and the device has room
    guard_now: bool,
    /// allocations for which the guard named places to keep clear
    guard_looks: u64,
    /// soft limit over peak live beyond which cached blocks are dissolved before growing
    /// (None: cache until the device or cap refuses)
    headroom: Option<f64>,
    budget: Option<Budget>,
    /// address space for stitched mappings (see `vas`)
    vas: vas::VaSpace,
    /// the mapping that grows at its end (tight pool; see `arena`)
    arena: Option<u32>,
    /// the budget in bytes as last computed (u64::MAX: none); a free above it enforces it
    limit_now: u64,
    /// (recent peak, page size) `limit_now` was computed for (see `refresh_budget`)
    limit_key: (u64, u64),
    /// recent peak live of the previous window
    prev_window_peak: u64,
    /// the most the pool held past its budget in this window and in the previous one
    forced: u64,
    prev_forced: u64,
    /// lifetime class of the next allocations, and whether any class but 0 was ever set
    /// (see `set_lifetime_class`)
    life: u8,
    lives: bool,
    /// the next allocation's two-ends class in the arena (see `set_ends_class`)
    ends_class: Option<bool>,
    /// mappings re-formed by remapping some of their pages (see `Stitch::repairable`)
    repairs: u64,
    /// of them, mappings of a round's places re-formed near the device's limit (`pressure`)
    pressure_reforms: u64,
    /// allocation count (`window_allocs`) at which the budget's window rolls
    next_window: u64,
    /// allocations a caller served from blocks it kept aside (`aside`): they count toward the
    /// budget's window, not toward the pool's own statistics and rounds
    aside_hits: u64,
    /// (epoch, `idle_gen`, pages) of the last scan for idle pages that found the rest
    /// pinned: nothing changed, nothing to scan
    idle_scan: Option<(u64, u64, u64)>,
    /// blocks dissolved and mappings dropped or re-formed: what may leave a page releasable
    /// within an epoch (see `budget::release_idle`)
    idle_gen: u64,
    /// (epoch, flushed epoch, pages, mappings, repairs, bytes kept) at which dissolving the
    /// cache was found to free no page (see `budget::release_possible`)
    stuck_key: Option<(u64, u64, u64, u64, u64, u64, u64)>,
    /// (allocations, cache hits) when the layout was last forgotten (see `quiet`)
    layout_mark: (u64, u64),
    stats: Stats,
    /// the device was near its limit at the last allocation the general path made while a
    /// block of the `ends` rule was asked for or this was set (see `ends`)
    near: bool,
    /// the fast path declines: `lives`, `faults_on` or `near`
    slow_only: bool,
    /// the allocation under way is placed by the `ends` rule
    ends_first: bool,
    /// blocks placed by the `ends` rule
    ends_places: u64,
}

impl Default for Stitch {
    fn default() -> Self {
        Self::new()
    }
}

impl Stitch {
    pub fn new() -> Self {
        Stitch {
            gran: 0,
            pages: Vec::new(),
            free_slots: Vec::new(),
            npages: 0,
            free_pages: BTreeSet::new(),
            bound_free: BTreeSet::new(),
            runs: FxMap::default(),
            grow_runs: false,
            shapes: Shapes::Pages,
            small_pages: BTreeSet::new(),
            ranges: Default::default(),
            prefix: Default::default(),
            suffix: Default::default(),
            maps: Vec::new(),
            free_map_slots: Vec::new(),
            nmaps: 0,
            maps_by_len: FxMap::default(),
            maps_by_va: BTreeMap::new(),
            blocks: Blocks::default(),
            sizes: SizeLists::default(),
            lru: Default::default(),
            ncached: 0,
            pending: Vec::new(),
            epoch: 0,
            flushed_epoch: 0,
            pending_bytes: 0,
            seq: 0,
            frees_since_sync: false,
            events: FxMap::default(),
            marks: FxMap::default(),
            busy_unsettled: false,
            retired: 0,
            passed: FxMap::default(),
            settled: 0,
            next_settle: 0,
            event_settles: false,
            faults: Faults::default(),
            faults_on: false,
            last_taken: None,
            ghosts: FxMap::default(),
            kept: Vec::new(),
            kept_on: false,
            tcaches: true,
            kept_carves: 0,
            rounds: Default::default(),
            layers: Default::default(),
            layers_on: true,
            holds_on: false,
            hold_ask: None,
            held: Vec::new(),
            held_over: None,
            grow_on: false,
            grows: 0,
            guard_on: false,
            guard_now: false,
            guard_looks: 0,
            headroom: None,
            budget: None,
            vas: vas::VaSpace::default(),
            arena: None,
            limit_now: u64::MAX,
            limit_key: (u64::MAX, 0),
            prev_window_peak: 0,
            forced: 0,
            prev_forced: 0,
            life: 0,
            lives: false,
            ends_class: None,
            repairs: 0,
            pressure_reforms: 0,
            next_window: u64::MAX,
            aside_hits: 0,
            idle_scan: None,
            idle_gen: 0,
            stuck_key: None,
            layout_mark: (0, 0),
            stats: Stats::default(),
            near: false,
            slow_only: false,
            ends_first: false,
            ends_places: 0,
        }
    }

    /// Soft limit: once the pool holds more than `peak_live * (1 + headroom)` bytes, a
    /// request that misses the cache dissolves cached blocks before the pool grows (tighter
    /// when memory is plentiful, at the cost of some driver calls in steady state). Default
    /// `None`: cache until the device or the cap refuses, then dissolve.
    pub fn with_headroom(mut self, headroom: Option<f64>) -> Self {
        self.headroom = headroom;
        self
    }

    /// Grow the arena (a budgeted pool's) by runs of pages under one handle while the device
    /// has room: one create and one map per growth instead of one each per page (see
    /// `pages`, "Runs"). Off by default: runs cut the driver calls of every trace but hold
    /// more on bert_serve (pages of a run partly in use are stitched elsewhere only with the
    /// whole run), and behind the interposer's thread caches a repeated t5 makes calls in its
    /// later passes (`examples/pool_slack.rs`, budget `0.05:2:runs`).
    pub fn with_runs(mut self, on: bool) -> Self {
        self.grow_runs = on;
        self
    }

    /// How new physical memory is cut into handles (see `pages`, "Handles sized per
    /// request"). Default `Shapes::Pages`: one handle per page (arena growth by runs aside,
    /// `with_runs`).
    pub fn with_shapes(mut self, shapes: Shapes) -> Self {
        self.shapes = shapes;
        self
    }

    /// Keep the places of large blocks as ranges that smaller requests are carved from,
    /// best fit (see `kept`).
    pub fn with_kept(mut self, on: bool) -> Self {
        self.kept_on = on;
        self
    }

    /// Give a repeated sequence of large requests within one round the places of the repeat
    /// before the previous one (see `layers`). On by default (it acts only under a budget).
    pub fn with_layers(mut self, on: bool) -> Self {
        self.layers_on = on;
        self
    }

    /// With the layer replay acting, a large allocation that gets no place of the sequence
    /// keeps out of the places the next ones will take, where that costs no driver call (see
    /// `layers`, "Holds").
    pub fn with_layer_holds(mut self, on: bool) -> Self {
        self.holds_on = on;
        self
    }

    /// Keep address room after every stitched mapping and serve a request larger than a
    /// stitched mapping whose bytes are free or cached (but for a head in its first page) by
    /// mapping only the pages missing at its end (see `grow`).
    pub fn with_grow(mut self, on: bool) -> Self {
        self.grow_on = on;
        self
    }

    /// Above its budget, ask (at most once per 64 allocations and frees) the events recorded
    /// on the streams of busy mappings and page fences whether the streams passed those frees,
    /// and let the answers end the busy marks and clear the fences (see `fences`, "Page
    /// fences"): a process that never synchronizes the device then gives such pages back.
    /// Off by default: the answers depend on how far the device has run, so the driver calls
    /// of a run would no longer follow from its requests alone (`vramshim replay`'s model
    /// completes an event only at a synchronization; on cuda-sim t5's stream-ordered replay
    /// makes one call fewer live than modelled with it on).
    pub fn with_event_settles(mut self, on: bool) -> Self {
        self.event_settles = on;
        self
    }

    /// Blocks placed in mappings grown in place (see `grow`).
    pub fn grows(&self) -> u64 {
        self.grows
    }

    /// Whether `vramshim replay` runs the live library's per-thread caches of stream-ordered
    /// frees in front of this pool (`vramshim_pool::thread_cache`; on by default). The pool
    /// itself never sees them; the interposer's caches have switches of their own.
    pub fn with_thread_caches(mut self, on: bool) -> Self {
        self.tcaches = on;
        self
    }

    /// Where the arena places the next allocations that reach it (a window of free bytes,
    /// not a replayed place): `Some(true)`, a block expected to live long, at the bottom of
    /// the lowest window that fits; `Some(false)`, a short-lived one, at the top of the
    /// highest; `None` (the default), the arena's own choice. Short-lived blocks then die
    /// above the long-lived ones and leave one run for the next large block. A measuring
    /// hook, not a rule of the pool: told the trace's own lifetimes (an oracle), it bounds
    /// what a pool predicting them could gain this way (`examples/pool_ends.rs`).
    #[doc(hidden)]
    pub fn set_ends_class(&mut self, class: Option<bool>) {
        self.ends_class = class;
    }

    /// Break safety rules on purpose (tests only).
    pub fn set_faults(&mut self, f: Faults) {
        self.faults = f;
        self.faults_on = f.any();
        self.update_slow_only();
    }

    /// Physical pages held.
    pub fn pages(&self) -> u64 {
        self.npages
    }

    /// Mappings held.
    pub fn mappings(&self) -> u64 {
        self.nmaps
    }

    /// Allocations placed where their rank had its place in the previous round.
    pub fn replays(&self) -> u64 {
        self.rounds.replays()
    }

    /// Mappings re-formed for a new block by remapping only the pages that differed.
    pub fn repairs(&self) -> u64 {
        self.repairs
    }

    /// Blocks freed and kept formed for reuse.
    pub fn cached_blocks(&self) -> usize {
        self.ncached
    }

    /// One line describing the page state (for debugging placement).
    #[doc(hidden)]
    pub fn debug_state(&self) -> String {
        let partial: Vec<&Page> = self
            .pages
            .iter()
            .flatten()
            .filter(|p| p.used > 0 && p.used < self.gran)
            .collect();
        let pfree: u64 = partial.iter().map(|p| self.gran - p.used).sum();
        let small_partial = partial.iter().filter(|p| p.class == SMALL).count();
        let small_free: u64 = partial
            .iter()
            .filter(|p| p.class == SMALL)
            .map(|p| self.gran - p.used)
            .sum();
        let full = self
            .pages
            .iter()
            .flatten()
            .filter(|p| p.used == self.gran)
            .count();
        let largest_suffix = self.suffix[LARGE]
            .iter()
            .next_back()
            .map(|x| x.0)
            .unwrap_or(0);
        let largest_prefix = self.prefix[LARGE]
            .iter()
            .next_back()
            .map(|x| x.0)
            .unwrap_or(0);
        format!(
            "small partial {small_partial} free {} KiB; pages {} (free {}, partial {}, full {}), partial free bytes {} KiB, largest suffix {} KiB, prefix {} KiB, cached {}, pending {}, live {} KiB, maps {}",
            small_free / 1024,
            self.npages,
            self.free_pages.len(),
            partial.len(),
            full,
            pfree / 1024,
            largest_suffix / 1024,
            largest_prefix / 1024,
            self.ncached,
            self.pending.len(),
            self.stats.live / 1024,
            self.nmaps
        )
    }

    fn page(&self, p: u32) -> &Page {
        self.pages[p as usize].as_ref().unwrap()
    }
    fn page_mut(&mut self, p: u32) -> &mut Page {
        self.pages[p as usize].as_mut().unwrap()
    }
    fn map(&self, m: u32) -> &Mapping {
        self.maps[m as usize].as_ref().unwrap()
    }
    fn map_mut(&mut self, m: u32) -> &mut Mapping {
        self.maps[m as usize].as_mut().unwrap()
    }

    fn update_reserved(&mut self) {
        let r = self.npages * self.gran;
        self.stats.set_reserved(r);
        self.stats.mappings = self.nmaps;
    }
}

impl Policy for Stitch {
    fn name(&self) -> &'static str {
        "stitch"
    }

    fn alloc(&mut self, dev: &mut dyn Device, req: Request) -> Result<Alloc, PoolError> {
        self.alloc_general(dev, req, true)
    }

    fn free(&mut self, dev: &mut dyn Device, addr: u64, mode: FreeMode) -> Result<u64, PoolError> {
        let epoch = self.epoch;
        let Some(id) = self.blocks.id(addr) else {
            return Err(PoolError::UnknownPointer(addr));
        };
        let b = self.blocks.at_mut(id);
        if b.state != BState::Live {
            return Err(PoolError::UnknownPointer(addr));
        }
        let req = b.req;
        b.epoch = epoch;
        self.frees_since_sync = true;
        self.stats.frees += 1;
        self.stats.live -= req;
        match mode {
            FreeMode::Sync => {
                b.state = BState::Pending;
                self.pending.push(id);
                self.pending_bytes += b.size;
                self.sizes.at_mut(b.list).pending += 1;
            }
            FreeMode::Async { stream } => {
                b.state = BState::Cached;
                b.free_stream = stream;
                self.seq += 1;
                b.seq = self.seq;
                let (size, seq) = (b.size, b.seq);
                self.sizes.at_mut(b.list).cached.push(id);
                let c = self.class_of(size);
                self.lru[c].push_back((seq, addr));
                self.ncached += 1;
                self.stats.cached += size;
                self.compact_lru();
            }
        }
        if self.stats.reserved > self.limit_now || self.window_allocs() >= self.next_window {
            self.enforce_budget(dev);
        }
        Ok(req)
    }

    fn trim(&mut self, dev: &mut dyn Device) -> Result<u64, PoolError> {
        self.stats.trims += 1;
        if dev.is_capturing() || self.gran == 0 {
            return Ok(0);
        }
        if self.frees_since_sync || !self.pending.is_empty() {
            self.do_sync(dev)?;
        }
        self.flush_pending();
        self.drop_busy_events(dev);
        while self.dissolve_some(dev, u64::MAX) {}
        let before = self.npages;
        for p in 0..self.pages.len() as u32 {
            if self.pages[p as usize].is_some() {
                self.purge_fences(dev, p);
            }
        }
        let unused: Vec<u32> = self
            .maps
            .iter()
            .enumerate()
            .filter_map(|(i, m)| m.as_ref().filter(|m| m.users == 0).map(|_| i as u32))
            .collect();
        for m in unused {
            self.drop_mapping(dev, m)?;
        }
        self.va_trim(dev);
        let free: Vec<u32> = self
            .free_pages
            .iter()
            .chain(self.bound_free.iter())
            .copied()
            .collect();
        for p in free {
            // a run goes back whole, once none of its pages is used or mapped
            if self.pages[p as usize].is_some()
                && self.run_all(p, |q| {
                    let pg = self.page(q);
                    pg.used == 0 && pg.maps.is_empty()
                })
            {
                self.release_page(dev, p)?;
            }
        }
        self.stats.releases += before - self.npages;
        Ok((before - self.npages) * self.gran)
    }

    fn note_process_sync(&mut self) {
        self.stats.process_syncs += 1;
        self.epoch += 1;
        // every fence and busy mark is of an earlier epoch now
        self.passed.clear();
        self.frees_since_sync = false;
    }

    fn owns(&self, addr: u64) -> bool {
        self.blocks
            .get(addr)
            .is_some_and(|b| b.state == BState::Live)
    }

    fn contains(&self, addr: u64) -> bool {
        self.maps_by_va
            .range(..=addr)
            .next_back()
            .is_some_and(|(&va, &m)| addr < va + self.map(m).pages.len() as u64 * self.gran)
    }

    fn stats(&self) -> Stats {
        Stats {
            pending: self.pending_bytes,
            ..self.stats
        }
    }

    fn note_aside_hits(&mut self, dev: &mut dyn Device, n: u64) {
        Stitch::note_aside_hits(self, dev, n);
    }

    fn retire_stream(&mut self, dev: &mut dyn Device, stream: Stream) {
        Stitch::retire_stream(self, dev, stream);
    }

    fn round_end_watch(&self) -> u64 {
        Stitch::round_end_watch(self)
    }

    fn aside_below(&self) -> u64 {
        Stitch::aside_below(self)
    }

    fn aside_run(&self) -> u64 {
        Stitch::aside_run(self)
    }

    /// As the interposer decides: its caches are off when `VRAMSHIM_POOL_DEBUG` names any of
    /// the pool's switches (faults, `runs`, `kept`: their tests exercise the pool's own rules).
    /// With layers on they keep only blocks under a page (`Stitch::aside_below`) and those of
    /// a run of one large size the layer replay has no period for (`Stitch::aside_run`).
    fn thread_caches(&self) -> bool {
        self.tcaches
            && self.faults == Faults::default()
            && !self.grow_runs
            && !self.kept_on
            && self.shapes == Shapes::Pages
    }

    fn pinned_above_budget(&self) -> bool {
        self.ncached > 0
            && self.gran > 0
            && self.stats.reserved > self.limit_now
            && (self.stats.reserved <= self.release_keep() || !self.releasable_page())
    }

    fn reset(&mut self) {
        let stats = self.stats;
        let (faults, headroom, budget, runs, kept, layers, tcaches) = (
            self.faults,
            self.headroom,
            self.budget,
            self.grow_runs,
            self.kept_on,
            self.layers_on,
            self.tcaches,
        );
        let (grow, holds, shapes, guard) =
            (self.grow_on, self.holds_on, self.shapes, self.guard_on);
        *self = Stitch::new()
            .with_headroom(headroom)
            .with_budget(budget)
            .with_runs(runs)
            .with_kept(kept)
            .with_layers(layers)
            .with_layer_holds(holds)
            .with_grow(grow)
            .with_shapes(shapes)
            .with_shape_guard(guard)
            .with_thread_caches(tcaches);
        self.set_faults(faults);
        self.stats = Stats {
            reserved: 0,
            live: 0,
            mappings: 0,
            cached: 0,
            pending: 0,
            recent_peak_live: 0,
            budget: self.stats.budget,
            ..stats
        };
    }
}

impl Stitch {
    /// [`Policy::alloc`] for a request that [`Stitch::alloc_cached`] has just declined, with
    /// nothing changed since: the same decisions, without asking the fast path again (the
    /// interposer's sequence; it would decline again).
    pub fn alloc_missed(&mut self, dev: &mut dyn Device, req: Request) -> Result<Alloc, PoolError> {
        // with nothing live the decline may have been the round's end, which the general
        // path sees to first
        let ask = self.stats.live == 0;
        self.alloc_general(dev, req, ask)
    }

    fn alloc_general(
        &mut self,
        dev: &mut dyn Device,
        req: Request,
        ask_hit: bool,
    ) -> Result<Alloc, PoolError> {
        if let Some(e) = crate::refuse_oversized(&req, &self.stats) {
            return Err(e);
        }
        if self.stats.live == 0 && self.budget.is_some() {
            self.forget_layout(dev);
        }
        // set by the cache when it hands a block out during this allocation
        self.last_taken = None;
        if ask_hit && let Some(addr) = self.alloc_hit(req.size, req.stream) {
            return Ok(Alloc {
                addr,
                size: round_up(req.size.max(1), ALIGN),
            });
        }
        if self.gran == 0 {
            self.gran = dev.granularity();
        }
        // near the device's limit every window counts: the guard stands aside (see `guard`)
        self.guard_now = self.guard_on && self.roomy(dev, 0);
        let reserved_before = self.stats.reserved;
        let t = req.stream;
        let size = round_up(req.size.max(1), ALIGN);
        if self.guard_now && !self.guarded(size).is_empty() {
            self.guard_looks += 1;
        }
        if self.faults.reuse_sync_frees_early && !self.pending.is_empty() {
            self.epoch += 1;
            self.flush_pending();
        }
        if !self.pending.is_empty() && self.flushed_epoch != self.epoch {
            self.flush_pending();
        }
        // under a budget, the place this allocation had in the previous round comes first
        // (see `rounds`): a cached block taken instead would let the layout drift
        // (with layers on, every large allocation after its size's first is due here: within
        // one round, a repeated sequence of them takes the places of two periods before, see
        // `layers`); near the device's limit a block of more than a page takes no twin, no
        // layer's place and no held mapping: it is placed on page ends (see `ends`; the mask
        // is a cheap first look, pages being a power of two bytes, that `ends_due` makes
        // exact), unless its rank's place of the previous round is free (see `ends`, "Rounds
        // first")
        let g = self.gran;
        let ends =
            ((size > g && size & g.wrapping_sub(1) != 0) || self.near) && self.ends_due(dev, size);
        let replayed = if (!ends || !self.faults.ends_skip_rounds)
            && self.budget.is_some()
            && self.round_due(size)
        {
            match self.round_commit(dev, size, t, req.size)? {
                None if self.layers_on && !ends => self.layer_commit(dev, size, t, req.size)?,
                r => r,
            }
        } else {
            None
        };
        // a replayed place is served as the allocation of the previous round that made it
        // was: where enough cudaFree'd memory waits, one synchronization releases it (the
        // test below), so that the blocks the round frees come back to the cache at the
        // same points and its later hits take the same blocks (see `rounds`, "Hits")
        if replayed.is_some()
            && !self.faults.replay_skips_sync
            && self.pending_bytes > 0
            && self.pending_bytes >= self.pending_limit()
            && !dev.is_capturing()
        {
            let _ = self.do_sync(dev);
        }
        let mut hit = None;
        if replayed.is_none() && !ends {
            hit = self.cache_take(dev, size, t, req.size);
        }
        // above the budget a miss dissolves the cache it kept (see `miss_above_budget`); a
        // twin found there is served first, as the fast path serves it
        if hit.is_none()
            && replayed.is_none()
            && self.stats.reserved > self.limit_now
            && self.ncached > 0
        {
            self.miss_above_budget(dev);
        }
        if hit.is_none()
            && replayed.is_none()
            && !ends
            && self.pending_bytes > 0
            && self.pending_bytes >= self.pending_limit()
            && !dev.is_capturing()
            && self.do_sync(dev).is_ok()
        {
            // enough cudaFree'd memory waits for a synchronization: one sync releases it all
            // (instead of growing while it waits)
            hit = self.cache_take(dev, size, t, req.size);
        }
        let slot = match (replayed, hit) {
            (Some(slot), _) => Ok(slot),
            (None, Some(a)) => Ok(Slot::Hit(a)),
            (None, None) => match self.hold_ask.take() {
                Some((n, p)) if n == self.stats.allocs => {
                    self.alloc_held(dev, size, t, req.size, p)
                }
                _ => self.alloc_slow(dev, size, t, req.size),
            },
        };
        let addr = match slot {
            Ok(Slot::Hit(a)) => {
                self.stats.cache_hits += 1;
                if self.budget.is_some() {
                    self.note_round(size, a);
                    if self.layers_on {
                        self.note_layer(size, a);
                    }
                }
                a
            }
            slot => {
                let (map, off) = match slot {
                    Ok(Slot::Hit(_)) => unreachable!(),
                    Ok(Slot::New(m, o)) => (m, o),
                    Err(PoolError::OutOfMemory { why, .. }) => {
                        return Err(PoolError::OutOfMemory {
                            requested: req.size,
                            reserved: self.stats.reserved,
                            live: self.stats.live,
                            why,
                        });
                    }
                    Err(e) => return Err(e),
                };
                let addr = self.map(map).va + off;
                self.note_ghost(size, map, off);
                self.note_kept(size, map, off);
                let list = self.sizes.intern(size);
                self.blocks.insert(Block {
                    addr,
                    list,
                    size,
                    req: req.size,
                    map,
                    off,
                    stream: t,
                    state: BState::Live,
                    free_stream: t,
                    event: None,
                    epoch: 0,
                    seq: 0,
                });
                if self.budget.is_some() {
                    self.note_round(size, addr);
                    if self.layers_on {
                        self.note_layer(size, addr);
                    }
                }
                self.gc_mappings(dev);
                addr
            }
        };
        self.stats.allocs += 1;
        self.stats.add_live(req.size);
        if self.budget.is_some() {
            self.after_alloc_budget(dev, reserved_before);
        }
        Ok(Alloc { addr, size })
    }
}
