//! A thread's first traced call arms its trace slot's life token (a robust mutex it holds for
//! its life), which adds the mutex to the thread's robust list. That call may run in a signal
//! handler that interrupted the thread inside the C library's lock or unlock of another robust
//! mutex, while the list is being changed (the list head's `list_op_pending` names that
//! mutex): arming then must leave the list alone. Here the handler runs with
//! `list_op_pending` set, as it finds it when it interrupts such an operation, and the list
//! must be the same after its first event; a thread whose first event comes outside such an
//! operation has its token listed (the check is not vacuous). With
//! `VRAMSHIM_TRACE_FAULT=arm-in-op` (the token armed without looking) the handler's event
//! changes the list mid-operation: this fails.

use std::sync::atomic::{AtomicU32, Ordering};

use vramshim::tracer;
use vramshim_testkit::temp_dir;
use vramshim_trace_tests::tick_window::{emit, gettid};

/// The kernel's `struct robust_list_head`.
#[repr(C)]
struct Head {
    list: *mut libc::c_void,
    futex_offset: libc::c_long,
    list_op_pending: *mut libc::c_void,
}

fn head() -> *mut Head {
    let mut head: *mut Head = std::ptr::null_mut();
    let mut len: libc::size_t = 0;
    // SAFETY: get_robust_list(0, ..) writes the calling thread's head and its size.
    let r = unsafe {
        libc::syscall(
            libc::SYS_get_robust_list,
            0 as libc::c_long,
            &mut head as *mut *mut Head,
            &mut len as *mut libc::size_t,
        )
    };
    assert_eq!(r, 0, "get_robust_list: {}", std::io::Error::last_os_error());
    assert_eq!(len, std::mem::size_of::<Head>());
    head
}

static EMITS: AtomicU32 = AtomicU32::new(0);

extern "C" fn first_event(_sig: libc::c_int) {
    emit(gettid(), 0);
    EMITS.fetch_add(1, Ordering::SeqCst);
}

/// The calling thread's robust list (its first entry) after its first event, emitted from a
/// signal handler while `list_op_pending` is `pending` (restored after); and before it.
fn list_around_first_event(pending: bool) -> (usize, usize) {
    let h = head();
    // A zeroed stand-in for the mutex an interrupted operation names: its futex word (at the
    // head's offset from the entry) is 0, no thread's id, so the kernel would leave it be.
    let mut stand_in = [0u64; 64];
    // SAFETY: the head is this thread's, written only by this thread.
    let (before, off) = unsafe { ((*h).list as usize, (*h).futex_offset) };
    assert!(off.unsigned_abs() < 256, "futex offset {off}");
    let entry = (stand_in.as_mut_ptr() as usize + 256) as *mut libc::c_void;
    if pending {
        // SAFETY: as above; the entry lies inside `stand_in`, which outlives the setting.
        unsafe { std::ptr::write_volatile(&mut (*h).list_op_pending, entry) };
    }
    let n = EMITS.load(Ordering::SeqCst);
    // SAFETY: raise delivers SIGUSR1 to this thread (handler installed) before it returns.
    assert_eq!(unsafe { libc::raise(libc::SIGUSR1) }, 0);
    assert_eq!(EMITS.load(Ordering::SeqCst), n + 1, "the handler ran");
    // SAFETY: as above.
    let after = unsafe {
        let after = std::ptr::read_volatile(&(*h).list) as usize;
        std::ptr::write_volatile(&mut (*h).list_op_pending, std::ptr::null_mut());
        after
    };
    std::hint::black_box(&mut stand_in);
    (before, after)
}

#[test]
fn arming_in_a_handler_that_interrupted_a_robust_list_operation_leaves_the_list_alone() {
    let dir = temp_dir("trace_robust_list");
    let path = dir.join("robust.vramtrace");
    tracer::testing::enable(path.to_str().unwrap(), 0);
    // SAFETY: installs a handler (a plain function) for SIGUSR1 in this test process.
    let old = unsafe {
        libc::signal(
            libc::SIGUSR1,
            first_event as extern "C" fn(libc::c_int) as libc::sighandler_t,
        )
    };
    assert_ne!(old, libc::SIG_ERR);
    // Fresh threads: their first event claims a slot and arms its token.
    let (before, after) = std::thread::spawn(|| list_around_first_event(true))
        .join()
        .unwrap();
    assert_eq!(
        after, before,
        "the robust list changed while an operation on it was under way"
    );
    let (before, after) = std::thread::spawn(|| list_around_first_event(false))
        .join()
        .unwrap();
    assert_ne!(
        after, before,
        "outside such an operation the token is armed (listed)"
    );
    tracer::on_exit();
}
