//! Tensor-level events from PyTorch's native caching allocator (`Torch`, `PyCode` and
//! `PyStack` records, docs/trace-format.md), for a job that was not changed.
//!
//! The Python startup hook that `vramshim run` puts in front of a traced Python program
//! (`analyzer/src/cmd/python/sitecustomize.py`) calls [`attach`] once the job has initialized CUDA
//! through `torch.cuda`. [`attach`] hands PyTorch's allocator a trace tracker (`attachAllocatorTraceTracker`, a C++ virtual
//! method that takes a `std::function<void(const TraceEntry&)>`):
//!
//! - The virtual slot is verified before it is called: the allocator object's vtable must be
//!   `NativeCachingAllocator`'s and the slot must hold that class's
//!   `attachAllocatorTraceTracker` (both local symbols, read from the library's `.symtab`);
//!   a wheel without `.symtab` is accepted only when its build-id is in [`VERIFIED`]. The
//!   `TraceEntry` layout is accepted for the PyTorch versions in [`LAYOUTS`]. Anything else:
//!   one line, no tracker, the trace stays at segment level. A wrong slot would crash the job.
//! - The tracker runs on the allocating thread under PyTorch's per-device allocator lock and
//!   never touches Python nor takes the GIL: it copies the entry's fields and the allocating
//!   thread's Python stack, then the event goes into the thread's trace buffer like every
//!   other event (streamed every 50 ms). The stack, by default, is read by `pyframes` from the
//!   thread's own interpreter frames (PyTorch calls the tracker whether or not its memory
//!   history is on, so the hook leaves that off: PyTorch's stack capture costs about a third
//!   of a training step's instructions); a new one is named at once, still without the GIL.
//!   When the entry carries a Python stack PyTorch captured (the job's own history, or the
//!   hook's when `pyframes` is off: [`ATTACHED_NEEDS_STACKS`]), a `torch::CapturedTraceback`
//!   recognized by its vtable, its frames' (code object, last instruction) pairs are copied
//!   instead; such a stack seen for the first time gets an id and a strong reference on the
//!   traceback object that is never dropped (so its code objects stay alive and their
//!   addresses cannot be reused by other code).
//! - [`drain`] (called by the hook's thread, with the GIL held, when [`wait`] returns because
//!   such a stack is new, at most 10 times a second, and at exit; the thread sleeps in
//!   [`wait`] without the GIL otherwise, so it never wakes while every stack is read by
//!   `pyframes`)
//!   names each new captured stack once through CPython's public API (`co_filename`, `co_qualname`,
//!   `PyCode_Addr2Line`) and writes `PyCode`/`PyStack` records. A stack's record may thus
//!   follow the first events that refer to it; readers resolve ids over the whole trace.
//!
//! `VRAMSHIM_TORCH_FAULT=drop` drops the tensor events (alloc and free), for the test that
//! shows the attribution depends on them.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_int, c_long, c_void};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};

use super::elf_syms::Elf;
use super::stack_keys::{self, Frame, StackKeys};
use crate::sys::setup::{Setup, SetupCell};
use crate::sys::spin::{SpinGuard, SpinLock};
use vramshim_trace::{Event, PyFrame, TorchOp, torch_action as act};

/// The allocator object pointer (`std::atomic<CUDAAllocator*>`), exported by libc10_cuda.so.
const ALLOCATOR_SYM: &CStr = c"_ZN3c104cuda20CUDACachingAllocator9allocatorE";
const NATIVE_PREFIX: &[u8] = b"_ZN3c104cuda20CUDACachingAllocator6Native22NativeCachingAllocator";
const ATTACH_NAME: &[u8] = b"27attachAllocatorTraceTrackerE";
const NATIVE_VTABLE: &[u8] =
    b"_ZTVN3c104cuda20CUDACachingAllocator6Native22NativeCachingAllocatorE";
/// `torch::CapturedTraceback`'s vtable (exported by libtorch_cpu.so).
const TRACEBACK_VTABLE: &CStr = c"_ZTVN5torch17CapturedTracebackE";

/// Wheels whose slot was checked against the symbol table (for copies stripped of
/// `.symtab`): libc10_cuda.so's GNU build-id, the virtual slot.
pub(crate) const VERIFIED: &[(&str, usize)] = &[
    // torch 2.15.0 (CUDA 13 build), checked against
    // NativeCachingAllocator::attachAllocatorTraceTracker in its .symtab.
    ("ad737ef98186840e3e3101d9321419122cd49754", 50),
    // torch 2.11.0+cu130, 2.12.1+cu130 (2.12.0's library is the same file) and 2.13.0+cu130
    // (the registry's x86-64 wheels), each checked the same way: the slot of the vtable whose
    // relocation points at that function.
    ("29dec3cf84422903fd1ea8ba24fa01f7c3de4214", 44),
    ("683ff1848b9f759fdb6049374ce8083f5d124a78", 46),
    ("cd671f1ea81ad5998caf4412a46a45ab3a936c6c", 48),
];

/// PyTorch versions (`major.minor`) whose `TraceEntry` layout was checked against their
/// headers: action (i32) at 0, device (i8) at 4, addr at 8, context (shared_ptr: object,
/// control block) at 16 and 24, stream at 32, size at 40; `CapturedTraceback`'s frame
/// vector (begin, end) at 8 and 16, 16 bytes per frame {code object, lasti: i32}.
///
/// - 2.15: checked against its headers and run (tests/workloads/pytorch).
/// - 2.14: its `c10::CachingDeviceAllocator::TraceEntry` differs from 2.15's only by a string
///   member after all of these (2.15 added `internal_metadata_`), and its
///   `torch/csrc/profiler/combined_traceback.h` is the same (compared on the 2.14.1+cu130
///   wheel's headers); its libc10_cuda.so keeps `.symtab`, so the slot is verified as for
///   2.15. Not run here (its CUDA libraries are not installed).
/// - 2.11, 2.12, 2.13: compared with 2.15 on the headers of the 2.11.0, 2.12.0, 2.12.1 and
///   2.13.0 wheels (+cu130). `TraceEntry` is in `c10/core/CachingDeviceAllocator.h` in each
///   (`c10/cuda/CUDACachingAllocator.h` takes it, and `AllocatorTraceTracker`, by `using`);
///   it differs from 2.15's only in what the tracker never reads: the action enum ends at
///   `OOM` (8; 2.15 appends `ANNOTATE`, 9) and the last member, `internal_metadata_`, is
///   absent (136 bytes, 2.15: 168). A program compiled against each version's headers
///   printed the offsets and sizes above and the actions 0 to 8, and asserted that
///   `AllocatorTraceTracker` is `std::function<void(const TraceEntry&)>`, that
///   `CUDAAllocator::attachAllocatorTraceTracker` takes one by value and that `allocator` is
///   `std::atomic<CUDAAllocator*>`. `combined_traceback.h` and `c10::GatheredContext` (only a
///   virtual destructor) are 2.15's, byte for byte. Each wheel's libc10_cuda.so keeps
///   `.symtab` with the allocator `Native::NativeCachingAllocator` (its vtable and
///   `attachAllocatorTraceTracker`), so the slot is verified at attach as for 2.15; it moved
///   (44, 46, 48; 2.15: 50). 2.11.0+cu130 was also run on the simulated GPU
///   (`scripts/gpu-torch-events.sh --sim`: attached at slot 44, tensors named by the training
///   script's lines); 2.12 and 2.13 were not.
pub(crate) const LAYOUTS: &[&str] = &["2.11", "2.12", "2.13", "2.14", "2.15"];

/// Innermost Python frames kept per stack.
pub(crate) const MAX_PY_FRAMES: usize = 128;
/// Distinct Python stacks interned; beyond, events carry no stack (one line says so).
const MAX_STACKS: usize = 1 << 16;

static ATTACHED: AtomicBool = AtomicBool::new(false);
/// Address a `CapturedTraceback`'s vptr holds (0: unknown, stacks are not read).
static TRACEBACK_VPTR: AtomicUsize = AtomicUsize::new(0);
/// `VRAMSHIM_TORCH_FAULT=drop`: tensor events are dropped.
static FAULT_DROP: AtomicBool = AtomicBool::new(false);
/// Captured stacks wait for [`drain`] (set with `State::pending` filled, under its lock).
static PENDING: AtomicBool = AtomicBool::new(false);
/// The thread that waits in [`wait`] for stacks to name (the hook's), woken by [`intern`].
static WAITER: OnceLock<std::thread::Thread> = OnceLock::new();

struct State {
    /// Live segments (device, start, size), sorted, from the tracker's own segment events
    /// (few, and changed rarely: a binary search finds a tensor's).
    segments: Vec<(i32, u64, u64)>,
    /// The indexes in `segments` of the two segments the last tensors were found in, the
    /// latest first (`usize::MAX` after segments were added or removed: none).
    recent: [usize; 2],
    /// Stacks PyTorch captured, by their frames' (code object, instruction offset).
    stacks: StackKeys,
    /// Stacks read by our own frame reader (`pyframes`), by
    /// [`super::pyframes::PyWalk::key_words`]; named when first seen, so they share no
    /// pending list.
    walks: StackKeys<u64>,
    /// Stack ids handed out so far (both tables share them).
    ids: u32,
    /// Stacks interned but not yet named by [`drain`].
    pending: Vec<(u32, Box<[Frame]>)>,
    full_said: bool,
}

impl State {
    /// Empty: built in place in [`STATE`] (no first-use check on the tracker's path).
    const fn new() -> Self {
        State {
            segments: Vec::new(),
            recent: [usize::MAX; 2],
            stacks: StackKeys::new(),
            walks: StackKeys::new(),
            ids: 0,
            pending: Vec::new(),
            full_said: false,
        }
    }
}

/// Behind the process's spin lock, not a `Mutex`: a thread of the parent may hold it at a
/// fork (inside the tracker, on any allocating thread), and a `Mutex` would stay locked in
/// the child for good: its first tensor event or [`drain`] would block forever. A forked
/// child takes it back ([`on_fork_child`]); a panic in the holder releases it.
static STATE: SpinLock<State> = SpinLock::new(State::new());
/// Code objects named so far (address -> PyCode id). Held for a whole [`drain`] and only
/// tried (a drain that finds another one running returns), so no thread ever waits on it
/// while attached to the interpreter.
static CODES: SpinLock<Option<HashMap<u64, u32>>> = SpinLock::new(None);

#[inline(always)]
fn state() -> SpinGuard<'static, State> {
    STATE.lock()
}

/// Forked child (the atfork child handler: its only thread, holding no guard): its trace
/// starts empty, so stacks and code objects are named again from the first id; the parent's
/// maps (maybe half updated by a thread that held the lock at the fork) are forgotten,
/// never read or freed. The segments go with them: a tensor event of the child in a segment
/// the parent mapped carries no segment.
pub(crate) fn on_fork_child() {
    // SAFETY: the child's only thread, holding no guard of either lock.
    let (st, codes) = unsafe { (STATE.reset_in_child(), CODES.reset_in_child()) };
    std::mem::forget(std::mem::replace(st, State::new()));
    std::mem::forget(codes.take());
    PENDING.store(false, Ordering::Relaxed);
    if API_FOUND.reset_in_child() {
        API.forget_in_child();
    }
}

// ---- libstdc++'s std::function<void(const TraceEntry&)>: {_Any_data, manager, invoker}.

#[repr(C)]
struct StdFunction {
    storage: [usize; 2],
    manager: ManagerFn,
    invoker: InvokerFn,
}
type ManagerFn = unsafe extern "C" fn(*mut [usize; 2], *const [usize; 2], c_int) -> bool;
type InvokerFn = unsafe extern "C" fn(*const [usize; 2], *const u8);
type AttachFn = unsafe extern "C" fn(*mut c_void, *mut StdFunction);

/// The functor is empty (all state is static): type info none, its pointer the storage,
/// clone a copy, destroy nothing (`_Manager_operation` 0..3).
unsafe extern "C" fn manager(dest: *mut [usize; 2], src: *const [usize; 2], op: c_int) -> bool {
    // SAFETY: libstdc++ passes two valid _Any_data (16 bytes each).
    unsafe {
        match op {
            0 => (*dest)[0] = 0,
            1 => (*dest)[0] = src as usize,
            2 => *dest = *src,
            _ => {}
        }
    }
    false
}

/// PyTorch's call of our tracker, one per allocator event. A tensor's allocation and
/// completed free (all but a few of the kept ones) go straight to their functions, as tail
/// calls: no register is saved here, and the free requests (FREE_REQUESTED, one a tensor:
/// the completed free follows) and snapshots, of which nothing is kept, leave after a few
/// compares. Each function it hands over to catches any panic (nothing may unwind into
/// PyTorch's C++) and checks that tracing is on; they are `extern "C"` (which cannot
/// unwind) so that this one needs no guard around their calls and can jump to them.
unsafe extern "C" fn invoker(_functor: *const [usize; 2], entry: *const u8) {
    if entry.is_null() {
        return;
    }
    let action = rd::<i32>(entry, 0);
    if action == act::ALLOC as i32 {
        return on_alloc(entry);
    }
    if action == act::FREE_COMPLETED as i32 {
        return on_free(entry);
    }
    if let Ok(action) = u8::try_from(action)
        && matches!(
            action,
            act::SEGMENT_ALLOC
                | act::SEGMENT_FREE
                | act::SEGMENT_MAP
                | act::SEGMENT_UNMAP
                | act::OOM
        )
    {
        on_other_entry(entry, action);
    }
}

#[inline]
fn rd<T: Copy>(p: *const u8, off: usize) -> T {
    // SAFETY: callers read fields of a TraceEntry (or CapturedTraceback) whose layout was
    // verified for this PyTorch version (LAYOUTS) at attach time.
    unsafe { std::ptr::read_unaligned(p.add(off) as *const T) }
}

/// A tensor's allocation (most of PyTorch's calls with a tensor's free, [`on_free`]): the
/// straight path, its segment and Python stack ([`tensor_alloc`]); the fault switch goes
/// to [`on_other`]. Not inlined into [`invoker`], so that a free request leaves before any
/// register is saved, and apart from [`on_free`], which then saves only what it uses.
#[inline(never)]
extern "C" fn on_alloc(e: *const u8) {
    if !super::enabled() {
        return;
    }
    // Nothing may unwind into PyTorch's C++.
    let _ = std::panic::catch_unwind(|| on_alloc_body(e));
}

#[inline(always)]
fn on_alloc_body(e: *const u8) {
    if FAULT_DROP.load(Ordering::Relaxed) {
        return on_other(e, act::ALLOC);
    }
    // A trace time (raw where the trace clock is the TSC): the writer converts it, like
    // every event's time.
    let t_ns = super::now_raw();
    let device = rd::<i8>(e, 4) as i32;
    let addr = rd::<u64>(e, 8);
    let stream = rd::<u64>(e, 32);
    let size = rd::<u64>(e, 40);
    let (segment, stack) = tensor_alloc(e, act::ALLOC, device, addr, size);
    // Tracing was found on at the entry ([`on_alloc`]): the buffer's own path, without
    // asking again.
    super::slots::emit_torch(&TorchOp {
        t_ns,
        tid: super::slots::OWN_THREAD,
        action: act::ALLOC,
        device,
        addr,
        size,
        stream,
        segment,
        stack,
    });
}

/// A tensor's completed free: its segment, no stack ([`on_alloc`]'s straight path).
#[inline(never)]
extern "C" fn on_free(e: *const u8) {
    if !super::enabled() {
        return;
    }
    // Nothing may unwind into PyTorch's C++.
    let _ = std::panic::catch_unwind(|| on_free_body(e));
}

#[inline(always)]
fn on_free_body(e: *const u8) {
    if FAULT_DROP.load(Ordering::Relaxed) {
        return on_other(e, act::FREE_COMPLETED);
    }
    let t_ns = super::now_raw();
    let device = rd::<i8>(e, 4) as i32;
    let addr = rd::<u64>(e, 8);
    let stream = rd::<u64>(e, 32);
    let size = rd::<u64>(e, 40);
    let segment = segment_locked(act::FREE_COMPLETED, device, addr, size);
    // Tracing was found on at the entry ([`on_free`]).
    super::slots::emit_torch(&TorchOp {
        t_ns,
        tid: super::slots::OWN_THREAD,
        action: act::FREE_COMPLETED,
        device,
        addr,
        size,
        stream,
        segment,
        stack: 0,
    });
}

/// [`on_other`] from [`invoker`].
#[cold]
#[inline(never)]
extern "C" fn on_other_entry(e: *const u8, action: u8) {
    if !super::enabled() {
        return;
    }
    // Nothing may unwind into PyTorch's C++.
    let _ = std::panic::catch_unwind(|| on_other(e, action));
}

/// A segment event or an OOM, and every entry while the fault switch drops tensor events.
#[cold]
#[inline(never)]
fn on_other(e: *const u8, action: u8) {
    let t_ns = super::now_raw();
    let device = rd::<i8>(e, 4) as i32;
    let addr = rd::<u64>(e, 8);
    let stream = rd::<u64>(e, 32);
    let size = rd::<u64>(e, 40);
    let dropped =
        FAULT_DROP.load(Ordering::Relaxed) && matches!(action, act::ALLOC | act::FREE_COMPLETED);
    let (segment, stack) = if action != act::OOM || dropped {
        // Frees and segment events: no stack.
        (segment_locked(action, device, addr, size), 0)
    } else {
        tensor_alloc(e, action, device, addr, size)
    };
    if dropped {
        return;
    }
    super::emit_torch(&TorchOp {
        t_ns,
        tid: super::slots::OWN_THREAD,
        action,
        device,
        addr,
        size,
        stream,
        segment,
        stack,
    });
}

/// [`segment_of`] under the state's lock.
#[inline(always)]
fn segment_locked(action: u8, device: i32, addr: u64, size: u64) -> u64 {
    segment_of(&mut state(), action, device, addr, size)
}

/// The segment and the Python stack of an allocation (or an OOM): the allocating thread's
/// own Python frames, read in place (this callback runs on it), or the stack PyTorch
/// captured for the entry when it carries one ([`with_captured`]).
#[inline(always)]
fn tensor_alloc(e: *const u8, action: u8, device: i32, addr: u64, size: u64) -> (u64, u32) {
    let ctx = rd::<usize>(e, 16);
    if ctx != 0 && TRACEBACK_VPTR.load(Ordering::Relaxed) != 0 {
        return with_captured(e, action, ctx, device, addr, size);
    }
    // No stack captured by PyTorch (its history off, or on without Python stacks).
    tensor_walk(action, device, addr, size)
}

/// [`tensor_alloc`] by the thread's own frames: a walk of their keys
/// ([`walk_keys`](super::pyframes::walk_keys)), the stack found by its key in the table,
/// and the segment, under one lock; a stack seen for the first time is named by
/// [`new_walk`], its records written (after the lock) before the event.
#[inline(always)]
fn tensor_walk(action: u8, device: i32, addr: u64, size: u64) -> (u64, u32) {
    let Some(mut w) = super::pyframes::walk_keys() else {
        return (segment_locked(action, device, addr, size), 0);
    };
    let mut g = state();
    let st = &mut *g;
    let segment = segment_of(st, action, device, addr, size);
    if w.is_empty() {
        return (segment, 0);
    }
    if let Some(id) = st.walks.get(w.key_hash(), |k| w.key_eq(k)) {
        return (segment, id);
    }
    let (stack, records) = new_walk(st, &mut w);
    drop(g);
    for r in records {
        super::emit(r);
    }
    (segment, stack)
}

/// [`tensor_alloc`] of an entry with a context: the Python stack PyTorch captured when the
/// context is one, else the thread's own frames.
#[cold]
#[inline(never)]
fn with_captured(
    e: *const u8,
    action: u8,
    ctx: usize,
    device: i32,
    addr: u64,
    size: u64,
) -> (u64, u32) {
    let Some(tb) = captured(ctx) else {
        return tensor_walk(action, device, addr, size);
    };
    let ctrl = rd::<usize>(e, 24);
    let h = tb.hash();
    let mut g = state();
    let st = &mut *g;
    (
        segment_of(st, action, device, addr, size),
        intern(st, h, &tb, ctrl),
    )
}

/// The segment an event concerns: the one it creates or frees, or the one a tensor lies in
/// (0 when none is known). A tensor's is looked for first in the two segments the last
/// tensors were found in (consecutive tensors mostly share one, or alternate between a
/// small and a large block's).
#[inline(always)]
fn segment_of(st: &mut State, action: u8, device: i32, addr: u64, size: u64) -> u64 {
    if matches!(action, act::ALLOC | act::FREE_COMPLETED) {
        let within = |i: usize| {
            st.segments
                .get(i)
                .filter(|&&(d, s, len)| d == device && s <= addr && addr - s < len)
                .map(|&(_, s, _)| s)
        };
        let [a, b] = st.recent;
        if let Some(s) = within(a) {
            return s;
        }
        if let Some(s) = within(b) {
            st.recent = [b, a];
            return s;
        }
    }
    segment_search(st, action, device, addr, size)
}

/// [`segment_of`] by a binary search (and the segment events' changes).
#[inline(never)]
fn segment_search(st: &mut State, action: u8, device: i32, addr: u64, size: u64) -> u64 {
    let segs = &mut st.segments;
    let at = segs.partition_point(|&(d, s, _)| (d, s) < (device, addr));
    let same = segs
        .get(at)
        .is_some_and(|&(d, s, _)| (d, s) == (device, addr));
    match action {
        act::SEGMENT_ALLOC | act::SEGMENT_MAP => {
            if same {
                segs[at].2 = size;
            } else {
                segs.insert(at, (device, addr, size));
                // The indexes after it moved.
                st.recent = [usize::MAX; 2];
            }
            addr
        }
        act::SEGMENT_FREE | act::SEGMENT_UNMAP => {
            if same {
                segs.remove(at);
                st.recent = [usize::MAX; 2];
            }
            addr
        }
        act::ALLOC | act::FREE_COMPLETED => {
            // The last segment starting at or below `addr`.
            let i = if same { Some(at) } else { at.checked_sub(1) };
            match i.filter(|&i| {
                let (d, s, len) = segs[i];
                d == device && addr - s < len
            }) {
                Some(i) => {
                    st.recent = [i, st.recent[0]];
                    segs[i].1
                }
                None => 0,
            }
        }
        _ => 0,
    }
}

/// The frames of a Python stack PyTorch captured (a `CapturedTraceback`), read in place:
/// 16 bytes per frame {code object, lasti: i32}, innermost first.
struct Captured {
    frames: *const u8,
    n: usize,
}

impl Captured {
    #[inline]
    fn frame(&self, i: usize) -> Frame {
        [
            rd::<u64>(self.frames, 16 * i),
            rd::<i32>(self.frames, 16 * i + 8) as u32 as u64,
        ]
    }

    fn hash(&self) -> u64 {
        let mut h: u64 = 0x8422_2325_cbf2_9ce4 ^ self.n as u64;
        for i in 0..self.n {
            let [code, lasti] = self.frame(i);
            h = stack_keys::mix(h, code);
            h = stack_keys::mix(h, lasti);
        }
        h
    }

    fn eq(&self, key: &[Frame]) -> bool {
        key.len() == self.n && key.iter().enumerate().all(|(i, k)| *k == self.frame(i))
    }

    fn key(&self) -> Box<[Frame]> {
        (0..self.n).map(|i| self.frame(i)).collect()
    }
}

/// The Python stack `ctx` holds, when it is a `CapturedTraceback` with frames (its
/// innermost [`MAX_PY_FRAMES`]).
fn captured(ctx: usize) -> Option<Captured> {
    let vptr = TRACEBACK_VPTR.load(Ordering::Relaxed);
    if ctx == 0 || vptr == 0 {
        return None;
    }
    let p = ctx as *const u8;
    if rd::<usize>(p, 0) != vptr {
        return None;
    }
    let (begin, end) = (rd::<usize>(p, 8), rd::<usize>(p, 16));
    if end <= begin || (end - begin) % 16 != 0 || begin == 0 {
        return None;
    }
    Some(Captured {
        frames: begin as *const u8,
        n: ((end - begin) / 16).min(MAX_PY_FRAMES),
    })
}

fn intern(st: &mut State, h: u64, tb: &Captured, ctrl: usize) -> u32 {
    if let Some(id) = st.stacks.get(h, |k| tb.eq(k)) {
        return id;
    }
    if st.ids as usize >= MAX_STACKS || ctrl == 0 {
        if !st.full_said && ctrl != 0 {
            st.full_said = true;
            crate::warn!(
                "{MAX_STACKS} distinct Python stacks recorded; later new stacks are not named"
            );
        }
        return 0;
    }
    // Keep the traceback (and so its code objects) alive for good: one more strong
    // reference on its control block (libstdc++'s _Sp_counted_base: use count at +8, an
    // atomic int under the default lock policy).
    // SAFETY: `ctrl` is the control block of the shared_ptr the TraceEntry holds, alive for
    // the duration of this callback.
    unsafe { (*((ctrl + 8) as *const AtomicI32)).fetch_add(1, Ordering::AcqRel) };
    st.ids += 1;
    let id = st.ids;
    let key = tb.key();
    st.stacks.insert(h, key.clone(), id);
    st.pending.push((id, key));
    if !PENDING.swap(true, Ordering::SeqCst) {
        // Pairs with the fence in `wait`.
        std::sync::atomic::fence(Ordering::SeqCst);
        if let Some(t) = WAITER.get() {
            // The hook's thread names it soon (a futex wake; never blocks).
            t.unpark();
        }
    }
    id
}

/// A stack our frame reader found that is in no table yet: its id, and its `PyCode` and
/// `PyStack` records to write. It is named now, since its code objects are alive only
/// while this thread runs them.
#[cold]
#[inline(never)]
fn new_walk(st: &mut State, walk: &mut super::pyframes::PyWalk) -> (u32, Vec<Event>) {
    let mut records = Vec::new();
    if st.ids as usize >= MAX_STACKS {
        if !st.full_said {
            st.full_said = true;
            crate::warn!(
                "{MAX_STACKS} distinct Python stacks recorded; later new stacks are not named"
            );
        }
        return (0, records);
    }
    let h = walk.key_hash();
    let key = walk.key_words();
    let Some(frames) = super::pyframes::py_frames(walk, &mut records) else {
        return (0, records);
    };
    st.ids += 1;
    let id = st.ids;
    st.walks.insert(h, key, id);
    records.push(Event::PyStack { id, frames });
    (id, records)
}

// ---- attach

/// Outcome of [`attach`], as the C entry point returns it.
pub(crate) const ATTACHED_OK: c_int = 0;
pub(crate) const NOT_TRACING: c_int = 1;
pub(crate) const REFUSED: c_int = -1;
/// Attached, but our own Python frame reader is off (`VRAMSHIM_PY_STACKS=0`, or this Python
/// is not one it reads): the hook switches on PyTorch's capture of Python stacks instead.
pub(crate) const ATTACHED_NEEDS_STACKS: c_int = 2;

struct Lib {
    path: String,
    base: u64,
}

fn find_lib(suffix: &str) -> Option<Lib> {
    struct Find<'a> {
        suffix: &'a str,
        found: Option<Lib>,
    }
    extern "C" fn visit(info: *mut libc::dl_phdr_info, _size: usize, arg: *mut c_void) -> c_int {
        // SAFETY: arg is the Find passed below; info is valid during the callback.
        let (f, info) = unsafe { (&mut *(arg as *mut Find), &*info) };
        if info.dlpi_name.is_null() {
            return 0;
        }
        // SAFETY: dlpi_name is a NUL-terminated string owned by the loader.
        let name = unsafe { CStr::from_ptr(info.dlpi_name) }.to_string_lossy();
        if name.ends_with(f.suffix) {
            f.found = Some(Lib {
                path: name.into_owned(),
                base: info.dlpi_addr,
            });
            return 1;
        }
        0
    }
    let mut f = Find {
        suffix,
        found: None,
    };
    // SAFETY: the callback only reads the loader's entries; `f` outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), &mut f as *mut Find as *mut c_void) };
    f.found
}

/// `dlsym` of `name` in the already-loaded library at `path` (never loads it).
fn sym_in(path: &str, name: &CStr) -> usize {
    let Ok(c) = CString::new(path) else { return 0 };
    // SAFETY: a NUL-terminated path; RTLD_NOLOAD only finds an object already loaded.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
    if h.is_null() {
        return 0;
    }
    let p = crate::cuda::real::dlsym_real(h, name) as usize;
    // SAFETY: balances the reference RTLD_NOLOAD took; the library stays loaded.
    unsafe { libc::dlclose(h) };
    p
}

fn refuse(why: &str) -> c_int {
    crate::warn!("PyTorch tensor-level events off ({why}); the trace stays at segment level");
    REFUSED
}

/// Attaches the trace tracker to PyTorch's caching allocator (see the module comment).
/// `version` is `torch.__version__`.
pub(crate) fn attach(version: &str) -> c_int {
    if !super::enabled() {
        return NOT_TRACING;
    }
    if ATTACHED.load(Ordering::Acquire) {
        return if super::pyframes::active() {
            ATTACHED_OK
        } else {
            ATTACHED_NEEDS_STACKS
        };
    }
    if crate::config::switch_on("VRAMSHIM_TORCH_FAULT", "drop") {
        FAULT_DROP.store(true, Ordering::Relaxed);
    }
    if !layout_checked(version) {
        return refuse(&format!(
            "PyTorch {version}: its allocator's trace entries are checked for {} only",
            LAYOUTS.join(", ")
        ));
    }
    if !cfg!(all(target_os = "linux", target_pointer_width = "64")) {
        return refuse("64-bit Linux only");
    }
    let Some(lib) = find_lib("/libc10_cuda.so") else {
        return refuse("libc10_cuda.so is not loaded");
    };
    let sym = sym_in(&lib.path, ALLOCATOR_SYM);
    if sym == 0 {
        return refuse("libc10_cuda.so exports no allocator");
    }
    // SAFETY: `sym` is the address of `std::atomic<CUDAAllocator*>` in libc10_cuda.so.
    let obj = unsafe { (*(sym as *const AtomicUsize)).load(Ordering::Acquire) };
    if obj == 0 {
        return refuse("the CUDA allocator is not set up yet");
    }
    // SAFETY: a polymorphic C++ object starts with its vptr.
    let vptr = unsafe { *(obj as *const usize) };
    let Some(elf) = Elf::open(&lib.path) else {
        return refuse("libc10_cuda.so cannot be read");
    };
    let slot = match (
        elf.find_symbol(|n| n == NATIVE_VTABLE),
        elf.find_symbol(|n| n.starts_with(NATIVE_PREFIX) && has(n, ATTACH_NAME)),
    ) {
        (Some(vt), Some(f)) => {
            let start = lib.base.wrapping_add(vt.value);
            if vptr as u64 != start + 16 {
                return refuse("the CUDA allocator is not PyTorch's native caching allocator");
            }
            let want = lib.base.wrapping_add(f.value) as usize;
            let n = (vt.size.saturating_sub(16) / 8) as usize;
            // SAFETY: the vtable object spans `vt.size` bytes from `start`; its slots follow
            // the offset-to-top and type-info words.
            let found = (0..n).find(|&i| unsafe { *((vptr + 8 * i) as *const usize) } == want);
            match found {
                Some(i) => i,
                None => return refuse("attachAllocatorTraceTracker is in no slot of its vtable"),
            }
        }
        _ => {
            let id = elf.build_id().unwrap_or_default();
            match VERIFIED.iter().find(|(b, _)| *b == id) {
                Some(&(_, slot)) => slot,
                None => {
                    return refuse(
                        "libc10_cuda.so has no symbol table and its build is not a verified one",
                    );
                }
            }
        }
    };
    // The Python stacks PyTorch captures: read only from objects with this vptr.
    let tb = find_lib("/libtorch_cpu.so").map_or(0, |l| sym_in(&l.path, TRACEBACK_VTABLE));
    if tb == 0 {
        crate::warn!("PyTorch's traceback type not found: tensor events carry no Python stack");
    } else {
        TRACEBACK_VPTR.store(tb + 16, Ordering::Relaxed);
    }
    let mut f = StdFunction {
        storage: [0; 2],
        manager,
        invoker,
    };
    // SAFETY: `slot` holds NativeCachingAllocator::attachAllocatorTraceTracker, verified
    // above; a by-value std::function is passed as a pointer to a temporary the caller owns
    // (Itanium C++ ABI), which the callee moves from. Our functor has nothing to destroy.
    unsafe {
        let fp = *((vptr + 8 * slot) as *const usize);
        let call: AttachFn = std::mem::transmute::<usize, AttachFn>(fp);
        call(obj as *mut c_void, &mut f);
    }
    ATTACHED.store(true, Ordering::Release);
    crate::info!("PyTorch {version}: tensor-level events on (allocator slot {slot})");
    if super::pyframes::active() {
        ATTACHED_OK
    } else {
        ATTACHED_NEEDS_STACKS
    }
}

/// Whether `version` (`torch.__version__`: "2.11.0+cu130", "2.13.0a0+git1234") is of a
/// `major.minor` in [`LAYOUTS`].
fn layout_checked(version: &str) -> bool {
    let mm: String = version
        .split('.')
        .take(2)
        .map(|p| p.trim_end_matches(|c: char| !c.is_ascii_digit()))
        .collect::<Vec<_>>()
        .join(".");
    LAYOUTS.contains(&mm.as_str())
}

fn has(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

// ---- drain: name new stacks, with the GIL held.

type GilCheckFn = unsafe extern "C" fn() -> c_int;
type GetAttrFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;
type AsUtf8Fn = unsafe extern "C" fn(*mut c_void, *mut isize) -> *const c_char;
type AsLongFn = unsafe extern "C" fn(*mut c_void) -> c_long;
type Addr2LineFn = unsafe extern "C" fn(*mut c_void, c_int) -> c_int;
type DecRefFn = unsafe extern "C" fn(*mut c_void);
type ErrClearFn = unsafe extern "C" fn();

struct PyApi {
    gil_check: GilCheckFn,
    getattr: GetAttrFn,
    as_utf8: AsUtf8Fn,
    as_long: AsLongFn,
    addr2line: Addr2LineFn,
    decref: DecRefFn,
    err_clear: ErrClearFn,
}

/// CPython's API, found on first use by one thread ([`py_api`]). Not a `OnceLock`: a child
/// forked while another thread was finding it would wait for that thread forever on its first
/// [`drain`] (the atexit one of a forked Python child); it looks again instead
/// ([`on_fork_child`]).
static API_FOUND: Setup = Setup::new();
static API: SetupCell<PyApi> = SetupCell::new();

fn py_api() -> Option<&'static PyApi> {
    if API_FOUND.answer(|| API_FOUND.run(find_and_keep_api)) {
        API.get()
    } else {
        None
    }
}

/// The set-up of [`API_FOUND`]: whether CPython's API is there.
fn find_and_keep_api() -> bool {
    find_py_api().is_some_and(|a| API.set(a).is_ok())
}

fn find_py_api() -> Option<PyApi> {
    let get = |n: &CStr| {
        let p = crate::cuda::real::dlsym_real(libc::RTLD_DEFAULT, n);
        (!p.is_null()).then_some(p as usize)
    };
    // SAFETY: each address is CPython's public function of that name, with that signature.
    unsafe {
        Some(PyApi {
            gil_check: std::mem::transmute::<usize, GilCheckFn>(get(c"PyGILState_Check")?),
            getattr: std::mem::transmute::<usize, GetAttrFn>(get(c"PyObject_GetAttrString")?),
            as_utf8: std::mem::transmute::<usize, AsUtf8Fn>(get(c"PyUnicode_AsUTF8AndSize")?),
            as_long: std::mem::transmute::<usize, AsLongFn>(get(c"PyLong_AsLong")?),
            addr2line: std::mem::transmute::<usize, Addr2LineFn>(get(c"PyCode_Addr2Line")?),
            decref: std::mem::transmute::<usize, DecRefFn>(get(c"Py_DecRef")?),
            err_clear: std::mem::transmute::<usize, ErrClearFn>(get(c"PyErr_Clear")?),
        })
    }
}

impl PyApi {
    /// `obj.<name>` as text (None on any error, which is cleared).
    fn attr_str(&self, obj: *mut c_void, name: &CStr) -> Option<String> {
        // SAFETY: GIL held (checked by `drain`); obj is a live code object; every new
        // reference is released.
        unsafe {
            let o = (self.getattr)(obj, name.as_ptr());
            if o.is_null() {
                (self.err_clear)();
                return None;
            }
            let mut n: isize = 0;
            let p = (self.as_utf8)(o, &mut n);
            let s = if p.is_null() || n < 0 {
                (self.err_clear)();
                None
            } else {
                let b = std::slice::from_raw_parts(p as *const u8, n as usize);
                Some(String::from_utf8_lossy(b).into_owned())
            };
            (self.decref)(o);
            s
        }
    }

    fn attr_int(&self, obj: *mut c_void, name: &CStr) -> c_long {
        // SAFETY: as in attr_str.
        unsafe {
            let o = (self.getattr)(obj, name.as_ptr());
            if o.is_null() {
                (self.err_clear)();
                return 0;
            }
            let v = (self.as_long)(o);
            if v == -1 {
                (self.err_clear)();
            }
            (self.decref)(o);
            v
        }
    }
}

/// Waits until captured stacks wait to be named (returns 1), at most `timeout_ms` (< 0: no
/// limit; returns 0 when it ran out). Called by the hook's thread without the GIL, so that
/// it runs [`drain`] only when there is work: nothing wakes it while every stack is named
/// at once (`pyframes`); [`intern`] wakes it when PyTorch captured a new one.
pub(crate) fn wait(timeout_ms: c_int) -> c_int {
    let me = std::thread::current();
    let registered = WAITER.get_or_init(|| me.clone()).id() == me.id();
    // Pairs with the fence in `intern`: either that thread sees this waiter, or this one
    // sees its PENDING.
    std::sync::atomic::fence(Ordering::SeqCst);
    let deadline = u64::try_from(timeout_ms)
        .ok()
        .map(|ms| std::time::Instant::now() + std::time::Duration::from_millis(ms));
    loop {
        if PENDING.load(Ordering::Acquire) {
            return 1;
        }
        let left = match deadline {
            Some(d) => match d.checked_duration_since(std::time::Instant::now()) {
                Some(left) if !left.is_zero() => Some(left),
                _ => return 0,
            },
            None => None,
        };
        match (registered, left) {
            // An unpark that came before the park makes it return at once: none is lost.
            (true, None) => std::thread::park(),
            (true, Some(left)) => std::thread::park_timeout(left),
            // Another thread waiting too (never the hook's case): it polls.
            (false, left) => {
                std::thread::sleep(left.map_or(std::time::Duration::from_millis(100), |l| {
                    l.min(std::time::Duration::from_millis(100))
                }))
            }
        }
    }
}

/// Names the stacks interned since the last call and writes their records. Must be called
/// with the GIL held (returns -1 without doing anything otherwise, when there is something
/// to name); returns how many stacks were named.
pub(crate) fn drain() -> c_int {
    if !ATTACHED.load(Ordering::Acquire) || !PENDING.load(Ordering::Acquire) {
        return 0;
    }
    let Some(api) = py_api() else {
        return -1;
    };
    // SAFETY: PyGILState_Check takes no argument and is safe to call from any thread.
    if unsafe { (api.gil_check)() } != 1 {
        return -1;
    }
    let Some(mut codes) = CODES.lock_within(1) else {
        return 0;
    };
    let codes = codes.get_or_insert_with(HashMap::new);
    let pending = {
        let mut g = state();
        PENDING.store(false, Ordering::Release);
        std::mem::take(&mut g.pending)
    };
    let n = pending.len();
    for (id, key) in pending {
        let mut frames = Vec::with_capacity(key.len());
        for k in key {
            let (code, lasti) = (k[0], super::pyframes::key_lasti(&k));
            let cid = *codes.entry(code).or_insert_with(|| {
                // Ids shared with the Python frames of native stacks.
                let next = super::pyframes::next_code_id();
                let o = code as *mut c_void;
                let function = api
                    .attr_str(o, c"co_qualname")
                    .or_else(|| api.attr_str(o, c"co_name"))
                    .unwrap_or_default();
                super::emit(Event::PyCode {
                    id: next,
                    file: api.attr_str(o, c"co_filename").unwrap_or_default(),
                    function,
                    first_line: api.attr_int(o, c"co_firstlineno").max(0) as u32,
                });
                next
            });
            // SAFETY: GIL held; the code object is alive (its traceback is kept).
            let line = unsafe { (api.addr2line)(code as *mut c_void, lasti) };
            frames.push(PyFrame {
                code: cid,
                line: line.max(0) as u32,
            });
        }
        super::emit(Event::PyStack { id, frames });
    }
    n as c_int
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The versions whose layout was compared are accepted, whatever their patch level and
    /// build suffix; older ones, and versions that only share a prefix with one, are not.
    #[test]
    fn layouts_accept_the_checked_versions_only() {
        for v in [
            "2.11.0+cu130",
            "2.11.0",
            "2.12.0+cu130",
            "2.12.1+cu130",
            "2.13.0+cu130",
            "2.13.0a0+git1234abc",
            "2.14.1+cu130",
            "2.15.0+cu132",
        ] {
            assert!(layout_checked(v), "{v} refused");
        }
        for v in [
            "2.10.0+cu128",
            "2.10",
            "2.1.0",
            "2.1",
            "1.13.1",
            "2.9.1",
            "2.16.0",
            "2.110.0",
            "12.11.0",
            "3.0.0",
            "2",
            "",
            "torch",
        ] {
            assert!(!layout_checked(v), "{v} accepted");
        }
    }

    /// Each build verified without a symbol table names one build-id (40 hex digits) once.
    #[test]
    fn verified_builds_are_distinct_build_ids() {
        let mut seen = std::collections::HashSet::new();
        for &(id, slot) in VERIFIED {
            assert!(
                id.len() == 40 && id.bytes().all(|b| b.is_ascii_hexdigit()),
                "{id}"
            );
            assert!(seen.insert(id), "{id} listed twice");
            assert!(slot > 2, "{id}: slot {slot} is not a virtual method's");
        }
    }

    #[test]
    fn tensors_are_found_in_their_segments() {
        let mut st = State::new();
        let seg = |st: &mut State, a, d, at, n| segment_of(st, a, d, at, n);
        assert_eq!(seg(&mut st, act::SEGMENT_ALLOC, 0, 0x2000, 0x1000), 0x2000);
        assert_eq!(seg(&mut st, act::SEGMENT_ALLOC, 0, 0x8000, 0x1000), 0x8000);
        assert_eq!(seg(&mut st, act::SEGMENT_ALLOC, 1, 0x2000, 0x4000), 0x2000);
        // Start, middle, just past the end, below every segment, another device.
        assert_eq!(seg(&mut st, act::ALLOC, 0, 0x2000, 16), 0x2000);
        assert_eq!(seg(&mut st, act::ALLOC, 0, 0x2800, 16), 0x2000);
        assert_eq!(seg(&mut st, act::ALLOC, 0, 0x3000, 16), 0);
        assert_eq!(seg(&mut st, act::FREE_COMPLETED, 0, 0x1000, 16), 0);
        assert_eq!(seg(&mut st, act::ALLOC, 1, 0x5000, 16), 0x2000);
        assert_eq!(seg(&mut st, act::ALLOC, 0, 0x8fff, 1), 0x8000);
        assert_eq!(seg(&mut st, act::SEGMENT_FREE, 0, 0x2000, 0x1000), 0x2000);
        assert_eq!(seg(&mut st, act::ALLOC, 0, 0x2800, 16), 0);
        assert_eq!(seg(&mut st, act::ALLOC, 1, 0x2800, 16), 0x2000);
        assert_eq!(st.segments, vec![(0, 0x8000, 0x1000), (1, 0x2000, 0x4000)]);
    }

    /// The segments the last tensors were found in are tried first: what they answer is
    /// what the search answers, as tensors come and go, segments are added before and after
    /// them, resized and freed.
    #[test]
    fn recent_segments_answer_as_the_search() {
        let mut st = State::new();
        let seg = |st: &mut State, a, d, at, n| segment_of(st, a, d, at, n);
        assert_eq!(seg(&mut st, act::SEGMENT_ALLOC, 0, 0x2000, 0x1000), 0x2000);
        assert_eq!(seg(&mut st, act::SEGMENT_ALLOC, 0, 0x8000, 0x1000), 0x8000);
        // Alternating between two segments, then a third, on the same device.
        for _ in 0..3 {
            assert_eq!(seg(&mut st, act::ALLOC, 0, 0x2100, 16), 0x2000);
            assert_eq!(seg(&mut st, act::ALLOC, 0, 0x8100, 16), 0x8000);
        }
        // Just past the recent ones' ends, below them, on another device: none.
        assert_eq!(seg(&mut st, act::ALLOC, 0, 0x3000, 16), 0);
        assert_eq!(seg(&mut st, act::ALLOC, 0, 0x9000, 16), 0);
        assert_eq!(seg(&mut st, act::FREE_COMPLETED, 0, 0x1fff, 16), 0);
        assert_eq!(seg(&mut st, act::ALLOC, 1, 0x2100, 16), 0);
        // A segment added before both: the recent indexes moved.
        assert_eq!(seg(&mut st, act::SEGMENT_ALLOC, 0, 0x1000, 0x800), 0x1000);
        assert_eq!(seg(&mut st, act::ALLOC, 0, 0x8100, 16), 0x8000);
        assert_eq!(seg(&mut st, act::ALLOC, 0, 0x1100, 16), 0x1000);
        assert_eq!(seg(&mut st, act::ALLOC, 0, 0x2100, 16), 0x2000);
        // A recent segment grown in place, then freed: its tensors' addresses are in none.
        assert_eq!(seg(&mut st, act::SEGMENT_ALLOC, 0, 0x2000, 0x2000), 0x2000);
        assert_eq!(seg(&mut st, act::ALLOC, 0, 0x3100, 16), 0x2000);
        assert_eq!(seg(&mut st, act::SEGMENT_FREE, 0, 0x2000, 0x2000), 0x2000);
        assert_eq!(seg(&mut st, act::FREE_COMPLETED, 0, 0x2100, 16), 0);
        assert_eq!(seg(&mut st, act::ALLOC, 0, 0x3100, 16), 0);
        assert_eq!(seg(&mut st, act::ALLOC, 0, 0x8100, 16), 0x8000);
        assert_eq!(seg(&mut st, act::ALLOC, 0, 0x1100, 16), 0x1000);
        // A segment mapped over a freed one's place, on the recent segments' device.
        assert_eq!(seg(&mut st, act::SEGMENT_MAP, 0, 0x2000, 0x200), 0x2000);
        assert_eq!(seg(&mut st, act::ALLOC, 0, 0x2100, 16), 0x2000);
        assert_eq!(seg(&mut st, act::ALLOC, 0, 0x2200, 16), 0);
    }

    /// A fork while another thread is finding CPython's API (inside its set-up): the child,
    /// where that thread does not exist, looks for it itself instead of waiting forever.
    #[test]
    fn a_forked_child_finds_the_python_api_itself() {
        let (code, found) =
            crate::sys::setup::fork_during_setup(&API_FOUND, find_and_keep_api, || {
                // What the atfork child handler does.
                on_fork_child();
                // Not a Python process: the child's own search answers "none".
                py_api().is_none() && API_FOUND.done() == Some(false)
            });
        assert!(!found);
        assert_eq!(
            code,
            Some(0),
            "the forked child did not find the API itself (None: it hung and was killed after 60 s)"
        );
    }

    /// A fork while another thread is inside the tracker (holding its state, as on a tensor
    /// event): the child, where that thread does not exist, takes the state back at once,
    /// fresh (its trace names every stack again), instead of waiting for it forever.
    #[test]
    fn a_forked_child_takes_the_trackers_state_back() {
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            let mut g = super::state();
            g.ids = 41;
            held_tx.send(()).unwrap();
            let _ = go_rx.recv();
            g.ids += 1;
        });
        held_rx.recv().unwrap();
        // SAFETY: fork has no memory preconditions; the child runs only the checks below (no
        // panics, no locks of the test harness) and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // What the atfork child handler does.
            super::on_fork_child();
            let fresh = super::state().ids == 0 && super::CODES.lock_within(1).is_some();
            // SAFETY: ends the child without running the parent's atexit handlers.
            unsafe { libc::_exit(if fresh { 0 } else { 1 }) }
        }
        let code = crate::sys::setup::wait_child_bounded(pid, std::time::Duration::from_secs(60));
        go_tx.send(()).unwrap();
        holder.join().unwrap();
        assert_eq!(
            code,
            Some(0),
            "the forked child did not take the tracker's state back (None: it hung and was killed after 60 s)"
        );
        assert_eq!(super::state().ids, 42);
    }
}
