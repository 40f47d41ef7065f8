//! A thread that emits after the exit path's tick has taken the last buffers (and before the
//! end record) gets every event written or counted lost: the exit tick is held after its drain
//! (`tracer::testing::on_tick`) while another thread emits more than a buffer's worth (so that
//! one would be handed over, too). The writer no longer takes events then, so they are counted
//! in the `Lost` record before the end record. With `VRAMSHIM_TRACE_FAULT=late-close` (threads
//! stopped only after the end record, as before) they sit in the thread's buffer and the
//! writer's queue, neither written nor counted: this fails. Here the thread appends `Event`s
//! (`tracer::emit`); `tick_window_exit_late_memop.rs` appends the dispatcher's way.

use vramshim_trace_tests::tick_window::{emit, events_after_the_exit_drain};

#[test]
fn events_emitted_after_the_exit_ticks_drain_are_counted_lost() {
    events_after_the_exit_drain("trace_tick_window_exit_late", emit);
}
