//! Call stacks: captured with libgcc's `_Unwind_Backtrace` (DWARF CFI, so it works for code
//! built without frame pointers), innermost frames inside libvramshim skipped, deduplicated
//! at capture through a fixed-size lock-free hash table that keeps every stack's frames and
//! compares them in full on a hash hit (no allocation, no lock; see [`lookup`]). Stacks
//! with Python frames merged in are interned apart, by their exact key (see [`MERGED`]).

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

use vramshim_trace::Event;

use super::stack_keys::StackKeys;
use crate::sys::spin::SpinLock;

/// Most frames `VRAMSHIM_STACKS` may ask for.
pub(crate) const MAX_FRAMES: usize = 64;

/// Captured return addresses, innermost first.
pub(crate) struct Frames {
    ips: [u64; MAX_FRAMES],
    len: usize,
}

impl Frames {
    pub(crate) fn as_slice(&self) -> &[u64] {
        &self.ips[..self.len]
    }
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[allow(non_camel_case_types)]
type _Unwind_Trace_Fn = extern "C" fn(ctx: *mut c_void, arg: *mut c_void) -> c_int;

unsafe extern "C" {
    // libgcc_s (linked by Rust's std on linux-gnu).
    fn _Unwind_Backtrace(trace: _Unwind_Trace_Fn, arg: *mut c_void) -> c_int;
    fn _Unwind_GetIP(ctx: *mut c_void) -> usize;
    fn _Unwind_GetCFA(ctx: *mut c_void) -> usize;
}

const URC_NO_REASON: c_int = 0;
const URC_NORMAL_STOP: c_int = 4;

struct Walk {
    frames: Frames,
    want: usize,
    /// Still inside libvramshim (innermost frames are skipped).
    skipping: bool,
    own: (u64, u64),
    /// CFA of the previous frame (0 before the first), and the last frame's IP.
    prev_cfa: u64,
    last_ip: u64,
    /// CFA of the second frame: the stack pointer of `capture_interned`'s caller.
    second_cfa: u64,
    /// Frames reported so far (the first is `capture_interned` itself: never kept, so the
    /// list is the one the fast walk, which starts at its caller, finds).
    seen: usize,
    /// The walk stopped because it had `want` frames (not at the end of the stack).
    full: bool,
}

impl Walk {
    /// A walk for up to `want` frames, skipping the innermost ones in `own` (libvramshim).
    /// Only data: the walk's first frame stays its caller's (see `seen`).
    #[inline(always)]
    fn new(want: usize, own: (u64, u64)) -> Walk {
        Walk {
            frames: Frames {
                ips: [0; MAX_FRAMES],
                len: 0,
            },
            want,
            skipping: true,
            own,
            prev_cfa: 0,
            last_ip: 0,
            second_cfa: 0,
            seen: 0,
            full: false,
        }
    }
}

extern "C" fn step(ctx: *mut c_void, arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the `Walk` passed to `_Unwind_Backtrace` by `capture`, alive for the
    // whole walk; `ctx` is the unwinder's context for this frame.
    let w = unsafe { &mut *(arg as *mut Walk) };
    // SAFETY: ctx is valid during the callback.
    let (ip, cfa) = unsafe { (_Unwind_GetIP(ctx) as u64, _Unwind_GetCFA(ctx) as u64) };
    if ip == 0 {
        return URC_NORMAL_STOP;
    }
    // libgcc reports each return address `ip` with the CFA it was found under (`ip` is stored
    // at `cfa - 8`; the code at `ip` runs with the stack pointer at `cfa`). The next frame's
    // CFA minus this one is the frame size of the function containing `ip`: learn it for the
    // fast walk, keyed by `ip`.
    if w.prev_cfa != 0 && cfa > w.prev_cfa {
        if w.second_cfa == 0 {
            w.second_cfa = cfa;
        }
        learn(w.last_ip, cfa - w.prev_cfa);
    }
    w.prev_cfa = cfa;
    w.last_ip = ip;
    w.seen += 1;
    if w.seen == 1 {
        return URC_NO_REASON;
    }
    if w.skipping {
        if ip >= w.own.0 && ip < w.own.1 {
            return URC_NO_REASON;
        }
        w.skipping = false;
    }
    w.frames.ips[w.frames.len] = ip;
    w.frames.len += 1;
    if w.frames.len >= w.want {
        w.full = true;
        URC_NORMAL_STOP
    } else {
        URC_NO_REASON
    }
}

static OWN_LO: AtomicU64 = AtomicU64::new(0);
static OWN_HI: AtomicU64 = AtomicU64::new(0);

fn own_range() -> (u64, u64) {
    let lo = OWN_LO.load(Ordering::Relaxed);
    if lo != 0 {
        return (lo, OWN_HI.load(Ordering::Relaxed));
    }
    let (lo, hi) = super::modules::text_range_of(step as *const () as u64).unwrap_or((1, 1));
    OWN_HI.store(hi, Ordering::Relaxed);
    OWN_LO.store(lo, Ordering::Relaxed);
    (lo, hi)
}

/// Test hook: skip no frame as libvramshim's own (a benchmark that links the tracer into its
/// own binary would otherwise skip all of its frames).
pub(crate) fn keep_own_frames() {
    OWN_HI.store(1, Ordering::Relaxed);
    OWN_LO.store(1, Ordering::Relaxed);
}

// ---- the fast walk: libgcc's answers cached per return address.
//
// For every IP libgcc has unwound, `OFFS` remembers CFA - SP (constant at a given IP for the
// usual rsp-based CFA rules), or `END` when the stack ended there. The fast walk follows the
// return addresses saved at CFA - 8, within the thread's stack bounds, and gives up (falls
// back to libgcc) at the first IP it does not know. Its result is only used when the same
// stack is already in the dedup table (i.e. libgcc produced it before), so a wrong rule
// (alloca, a frame pointer-based CFA) costs a fallback, never a wrong stack.

const OFF_BITS: u32 = 14;
const OFFS_N: usize = 1 << OFF_BITS;
const END: u32 = u32::MAX;
/// Entry `i`: return address at `2 i`, its rule at `2 i + 1` (one cache line for both).
static OFFS: [AtomicU64; 2 * OFFS_N] = [const { AtomicU64::new(0) }; 2 * OFFS_N];
/// `capture_interned`'s frame size: its caller's stack pointer minus its own (0 = not
/// learned yet). The fast walk starts there.
static OFF0: AtomicU64 = AtomicU64::new(0);

fn off_slot(ip: u64) -> usize {
    (ip.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - OFF_BITS)) as usize
}

fn learn(ip: u64, off: u64) {
    let off = if off >= END as u64 {
        return;
    } else {
        off as u32
    };
    store_rule(ip, off);
}

fn store_rule(ip: u64, off: u32) {
    let mut i = off_slot(ip);
    for _ in 0..8 {
        let cur = OFFS[2 * i].load(Ordering::Acquire);
        if cur == ip {
            // Keep the first rule; an END mark wins (it only comes from a completed walk).
            if off == END {
                OFFS[2 * i + 1].store(END as u64, Ordering::Release);
            }
            return;
        }
        if cur == 0 {
            // Value first, then key: a reader that sees the key sees a value (0 = unusable).
            OFFS[2 * i + 1].store(off as u64, Ordering::Release);
            if OFFS[2 * i]
                .compare_exchange(0, ip, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return;
            }
        }
        i = (i + 1) & (OFFS_N - 1);
    }
}

#[inline]
fn rule(ip: u64) -> Option<u32> {
    let mut i = off_slot(ip);
    for _ in 0..8 {
        let cur = OFFS[2 * i].load(Ordering::Acquire);
        if cur == ip {
            let v = OFFS[2 * i + 1].load(Ordering::Acquire) as u32;
            return (v != 0).then_some(v);
        }
        if cur == 0 {
            return None;
        }
        i = (i + 1) & (OFFS_N - 1);
    }
    None
}

thread_local! {
    // const-initialized, not Drop: this thread's stack bounds [lo, hi), 0 = not known yet.
    static STACK_LO: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    static STACK_HI: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// This thread's stack bounds (`pthread_getattr_np`, once per thread).
fn stack_bounds() -> Option<(u64, u64)> {
    let hi = STACK_HI.with(|c| c.get());
    if hi != 0 {
        return Some((STACK_LO.with(|c| c.get()), hi));
    }
    // SAFETY: attr is initialised by pthread_getattr_np and destroyed below; the out-pointers
    // are valid.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return None;
        }
        let mut addr: *mut c_void = std::ptr::null_mut();
        let mut size: usize = 0;
        let rc = libc::pthread_attr_getstack(&attr, &mut addr, &mut size);
        libc::pthread_attr_destroy(&mut attr);
        if rc != 0 || addr.is_null() || size == 0 {
            return None;
        }
        let lo = addr as u64;
        let hi = lo + size as u64;
        STACK_LO.with(|c| c.set(lo));
        STACK_HI.with(|c| c.set(hi));
        Some((lo, hi))
    }
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn stack_pointer() -> u64 {
    let sp: u64;
    // SAFETY: reads the stack pointer register; no memory access.
    unsafe {
        std::arch::asm!("mov {}, rsp", out(reg) sp, options(nomem, nostack, preserves_flags))
    };
    sp
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn stack_pointer() -> u64 {
    0
}

/// Most steps (own frames included) a fast walk follows: its loop bound.
const MAX_STEPS: usize = MAX_FRAMES + 16;

/// What a fast walk read: for every step, the stack slot (`cfa - 8`) and the return address
/// found there; the first `skip` steps are libvramshim's own frames.
struct Trail {
    slots: [u64; MAX_STEPS],
    ips: [u64; MAX_STEPS],
    n: usize,
    skip: usize,
}

impl Trail {
    fn frames(&self) -> &[u64] {
        &self.ips[self.skip..self.n]
    }
}

fn fast_walk(sp: u64, want: usize, own: (u64, u64), t: &mut Trail) -> Option<()> {
    if sp == 0 {
        return None;
    }
    let off0 = OFF0.load(Ordering::Relaxed);
    if off0 == 0 {
        return None;
    }
    let (lo, hi) = stack_bounds()?;
    if sp < lo || sp >= hi {
        return None; // on another stack (signal handler, coroutine): let libgcc do it
    }
    let mut skipping = true;
    let mut cfa = sp.checked_add(off0)?;
    for i in 0..MAX_STEPS {
        if cfa % 8 != 0 || cfa < sp + 8 || cfa > hi {
            return None;
        }
        // SAFETY: cfa - 8 lies within this thread's stack, between the current stack pointer
        // and the stack's top, which is mapped memory; aligned to 8.
        let ip = unsafe { std::ptr::read_volatile((cfa - 8) as *const u64) };
        if ip == 0 {
            return None;
        }
        t.slots[i] = cfa - 8;
        t.ips[i] = ip;
        t.n = i + 1;
        if skipping && ip >= own.0 && ip < own.1 {
            // still inside libvramshim
            t.skip = i + 1;
        } else {
            skipping = false;
            if t.n - t.skip >= want {
                return Some(());
            }
        }
        match rule(ip)? {
            END => return (t.n > t.skip).then_some(()),
            off => {
                let next = cfa.checked_add(off as u64)?;
                if next <= cfa {
                    return None;
                }
                cfa = next;
            }
        }
    }
    None
}

// ---- the per-thread cache of recent walks.
//
// A loop allocates from the same few places: the same stack pointer at `capture_interned`
// and the same return addresses in the same stack slots. A fast walk is a function of the
// stack pointer and the words it reads (the rules are fixed once learned), so when every
// slot of a remembered walk still holds the same return address, the walk would give the
// same frames, and the remembered stack id is the answer: ~20 independent loads instead of a
// dependent chain of loads and table probes, and no hashing. Exact by construction: every
// word the walk depended on is compared, and the id is the one the shared table (below) gave
// those frames after comparing them in full; nothing is matched by a hash here.

/// Walks remembered per thread.
const CACHED_WALKS: usize = 4;
/// Longest walk remembered (steps, own frames included).
const CACHE_STEPS: usize = 48;

#[derive(Clone, Copy)]
struct CachedWalk {
    sp: u64,
    want: usize,
    /// Steps (0 = empty entry).
    n: usize,
    id: u32,
    slots: [u64; CACHE_STEPS],
    ips: [u64; CACHE_STEPS],
}

struct WalkCache {
    ents: [CachedWalk; CACHED_WALKS],
    next: usize,
}

const EMPTY_WALK: CachedWalk = CachedWalk {
    sp: 0,
    want: 0,
    n: 0,
    id: 0,
    slots: [0; CACHE_STEPS],
    ips: [0; CACHE_STEPS],
};

thread_local! {
    // const-initialized, not Drop: no lazy init, no destructor.
    static WALKS: std::cell::RefCell<WalkCache> = const {
        std::cell::RefCell::new(WalkCache {
            ents: [EMPTY_WALK; CACHED_WALKS],
            next: 0,
        })
    };
}

/// The stack id of a remembered walk that the stack still matches.
#[inline]
fn cached(sp: u64, want: usize) -> Option<u32> {
    if FAULT_NO_CACHE.load(Ordering::Relaxed) {
        return None;
    }
    WALKS
        .try_with(|c| {
            // A signal handler's hook on this thread, inside ours: no cache.
            let c = c.try_borrow().ok()?;
            c.ents.iter().find_map(|e| {
                if e.n == 0 || e.sp != sp || e.want != want {
                    return None;
                }
                let mut diff = 0u64;
                for k in 0..e.n.min(CACHE_STEPS) {
                    // SAFETY: this thread's walk from this same stack pointer read these
                    // slots: they lie between the stack pointer and the top of this
                    // thread's stack (checked then; the stack is the same), aligned to 8.
                    diff |= unsafe { std::ptr::read_volatile(e.slots[k] as *const u64) } ^ e.ips[k];
                }
                (diff == 0).then_some(e.id)
            })
        })
        .ok()
        .flatten()
}

fn remember(sp: u64, want: usize, t: &Trail, id: u32) {
    if t.n > CACHE_STEPS {
        return;
    }
    let _ = WALKS.try_with(|c| {
        let Ok(mut c) = c.try_borrow_mut() else {
            return;
        };
        let i = c.next % CACHED_WALKS;
        c.next = c.next.wrapping_add(1);
        let e = &mut c.ents[i];
        e.sp = sp;
        e.want = want;
        e.id = id;
        e.n = t.n;
        e.slots[..t.n].copy_from_slice(&t.slots[..t.n]);
        e.ips[..t.n].copy_from_slice(&t.ips[..t.n]);
    });
}

/// Forget this thread's remembered walks (their ids mean nothing in a forked child's file).
fn forget_walks() {
    let _ = WALKS.try_with(|c| {
        if let Ok(mut c) = c.try_borrow_mut() {
            for e in c.ents.iter_mut() {
                e.n = 0;
            }
        }
    });
}

/// Fault switch (`VRAMSHIM_STACKS_FAULT=nocache`): every capture walks (benchmarks the walk).
static FAULT_NO_CACHE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub(crate) fn init() {
    FAULT_NO_CACHE.store(
        crate::config::switch_on("VRAMSHIM_STACKS_FAULT", "nocache"),
        Ordering::Relaxed,
    );
}

/// Up to `depth` return addresses of the caller, outside libvramshim, deduplicated: the stack's
/// id, and its frames when this is the stack's first appearance (write a `Stack` record).
/// `None` when no frame could be captured.
#[inline(never)]
pub(crate) fn capture_interned(depth: usize) -> Option<(u32, Option<Frames>)> {
    let sp = stack_pointer();
    let want = depth.clamp(1, MAX_FRAMES);
    if let Some(id) = cached(sp, want) {
        return Some((id, None));
    }
    let own = own_range();
    let mut t = Trail {
        slots: [0; MAX_STEPS],
        ips: [0; MAX_STEPS],
        n: 0,
        skip: 0,
    };
    if fast_walk(sp, want, own, &mut t).is_some()
        && let Some(id) = lookup(hash(t.frames()), t.frames())
    {
        remember(sp, want, &t, id);
        return Some((id, None));
    }
    let mut w = Walk::new(want, own);
    // SAFETY: `step` matches the callback ABI; `w` outlives the call.
    let rc = unsafe { _Unwind_Backtrace(step, &mut w as *mut Walk as *mut c_void) };
    // The walk ended by itself (end of stack, or libgcc found no unwind info past the last
    // frame, e.g. `_start`): nothing follows `last_ip`. (A walk our callback stopped returns
    // _URC_FATAL_PHASE1_ERROR, not NORMAL_STOP: `full` tells them apart. Marking the last
    // frame of a full walk as the end made every later fast walk through that return
    // address stop there, miss the table and fall back to libgcc.)
    if !w.full && rc != URC_NORMAL_STOP && w.last_ip != 0 {
        store_rule(w.last_ip, END);
    }
    if sp != 0 && w.second_cfa > sp && OFF0.load(Ordering::Relaxed) == 0 {
        OFF0.store(w.second_cfa - sp, Ordering::Relaxed);
    }
    if w.frames.is_empty() {
        return None;
    }
    let (id, is_new) = intern(&w.frames);
    Some((id, is_new.then_some(w.frames)))
}

/// [`capture_interned`] with the calling thread's Python frames merged in when it runs
/// Python code (`pyframes`): the stack's id, and the records to write before the event that
/// refers to it (new `PyCode`s, new `Stack`s; empty for a stack seen before).
#[inline(never)]
pub(crate) fn capture(depth: usize) -> Option<(u32, Vec<Event>)> {
    if !super::pyframes::active() {
        let (id, frames) = capture_interned(depth)?;
        return Some((
            id,
            frames
                .map(|f| vec![record(id, f.as_slice())])
                .unwrap_or_default(),
        ));
    }
    // The native walk first, from this frame: libgcc's unwinding of every frame between here
    // and the caller costs hundreds of instructions each, so none is added in between.
    let (nid, nframes) = capture_interned(depth)?;
    super::pyframes::with_walk(|py| capture_with(depth, py, nid, nframes))
}

/// [`capture`] with the calling thread's Python frames `py` and its native stack's id
/// `nid` (with its frames when that stack is new).
fn capture_with(
    depth: usize,
    py: &super::pyframes::PyWalk,
    nid: u32,
    nframes: Option<Frames>,
) -> Option<(u32, Vec<Event>)> {
    let mut records = Vec::new();
    if let Some(f) = &nframes {
        // The native stack on its own: later events of threads without Python may use it.
        records.push(record(nid, f.as_slice()));
    }
    if py.is_empty() {
        return Some((nid, records));
    }
    let h = py.hash() ^ (nid as u64).wrapping_mul(0xff51_afd7_ed55_8ccd);
    let same = |k: &[u64]| k.first() == Some(&(nid as u64)) && py.words_eq(&k[1..]);
    if let Some(id) = merged_get(h, same) {
        return Some((id, records));
    }
    let native = match nframes {
        Some(f) => f.as_slice().to_vec(),
        None => unwind(depth.clamp(1, MAX_FRAMES)).as_slice().to_vec(),
    };
    let merged = super::pyframes::merge(&native, py, &mut records);
    let (id, is_new) = merged_intern(h, same, || {
        std::iter::once(nid as u64).chain(py.words()).collect()
    });
    if is_new {
        records.push(record(id, &merged));
    }
    Some((id, records))
}

/// Merged stacks seen, by their exact key: the native stack's id, then the Python frames'
/// [`words`](super::pyframes::PyWalk::words) (which fix the merged frames). A hash alone
/// would give two different stacks whose hashes collide one id, and name one of them wrongly
/// in the trace. Behind the spin lock a forked child takes back ([`on_fork_child`]).
static MERGED: SpinLock<Option<Merged>> = SpinLock::new(None);

#[derive(Default)]
struct Merged {
    keys: StackKeys<u64>,
    /// Bytes the remembered keys take, about (bounds the table's memory).
    bytes: usize,
}

/// Most bytes of merged keys remembered; later new stacks get fresh ids, not remembered
/// (still correct, only not deduplicated, like a full native table).
const MERGED_BYTES: usize = 16 << 20;
/// Bytes counted per remembered key besides its words (map entry, bucket, allocation).
const MERGED_ENTRY_BYTES: usize = 64;

/// The id of the merged stack with hash `h` whose key `eq` accepts.
fn merged_get(h: u64, eq: impl Fn(&[u64]) -> bool) -> Option<u32> {
    MERGED.lock().as_ref()?.keys.get(h, eq)
}

/// The id of the merged stack with hash `h` whose key `eq` accepts, or a new id for the key
/// `key()` builds (which `eq` accepts), and whether it is new.
fn merged_intern(
    h: u64,
    eq: impl Fn(&[u64]) -> bool,
    key: impl FnOnce() -> Box<[u64]>,
) -> (u32, bool) {
    let mut g = MERGED.lock();
    let m = g.get_or_insert_with(Merged::default);
    // Another thread may have added it since `merged_get`.
    if let Some(id) = m.keys.get(h, eq) {
        return (id, false);
    }
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let key = key();
    let cost = key.len() * 8 + MERGED_ENTRY_BYTES;
    if m.bytes + cost <= MERGED_BYTES {
        m.bytes += cost;
        m.keys.insert(h, key, id);
    }
    (id, true)
}

fn record(id: u32, frames: &[u64]) -> Event {
    Event::Stack {
        id,
        frames: frames.to_vec(),
    }
}

/// A full libgcc walk of the caller's stack (libvramshim's frames skipped), not interned.
#[inline(never)]
fn unwind(want: usize) -> Frames {
    let mut w = Walk::new(want, own_range());
    // SAFETY: `step` matches the callback ABI; `w` outlives the call.
    unsafe { _Unwind_Backtrace(step, &mut w as *mut Walk as *mut c_void) };
    w.frames
}

// ---- the shared table of native stacks: hash -> id, lock-free, every key kept and compared.
//
// What is matched where: the per-thread cache above compares a walk's inputs exactly (the same
// stack pointer, the same return address in every stack slot the remembered walk read), so it
// stands for the frames that walk gave, and its id is the one this table gave those frames.
// This table finds a stack by its hash, then compares the frames in full against the key the
// slot keeps: two stacks whose hashes collide keep their own ids (a hash alone would name one
// of them wrongly in every post-mortem). The fast walk's frames are only used on such an
// exact hit, so a wrong fast walk costs a fallback to libgcc, never a wrong stack.

const TABLE_BITS: u32 = 16;
const TABLE: usize = 1 << TABLE_BITS;
const PROBES: usize = 32;

/// A slot's hash (0 = empty). Claimed first; the entry follows.
static HASHES: [AtomicU64; TABLE] = [const { AtomicU64::new(0) }; TABLE];
/// A slot's entry: `id << 32 | key offset << LEN_BITS | key length` (0 = its inserting
/// thread has not published it yet; ids start at 1, so a published entry is never 0).
static ENTRIES: [AtomicU64; TABLE] = [const { AtomicU64::new(0) }; TABLE];
static NEXT_ID: AtomicU32 = AtomicU32::new(1);

/// Bits of an entry that hold the key's length (at most [`MAX_FRAMES`]).
const LEN_BITS: u32 = 7;
/// Words of keys kept: 16 MiB, as for merged stacks. Past that, new stacks get fresh ids
/// without being remembered (still correct, only not deduplicated). Zero pages until used.
const KEY_WORDS: usize = (16 << 20) / 8;
/// The keys' frames, appended once (bump allocated) and never changed until a fork resets.
static KEYS: [AtomicU64; KEY_WORDS] = [const { AtomicU64::new(0) }; KEY_WORDS];
/// Words of [`KEYS`] handed out.
static KEYS_USED: AtomicUsize = AtomicUsize::new(0);

const _: () = assert!(MAX_FRAMES < 1 << LEN_BITS && KEY_WORDS <= 1 << (32 - LEN_BITS));

#[cfg(test)]
thread_local! {
    /// Test hook: every stack this thread hashes gets this hash (0 = the real one).
    static FORCED_HASH: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

fn hash(frames: &[u64]) -> u64 {
    #[cfg(test)]
    {
        let h = FORCED_HASH.with(|c| c.get());
        if h != 0 {
            return h;
        }
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ frames.len() as u64;
    for &f in frames {
        h = (h.rotate_left(5) ^ f).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    h ^= h >> 29;
    h | 1 // never 0 (0 = empty slot)
}

/// Whether the published entry `e`'s key is `frames`, word for word.
#[inline]
fn key_is(e: u64, frames: &[u64]) -> bool {
    let len = (e & ((1 << LEN_BITS) - 1)) as usize;
    let off = ((e as u32) >> LEN_BITS) as usize;
    if len != frames.len() || off + len > KEY_WORDS {
        return false;
    }
    // The words were stored before the entry was published (Release), and read after it
    // (Acquire): these loads see them.
    let mut diff = 0u64;
    for (k, &f) in KEYS[off..off + len].iter().zip(frames) {
        diff |= k.load(Ordering::Relaxed) ^ f;
    }
    diff == 0
}

/// The id of the already interned stack `frames` (hash `h`).
fn lookup(h: u64, frames: &[u64]) -> Option<u32> {
    let mut i = (h >> (64 - TABLE_BITS)) as usize;
    for _ in 0..PROBES {
        let cur = HASHES[i].load(Ordering::Acquire);
        if cur == 0 {
            return None;
        }
        if cur == h {
            let e = ENTRIES[i].load(Ordering::Acquire);
            if e == 0 {
                return None; // being inserted: a miss (the libgcc walk then waits for it)
            }
            if key_is(e, frames) {
                return Some((e >> 32) as u32);
            }
        }
        i = (i + 1) & (TABLE - 1);
    }
    None
}

/// Stack id for `frames`, and whether this is its first appearance (emit a `Stack` record).
pub(crate) fn intern(frames: &Frames) -> (u32, bool) {
    intern_key(hash(frames.as_slice()), frames.as_slice())
}

/// Stack id for the stack `frames` with hash `h` (never 0), and whether it is new.
fn intern_key(h: u64, frames: &[u64]) -> (u32, bool) {
    let mut i = (h >> (64 - TABLE_BITS)) as usize;
    // Where this key's words went, once stored (only when an empty slot is reached).
    let mut key: Option<u64> = None;
    for _ in 0..PROBES {
        let mut cur = HASHES[i].load(Ordering::Acquire);
        if cur == 0 {
            // Slots are only ever filled: an empty one ends the probe sequence, so the
            // stack is not in the table. Its key goes into the arena before the slot is
            // claimed, so that a reader who sees the hash only waits for the entry.
            let k = match key {
                Some(k) => k,
                None => match store_key(frames) {
                    Some(k) => *key.insert(k),
                    // Keys full: a fresh id, not remembered.
                    None => return (NEXT_ID.fetch_add(1, Ordering::Relaxed), true),
                },
            };
            match HASHES[i].compare_exchange(0, h, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
                    ENTRIES[i].store((id as u64) << 32 | k, Ordering::Release);
                    return (id, true);
                }
                // Another thread claimed it first: compare with its stack below. (Its key
                // may be this one: the words stored here are then left unused, which only
                // happens when two threads meet one new stack at once.)
                Err(other) => cur = other,
            }
        }
        if cur == h {
            let e = wait_entry(i);
            if key_is(e, frames) {
                return ((e >> 32) as u32, false);
            }
        }
        i = (i + 1) & (TABLE - 1);
    }
    // Table region full: still correct, just not deduplicated.
    (NEXT_ID.fetch_add(1, Ordering::Relaxed), true)
}

/// Copies `frames` into [`KEYS`]: their place as an entry's low bits, or `None` when the
/// keys' words are spent.
fn store_key(frames: &[u64]) -> Option<u64> {
    let len = frames.len();
    if len >= 1 << LEN_BITS {
        return None;
    }
    let off = KEYS_USED
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
            (u + len <= KEY_WORDS).then_some(u + len)
        })
        .ok()?;
    for (k, &f) in KEYS[off..off + len].iter().zip(frames) {
        k.store(f, Ordering::Relaxed);
    }
    Some(((off as u64) << LEN_BITS) | len as u64)
}

fn wait_entry(i: usize) -> u64 {
    // The inserting thread publishes the entry right after winning the slot.
    loop {
        let e = ENTRIES[i].load(Ordering::Acquire);
        if e != 0 {
            return e;
        }
        std::hint::spin_loop();
    }
}

/// Forked child: its file starts empty, so every stack must be written again.
pub(crate) fn on_fork_child() {
    if super::stack_depth() == 0 {
        return;
    }
    forget_walks();
    for (h, e) in HASHES.iter().zip(ENTRIES.iter()) {
        h.store(0, Ordering::Relaxed);
        e.store(0, Ordering::Relaxed);
    }
    KEYS_USED.store(0, Ordering::Relaxed);
    NEXT_ID.store(1, Ordering::Relaxed);
    // SAFETY: the atfork child handler: the process's only thread, holding no guard. The
    // parent's map (maybe half updated by a thread that held the lock) is never read or freed.
    std::mem::forget(unsafe { MERGED.reset_in_child() }.take());
    super::pyframes::on_fork_child();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two different merged stacks whose hashes collide keep their own ids; the same key
    /// finds its id again.
    #[test]
    fn merged_stacks_with_one_hash_keep_their_own_ids() {
        let h = 0x5eed_c011_1de5_0001;
        let a: &[u64] = &[7, 100, 3, 200, 5];
        let b: &[u64] = &[7, 100, 3, 200, 6];
        let (ia, new_a) = merged_intern(h, |k| k == a, || a.into());
        assert!(new_a);
        assert_eq!(merged_get(h, |k| k == b), None, "a hit needs the same key");
        let (ib, new_b) = merged_intern(h, |k| k == b, || b.into());
        assert!(new_b, "a colliding stack was taken for another");
        assert_ne!(ia, ib);
        assert_eq!(merged_intern(h, |k| k == a, || a.into()), (ia, false));
        assert_eq!(merged_get(h, |k| k == b), Some(ib));
    }

    /// Two different native stacks whose hashes collide keep their own ids; each finds its
    /// own id again, and a lookup needs the same frames, not only the same hash.
    #[test]
    fn native_stacks_with_one_hash_keep_their_own_ids() {
        let h = 0x5eed_c011_1de5_0003;
        let a: &[u64] = &[0x40_1000, 0x40_2000, 0x40_3000];
        let b: &[u64] = &[0x40_1000, 0x40_2000, 0x40_3008];
        let (ia, new_a) = intern_key(h, a);
        assert!(new_a);
        assert_eq!(lookup(h, b), None, "a hit needs the same frames");
        let (ib, new_b) = intern_key(h, b);
        assert!(new_b, "a colliding stack was taken for another");
        assert_ne!(ia, ib);
        assert_eq!(intern_key(h, a), (ia, false));
        assert_eq!(intern_key(h, b), (ib, false));
        assert_eq!(lookup(h, a), Some(ia));
        assert_eq!(lookup(h, b), Some(ib));
        assert_eq!(lookup(h, &a[..2]), None, "a prefix is another stack");
    }

    /// Threads interning the same new stacks at once, 300 hashes shared by 20 stacks each
    /// (within one probe sequence): every thread gets one id per stack, and different stacks
    /// different ids.
    #[test]
    fn concurrent_interning_of_colliding_stacks_agrees_on_ids() {
        const N: u64 = 6000;
        let key = |k: u64| [0x7f00_0000 + k, 0x7f10_0000, 0x7f20_0000 + k % 7];
        // Home slots 0xd0 apart: each hash's 20 stacks fill their own run of slots.
        let h = |k: u64| (0xd0 * (k % 300)) << 48 | 0x0de5_0101;
        let start = std::sync::Arc::new(std::sync::Barrier::new(4));
        let per_thread: Vec<Vec<u32>> = (0..4)
            .map(|_| {
                let start = start.clone();
                std::thread::spawn(move || {
                    start.wait();
                    // All in one order, so that they meet on every new stack.
                    (0..N).map(|k| intern_key(h(k), &key(k)).0).collect()
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|j| j.join().unwrap())
            .collect();
        for ids in &per_thread[1..] {
            assert_eq!(
                ids, &per_thread[0],
                "two threads got different ids for one stack"
            );
        }
        let mut distinct = per_thread[0].clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), N as usize, "two stacks share an id");
        for k in 0..N {
            assert_eq!(lookup(h(k), &key(k)), Some(per_thread[0][k as usize]));
        }
    }

    #[inline(never)]
    fn nest(depth: u32, want: usize, out: &mut Option<(u32, Option<Frames>)>) {
        if depth == 0 {
            *out = capture_interned(want);
        } else {
            nest(depth - 1, want, out);
        }
        std::hint::black_box(depth);
    }

    /// End to end through `capture_interned` (libgcc walk, fast walk, remembered walks):
    /// two call paths whose stacks are forced onto one hash get two ids, and each keeps its
    /// own on later captures.
    #[test]
    fn captured_stacks_with_one_hash_keep_their_own_ids() {
        keep_own_frames();
        std::thread::spawn(|| {
            FORCED_HASH.with(|c| c.set(0x5eed_c011_1de5_0005));
            let capture = |depth| {
                let mut out = None;
                nest(depth, MAX_FRAMES, &mut out);
                out.map(|(id, f)| (id, f.map(|f| f.as_slice().to_vec())))
                    .expect("a stack")
            };
            // One call site for every capture: the stacks differ only by `nest`'s depth.
            let got: Vec<_> = [2, 3, 2, 3, 2, 3].into_iter().map(capture).collect();
            let (ia, fa) = got[0].clone();
            let (ib, fb) = got[1].clone();
            let (fa, fb) = (fa.expect("new: frames"), fb.expect("new: frames"));
            assert_ne!(fa, fb);
            assert_ne!(
                ia, ib,
                "a different stack with the same hash was given its id"
            );
            for pair in got[2..].chunks(2) {
                assert_eq!(pair, [(ia, None), (ib, None)]);
            }
        })
        .join()
        .unwrap();
    }

    #[inline(never)]
    fn recurse(depth: u32, out: &mut Option<(u32, Option<Frames>)>) {
        if depth == 0 {
            *out = capture_interned(4);
        } else {
            recurse(depth - 1, out);
        }
        std::hint::black_box(depth);
    }

    /// A libgcc walk that stops at the wanted depth (the stack goes on) must not record its
    /// last return address as the end of the stack: fast walks through it would stop there.
    #[test]
    fn a_walk_stopped_at_the_wanted_depth_marks_no_end() {
        keep_own_frames();
        let mut out = None;
        recurse(12, &mut out);
        let (id, frames) = out.expect("a stack");
        let frames = frames.expect("first appearance: frames");
        assert_eq!(frames.as_slice().len(), 4);
        let last = *frames.as_slice().last().unwrap();
        assert_ne!(rule(last), Some(END), "the 4th frame was marked as the end");
        // And the same stack is found again without libgcc (fast walk or remembered walk).
        let mut again = None;
        recurse(12, &mut again);
        assert_eq!(again.map(|(i, f)| (i, f.is_none())), Some((id, true)));
    }
}
