//! Helper of `tests/tid_reuse.rs`: a traced process in which a new thread gets the tid of a
//! thread that has just exited, before the trace writer has noticed the exit. Run as the first
//! process of a new pid namespace (`unshare --user --map-root-user --pid --fork --mount-proc`),
//! where `/proc/sys/kernel/ns_last_pid` picks the next tid the kernel hands out.
//!
//! `tid_reuse TRACE MODE`: thread A emits allocations 0..5 and exits; thread B is made with
//! A's tid, and (MODE `emits`) emits allocations 100..105 at once, or (MODE `silent`) only
//! after the marker. While B runs, the process waits for two ticks of the writer that free the
//! slots of exited threads to pass, then emits the marker (an allocation of `MARKER` bytes on
//! the main thread); then B ends and the trace is finished. Prints `tid TID` (A's and B's).
//! Exits 3 when B did not get A's tid (the test says why).

use std::sync::mpsc::{Receiver, sync_channel};
use std::time::{Duration, Instant};

use vramshim::tracer;
use vramshim::tracer::testing::TickPoint;
use vramshim_trace_tests::tick_window::{emit, gettid};

/// Size of the main thread's marker allocation.
const MARKER: u64 = 999_999;

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

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, path, mode] = &args[..] else {
        eprintln!("usage: tid_reuse TRACE emits|silent");
        std::process::exit(2);
    };
    let silent = match mode.as_str() {
        "emits" => false,
        "silent" => true,
        _ => {
            eprintln!("tid_reuse: MODE is emits or silent, not {mode:?}");
            std::process::exit(2);
        }
    };
    tracer::testing::enable(path, 0);
    let me = gettid();
    emit(me, 0);

    let a = std::thread::spawn(|| {
        let tid = gettid();
        for i in 0..5 {
            emit(tid, i);
        }
        tid
    })
    .join()
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !gone(a) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(gone(a), "thread {a} still existed 60 s after it returned");

    // The next tid the kernel hands out in this namespace is A's.
    std::fs::write("/proc/sys/kernel/ns_last_pid", format!("{}", a - 1))
        .unwrap_or_else(|e| panic!("cannot write /proc/sys/kernel/ns_last_pid: {e}"));
    let (tid_tx, tid_rx) = sync_channel::<u32>(1);
    let (end_tx, end_rx) = sync_channel::<()>(1);
    let b = std::thread::spawn(move || {
        let tid = gettid();
        if !silent {
            for i in 100..105 {
                emit(tid, i);
            }
        }
        tid_tx.send(tid).unwrap();
        end_rx.recv().unwrap();
        if silent {
            for i in 100..105 {
                emit(tid, i);
            }
        }
    });
    let b_tid = wait(&tid_rx, "tid from thread B");
    println!("tid {a} {b_tid}");
    if b_tid != a {
        eprintln!("tid_reuse: thread B got tid {b_tid}, not thread A's {a}");
        end_tx.send(()).unwrap();
        b.join().unwrap();
        std::process::exit(3);
    }

    // Two ticks that free slots, both begun after A was gone (the first may have looked for
    // exited threads before), then the next tick (the second's records are written).
    let (reaped_tx, reaped_rx) = sync_channel::<()>(1);
    let mut stage = 0;
    tracer::testing::on_tick(Some(Box::new(move |p| match (stage, p) {
        (0 | 1, TickPoint::BeforeReap) => stage += 1,
        (2, TickPoint::BeforeDrain { .. }) => {
            let _ = reaped_tx.send(());
            stage = 3;
        }
        _ => {}
    })));
    wait(&reaped_rx, "two ticks that free slots");
    tracer::testing::on_tick(None);
    emit(me, MARKER);

    end_tx.send(()).unwrap();
    b.join().unwrap();
    tracer::on_exit();
}
