//! A signal handler that exits (`on_exit`) while the same thread is already in the exit path,
//! holding the trace writer's lock (here: the exit tick is held where it has the lock and has
//! not yet closed the writer), returns at once instead of waiting for that lock, which its own
//! thread holds: the library never hangs a job. The interrupted exit path then finishes the
//! trace as usual. With `VRAMSHIM_TRACE_FAULT=nested-exit-waits` (the nested exit waits for
//! the lock) the handler never returns: the watchdog then fails the test.

use std::sync::atomic::{AtomicBool, Ordering};

use vramshim::tracer;
use vramshim::tracer::testing::TickPoint;
use vramshim_testkit::temp_dir;
use vramshim_trace_tests::tick_window::{check, emit, gettid, watchdog};

static HANDLED: AtomicBool = AtomicBool::new(false);

extern "C" fn exit_from_handler(_sig: libc::c_int) {
    tracer::on_exit();
    HANDLED.store(true, Ordering::SeqCst);
}

#[test]
fn an_exit_in_a_handler_that_interrupted_the_exit_path_returns() {
    let dir = temp_dir("trace_tick_window_exit_nested");
    let path = dir.join("window.vramtrace");
    tracer::testing::enable(path.to_str().unwrap(), 0);
    let tid = gettid();
    for i in 0..10 {
        emit(tid, i);
    }
    // SAFETY: installs a handler for SIGUSR1 (a plain function) in this test process.
    let old = unsafe {
        libc::signal(
            libc::SIGUSR1,
            exit_from_handler as extern "C" fn(libc::c_int) as libc::sighandler_t,
        )
    };
    assert_ne!(old, libc::SIG_ERR);
    let mut fired = false;
    tracer::testing::on_tick(Some(Box::new(move |p| {
        if p == (TickPoint::BeforeDrain { at_exit: true }) && !fired {
            fired = true;
            // SAFETY: raise delivers SIGUSR1 to this thread before it returns.
            assert_eq!(unsafe { libc::raise(libc::SIGUSR1) }, 0);
        }
    })));
    watchdog(
        120,
        "the nested exit did not return in 120 s: it waits for its own thread",
    );
    tracer::on_exit();
    tracer::testing::on_tick(None);
    assert!(HANDLED.load(Ordering::SeqCst), "the handler returned");
    check(&path, tid, 10);
}
