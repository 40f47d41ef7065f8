//! Python frames in native call stacks (`VRAMSHIM_STACKS`): when the allocating thread runs
//! CPython code, the stack recorded for its allocation holds its Python frames (file,
//! function, line) in place of the interpreter's eval-loop frames that ran them.
//!
//! Safety rules (the hook runs inside any CUDA call, on any thread, with or without the GIL):
//! nothing here calls into CPython beyond `PyGILState_GetThisThreadState` (a thread-local
//! read), allocates a Python object, touches a reference count or the GIL. The frames read
//! are the calling thread's own: only that thread pushes or pops them, and it is inside this
//! call, so the chain and the code objects it references stay put while they are read, GIL
//! or not. Everything is read at the addresses of the interpreter's own structures, whose
//! layout is per version:
//!
//! - 3.13 and 3.14 publish `_Py_DebugOffsets` at the start of `_PyRuntime` (cookie
//!   `xdebugpy`, its version; 3.14's has more fields, [`debug_idx`]): the offsets come from
//!   there. 3.14's frames hold their code object by a tagged reference (`_PyStackRef`),
//!   untagged before it is read ([`Layout::code_tag`]). A free-threaded build is refused with
//!   one line (see [`layout_from_debug`] for why).
//! - 3.10, 3.11 and 3.12 use the offsets in [`layout`], taken from each version's headers.
//! - Any other version: one line, native frames only.
//!
//! The walk is compiled once per known layout (3.10-3.12's, 3.13.0's and 3.14.10's debug
//! offsets), its offsets constants, and picked at set-up ([`compiled_walk`]); a layout that
//! is none of these is read by the walk that loads its offsets.
//!
//! Before any plain read, the first walks of the process read through `process_vm_readv`
//! (a wrong address is an error there, not a crash) and must find what the layout promises
//! (each frame's code object of type `PyCode_Type`, its file name a `str`, its line table
//! `bytes`); else one line and no Python frames for the rest of the process. Every later walk
//! still stops at a frame whose code object is not of that type.
//!
//! A walk yields, per frame, the code object's address, the instruction offset and what
//! names the code object (its file name and function name, by address and cached hash, its
//! line table by address and length, its first line). Stacks are deduplicated on all of
//! these: a code object freed and another created at its address is a new stack unless it
//! is named the same. A new stack is
//! named at once, still without the GIL: its code objects' names are copied from their
//! `str` objects (immutable once created) and the line of each frame decoded from the code
//! object's line table, so nothing waits for a later pass that would need the code objects
//! alive. Each code object (by those same addresses) is written once as a `PyCode` record;
//! the stack's `Stack` record holds each Python frame as [`PY_FRAME_BIT`] | code id << 32 |
//! line, in the place of the eval-loop frame that ran it (docs/trace-format.md).
//!
//! `VRAMSHIM_PY_STACKS=0` leaves Python frames out. `VRAMSHIM_PYFRAMES_FAULT=noident`
//! deduplicates and names on the code object's address alone (the reuse check off), for the
//! test that shows a reused address is then named wrongly; `layout` shifts the offset of a
//! frame's code object (the checked walks must refuse it), `layout-unchecked` does too and
//! reads without checking first (what the check prevents).

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_void};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, Ordering};

use crate::sys::setup::{Setup, SetupCell};
use crate::sys::spin::SpinLock;

use vramshim_trace::Event;

/// Python frames kept per stack (innermost first).
pub(crate) const MAX_PY: usize = 64;
/// Interpreter frames looked at per walk (C-stack shim frames included).
const MAX_STEPS: usize = 3 * MAX_PY;
/// Marks a Python frame among a `Stack` record's frames (user-space addresses never have it).
pub(crate) const PY_FRAME_BIT: u64 = 1 << 63;
/// Longest line table read (bytes) and longest name copied (characters).
const MAX_TABLE: usize = 1 << 20;
const MAX_NAME: usize = 4096;

/// One frame of a walk beside its key ([`PyWalk::keys`]): where to read its names.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct RawFrame {
    code: u64,
    filename: u64,
    name: u64,
    linetable: u64,
    /// The outermost frame of one run of the interpreter's eval loop.
    entry: bool,
}

const NO_FRAME: RawFrame = RawFrame {
    code: 0,
    filename: 0,
    name: 0,
    linetable: 0,
    entry: false,
};

/// One thread's Python frames, innermost first.
pub(crate) struct PyWalk {
    /// Per frame, what identifies it: what names its code object (see [`walk_with`]; the
    /// code object's address alone with `VRAMSHIM_PYFRAMES_FAULT=noident`) and the offset
    /// of the executing instruction in code units (an `i32`, negative: not started), as
    /// `u64`s side by side, so that a whole stack's key is compared as one block of memory.
    keys: [Frame; MAX_PY],
    /// Per frame, its key folded into one word, `ident ^ offset << 32` (what the stack's
    /// hash mixes): written by a walk of the keys alone ([`walk_keys`]), whose stack is
    /// looked up by these words ([`key_words`](Self::key_words)); a full walk leaves them as
    /// they were (so [`py_frames`] compares its frames with the keys walk's).
    words: [u64; MAX_PY],
    frames: [RawFrame; MAX_PY],
    n: usize,
    /// [`key_hash`](Self::key_hash), computed by the walk as it reads the frames.
    key_hash: u64,
    /// Whether `frames` were written by this walk (a full walk, [`with_walk`]); a walk of
    /// the keys alone ([`walk_keys`]) leaves them as an earlier walk left them.
    full: bool,
}

/// One frame of a stack's key ([`PyWalk::keys`]).
pub(crate) type Frame = [u64; 2];

/// The instruction offset a key's frame holds.
#[inline]
pub(crate) fn key_lasti(k: &Frame) -> i32 {
    k[1] as u32 as i32
}

/// The hash of a walk's keys ([`PyWalk::key_hash`]): each frame's word (its identity, a
/// mixed 64-bit value, with the offset in its high half) xored into the running value
/// rotated, then one [`mix`] with the number of frames. The words are already well spread
/// (the table compares keys in full on a hit; the hash only places them), so a frame
/// costs no multiply.
const KEY_SEED: u64 = 0x8422_2325_cbf2_9ce4;

thread_local! {
    // const-initialized, not Drop: each thread's walk buffer (4.6 KiB) lives in its TLS
    // block, so a walk neither allocates nor clears it; only the frames found are written.
    static WALK: std::cell::RefCell<PyWalk> = const {
        std::cell::RefCell::new(PyWalk::new())
    };
}

/// Runs `f` on the calling thread's Python frames (see [`walk`]), read into the thread's
/// own buffer.
#[inline]
pub(crate) fn with_walk<R>(f: impl FnOnce(&PyWalk) -> R) -> R {
    with_buf(|w| {
        walk(w, true);
        f(w)
    })
}

/// The keys of the calling thread's Python frames (the tensor tracker's walk), in its own
/// buffer: what identifies each frame and the stack's hash, not where to read its names,
/// which only a new stack needs ([`py_frames`] reads them then). `None` when Python frames
/// are off in this process, or this thread has no Python thread state or (once the layout
/// is verified) no frame: both asked before the buffer is taken, since autograd's threads,
/// half of a training step's allocations, have a thread state without frames. Inlined into
/// the caller, which reads the buffer in place.
#[inline(always)]
pub(crate) fn walk_keys() -> Option<WalkBuf> {
    let state = STATE.load(Ordering::Acquire);
    if state == ON {
        // Plain reads are on once the runtime was found and its first walks checked: it is
        // there, without asking the set-up again.
        let py = PY.get()?;
        return (py.keys_buf)(py, thread_state(py)?);
    }
    if state == OFF {
        return None;
    }
    let py = py()?;
    let mut w = buf();
    walk_in(py, &mut w, false);
    (!w.is_empty()).then_some(w)
}

/// The calling thread's Python thread state, with plain reads (a verified layout); `None`
/// while the interpreter shuts down (it frees other threads' states) or when the thread has
/// none.
#[inline(always)]
fn thread_state(py: &Py) -> Option<u64> {
    if rd_u64::<false>(py.runtime + py.l.rt_finalizing as u64) != Some(0) {
        return None;
    }
    // SAFETY: see Py::get_tstate (a thread-local read).
    let ts = unsafe { (py.get_tstate)() } as u64;
    (ts != 0).then_some(ts)
}

#[inline]
fn with_buf<R>(f: impl FnOnce(&mut PyWalk) -> R) -> R {
    f(&mut buf())
}

/// The calling thread's walk buffer, borrowed until dropped.
pub(crate) struct WalkBuf {
    /// The buffer `_hold` borrows or owns.
    w: *mut PyWalk,
    _hold: Hold,
}

/// What keeps [`WalkBuf::w`] valid (held for its drop alone).
enum Hold {
    Tls {
        _borrow: std::cell::RefMut<'static, PyWalk>,
    },
    Own {
        _buf: Box<PyWalk>,
    },
}

impl std::ops::Deref for WalkBuf {
    type Target = PyWalk;
    #[inline(always)]
    fn deref(&self) -> &PyWalk {
        // SAFETY: `w` points into what `_hold` borrows or owns, alive as long as `self`.
        unsafe { &*self.w }
    }
}

impl std::ops::DerefMut for WalkBuf {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut PyWalk {
        // SAFETY: as in `deref`; `&mut self` makes this the only reference.
        unsafe { &mut *self.w }
    }
}

#[inline(always)]
fn buf() -> WalkBuf {
    // The thread's buffer by address: `with` of a closure that only takes it is inlined
    // (one call to the TLS accessor), where `with` of the whole walk was not (~40
    // instructions an allocation for the tracker).
    let cell: *const std::cell::RefCell<PyWalk> = WALK.with(|w| w as *const _);
    // SAFETY: a thread-local without a destructor stays valid until its thread exits, and
    // `WalkBuf` cannot leave this thread (it holds a raw pointer and a `RefMut`, neither
    // `Send`); the buffer is only reached through the RefCell's borrow.
    let cell: &'static std::cell::RefCell<PyWalk> = unsafe { &*cell };
    match cell.try_borrow_mut() {
        Ok(mut g) => WalkBuf {
            w: &mut *g as *mut PyWalk,
            _hold: Hold::Tls { _borrow: g },
        },
        // Re-entered on this thread (never expected: nothing below calls back): a buffer
        // of its own.
        Err(_) => {
            let mut b = Box::new(PyWalk::new());
            WalkBuf {
                w: &mut *b as *mut PyWalk,
                _hold: Hold::Own { _buf: b },
            }
        }
    }
}

impl PyWalk {
    pub(crate) const fn new() -> PyWalk {
        PyWalk {
            keys: [[0; 2]; MAX_PY],
            words: [0; MAX_PY],
            frames: [NO_FRAME; MAX_PY],
            n: 0,
            key_hash: 0,
            full: false,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// What identifies the stack a walk of the keys alone ([`walk_keys`]) found, one word a
    /// frame: what names each code object (a 64-bit hash of it, [`walk_with`]) with the
    /// instruction offset in its high half, `ident ^ offset << 32`. Two frames with the same
    /// word have the same identity and offset as surely as two code objects with the same
    /// identity hash are the same (the offset's 32 bits only move where the identities'
    /// 64 would have to agree). The key [`key_hash`](Self::key_hash) hashes and
    /// [`key_eq`](Self::key_eq) compares: half the bytes of (identity, offset) pairs.
    pub(crate) fn key_words(&self) -> Box<[u64]> {
        self.words[..self.n].into()
    }

    /// A fast hash of the stack's frames (equal keys, equal hashes), computed by the walk;
    /// the same for a keys walk ([`key_words`](Self::key_words)) and a full one.
    #[inline]
    pub(crate) fn key_hash(&self) -> u64 {
        self.key_hash
    }

    /// Whether `key` is this keys walk's [`key_words`](Self::key_words), compared in full.
    #[inline]
    pub(crate) fn key_eq(&self, key: &[u64]) -> bool {
        key == &self.words[..self.n]
    }

    /// A hash of [`words`](Self::words): what identifies the stack (code objects,
    /// instruction offsets, naming objects) and where each run of the eval loop starts:
    /// [`key_hash`](Self::key_hash) and the places of the entry frames.
    pub(crate) fn hash(&self) -> u64 {
        debug_assert!(self.full, "a merged stack's hash needs a full walk");
        let mut h = self.key_hash;
        for (i, f) in self.frames[..self.n].iter().enumerate() {
            if f.entry {
                h = mix(h, i as u64);
            }
        }
        h
    }

    /// What identifies frame `i` within a stack: its key (what names its code object, its
    /// instruction offset) with whether it entered the eval loop (where a merged stack's
    /// Python frames sit among the native ones).
    #[inline(always)]
    fn frame_words(&self, i: usize) -> [u64; 2] {
        let [ident, lasti] = self.keys[i];
        [ident, lasti | (self.frames[i].entry as u64) << 32]
    }

    /// What identifies the stack exactly, two words per frame (see [`Self::frame_words`]).
    pub(crate) fn words(&self) -> impl Iterator<Item = u64> + '_ {
        (0..self.n).flat_map(|i| self.frame_words(i))
    }

    /// Whether `key` is [`words`](Self::words), compared in full.
    pub(crate) fn words_eq(&self, key: &[u64]) -> bool {
        key.len() == 2 * self.n
            && key
                .chunks_exact(2)
                .enumerate()
                .all(|(i, k)| *k == self.frame_words(i))
    }
}

#[inline]
fn mix(h: u64, v: u64) -> u64 {
    (h.rotate_left(5) ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

// ---- layouts

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Gen {
    /// 3.10: `PyFrameObject`s, `f_lasti` an instruction index (i32).
    Frames,
    /// 3.11, 3.12: `_PyInterpreterFrame`s reached through `tstate->cframe`.
    CFrame,
    /// 3.13: `tstate->current_frame`.
    Current,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Layout {
    minor: u32,
    kind: Gen,
    /// `tstate->cframe` (CFrame), then the current frame in it; or the current frame in the
    /// thread state.
    ts_cframe: usize,
    cur_frame: usize,
    f_back: usize,
    f_code: usize,
    /// The tag bits of a frame's reference to its code object (3.14's `_PyStackRef`), cleared
    /// before it is read; 0 where it is a plain pointer.
    code_tag: u64,
    /// 3.10: `f_lasti`; later: the instruction pointer.
    f_instr: usize,
    /// `owner` (3.12+: 3 is a C-stack shim frame), 0 when unused.
    f_owner: usize,
    /// `is_entry` (3.11), 0 when unused.
    f_is_entry: usize,
    co_filename: usize,
    co_name: usize,
    co_linetable: usize,
    co_firstlineno: usize,
    /// `co_code_adaptive` (3.11+).
    co_code: usize,
    /// Where a compact `str`'s characters start: ASCII, other.
    str_ascii: usize,
    str_compact: usize,
    rt_finalizing: usize,
}

/// The `owner` of the shim frame an eval-loop run starts with: `FRAME_OWNED_BY_CSTACK` (3) in
/// 3.12 and 3.13; in 3.14 the shim is `FRAME_OWNED_BY_INTERPRETER`, which took the value 3
/// (its `FRAME_OWNED_BY_CSTACK` is 4 and marks no frame of a thread's chain).
const OWNED_BY_CSTACK: u8 = 3;

/// The offsets of CPython 3.10-3.12 (x86-64 and aarch64 Linux builds, from each version's
/// `Include/internal` headers; checked at run time before use, see the module comment).
const fn layout(minor: u32) -> Option<Layout> {
    Some(match minor {
        10 => Layout {
            minor,
            kind: Gen::Frames,
            ts_cframe: 0,
            cur_frame: 24,
            f_back: 24,
            f_code: 32,
            code_tag: 0,
            f_instr: 96,
            f_owner: 0,
            f_is_entry: 0,
            co_filename: 104,
            co_name: 112,
            co_linetable: 120,
            co_firstlineno: 40,
            co_code: 0,
            str_ascii: 48,
            str_compact: 72,
            rt_finalizing: 16,
        },
        11 => Layout {
            minor,
            kind: Gen::CFrame,
            ts_cframe: 56,
            cur_frame: 8,
            f_back: 48,
            f_code: 32,
            code_tag: 0,
            f_instr: 56,
            f_owner: 0,
            f_is_entry: 68,
            co_filename: 112,
            co_name: 128, // co_qualname
            co_linetable: 136,
            co_firstlineno: 72,
            co_code: 184,
            str_ascii: 48,
            str_compact: 72,
            rt_finalizing: 24,
        },
        12 => Layout {
            minor,
            kind: Gen::CFrame,
            ts_cframe: 56,
            cur_frame: 0,
            f_back: 8,
            f_code: 0,
            code_tag: 0,
            f_instr: 56,
            f_owner: 70,
            f_is_entry: 0,
            co_filename: 112,
            co_name: 128, // co_qualname
            co_linetable: 136,
            co_firstlineno: 68,
            co_code: 192,
            str_ascii: 40,
            str_compact: 56,
            rt_finalizing: 24,
        },
        _ => return None,
    })
}

/// The layout 3.13's `_Py_DebugOffsets` describes in the 3.13.0 build (x86-64 Linux): the
/// walk compiled for it is taken when a 3.13 interpreter's own offsets are these
/// ([`compiled_walk`]); any other 3.13 is read with the offsets it describes.
const LAYOUT_313: Layout = Layout {
    minor: 13,
    kind: Gen::Current,
    ts_cframe: 0,
    cur_frame: 72,
    f_back: 8,
    f_code: 0,
    code_tag: 0,
    f_instr: 56,
    f_owner: 70,
    f_is_entry: 0,
    co_filename: 112,
    co_name: 128,
    co_linetable: 136,
    co_firstlineno: 68,
    co_code: 200,
    str_ascii: 40,
    str_compact: 56,
    rt_finalizing: 608,
};

/// The layout 3.14's `_Py_DebugOffsets` describes in the 3.14.10 build (x86-64 Linux, the
/// interpreter `scripts/setup-cpython314` installs), like [`LAYOUT_313`]. A frame's code
/// object is a `_PyStackRef` there: its low bits are tags (bit 0: the frame holds no
/// reference of its own; both set: a tagged integer, never a frame's code), cleared before
/// it is read (Include/internal/pycore_stackref.h).
const LAYOUT_314: Layout = Layout {
    minor: 14,
    kind: Gen::Current,
    ts_cframe: 0,
    cur_frame: 72,
    f_back: 8,
    f_code: 0,
    code_tag: 3,
    f_instr: 56,
    f_owner: 74,
    f_is_entry: 0,
    co_filename: 112,
    co_name: 128,
    co_linetable: 136,
    co_firstlineno: 68,
    co_code: 208,
    str_ascii: 40,
    str_compact: 56,
    rt_finalizing: 784,
};

/// The layout [`walk_with`] is compiled for when its `M` is `minor` (10 to 14; with `M` = 0
/// the walk reads `py.l`, and this value is not used).
const fn fixed(minor: u32) -> Layout {
    match layout(minor) {
        Some(l) => l,
        None if minor == 14 => LAYOUT_314,
        None => LAYOUT_313,
    }
}

/// A walk of the calling thread's frames with plain reads (a verified layout).
type Walker = fn(&Py, &mut PyWalk) -> Result<(), &'static str>;
/// The keys walk from a thread state on ([`walk_ts`]), with plain reads.
type KeysFrom = fn(&Py, u64, &mut PyWalk) -> Result<(), &'static str>;
/// The tensor tracker's keys walk from a thread state on, in the thread's buffer taken
/// only when there is a frame ([`keys_buf`]).
type KeysBuf = fn(&Py, u64) -> Option<WalkBuf>;

/// The walks compiled for `l` (the full walk, and the keys walk from a thread state on, into
/// a buffer given or the thread's own), with its offsets as constants (no offset loaded per
/// frame, no branch on the frame kind), where `l` is one of the layouts known at build time.
fn compiled_walk(l: &Layout) -> Option<(Walker, KeysFrom, KeysBuf)> {
    Some(match l.minor {
        10 if *l == fixed(10) => (
            walk_with::<false, 10, true>,
            walk_ts::<false, 10, false>,
            keys_buf::<10>,
        ),
        11 if *l == fixed(11) => (
            walk_with::<false, 11, true>,
            walk_ts::<false, 11, false>,
            keys_buf::<11>,
        ),
        12 if *l == fixed(12) => (
            walk_with::<false, 12, true>,
            walk_ts::<false, 12, false>,
            keys_buf::<12>,
        ),
        13 if *l == fixed(13) => (
            walk_with::<false, 13, true>,
            walk_ts::<false, 13, false>,
            keys_buf::<13>,
        ),
        14 if *l == fixed(14) => (
            walk_with::<false, 14, true>,
            walk_ts::<false, 14, false>,
            keys_buf::<14>,
        ),
        _ => return None,
    })
}

/// Where the offsets the walk uses sit in `_Py_DebugOffsets` (the index of each 8-byte
/// word), per version: the struct grew fields between 3.13 and 3.14 (each version's
/// Include/internal/pycore_debug_offsets.h).
struct DebugIdx {
    finalizing: usize,
    current_frame: usize,
    previous: usize,
    executable: usize,
    instr_ptr: usize,
    owner: usize,
    filename: usize,
    qualname: usize,
    linetable: usize,
    firstlineno: usize,
    co_code_adaptive: usize,
    /// Offsets the walk and the naming take as fixed (an object's type, a `bytes`' length
    /// and data, a `str`'s state, length and ASCII data), with the value each must have: a
    /// build that differs, or a table of indices that does not fit the struct, is refused.
    fixed: &'static [(usize, u64)],
    /// The tag bits of `_PyInterpreterFrame.f_executable` ([`Layout::code_tag`]).
    code_tag: u64,
}

const fn debug_idx(minor: u32) -> Option<DebugIdx> {
    Some(match minor {
        13 => DebugIdx {
            finalizing: 4,
            current_frame: 23,
            previous: 29,
            executable: 30,
            instr_ptr: 31,
            owner: 33,
            filename: 35,
            qualname: 37,
            linetable: 38,
            firstlineno: 39,
            co_code_adaptive: 43,
            // pyobject.ob_type; bytes_object.ob_size, ob_sval; unicode_object.state, length,
            // asciiobject_size.
            fixed: &[(45, 8), (65, 16), (66, 32), (68, 32), (69, 16), (70, 40)],
            code_tag: 0,
        },
        14 => DebugIdx {
            finalizing: 4,
            current_frame: 26,
            previous: 32,
            executable: 33,
            instr_ptr: 34,
            owner: 36,
            filename: 40,
            qualname: 42,
            linetable: 43,
            firstlineno: 44,
            co_code_adaptive: 48,
            // pyobject.ob_type; bytes_object.ob_size, ob_sval; unicode_object.state, length,
            // asciiobject_size.
            fixed: &[(51, 8), (75, 16), (76, 32), (78, 32), (79, 16), (80, 40)],
            code_tag: 3,
        },
        _ => return None,
    })
}

/// Words of `_Py_DebugOffsets` read (3.14's has 90).
const DEBUG_WORDS: usize = 96;

/// The layout `_Py_DebugOffsets` (at the start of `_PyRuntime`, 3.13 and 3.14) describes, or
/// why not.
fn debug_layout(rt: u64, minor: u32) -> Result<Layout, String> {
    let idx = debug_idx(minor).ok_or("no debug offsets are known for this version")?;
    let mut d = [0u64; DEBUG_WORDS];
    let bytes = d.len() * 8;
    // SAFETY: `d` is a local buffer of `bytes` bytes.
    let buf = unsafe { std::slice::from_raw_parts_mut(d.as_mut_ptr() as *mut u8, bytes) };
    if !checked_read(rt, buf) {
        return Err("its runtime state cannot be read".into());
    }
    layout_from_debug(&d, minor, &idx)
}

/// [`debug_layout`] from the words read.
fn layout_from_debug(d: &[u64; DEBUG_WORDS], minor: u32, idx: &DebugIdx) -> Result<Layout, String> {
    if &d[0].to_le_bytes() != b"xdebugpy" {
        return Err("its runtime state has no debug offsets".into());
    }
    if d[1] >> 24 != 3 || (d[1] >> 16) & 0xff != minor as u64 {
        return Err(format!(
            "its debug offsets are for another version ({:#x})",
            d[1]
        ));
    }
    if d[2] != 0 {
        // 3.14t: its frames hold code objects by deferred references (kept alive by the
        // collector, which scans thread stacks), but a frame's instruction pointer is in
        // this thread's own copy of the bytecode, found through the code object's array of
        // copies, which another thread replaces and frees (delayed until every attached
        // thread has passed a quiescent point: a thread inside a CUDA call has detached)
        // when it first runs that code (Objects/codeobject.c, `create_tlbc_lock_held`).
        // 3.13t has no such copies, but its object header is laid out otherwise (the walk
        // takes an object's type at offset 8) and no 3.13t could be tested.
        return Err(if minor >= 14 {
            "a free-threaded build: a frame's line is found through an array other threads \
             replace and free while this thread is in the call"
        } else {
            "a free-threaded build: its objects are laid out otherwise; not read"
        }
        .into());
    }
    let u = |i: usize| -> Result<usize, String> {
        let v = d[i];
        if v >= 1 << 16 {
            return Err(format!("debug offset {i} is implausible ({v})"));
        }
        Ok(v as usize)
    };
    if let Some(&(i, want)) = idx.fixed.iter().find(|&&(i, want)| d[i] != want) {
        return Err(format!(
            "its objects are not laid out as expected (debug offset {i} is {}, not {want})",
            d[i]
        ));
    }
    Ok(Layout {
        minor,
        kind: Gen::Current,
        ts_cframe: 0,
        cur_frame: u(idx.current_frame)?,
        f_back: u(idx.previous)?,
        f_code: u(idx.executable)?,
        code_tag: idx.code_tag,
        f_instr: u(idx.instr_ptr)?,
        f_owner: u(idx.owner)?,
        f_is_entry: 0,
        co_filename: u(idx.filename)?,
        co_name: u(idx.qualname)?,
        co_linetable: u(idx.linetable)?,
        co_firstlineno: u(idx.firstlineno)?,
        co_code: u(idx.co_code_adaptive)?,
        str_ascii: 40,
        str_compact: 56,
        rt_finalizing: u(idx.finalizing)?,
    })
}

// ---- memory

/// Reads `buf.len()` bytes at `addr` of this process through the kernel: a bad address is an
/// error, never a fault.
fn checked_read(addr: u64, buf: &mut [u8]) -> bool {
    if addr == 0 {
        return false;
    }
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut c_void,
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut c_void,
        iov_len: buf.len(),
    };
    // SAFETY: both vectors describe valid ranges of their address space (ours: `buf`); the
    // kernel checks the remote one.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    n == buf.len() as isize
}

/// Lowest address an object may have (the first page is never mapped): callers check each
/// object's address against it before a plain read of its fields ([`rd`]).
const MIN_ADDR: u64 = 4096;

/// A read of `N` bytes at `addr`: through the kernel when `CHECKED` (before the layout is
/// verified; a bad address is `None`), else a plain load (a verified layout; the calling
/// thread's own frames), which always succeeds: the caller has checked the address of the
/// object `addr` lies in against [`MIN_ADDR`], or it is one of the names of a live code
/// object (so no per-field test costs the hot walk).
#[inline(always)]
fn rd<const CHECKED: bool, const N: usize>(addr: u64) -> Option<[u8; N]> {
    let mut b = [0u8; N];
    if CHECKED {
        return (addr >= MIN_ADDR && checked_read(addr, &mut b)).then_some(b);
    }
    // SAFETY: `addr` is a field of an object the calling thread's interpreter frames
    // reference (alive while this thread is inside this call; its address checked against
    // MIN_ADDR by the caller, or one a live code object holds), at an offset of a verified
    // layout.
    unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, b.as_mut_ptr(), N) };
    Some(b)
}

#[inline(always)]
fn rd_u64<const C: bool>(addr: u64) -> Option<u64> {
    rd::<C, 8>(addr).map(u64::from_le_bytes)
}
#[inline(always)]
fn rd_i32<const C: bool>(addr: u64) -> Option<i32> {
    rd::<C, 4>(addr).map(i32::from_le_bytes)
}
#[inline(always)]
fn rd_u8<const C: bool>(addr: u64) -> Option<u8> {
    rd::<C, 1>(addr).map(|b| b[0])
}

// ---- the runtime found in this process

type GetTstateFn = unsafe extern "C" fn() -> *mut c_void;

struct Py {
    l: Layout,
    /// The plain walks for `l` ([`compiled_walk`], else the ones that read `l`), picked
    /// once: the full walk, and the walk of the keys alone from a thread state on.
    walk: Walker,
    keys_from: KeysFrom,
    keys_buf: KeysBuf,
    get_tstate: GetTstateFn,
    runtime: u64,
    code_type: u64,
    str_type: u64,
    bytes_type: u64,
    /// The eval loop's code ranges (`_PyEval_EvalFrameDefault` and its cold part).
    eval: Vec<(u64, u64)>,
}

const UNKNOWN: u8 = 0;
const CHECKING: u8 = 1;
const ON: u8 = 2;
const OFF: u8 = 3;
static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);
/// Walks through the kernel that found frames as the layout promises; plain reads after 2.
static CHECKED_OK: AtomicU32 = AtomicU32::new(0);
/// The runtime, found on first use by one thread ([`find_py`]). Not a `OnceLock`: a child
/// forked while another thread was finding it would wait for that thread forever on its
/// first walk; it looks again instead ([`reset_in_child`]).
static PY_FOUND: Setup = Setup::new();
static PY: SetupCell<Py> = SetupCell::new();
static FAULT_NOIDENT: AtomicBool = AtomicBool::new(false);

fn sym(name: &CStr) -> u64 {
    crate::cuda::real::dlsym_real(libc::RTLD_DEFAULT, name) as u64
}

fn off(why: &str) -> Option<Py> {
    crate::warn!("Python frames off ({why}); call stacks have native frames only");
    STATE.store(OFF, Ordering::Release);
    None
}

fn find_py() -> Option<Py> {
    if crate::config::var("VRAMSHIM_PY_STACKS").is_some_and(|v| v.trim() == "0") {
        STATE.store(OFF, Ordering::Release);
        return None;
    }
    use crate::config::switch_on;
    FAULT_NOIDENT.store(
        switch_on("VRAMSHIM_PYFRAMES_FAULT", "noident"),
        Ordering::Relaxed,
    );
    let unchecked = switch_on("VRAMSHIM_PYFRAMES_FAULT", "layout-unchecked");
    let runtime = sym(c"_PyRuntime");
    let gts = sym(c"PyGILState_GetThisThreadState");
    let eval = sym(c"_PyEval_EvalFrameDefault");
    if runtime == 0 || gts == 0 || eval == 0 {
        // Not a Python process (or an interpreter loaded privately): nothing to say.
        STATE.store(OFF, Ordering::Release);
        return None;
    }
    if !cfg!(all(target_os = "linux", target_pointer_width = "64")) {
        return off("64-bit Linux only");
    }
    let (major, minor) = match version() {
        Some(v) => v,
        None => return off("the Python version cannot be read"),
    };
    let mut l = if major == 3 && debug_idx(minor).is_some() {
        match debug_layout(runtime, minor) {
            Ok(l) => l,
            Err(e) => return off(&format!("Python 3.{minor}: {e}")),
        }
    } else if major == 3
        && let Some(l) = layout(minor)
    {
        l
    } else {
        return off(&format!(
            "Python {major}.{minor}: frame layouts are known for 3.10 to 3.14"
        ));
    };
    let code_type = sym(c"PyCode_Type");
    let str_type = sym(c"PyUnicode_Type");
    let bytes_type = sym(c"PyBytes_Type");
    if code_type == 0 || str_type == 0 || bytes_type == 0 {
        return off("the interpreter's type objects are not exported");
    }
    // SAFETY: the address is CPython's `PyGILState_GetThisThreadState`, which takes nothing
    // and reads this thread's thread-local state.
    let get_tstate = unsafe { std::mem::transmute::<u64, GetTstateFn>(gts) };
    let eval = eval_ranges(eval);
    if eval.is_empty() {
        crate::info!("the eval loop's extent is unknown: Python frames follow the native ones");
    }
    if switch_on("VRAMSHIM_PYFRAMES_FAULT", "layout") || unchecked {
        // A wrong offset of a frame's code object: what the checked walks must catch.
        l.f_code += 8;
    }
    // `layout-unchecked`: plain reads from the start, as if the layout were verified.
    let first = if unchecked { ON } else { CHECKING };
    let walk = compiled_walk(&l);
    crate::debug!(
        "Python 3.{minor}: frames read by {}",
        if walk.is_some() {
            "the walk compiled for its layout"
        } else {
            "the walk that loads its offsets"
        }
    );
    STATE.store(first, Ordering::Release);
    Some(Py {
        l,
        walk: walk.map_or(walk_with::<false, 0, true>, |w| w.0),
        keys_from: walk.map_or(walk_ts::<false, 0, false>, |w| w.1),
        keys_buf: walk.map_or(keys_buf::<0>, |w| w.2),
        get_tstate,
        runtime,
        code_type,
        str_type,
        bytes_type,
        eval,
    })
}

/// (major, minor) of the running interpreter: `Py_Version` (3.11+), else `Py_GetVersion()`.
fn version() -> Option<(u32, u32)> {
    let v = sym(c"Py_Version");
    if v != 0 {
        let hex = u32::from_le_bytes(rd::<true, 4>(v)?);
        return Some((hex >> 24, (hex >> 16) & 0xff));
    }
    let f = sym(c"Py_GetVersion");
    if f == 0 {
        return None;
    }
    // SAFETY: CPython's `Py_GetVersion` (before 3.11): formats constants into a static
    // buffer and returns it; no Python object, no lock.
    let s = unsafe {
        let f = std::mem::transmute::<u64, unsafe extern "C" fn() -> *const c_char>(f);
        let p = f();
        if p.is_null() {
            return None;
        }
        CStr::from_ptr(p).to_string_lossy().into_owned()
    };
    let mut it = s.split(|c: char| !c.is_ascii_digit());
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// `[start, end)` of the eval loop function (and its `.cold` part where the symbol table
/// has one), from the object file that holds `eval`.
fn eval_ranges(eval: u64) -> Vec<(u64, u64)> {
    let mut info: libc::Dl_info = unsafe_zeroed();
    // SAFETY: `info` is a valid out-parameter; `eval` is an address in a loaded object.
    if unsafe { libc::dladdr(eval as *const c_void, &mut info) } == 0 || info.dli_fname.is_null() {
        return Vec::new();
    }
    // SAFETY: dli_fname is the loader's NUL-terminated path of the object.
    let path = unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy();
    let base = info.dli_fbase as u64;
    let path = if path.is_empty() || !path.contains('/') {
        std::fs::read_link("/proc/self/exe")
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default()
    } else {
        path.into_owned()
    };
    let Some(elf) = super::elf_syms::Elf::open(&path) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for name in [
        &b"_PyEval_EvalFrameDefault"[..],
        b"_PyEval_EvalFrameDefault.cold",
    ] {
        if let Some(s) = elf.find_any_symbol(|n| n == name)
            && s.size > 0
        {
            let start = base.wrapping_add(s.value);
            out.push((start, start + s.size));
        }
    }
    // The symbol found must be the function dlsym gave.
    if !out.iter().any(|&(s, _)| s == eval) {
        return Vec::new();
    }
    out
}

fn unsafe_zeroed<T: Copy>() -> T {
    // SAFETY: only used for plain C structs (all-zero is a valid value).
    unsafe { std::mem::zeroed() }
}

#[inline]
fn py() -> Option<&'static Py> {
    if STATE.load(Ordering::Acquire) == OFF {
        return None;
    }
    if PY_FOUND.answer(|| PY_FOUND.run(find_and_keep)) {
        PY.get()
    } else {
        None
    }
}

/// The set-up of [`PY_FOUND`]: whether this process runs a Python whose frames we read.
fn find_and_keep() -> bool {
    find_py().is_some_and(|p| PY.set(p).is_ok())
}

/// Forked child (the atfork child handler): a search for the runtime another thread of the
/// parent was making is made again here (what it found so far is forgotten).
pub(crate) fn reset_in_child() {
    if PY_FOUND.reset_in_child() {
        PY.forget_in_child();
    }
}

/// Whether Python frames may be recorded in this process (cheap after the first call).
#[inline]
pub(crate) fn active() -> bool {
    STATE.load(Ordering::Relaxed) != OFF && py().is_some()
}

/// The calling thread's Python frames, innermost first, into `out` (empty when it runs no
/// Python code, or Python frames are off); `full`: with where to read each frame's names
/// (else its key alone).
pub(crate) fn walk(out: &mut PyWalk, full: bool) {
    out.n = 0;
    let Some(py) = py() else { return };
    walk_in(py, out, full);
}

/// [`walk`] in the runtime found.
#[inline]
fn walk_in(py: &Py, out: &mut PyWalk, full: bool) {
    out.n = 0;
    let state = STATE.load(Ordering::Acquire);
    if state == OFF {
        return;
    }
    let checked = state != ON;
    // The checked walks (the first of the process) are full ones.
    let r = if checked {
        walk_with::<true, 0, true>(py, out)
    } else if full {
        (py.walk)(py, out)
    } else {
        match thread_state(py) {
            Some(ts) => (py.keys_from)(py, ts, out),
            None => Ok(()),
        }
    };
    match r {
        Ok(()) => {
            if checked && !full {
                // Asked for the keys: a checked walk is a full one, whose words are these.
                for i in 0..out.n {
                    let [ident, lasti] = out.keys[i];
                    out.words[i] = ident ^ lasti << 32;
                }
            }
            if checked && out.n > 0 && CHECKED_OK.fetch_add(1, Ordering::AcqRel) >= 1 {
                STATE.store(ON, Ordering::Release);
            }
        }
        Err(why) => {
            out.n = 0;
            if checked && STATE.swap(OFF, Ordering::AcqRel) != OFF {
                crate::warn!(
                    "Python frames off (Python 3.{}: {why}: its frames are not laid out as \
                     expected); call stacks have native frames only",
                    py.l.minor
                );
            }
        }
    }
}

/// The walk itself: `C` reads through the kernel (before the layout is verified); `M` is
/// the minor version whose layout ([`fixed`]) it is compiled for, 0 for `py.l`'s; `FULL`
/// also writes where to read each frame's names and whether it entered the eval loop
/// ([`PyWalk::frames`]), which only a new stack and `--stacks`' merged stacks need: the
/// tensor tracker's walk of a stack seen before reads what identifies each frame and
/// stores its key alone.
fn walk_with<const C: bool, const M: u32, const FULL: bool>(
    py: &Py,
    out: &mut PyWalk,
) -> Result<(), &'static str> {
    let l = &if M == 0 { py.l } else { const { fixed(M) } };
    out.full = FULL;
    // An interpreter shutting down frees other threads' states.
    if rd_u64::<C>(py.runtime + l.rt_finalizing as u64).ok_or("runtime unreadable")? != 0 {
        return Ok(());
    }
    // SAFETY: see Py::get_tstate (a thread-local read).
    let ts = unsafe { (py.get_tstate)() } as u64;
    if ts == 0 {
        return Ok(());
    }
    walk_ts::<C, M, FULL>(py, ts, out)
}

/// [`walk_with`] from the thread state `ts` (not 0) on: the tensor tracker's keys walk
/// starts here, having asked for the thread state before taking its buffer
/// ([`walk_keys`]).
#[inline(always)]
fn walk_ts<const C: bool, const M: u32, const FULL: bool>(
    py: &Py,
    ts: u64,
    out: &mut PyWalk,
) -> Result<(), &'static str> {
    out.full = FULL;
    let frame = first_frame::<C, M>(py, ts)?;
    walk_frames::<C, M, FULL>(py, frame, out)
}

/// The innermost frame of the thread state `ts` (not 0), 0 when it has none.
#[inline(always)]
fn first_frame<const C: bool, const M: u32>(py: &Py, ts: u64) -> Result<u64, &'static str> {
    let l = &if M == 0 { py.l } else { const { fixed(M) } };
    if ts < MIN_ADDR {
        return Err("thread state unreadable");
    }
    Ok(match l.kind {
        Gen::CFrame => {
            let cf = rd_u64::<C>(ts + l.ts_cframe as u64).ok_or("thread state unreadable")?;
            if cf == 0 {
                return Ok(0);
            }
            if cf < MIN_ADDR {
                return Err("frame pointer unreadable");
            }
            rd_u64::<C>(cf + l.cur_frame as u64).ok_or("frame pointer unreadable")?
        }
        Gen::Frames | Gen::Current => {
            rd_u64::<C>(ts + l.cur_frame as u64).ok_or("thread state unreadable")?
        }
    })
}

/// The tensor tracker's keys walk, compiled per layout like [`walk_ts`]: the calling
/// thread's buffer with the keys of its frames from the thread state `ts` on, or `None`
/// when the thread runs no Python code (autograd's threads have a thread state and no
/// frame: half of a training step's allocations) or its frames cannot be read; the buffer
/// is taken only when there is a frame to read.
fn keys_buf<const M: u32>(py: &Py, ts: u64) -> Option<WalkBuf> {
    let frame = first_frame::<false, M>(py, ts).ok()?;
    if frame == 0 {
        return None;
    }
    let mut w = buf();
    w.full = false;
    if walk_frames::<false, M, false>(py, frame, &mut w).is_err() {
        w.n = 0;
    }
    Some(w)
}

/// [`walk_ts`] from its first frame (0: none) on.
#[inline(always)]
fn walk_frames<const C: bool, const M: u32, const FULL: bool>(
    py: &Py,
    mut frame: u64,
    out: &mut PyWalk,
) -> Result<(), &'static str> {
    let l = &if M == 0 { py.l } else { const { fixed(M) } };
    out.n = 0;
    let strict = C;
    // Read once a walk, in every walk, so that the fault breaks the walk jobs really run.
    let noident = FAULT_NOIDENT.load(Ordering::Relaxed);
    // Frames found so far and the hash of their keys, kept in registers (written to `out`
    // once, at the end).
    let mut n = 0;
    let mut kh = KEY_SEED;
    for _ in 0..MAX_STEPS {
        if frame == 0 || n >= MAX_PY {
            break;
        }
        if frame < MIN_ADDR {
            return Err("frame unreadable");
        }
        let code = rd_u64::<C>(frame + l.f_code as u64).ok_or("frame unreadable")? & !l.code_tag;
        if l.f_owner != 0
            && rd_u8::<C>(frame + l.f_owner as u64).ok_or("frame unreadable")? == OWNED_BY_CSTACK
        {
            // The shim an eval-loop run starts with: the frame before it was that run's first.
            if FULL && n > 0 {
                out.frames[n - 1].entry = true;
            }
            frame = rd_u64::<C>(frame + l.f_back as u64).ok_or("frame unreadable")?;
            continue;
        }
        if code < MIN_ADDR || rd_u64::<C>(code + 8) != Some(py.code_type) {
            if strict {
                return Err("a frame's code is not a code object");
            }
            break;
        }
        let lasti = match l.kind {
            Gen::Frames => rd_i32::<C>(frame + l.f_instr as u64).ok_or("frame unreadable")?,
            _ => {
                let ip = rd_u64::<C>(frame + l.f_instr as u64).ok_or("frame unreadable")?;
                // Code units from the first: 3.11 and 3.12 point one unit before it (-1)
                // until the frame starts. An instruction pointer is always within its code
                // object's units; were it not, this is some other value, which names no line.
                // In 32 bits (the same for any offset below 2 GiB, and no 64-bit constants
                // held in registers through the walk's loop).
                ((ip as u32).wrapping_sub((code as u32).wrapping_add(l.co_code as u32)) as i32) >> 1
            }
        };
        let filename = rd_u64::<C>(code + l.co_filename as u64).ok_or("code unreadable")?;
        let name = rd_u64::<C>(code + l.co_name as u64).ok_or("code unreadable")?;
        let linetable = rd_u64::<C>(code + l.co_linetable as u64).ok_or("code unreadable")?;
        // A live code object (its type checked above; its frame holds a reference to it)
        // always has its names: their addresses are checked by the first walks, through the
        // kernel, where a layout that is not the one expected would show; the plain walks
        // rely on that.
        if C && (filename < MIN_ADDR || name < MIN_ADDR || linetable < MIN_ADDR) {
            return Err("a code object's names are unreadable");
        }
        if strict
            && (rd_u64::<C>(filename + 8) != Some(py.str_type)
                || rd_u64::<C>(name + 8) != Some(py.str_type)
                || rd_u64::<C>(linetable + 8) != Some(py.bytes_type))
        {
            return Err("a code object's names are not strings");
        }
        // The code object is known by its address and what names it: its file name and
        // function name (address and cached hash: a freed name's address may be reused by
        // a string with other characters, whose hash differs), its line table (address and
        // length) and first line. A code object freed and another created at its address
        // shares all of these only when it is named the same. Each name enters as its
        // address xor its hash, one word: two names give the same word only when their
        // hashes differ exactly as their addresses do (the same address: the same hash),
        // which for string hashes (SipHash, or -1 not yet computed) is a 64-bit
        // coincidence, like the identity's own; the line table's length and the first line
        // share a word (a length < 4 GiB, a line < 2^32: nothing lost).
        let ident = if noident {
            code
        } else {
            let first = rd_i32::<C>(code + l.co_firstlineno as u64).ok_or("code unreadable")?;
            let fhash = rd_u64::<C>(filename + 24).ok_or("name unreadable")?;
            let nhash = rd_u64::<C>(name + 24).ok_or("name unreadable")?;
            let tlen = rd_u64::<C>(linetable + 16).ok_or("line table unreadable")?;
            let mut h = mix(code, filename ^ fhash);
            h = mix(h, name ^ nhash);
            h = mix(h, linetable);
            mix(h, tlen << 32 | first as u32 as u64)
        };
        if FULL {
            let entry = match l.kind {
                Gen::Frames => true,
                _ if l.f_is_entry != 0 => {
                    rd_u8::<C>(frame + l.f_is_entry as u64).ok_or("frame unreadable")? != 0
                }
                _ => false,
            };
            out.frames[n] = RawFrame {
                code,
                filename,
                name,
                linetable,
                entry,
            };
        }
        let lasti = lasti as u32 as u64;
        // One step of the hash a frame: the offset (32 bits) in the identity's high half,
        // the word a keys walk stores (`PyWalk::words`).
        let word = ident ^ lasti << 32;
        kh = kh.rotate_left(5) ^ word;
        if FULL {
            out.keys[n] = [ident, lasti];
        } else {
            out.words[n] = word;
        }
        n += 1;
        // The caller's frame, read last: the frame's own register then holds it (no copy a
        // frame).
        frame = rd_u64::<C>(frame + l.f_back as u64).ok_or("frame unreadable")?;
    }
    out.n = n;
    out.key_hash = mix(kh, n as u64);
    Ok(())
}

// ---- naming (new stacks only)

/// Code objects named so far (by [`RawFrame::ident`]) -> `PyCode` id. The process's spin
/// lock: a forked child takes it back (a held `Mutex` would deadlock there), a contended
/// holder gets the CPU back (it yields), and a panic in the holder releases it.
static CODES: SpinLock<Option<HashMap<u64, u32>>> = SpinLock::new(None);
/// `PyCode` ids, shared with the tensor-level route's (`torch::drain`).
static NEXT_CODE: AtomicU32 = AtomicU32::new(1);

pub(crate) fn next_code_id() -> u32 {
    NEXT_CODE.fetch_add(1, Ordering::Relaxed)
}

fn with_codes<R>(f: impl FnOnce(&mut HashMap<u64, u32>) -> R) -> R {
    f(CODES.lock().get_or_insert_with(HashMap::new))
}

/// Forked child: its trace starts empty, so every code object is named again. Touches no
/// lock (another thread of the parent may have held it).
pub(crate) fn on_fork_child() {
    // SAFETY: called from the atfork child handler: the child's only thread, holding no
    // guard. The old map (maybe half-updated) is leaked, not dropped.
    std::mem::forget(unsafe { CODES.reset_in_child() }.take());
}

fn read_str(py: &Py, s: u64) -> String {
    if s < MIN_ADDR || rd_u64::<false>(s + 8) != Some(py.str_type) {
        return String::from("?");
    }
    let (Some(state), Some(len)) = (rd::<false, 4>(s + 32), rd_u64::<false>(s + 16)) else {
        return String::from("?");
    };
    let state = u32::from_le_bytes(state);
    let (kind, compact, ascii) = ((state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1);
    if compact == 0 || !matches!(kind, 1 | 2 | 4) {
        return String::from("?");
    }
    let len = (len as usize).min(MAX_NAME);
    let data = s + if ascii == 1 {
        py.l.str_ascii
    } else {
        py.l.str_compact
    } as u64;
    let k = kind as usize;
    let mut raw = vec![0u8; len * k];
    // SAFETY: a compact str of `len` characters of `k` bytes stores them at `data`; the
    // string is referenced by a live code object of this thread's frames and never changes.
    unsafe { std::ptr::copy_nonoverlapping(data as *const u8, raw.as_mut_ptr(), raw.len()) };
    raw.chunks_exact(k)
        .map(|c| {
            let cp = match k {
                1 => c[0] as u32,
                2 => u16::from_le_bytes([c[0], c[1]]) as u32,
                _ => u32::from_le_bytes([c[0], c[1], c[2], c[3]]),
            };
            char::from_u32(cp).unwrap_or('\u{fffd}')
        })
        .collect()
}

fn read_bytes(py: &Py, b: u64) -> Vec<u8> {
    if b < MIN_ADDR || rd_u64::<false>(b + 8) != Some(py.bytes_type) {
        return Vec::new();
    }
    let len = rd_u64::<false>(b + 16).unwrap_or(0) as usize;
    if len > MAX_TABLE {
        return Vec::new();
    }
    let mut v = vec![0u8; len];
    // SAFETY: a bytes object of `len` bytes holds them at offset 32; immutable, alive (its
    // code object is referenced by this thread's frames).
    unsafe { std::ptr::copy_nonoverlapping((b + 32) as *const u8, v.as_mut_ptr(), len) };
    v
}

/// The source line of code unit `unit` (3.10: `addr` is a byte offset), per the version's
/// line table format; `first` for an instruction not started, 0 when unknown.
pub(crate) fn line_of(minor: u32, table: &[u8], first: i32, unit: i32) -> i32 {
    if unit < 0 {
        return first;
    }
    if minor <= 10 {
        // PEP 626 pairs: (byte delta: u8, line delta: i8, -128 = no line).
        let addr = unit as i64 * 2;
        let (mut line, mut end) = (first as i64, 0i64);
        for p in table.chunks_exact(2) {
            let start = end;
            end += p[0] as i64;
            let d = p[1] as i8;
            let this = if d == -128 {
                -1
            } else {
                line += d as i64;
                line
            };
            if start <= addr && addr < end {
                return this.max(0) as i32;
            }
        }
        return 0;
    }
    // 3.11+ location table: entries start with a byte with bit 7 set: code in bits 3-6,
    // length - 1 (code units) in bits 0-2.
    let (mut line, mut at, mut i) = (first as i64, 0i64, 0usize);
    while i < table.len() {
        let b = table[i];
        let code = (b >> 3) & 15;
        let len = (b & 7) as i64 + 1;
        let delta = match code {
            13 | 14 => svarint(&table[i + 1..]),
            10..=12 => code as i64 - 10,
            _ => 0,
        };
        line += delta;
        let this = if code == 15 { -1 } else { line };
        if at <= unit as i64 && (unit as i64) < at + len {
            return this.max(0) as i32;
        }
        at += len;
        i += 1;
        while i < table.len() && table[i] & 128 == 0 {
            i += 1;
        }
    }
    0
}

fn svarint(b: &[u8]) -> i64 {
    let (mut v, mut shift) = (0u64, 0u32);
    for &x in b.iter().take(10) {
        v |= ((x & 63) as u64) << shift;
        shift += 6;
        if x & 64 == 0 {
            break;
        }
    }
    if v & 1 == 1 {
        -((v >> 1) as i64)
    } else {
        (v >> 1) as i64
    }
}

/// The `PyCode` id of `f`'s code object (its record pushed to `records` the first time) and
/// the line `f` runs (`k` its key). Reads only this thread's live frames' objects (see the
/// module comment).
fn name_frame(py: &Py, f: &RawFrame, k: &Frame, records: &mut Vec<Event>) -> (u32, i32) {
    let key = k[0];
    let first = rd_i32::<false>(f.code + py.l.co_firstlineno as u64).unwrap_or(0);
    let id = with_codes(|m| m.get(&key).copied());
    let id = match id {
        Some(id) => id,
        None => {
            let file = read_str(py, f.filename);
            let function = read_str(py, f.name);
            let (id, new) = with_codes(|m| match m.get(&key) {
                Some(&id) => (id, false),
                None => {
                    let id = next_code_id();
                    m.insert(key, id);
                    (id, true)
                }
            });
            if new {
                records.push(Event::PyCode {
                    id,
                    file,
                    function,
                    first_line: first.max(0) as u32,
                });
            }
            id
        }
    };
    let line = line_of(
        py.l.minor,
        &read_bytes(py, f.linetable),
        first,
        key_lasti(k),
    );
    (id, line)
}

/// The Python frames of `walk` (innermost first), named now like [`merge`]'s: what a
/// `PyStack` record holds. New code objects' `PyCode` records go to `records`. A walk of
/// the keys alone ([`walk_keys`]) is read again in full first (the same frames: this
/// thread is still inside the call that walked them); `None` if it did not find the same
/// keys, or Python frames are off.
pub(crate) fn py_frames(
    walk: &mut PyWalk,
    records: &mut Vec<Event>,
) -> Option<Vec<vramshim_trace::PyFrame>> {
    let py = py()?;
    if !walk.full {
        // The full walk leaves the keys walk's words as they are: its frames must fold to
        // them, one by one.
        let n = walk.n;
        walk_in(py, walk, true);
        if walk.n != n
            || walk.keys[..n]
                .iter()
                .zip(&walk.words[..n])
                .any(|(&[ident, lasti], &w)| ident ^ lasti << 32 != w)
        {
            return None;
        }
    }
    Some(
        walk.frames[..walk.n]
            .iter()
            .zip(&walk.keys)
            .map(|(f, k)| {
                let (code, line) = name_frame(py, f, k, records);
                vramshim_trace::PyFrame {
                    code,
                    line: line.max(0) as u32,
                }
            })
            .collect(),
    )
}

/// The merged frames of a new stack: `native` (innermost first) with each eval-loop frame
/// replaced by the Python frames of that run of the loop, the rest after the native ones.
/// New code objects' `PyCode` records go to `records`.
pub(crate) fn merge(native: &[u64], walk: &PyWalk, records: &mut Vec<Event>) -> Vec<u64> {
    debug_assert!(walk.full, "merging needs a full walk");
    let Some(py) = py() else {
        return native.to_vec();
    };
    let mut tagged = Vec::with_capacity(walk.n);
    let mut ends = Vec::new();
    for (i, (f, k)) in walk.frames[..walk.n].iter().zip(&walk.keys).enumerate() {
        let (id, line) = name_frame(py, f, k, records);
        tagged.push(PY_FRAME_BIT | (id as u64 & 0x7fff_ffff) << 32 | line.max(0) as u32 as u64);
        if f.entry {
            ends.push(i + 1);
        }
    }
    if ends.last() != Some(&walk.n) {
        ends.push(walk.n);
    }
    let in_eval = |ip: u64| {
        let ip = ip.wrapping_sub(1);
        py.eval.iter().any(|&(s, e)| ip >= s && ip < e)
    };
    let mut out = Vec::with_capacity(native.len() + tagged.len());
    let (mut seg, mut from) = (0usize, 0usize);
    for &ip in native {
        if seg < ends.len() && in_eval(ip) {
            out.extend_from_slice(&tagged[from..ends[seg]]);
            from = ends[seg];
            seg += 1;
        } else {
            out.push(ip);
        }
    }
    out.extend_from_slice(&tagged[from..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn location_table_lines() {
        // first line 10; entries: short form (same line, 2 units), one-line+1 (1 unit),
        // no-columns -3 (svarint 7 = -3) (3 units), no location (1 unit).
        let t = [
            0x80 | 1,
            0x00,
            0x80 | (11 << 3),
            0,
            0,
            0x80 | (13 << 3) | 2,
            7,
            0xf8,
        ];
        assert_eq!(line_of(11, &t, 10, 0), 10);
        assert_eq!(line_of(11, &t, 10, 1), 10);
        assert_eq!(line_of(11, &t, 10, 2), 11);
        assert_eq!(line_of(11, &t, 10, 3), 8);
        assert_eq!(line_of(11, &t, 10, 5), 8);
        assert_eq!(line_of(11, &t, 10, 6), 0);
        assert_eq!(line_of(11, &t, 10, -1), 10);
    }

    #[test]
    fn pep626_lines() {
        // first line 5: bytes 0-3 line 6, 4-5 no line, 6-9 line 4.
        let t = [4u8, 1, 2, 0x80, 4, (-2i8) as u8];
        assert_eq!(line_of(10, &t, 5, 0), 6);
        assert_eq!(line_of(10, &t, 5, 1), 6);
        assert_eq!(line_of(10, &t, 5, 2), 0);
        assert_eq!(line_of(10, &t, 5, 4), 4);
        assert_eq!(line_of(10, &t, 5, 9), 0);
    }

    /// A fork while another thread is finding the runtime (inside the set-up): the child,
    /// where that thread does not exist, looks for it itself instead of waiting forever.
    #[test]
    fn a_forked_child_finds_the_runtime_itself() {
        let (code, found) = crate::sys::setup::fork_during_setup(&PY_FOUND, find_and_keep, || {
            // What the atfork child handler does.
            reset_in_child();
            // Not a Python process: the child's own search answers "none". The set-up is
            // asked directly: `py()` answers at once when the frames are already off.
            !PY_FOUND.answer(|| PY_FOUND.run(find_and_keep)) && PY_FOUND.done() == Some(false)
        });
        assert!(!found);
        assert_eq!(
            code,
            Some(0),
            "the forked child did not find the runtime itself (None: it hung and was killed after 60 s)"
        );
    }

    /// `_Py_DebugOffsets` of CPython 3.14.10 (x86-64 Linux, Debian's build): the first 90
    /// words, as its `_PyRuntime` holds them.
    fn debug_314() -> [u64; DEBUG_WORDS] {
        let words: [u64; 90] = [
            u64::from_le_bytes(*b"xdebugpy"),
            0x030e_0af0,
            0,
            316616,
            784,
            808,
            225864,
            7280,
            7272,
            7344,
            7360,
            7408,
            7688,
            7672,
            7680,
            16,
            7784,
            0,
            7800,
            7792,
            7992,
            0,
            832,
            0,
            8,
            16,
            72,
            152,
            160,
            232,
            32,
            88,
            8,
            0,
            56,
            80,
            74,
            64,
            0,
            216,
            112,
            120,
            128,
            136,
            68,
            52,
            96,
            104,
            208,
            0,
            16,
            8,
            416,
            24,
            88,
            168,
            40,
            32,
            16,
            40,
            24,
            16,
            200,
            24,
            40,
            32,
            48,
            32,
            40,
            24,
            16,
            32,
            16,
            24,
            40,
            16,
            32,
            64,
            32,
            16,
            40,
            264,
            192,
            160,
            24,
            72,
            67,
            0,
            8,
            24,
        ];
        let mut d = [0u64; DEBUG_WORDS];
        d[..90].copy_from_slice(&words);
        d
    }

    #[test]
    fn debug_offsets_of_3_14() {
        let idx = debug_idx(14).unwrap();
        let l = layout_from_debug(&debug_314(), 14, &idx).unwrap();
        assert_eq!(l, LAYOUT_314);
        assert!(compiled_walk(&l).is_some());
        // Another 3.14 whose offsets differ is read by the walk that loads them.
        let mut d = debug_314();
        d[36] = 75;
        let l = layout_from_debug(&d, 14, &idx).unwrap();
        assert_eq!(l.f_owner, 75);
        assert!(compiled_walk(&l).is_none());
    }

    #[test]
    fn a_free_threaded_3_14_is_refused() {
        let mut d = debug_314();
        d[2] = 1;
        let e = layout_from_debug(&d, 14, &debug_idx(14).unwrap()).unwrap_err();
        assert!(
            e.starts_with("a free-threaded build: a frame's line"),
            "{e}"
        );
        // 3.13t, refused for its object layout.
        d[1] = 0x030d_00f0;
        let e = layout_from_debug(&d, 13, &debug_idx(13).unwrap()).unwrap_err();
        assert!(e.starts_with("a free-threaded build: its objects"), "{e}");
    }

    #[test]
    fn debug_offsets_that_break_fixed_object_offsets_are_refused() {
        let idx = debug_idx(14).unwrap();
        for (i, _) in idx.fixed {
            let mut d = debug_314();
            d[*i] += 8;
            let e = layout_from_debug(&d, 14, &idx).unwrap_err();
            assert!(e.contains("not laid out as expected"), "{e}");
        }
        // The version the offsets are for is checked too.
        let e = layout_from_debug(&debug_314(), 13, &debug_idx(13).unwrap()).unwrap_err();
        assert!(e.contains("another version"), "{e}");
    }

    #[test]
    fn checked_reads_refuse_bad_addresses() {
        let mut b = [0u8; 8];
        assert!(!checked_read(8, &mut b));
        let x = 0x1122_3344_5566_7788u64;
        assert!(checked_read(&x as *const u64 as u64, &mut b));
        assert_eq!(u64::from_le_bytes(b), x);
    }
}
