//! NVIDIA's runtime tries a stream-ordered allocation before it has made its context current
//! (RMM's CudaAsyncMemoryResource, first thing): the driver answers CUDA_ERROR_INVALID_CONTEXT
//! (201), as a real driver does with no current context, and the runtime makes its primary
//! context current and repeats the call; the program only sees the retry. The analysis counts
//! such a failure as retried by the runtime, not as a failed allocation, and only when the same
//! thread's next allocation is that same request succeeding: any other 201, or a 201 followed by
//! something else, stays a failure.

mod common;
use common::*;

use std::path::Path;

use vramshim_analyzer::analysis::{self, Options, TraceReport};
use vramshim_analyzer::input;
use vramshim_trace::{AllocKind, Api, Event, MemOp};

const INVALID_CONTEXT: i32 = 201;

fn op(t: u64, tid: u32, addr: u64, size: u64, result: i32) -> MemOp {
    MemOp {
        tid,
        kind: AllocKind::Async,
        ..memop(t, Api::CuMemAllocFromPoolAsync, addr, size, result)
    }
}

fn alloc(t: u64, tid: u32, addr: u64, size: u64, result: i32) -> Event {
    Event::Alloc(op(t, tid, addr, size, result))
}

fn report(dir: &Path, events: &[Event]) -> TraceReport {
    let opts = Options {
        progress: false,
        ..Options::default()
    };
    analysis::analyze(
        input::open(&write_trace(dir, "retried", events)).unwrap(),
        &opts,
    )
    .unwrap()
}

/// (failed, retried) of device 0, and the same from its call rows.
fn counts(r: &TraceReport) -> (u64, u64, u64, u64) {
    let d = &r.devices[0];
    (
        d.failed_allocs,
        d.retried_allocs,
        d.calls.iter().map(|c| c.failed).sum(),
        d.calls.iter().map(|c| c.retried).sum(),
    )
}

const MIB: u64 = 1 << 20;

#[test]
fn a_failure_for_want_of_a_context_retried_at_once_is_not_a_failure() {
    let d = scratch("retried");
    let r = report(
        &d,
        &[
            alloc(1_000, 5, 0, MIB, INVALID_CONTEXT),
            alloc(2_000, 5, 0x7000_0000, MIB, 0),
            alloc(3_000, 5, 0x7100_0000, 64 * MIB, 0),
        ],
    );
    assert_eq!(counts(&r), (0, 1, 0, 1), "{:?}", r.devices[0].calls);
    assert_eq!(r.devices[0].allocs, 2);
    let text = String::from_utf8(ok(&d, &["summary", "t.vramtrace"]).stdout).unwrap();
    assert!(
        text.contains("allocations 2 (0 failed, 0 pooled)")
            && text.contains("retried by the runtime: 1")
            && text.contains("1 retried by the runtime"),
        "the summary says so: {text}"
    );
}

#[test]
fn other_failures_stay_failures() {
    // Another thread's success does not retry this thread's request; a different size is
    // another request; an out-of-memory is never "retried"; a 201 with nothing after stays.
    let r = report(
        &scratch("not-retried"),
        &[
            alloc(1_000, 5, 0, MIB, INVALID_CONTEXT),
            alloc(2_000, 6, 0x7000_0000, MIB, 0),
            alloc(3_000, 5, 0x7100_0000, 2 * MIB, 0),
            alloc(4_000, 7, 0, MIB, 2),
            alloc(5_000, 7, 0x7200_0000, MIB, 0),
            alloc(6_000, 8, 0, MIB, INVALID_CONTEXT),
        ],
    );
    assert_eq!(counts(&r), (3, 0, 3, 0), "{:?}", r.devices[0].calls);
}
