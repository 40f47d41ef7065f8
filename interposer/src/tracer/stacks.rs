//! Call stacks: captured with libgcc's `_Unwind_Backtrace` (DWARF CFI, so it works for code
//! built without frame pointers), innermost frames inside libvramshim skipped, deduplicated
//! at capture through a fixed-size lock-free hash table (no allocation, no lock).

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Most frames `VRAMSHIM_STACKS` may ask for.
pub const MAX_FRAMES: usize = 64;

/// Captured return addresses, innermost first.
pub struct Frames {
    ips: [u64; MAX_FRAMES],
    len: usize,
}

impl Frames {
    pub fn as_slice(&self) -> &[u64] {
        &self.ips[..self.len]
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[allow(non_camel_case_types)]
type _Unwind_Trace_Fn = extern "C" fn(ctx: *mut c_void, arg: *mut c_void) -> c_int;

unsafe extern "C" {
    // libgcc_s (linked by Rust's std on linux-gnu).
    fn _Unwind_Backtrace(trace: _Unwind_Trace_Fn, arg: *mut c_void) -> c_int;
    fn _Unwind_GetIP(ctx: *mut c_void) -> usize;
}

const URC_NO_REASON: c_int = 0;
const URC_NORMAL_STOP: c_int = 4;

struct Walk {
    frames: Frames,
    want: usize,
    /// Still inside libvramshim (innermost frames are skipped).
    skipping: bool,
    own: (u64, u64),
}

extern "C" fn step(ctx: *mut c_void, arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the `Walk` passed to `_Unwind_Backtrace` by `capture`, alive for the
    // whole walk; `ctx` is the unwinder's context for this frame.
    let w = unsafe { &mut *(arg as *mut Walk) };
    // SAFETY: ctx is valid during the callback.
    let ip = unsafe { _Unwind_GetIP(ctx) } as u64;
    if ip == 0 {
        return URC_NORMAL_STOP;
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

/// Up to `depth` return addresses of the caller, outside libvramshim.
#[inline(never)]
pub fn capture(depth: usize) -> Frames {
    let mut w = Walk {
        frames: Frames {
            ips: [0; MAX_FRAMES],
            len: 0,
        },
        want: depth.clamp(1, MAX_FRAMES),
        skipping: true,
        own: own_range(),
    };
    // SAFETY: `step` matches the callback ABI; `w` outlives the call.
    unsafe { _Unwind_Backtrace(step, &mut w as *mut Walk as *mut c_void) };
    w.frames
}

const TABLE_BITS: u32 = 16;
const TABLE: usize = 1 << TABLE_BITS;
const PROBES: usize = 32;

static HASHES: [AtomicU64; TABLE] = [const { AtomicU64::new(0) }; TABLE];
static IDS: [AtomicU32; TABLE] = [const { AtomicU32::new(0) }; TABLE];
static NEXT_ID: AtomicU32 = AtomicU32::new(1);

fn hash(frames: &[u64]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ frames.len() as u64;
    for &f in frames {
        h = (h.rotate_left(5) ^ f).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    h ^= h >> 29;
    h | 1 // never 0 (0 = empty slot)
}

/// Stack id for `frames`, and whether this is its first appearance (emit a `Stack` record).
pub fn intern(frames: &Frames) -> (u32, bool) {
    let h = hash(frames.as_slice());
    let mut i = (h >> (64 - TABLE_BITS)) as usize;
    for _ in 0..PROBES {
        let cur = HASHES[i].load(Ordering::Acquire);
        if cur == h {
            return (wait_id(i), false);
        }
        if cur == 0 {
            match HASHES[i].compare_exchange(0, h, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
                    IDS[i].store(id, Ordering::Release);
                    return (id, true);
                }
                Err(other) if other == h => return (wait_id(i), false),
                Err(_) => {}
            }
        }
        i = (i + 1) & (TABLE - 1);
    }
    // Table region full: still correct, just not deduplicated.
    (NEXT_ID.fetch_add(1, Ordering::Relaxed), true)
}

fn wait_id(i: usize) -> u32 {
    // The inserting thread stores the id right after winning the slot.
    loop {
        let id = IDS[i].load(Ordering::Acquire);
        if id != 0 {
            return id;
        }
        std::hint::spin_loop();
    }
}

/// Forked child: its file starts empty, so every stack must be written again.
pub fn on_fork_child() {
    if super::stack_depth() == 0 {
        return;
    }
    for (h, id) in HASHES.iter().zip(IDS.iter()) {
        h.store(0, Ordering::Relaxed);
        id.store(0, Ordering::Relaxed);
    }
    NEXT_ID.store(1, Ordering::Relaxed);
}
