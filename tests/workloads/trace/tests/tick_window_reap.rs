//! A thread that emits and exits while a tick is between taking the partial buffers and
//! freeing the slots of exited threads gets its `ThreadExit` record after its last events:
//! the tick is held there (`tracer::testing::on_tick`, at a tick that frees slots) while the
//! thread emits and exits. With `VRAMSHIM_TRACE_FAULT=late-reap` (exited threads looked for
//! after the buffers were taken, as before) the record comes before those events: this fails.

use std::sync::mpsc::{Receiver, sync_channel};
use std::time::{Duration, Instant};

use vramshim::tracer;
use vramshim::tracer::testing::TickPoint;
use vramshim_testkit::temp_dir;
use vramshim_trace_tests::tick_window::{check, emit, gettid};

/// True once thread `tid` of this process no longer exists.
fn gone(tid: u32) -> bool {
    // SAFETY: tgkill with signal 0 only checks that the thread exists.
    let r = unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid as libc::c_long, 0) };
    r == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

fn wait<T>(rx: &Receiver<T>, what: &str) -> T {
    // A tick that frees slots comes every second; this only bounds a hang.
    rx.recv_timeout(Duration::from_secs(120))
        .unwrap_or_else(|_| panic!("no {what} within 120 s"))
}

#[test]
fn a_thread_that_exits_while_a_tick_reaps_gets_its_exit_record_after_its_events() {
    let dir = temp_dir("trace_tick_window_reap");
    let path = dir.join("window.vramtrace");
    tracer::testing::enable(path.to_str().unwrap(), 0);
    let (go_tx, go_rx) = sync_channel::<()>(0);
    let (tid_tx, tid_rx) = sync_channel::<u32>(0);
    let (after_tx, after_rx) = sync_channel::<bool>(1);
    let (reaped_tx, reaped_rx) = sync_channel::<()>(1);
    // 0: waiting for the first reaping tick; 1: the thread has exited in it; 2: a second
    // reaping tick began (the thread gone before it: it frees the slot); 3: the tick after
    // it began (the second one is written).
    let mut stage = 0;
    tracer::testing::on_tick(Some(Box::new(move |p| match (stage, p) {
        (0, TickPoint::BeforeReap) => {
            go_tx.send(()).unwrap();
            let tid = tid_rx.recv().unwrap();
            // The thread has returned; wait until the kernel has let it go.
            let deadline = Instant::now() + Duration::from_secs(60);
            while !gone(tid) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            let _ = after_tx.send(gone(tid));
            stage = 1;
        }
        (1, TickPoint::BeforeReap) => stage = 2,
        (2, TickPoint::BeforeDrain { .. }) => {
            let _ = reaped_tx.send(());
            stage = 3;
        }
        _ => {}
    })));
    let t = std::thread::spawn(move || {
        let tid = gettid();
        let mut next = 0;
        for _ in 0..100 {
            emit(tid, next);
            next += 1;
        }
        go_rx.recv().unwrap();
        for _ in 0..10 {
            emit(tid, next);
            next += 1;
        }
        tid_tx.send(tid).unwrap();
        (tid, next)
    });
    let exited = wait(&after_rx, "tick that frees slots");
    assert!(exited, "the thread still existed 60 s after it returned");
    let (tid, n) = t.join().unwrap();
    wait(&reaped_rx, "second tick that frees slots");
    tracer::testing::on_tick(None);
    tracer::on_exit();
    let c = check(&path, tid, n);
    assert_eq!(c.exits, 1, "thread {tid}: one ThreadExit record");
}
