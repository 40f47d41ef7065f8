//! Feeds arbitrary bytes to the pickle reader behind `import --from memory-viz`: it must never
//! panic, never overflow the stack, and never allocate past its limits. The limit is checked per
//! input, not through the process's RSS (which ASan's quarantine of freed memory inflates): a
//! counting allocator follows the heap the reader holds, and the target aborts at the first
//! allocation that takes it past what the reader's budget promises (64 MiB plus 64 bytes per
//! input byte, for the decoded values) times the bookkeeping around them (the parse stack's
//! spare capacity, a container's items while they are moved into it), [`PEAK_OVER_BUDGET`]. A pickle that reads is then taken as a memory snapshot (the
//! shape checks and sizes).
#![no_main]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use libfuzzer_sys::fuzz_target;
use vramshim_analyzer::formats::pickle;

/// Heap bytes held now, and the most the current read may hold (0: no limit).
static LIVE: AtomicUsize = AtomicUsize::new(0);
static LIMIT: AtomicUsize = AtomicUsize::new(0);

struct Counting;

// SAFETY: every call goes to the system allocator with the caller's layout unchanged; the
// counters only observe.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: forwarded as given.
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            note_grow(l.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        // SAFETY: forwarded as given.
        let p = unsafe { System.alloc_zeroed(l) };
        if !p.is_null() {
            note_grow(l.size());
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size(), Relaxed);
        // SAFETY: forwarded as given.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        // SAFETY: forwarded as given.
        let q = unsafe { System.realloc(p, l, new) };
        if !q.is_null() {
            LIVE.fetch_sub(l.size(), Relaxed);
            note_grow(new);
        }
        q
    }
}

fn note_grow(n: usize) {
    let now = LIVE.fetch_add(n, Relaxed) + n;
    let limit = LIMIT.load(Relaxed);
    if limit != 0 && now > limit {
        // Nothing that allocates here: the message is a constant, and the abort is the crash
        // libFuzzer saves the input of.
        use std::io::Write;
        let _ = std::io::stderr().write_all(
            b"the pickle reader's heap went past its budget (64 MiB plus 64 bytes per input byte) \
              times PEAK_OVER_BUDGET\n",
        );
        std::process::abort();
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// How far the reader's heap may go past the bytes its budget charges: a `Vec` that grows by
/// doubling holds up to twice its items, and the memo's table adds its own spare capacity.
const PEAK_OVER_BUDGET: u64 = 3;

/// Reads `data` with the heap it may take bounded by the reader's budget.
fn read_bounded(data: &[u8]) -> Result<pickle::Value, pickle::PickleError> {
    let budget = pickle::BASE_BUDGET + data.len() as u64 * pickle::BUDGET_PER_BYTE;
    LIMIT.store(
        LIVE.load(Relaxed) + (budget * PEAK_OVER_BUDGET) as usize,
        Relaxed,
    );
    let out = pickle::read(data);
    LIMIT.store(0, Relaxed);
    out
}

fuzz_target!(|data: &[u8]| {
    let _ = read_bounded(data);
    // The same bytes after a protocol header: the fuzzer reaches the opcodes at once.
    let mut framed = Vec::with_capacity(data.len() + 2);
    framed.extend_from_slice(&[0x80, 2]);
    framed.extend_from_slice(data);
    if let Ok(v) = read_bounded(&framed) {
        let _ =
            vramshim_analyzer::formats::memviz::events_of(std::path::Path::new("fuzz.pickle"), &v);
    }
});
