//! `tick_window_exit_late.rs` with the dispatcher's way of appending an allocation
//! (`tracer::emit_memop`: the owner's window when its buffer has room, the general path
//! otherwise), which `libvramshim.so`'s hooks take. With `VRAMSHIM_TRACE_FAULT=late-close` this
//! fails.

use vramshim_trace_tests::tick_window::{emit_memop, events_after_the_exit_drain};

#[test]
fn allocations_appended_after_the_exit_ticks_drain_are_counted_lost() {
    events_after_the_exit_drain("trace_tick_window_exit_late_memop", emit_memop);
}
