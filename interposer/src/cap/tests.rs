use std::cell::RefCell;
use std::path::PathBuf;
use std::sync::Arc;

use super::*;
use vramshim_region::spec::parse_cap;

thread_local! {
    static LINES: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// The cap's log for tests (also the waiting tests'): lines kept per thread.
pub(super) fn capture(line: &str) {
    LINES.with(|l| l.borrow_mut().push(line.to_string()));
}

pub(super) fn take_lines() -> Vec<String> {
    LINES.with(|l| std::mem::take(&mut *l.borrow_mut()))
}

fn queries(q: DeviceQueries) -> &'static OnceLock<DeviceQueries> {
    let cell = Box::leak(Box::new(OnceLock::new()));
    let _ = cell.set(q);
    cell
}

const GIB: u64 = 1 << 30;

fn total_16g(d: i32) -> Option<u64> {
    (0..2).contains(&d).then_some(16 * GIB)
}
fn two_devices() -> Option<i32> {
    Some(2)
}
fn no_process_use(_: i32) -> Option<u64> {
    None
}
fn uuid_of(d: i32) -> Option<[u8; 16]> {
    (0..2).contains(&d).then_some([d as u8 + 1; 16])
}
const SIM2: DeviceQueries = DeviceQueries {
    total: total_16g,
    count: two_devices,
    process_used: no_process_use,
    uuid: uuid_of,
    settle_pools: no_pools_here,
};
fn no_pools_here(_: i32, _: u64) -> Option<u64> {
    None
}

fn settings(cap: &str) -> Settings {
    Settings {
        spec: parse_cap(cap).unwrap(),
        cap_text: Some(cap.to_string()),
        shared: None,
        shared_invalid: None,
        context: ContextMode::Include,
        strict: false,
        fault: Fault::None,
        origin: std::array::from_fn(|_| Some(format!("VRAMSHIM_CAP=\"{cap}\""))),
        replaced: Vec::new(),
        dmem: Vec::new(),
        on_cap: wait::OnCap::Fail,
    }
}

fn private(cap: &str) -> Cap {
    Cap::new(settings(cap), queries(SIM2), capture)
}

fn shared(cap: Option<&str>, path: &std::path::Path) -> Cap {
    let mut s = settings(cap.unwrap_or("1"));
    if cap.is_none() {
        s.spec = CapSpec::none();
        s.cap_text = None;
    }
    s.shared = Some(("test".into(), path.to_path_buf()));
    Cap::new(s, queries(SIM2), capture)
}

/// A region path in a fresh directory, removed when the returned guard is dropped.
fn tmp(tag: &str) -> (vramshim_testkit::TempDir, PathBuf) {
    let d = vramshim_testkit::TempDir::new(&format!("cap-{tag}"));
    let region = d.join("region");
    (d, region)
}

#[test]
fn private_cap_refuses_at_the_cap_and_prints_once() {
    take_lines();
    let c = private("1GiB");
    assert_eq!(c.try_charge(0, GIB / 2, Api::CudaMalloc), Ok(()));
    assert_eq!(c.try_charge(0, GIB / 2, Api::CuMemAlloc), Ok(()));
    assert_eq!(
        c.try_charge(0, 1, Api::CudaMallocAsync),
        Err(Refusal {
            in_use: GIB,
            cap: GIB
        })
    );
    assert_eq!(
        c.try_charge(0, GIB, Api::CuMemCreate),
        Err(Refusal {
            in_use: GIB,
            cap: GIB
        })
    );
    let lines = take_lines();
    assert_eq!(lines.len(), 1, "{lines:?}");
    let l = &lines[0];
    assert!(
        l.contains("cudaMallocAsync of 1 B (1 bytes) on device 0 refused"),
        "{l}"
    );
    assert!(
        l.contains("1 GiB in use")
            && l.contains("cap 1 GiB")
            && l.contains("VRAMSHIM_CAP=\"1GiB\""),
        "{l}"
    );
    c.uncharge(0, GIB / 2);
    assert_eq!(c.try_charge(0, GIB / 2, Api::CudaMalloc), Ok(()));
    // Devices are separate; an out-of-range or host device is never charged.
    assert_eq!(c.try_charge(1, GIB, Api::CudaMalloc), Ok(()));
    assert_eq!(c.try_charge(-1, u64::MAX, Api::CudaMalloc), Ok(()));
    assert_eq!(c.try_charge(99, u64::MAX, Api::CudaMalloc), Ok(()));
}

#[test]
fn fraction_resolves_from_the_device_total() {
    let c = private("0.25");
    assert_eq!(c.try_charge(0, 4 * GIB, Api::CudaMalloc), Ok(()));
    assert_eq!(
        c.try_charge(0, 1, Api::CudaMalloc),
        Err(Refusal {
            in_use: 4 * GIB,
            cap: 4 * GIB
        })
    );
    // Without a driver query, the first memory-information call resolves it.
    let c = Cap::new(settings("0.5"), queries(DeviceQueries::UNKNOWN), capture);
    assert_eq!(c.adjust_meminfo(0, 10 * GIB, 16 * GIB), (8 * GIB, 8 * GIB));
    assert_eq!(
        c.try_charge(0, 8 * GIB + 1, Api::CudaMalloc)
            .map_err(|r| r.cap),
        Err(8 * GIB)
    );
}

static LATE_TOTAL: AtomicU64 = AtomicU64::new(0);
fn late_total(d: i32) -> Option<u64> {
    let t = LATE_TOTAL.load(Relaxed);
    (d == 0 && t > 0).then_some(t)
}

#[test]
fn an_unresolvable_fraction_is_said_once_and_resolves_when_the_total_is_known() {
    take_lines();
    let q = DeviceQueries {
        total: late_total,
        ..DeviceQueries::UNKNOWN
    };
    let c = Cap::new(settings("50%"), queries(q), capture);
    for _ in 0..5 {
        assert_eq!(c.try_charge(0, 64 * GIB, Api::CudaMalloc), Ok(()));
    }
    let lines = take_lines();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains("VRAMSHIM_CAP=\"50%\"")
            && lines[0].contains("device 0 runs uncapped until"),
        "{}",
        lines[0]
    );
    // The driver reports a total later: the next request resolves the cap and is refused.
    LATE_TOTAL.store(16 * GIB, Relaxed);
    assert_eq!(
        c.try_charge(0, 1, Api::CudaMalloc).map_err(|r| r.cap),
        Err(8 * GIB)
    );
    let lines = take_lines();
    assert!(
        lines.len() == 1 && lines[0].contains("refused"),
        "only the refusal is said: {lines:?}"
    );
}

#[test]
fn meminfo_reports_the_cap_clamped_and_never_underflows() {
    let c = private("4GiB");
    assert_eq!(c.adjust_meminfo(0, 15 * GIB, 16 * GIB), (4 * GIB, 4 * GIB));
    c.try_charge(0, 3 * GIB, Api::CudaMalloc).unwrap();
    assert_eq!(c.adjust_meminfo(0, 15 * GIB, 16 * GIB), (GIB, 4 * GIB));
    // Others use the card: free is clamped to the real free.
    assert_eq!(c.adjust_meminfo(0, GIB / 2, 16 * GIB), (GIB / 2, 4 * GIB));
    // A context charged past the cap: free is 0, not 2^64 - something.
    c.on_context_created(0, 10 * GIB, 8 * GIB);
    assert_eq!(c.adjust_meminfo(0, 15 * GIB, 16 * GIB), (0, 4 * GIB));
    assert_eq!(
        c.nvml_adjust(0, 16 * GIB, 15 * GIB, GIB),
        (4 * GIB, 0, 4 * GIB)
    );
    // A cap larger than the card reports the card.
    let big = private("64GiB");
    assert_eq!(
        big.adjust_meminfo(0, 15 * GIB, 16 * GIB),
        (15 * GIB, 16 * GIB)
    );
    assert_eq!(big.total_for(0, 16 * GIB), 16 * GIB);
    // An uncapped device is untouched.
    let one = private("0=1GiB");
    assert_eq!(one.adjust_meminfo(1, 3, 5), (3, 5));
    assert_eq!(one.total_for(1, 5), 5);
    assert_eq!(one.total_for(0, 16 * GIB), GIB);
}

#[test]
fn nvml_numbers_add_up() {
    let c = private("8GiB");
    c.try_charge(0, 2 * GIB, Api::CudaMalloc).unwrap();
    assert_eq!(
        c.nvml_adjust(0, 16 * GIB, 12 * GIB, 4 * GIB),
        (8 * GIB, 6 * GIB, 2 * GIB)
    );
    let (t, r, f, u) = c.nvml_adjust_v2(0, 16 * GIB, GIB / 2, 12 * GIB, 3 * GIB);
    assert_eq!((t, r, f), (8 * GIB, GIB / 2, 6 * GIB));
    assert_eq!(r + f + u, t);
    let n = private("0=1GiB");
    assert_eq!(n.nvml_adjust(1, 10, 6, 4), (10, 6, 4));
}

#[test]
fn per_device_caps() {
    let c = private("0=1GiB,1=0.5");
    assert_eq!(c.total_for(0, 16 * GIB), GIB);
    assert_eq!(c.total_for(1, 16 * GIB), 8 * GIB);
    assert!(c.try_charge(0, GIB + 1, Api::CudaMalloc).is_err());
    assert!(c.try_charge(1, 8 * GIB, Api::CudaMalloc).is_ok());
    assert!(c.try_charge(1, 1, Api::CudaMalloc).is_err());
}

#[test]
fn unknown_device_index_is_pass_through_with_one_line() {
    take_lines();
    let c = private("0=1GiB,3=2GiB");
    assert!(!c.ready());
    assert_eq!(c.try_charge(0, 100 * GIB, Api::CudaMalloc), Ok(()));
    assert_eq!(c.adjust_meminfo(0, 5, 16 * GIB), (5, 16 * GIB));
    let lines = take_lines();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains(
            "VRAMSHIM_CAP=\"0=1GiB,3=2GiB\" names device 3, but this process sees 2 device(s)"
        ),
        "{}",
        lines[0]
    );
    assert!(lines[0].contains("pass-through"));
}

#[test]
fn context_counts_unless_excluded() {
    let c = private("4GiB");
    c.on_context_created(0, 16 * GIB, 16 * GIB - (300 << 20));
    assert_eq!(c.context_charged(0), 300 << 20);
    assert_eq!(
        c.adjust_meminfo(0, 15 * GIB, 16 * GIB).0,
        4 * GIB - (300 << 20)
    );
    assert!(
        c.try_charge(0, 4 * GIB - (300 << 20) + 1, Api::CudaMalloc)
            .is_err()
    );
    c.on_context_destroyed(0);
    assert_eq!(c.in_use(0), 0);
    let mut s = settings("4GiB");
    s.context = ContextMode::Exclude;
    let c = Cap::new(s, queries(SIM2), capture);
    c.on_context_created(0, 16 * GIB, 16 * GIB - (300 << 20));
    assert_eq!(c.in_use(0), 0);
    assert!(c.try_charge(0, 4 * GIB, Api::CudaMalloc).is_ok());
}

#[test]
fn fork_child_starts_empty() {
    take_lines();
    let c = private("1GiB");
    c.try_charge(0, GIB, Api::CudaMalloc).unwrap();
    assert!(c.try_charge(0, 1, Api::CudaMalloc).is_err());
    c.on_fork_child();
    assert_eq!(c.in_use(0), 0);
    assert!(c.try_charge(0, GIB, Api::CudaMalloc).is_ok());
    assert!(c.try_charge(0, 1, Api::CudaMalloc).is_err());
    assert_eq!(
        take_lines().len(),
        2,
        "the child prints its own first refusal"
    );
}

/// The pool's pages are charged quietly (the pool may still place the request by dissolving
/// its cache); an unpooled request the cap would refuse first has the cached pages given back
/// (`release_cached`) and is served without a line; only a final refusal prints one.
#[test]
fn pool_pages_and_unpooled_requests_share_the_cap() {
    take_lines();
    let c = private("8MiB");
    let page = 2 << 20;
    for _ in 0..3 {
        assert!(c.charge_page(0, page, 0).is_ok());
    }
    assert_eq!(
        c.charge_page(0, 4 * page, 0),
        Err(Refusal {
            in_use: 3 * page,
            cap: 8 << 20
        })
    );
    assert!(take_lines().is_empty(), "a refused page says nothing");
    // 4 MiB unpooled: refused until the pool gives two cached pages back.
    let mut asked = 0;
    let got = c.charge_alloc_or(0, 4 << 20, Api::CudaMallocPitch, 0, || {
        asked += 1;
        c.uncharge(0, 2 * page);
        true
    });
    assert_eq!((got, asked), (Ok(4 << 20), 1));
    assert!(take_lines().is_empty(), "served after the trim: no line");
    assert_eq!(c.in_use(0), 3 * page);
    // Nothing left to give back: refused, one line.
    let got = c.charge_alloc_or(0, 4 << 20, Api::CudaMallocPitch, 0, || false);
    assert!(got.is_err());
    assert_eq!(take_lines().len(), 1);
    // A pool refusal reported by the dispatcher counts as the first refusal's line only once.
    c.pool_refused(0, 4 << 20, got.unwrap_err(), Api::CudaMalloc);
    assert!(take_lines().is_empty());
}

/// A fork while another thread holds the packed-page table's lock: in the child (where that
/// thread does not exist) the table starts empty and unlocked, so packed allocations are
/// charged and given back by page as in any process, without waiting on the lock.
#[test]
fn fork_child_gets_a_free_packed_table() {
    const ADDR: u64 = 0x7000_0000_0000;
    let c = Arc::new(private("64MiB"));
    let ch = c.charge_alloc(0, 1024, Api::CudaMalloc).unwrap();
    assert_eq!(
        c.settle_alloc(0, ADDR, 1024, ch, Api::CudaMalloc),
        PACKED_CHARGE
    );
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let c2 = c.clone();
    let holder = std::thread::spawn(move || {
        let g = c2.packed_lock(u32::MAX).unwrap();
        held_tx.send(()).unwrap();
        go_rx.recv().unwrap();
        drop(g);
    });
    held_rx.recv().unwrap();
    // SAFETY: fork has no memory preconditions; the child runs only the checks below (no
    // panics, no locks of the test harness) and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        c.on_fork_child();
        let ok = (|| {
            c.packed_lock(PACKED_LOCK_TRIES)?;
            let ch = c.charge_alloc(0, 1024, Api::CudaMalloc).ok()?;
            let e = c.settle_alloc(0, ADDR, 1024, ch, Api::CudaMalloc);
            (e == PACKED_CHARGE && c.in_use(0) == DEVICE_PAGE).then_some(())?;
            c.uncharge_entry(0, ADDR, e);
            (c.in_use(0) == 0).then_some(())
        })()
        .is_some();
        // SAFETY: ends the child without running the parent's atexit handlers.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) }
    }
    go_tx.send(()).unwrap();
    holder.join().unwrap();
    let mut status = 0;
    // SAFETY: our own child; a valid out-pointer.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child's packed table was not usable (status {status:#x})"
    );
}

fn hammer_private(c: Arc<Cap>, threads: usize, iters: usize) -> u64 {
    let cap = c.cap_bytes(0);
    let device = Arc::new(AtomicU64::new(0));
    let violations = Arc::new(AtomicU64::new(0));
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let (c, device, violations) =
                (Arc::clone(&c), Arc::clone(&device), Arc::clone(&violations));
            std::thread::spawn(move || {
                let mut held = Vec::new();
                let mut rng = vramshim_testkit::XorShift(0x2545_f491_4f6c_dd1d ^ (t as u64 + 1));
                for _ in 0..iters {
                    let x = rng.next_u64();
                    if !x.is_multiple_of(3) || held.is_empty() {
                        let b = 1 + x % (cap / 3);
                        if c.try_charge(0, b, Api::CudaMalloc).is_ok() {
                            if device.fetch_add(b, SeqCst) + b > cap {
                                violations.fetch_add(1, SeqCst);
                            }
                            held.push(b);
                        }
                    } else {
                        let b: u64 = held.swap_remove(x as usize % held.len());
                        device.fetch_sub(b, SeqCst);
                        c.uncharge(0, b);
                    }
                }
                for b in held {
                    device.fetch_sub(b, SeqCst);
                    c.uncharge(0, b);
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    violations.load(SeqCst)
}

#[test]
fn threads_never_pass_a_private_cap() {
    let c = Arc::new(private("1MiB"));
    assert_eq!(hammer_private(Arc::clone(&c), 8, 30_000), 0);
    assert_eq!(c.in_use(0), 0);
}

#[test]
fn racy_fault_is_caught_by_the_thread_test() {
    let mut s = settings("1MiB");
    s.fault = Fault::RacyCharge;
    let mut caught = false;
    for _ in 0..50 {
        let c = Arc::new(Cap::new(s.clone(), queries(SIM2), capture));
        if hammer_private(c, 8, 20_000) > 0 {
            caught = true;
            break;
        }
    }
    assert!(caught);
}

/// Two members of the group at `path` (the first creates it), with these caps: two
/// "processes" in one, with the same pid, so they get one image (else the second would free
/// the first's slot as the leftover of an exec).
fn two_members(path: &std::path::Path, first: &str, second: &str) -> (Cap, Cap) {
    take_lines();
    let a = shared(Some(first), path);
    let mut b = shared(Some(second), path);
    b.image = a.image;
    (a, b)
}

#[test]
fn shared_budget_across_two_caps() {
    let (_dir, path) = tmp("shared");
    let (a, b) = two_members(&path, "1GiB", "2GiB");
    a.try_charge(0, GIB / 2, Api::CudaMalloc).unwrap();
    // b's VRAMSHIM_CAP differs: warned; the region's cap, the stricter, binds.
    assert!(b.try_charge(0, GIB / 2 + 1, Api::CudaMalloc).is_err());
    let lines = take_lines();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("differs from the cap of the shared region")
                && l.contains("both apply and the stricter binds")),
        "{lines:?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("VRAMSHIM_SHARED=\"test\"") && l.contains("refused")),
        "{lines:?}"
    );
    assert_eq!(b.adjust_meminfo(0, 15 * GIB, 16 * GIB), (GIB / 2, GIB));
    b.try_charge(0, GIB / 4, Api::CudaMalloc).unwrap();
    assert_eq!(a.adjust_meminfo(0, 15 * GIB, 16 * GIB), (GIB / 4, GIB));
    a.uncharge(0, GIB / 2);
    b.uncharge(0, GIB / 4);
    assert_eq!(a.in_use(0), 0);
    // A process without VRAMSHIM_CAP joins the budget silently.
    let mut c = shared(None, &path);
    c.image = a.image;
    assert_eq!(c.total_for(0, 16 * GIB), GIB);
    assert!(take_lines().is_empty());
    let snap = Region::open(&path).unwrap().snapshot();
    assert_eq!(snap.refusals[0], 1);
}

/// A member whose own cap is smaller than the group's keeps it: the group's cap bounds the
/// group's total, the member's its own bytes (charges, the context, memory queries), and a
/// refusal names the one that bound. A member whose own cap comes from another tool's
/// variable keeps it the same way.
#[test]
fn a_members_smaller_own_cap_still_binds() {
    let (_dir, path) = tmp("member");
    let (a, b) = two_members(&path, "4GiB", "1GiB");
    a.try_charge(0, GIB, Api::CudaMalloc).unwrap();
    let lines = take_lines();
    b.try_charge(0, GIB / 2, Api::CudaMalloc).unwrap();
    let said = take_lines();
    assert!(lines.is_empty(), "{lines:?}");
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(
        said[0].contains("VRAMSHIM_CAP=\"1GiB\" differs from the cap of the shared region")
            && said[0].contains("(\"4294967296\", set by the process that created it)")
            && said[0].contains("both apply and the stricter binds"),
        "{}",
        said[0]
    );
    // Its own 1 GiB binds although the group has 2.5 GiB left.
    assert_eq!(
        b.try_charge(0, GIB / 2 + 1, Api::CudaMalloc),
        Err(Refusal {
            in_use: GIB / 2,
            cap: GIB
        })
    );
    let refusal = take_lines();
    assert!(
        refusal[0].contains("cap 1 GiB (set by VRAMSHIM_CAP=\"1GiB\", this process's own cap inside the budget shared by VRAMSHIM_SHARED=\"test\""),
        "{refusal:?}"
    );
    // A refused charge leaves nothing behind, in the group or its own.
    assert_eq!(b.in_use(0), GIB + GIB / 2);
    b.try_charge(0, GIB / 2, Api::CudaMalloc).unwrap();
    // Memory queries: its own cap is its total, its own room its free memory.
    assert_eq!(b.adjust_meminfo(0, 15 * GIB, 16 * GIB), (0, GIB));
    assert_eq!(b.total_for(0, 16 * GIB), GIB);
    assert_eq!(a.adjust_meminfo(0, 15 * GIB, 16 * GIB), (2 * GIB, 4 * GIB));
    // The cap the registry publishes for each (`vramshim_process_cap_bytes`): the one that
    // binds it.
    assert_eq!(
        (a.binding_limit(0), b.binding_limit(0)),
        (Some(4 * GIB), Some(GIB))
    );
    // And the group's, beside it.
    assert_eq!(
        (a.group_limit(0), b.group_limit(0)),
        (Some(4 * GIB), Some(4 * GIB))
    );
    b.uncharge(0, GIB / 2);
    assert_eq!(b.adjust_meminfo(0, 15 * GIB, 16 * GIB), (GIB / 2, GIB));
    let (total, free, used) = b.nvml_adjust(0, 16 * GIB, 15 * GIB, GIB);
    assert_eq!((total, free, used), (GIB, GIB / 2, GIB / 2));
    // The group's cap still binds the member when the group is fuller than its own cap.
    a.try_charge(0, 2 * GIB + GIB / 4, Api::CudaMalloc).unwrap();
    assert_eq!(
        b.try_charge(0, GIB / 2, Api::CudaMalloc).map_err(|r| r.cap),
        Err(4 * GIB)
    );
    assert_eq!(b.adjust_meminfo(0, 15 * GIB, 16 * GIB), (GIB / 4, GIB));
    b.uncharge(0, GIB / 2);
    a.uncharge(0, 3 * GIB + GIB / 4);
    assert_eq!(a.in_use(0), 0);
    // Another tool's limit as the member's own cap.
    let mut s = settings("512MiB");
    s.cap_text = None;
    s.origin = std::array::from_fn(|_| Some("GPU_MEMORY_LIMIT=\"512MiB\"".to_string()));
    s.shared = Some(("test".into(), path.clone()));
    let mut c = Cap::new(s, queries(SIM2), capture);
    c.image = a.image;
    assert!(c.try_charge(0, GIB, Api::CudaMalloc).is_err());
    let lines = take_lines();
    assert!(
        lines[0].contains("GPU_MEMORY_LIMIT=\"512MiB\" differs from the cap"),
        "{lines:?}"
    );
    assert_eq!(
        a.in_use(0),
        0,
        "a refused member's charge stayed in the group"
    );
}

/// The pool's room (what the cap still lets the process take) of a member whose own cap
/// binds is its own cap less its own bytes, not less the group's: the group's bytes bound it
/// only where the group's room is the smaller.
#[test]
fn a_members_pool_room_is_its_own_where_its_own_cap_binds() {
    let (_dir, path) = tmp("member-room");
    let (a, b) = two_members(&path, "4GiB", "1GiB");
    a.try_charge(0, GIB, Api::CudaMalloc).unwrap();
    b.try_charge(0, GIB / 2, Api::CudaMalloc).unwrap();
    take_lines();
    assert_eq!(b.pool_headroom(0), Some(GIB / 2));
    assert_eq!(a.pool_headroom(0), Some(2 * GIB + GIB / 2));
    // The group fuller than the member's own cap leaves: the group's room binds it.
    a.try_charge(0, 2 * GIB + GIB / 4, Api::CudaMalloc).unwrap();
    assert_eq!(b.pool_headroom(0), Some(GIB / 4));
    a.uncharge(0, 3 * GIB + GIB / 4);
    b.uncharge(0, GIB / 2);
}

/// A member's own cap on a device the group's cap leaves uncapped binds its charges there,
/// and its memory queries say so (its cap as the total, its own room as free), as on a
/// device the group caps.
#[test]
fn a_members_own_cap_on_a_device_the_group_leaves_uncapped() {
    let (_dir, path) = tmp("member-uncapped");
    let (a, b) = two_members(&path, "0=4GiB", "1GiB");
    a.try_charge(0, GIB, Api::CudaMalloc).unwrap();
    b.try_charge(1, GIB / 2, Api::CudaMalloc).unwrap();
    assert_eq!(
        b.try_charge(1, GIB / 2 + 1, Api::CudaMalloc)
            .map_err(|r| r.cap),
        Err(GIB)
    );
    let _ = take_lines();
    assert_eq!(b.adjust_meminfo(1, 15 * GIB, 16 * GIB), (GIB / 2, GIB));
    assert_eq!(b.total_for(1, 16 * GIB), GIB);
    assert_eq!((a.binding_limit(1), b.binding_limit(1)), (None, Some(GIB)));
    assert_eq!((a.group_limit(1), b.group_limit(1)), (None, None));
    assert_eq!(
        b.nvml_adjust(1, 16 * GIB, 15 * GIB, GIB),
        (GIB, GIB / 2, GIB / 2)
    );
    // The device's own free memory still bounds it.
    assert_eq!(b.adjust_meminfo(1, GIB / 4, 16 * GIB), (GIB / 4, GIB));
    // The trace header's device cap (what `is_capped` and `total_for` give) says so too.
    assert!(b.is_capped(1) && b.is_capped(0) && a.is_capped(0));
    // The group member without a cap of its own sees the device as it is.
    assert!(!a.is_capped(1));
    assert_eq!(
        a.adjust_meminfo(1, 15 * GIB, 16 * GIB),
        (15 * GIB, 16 * GIB)
    );
    assert_eq!(a.total_for(1, 16 * GIB), 16 * GIB);
    b.uncharge(1, GIB / 2);
    assert_eq!(b.adjust_meminfo(1, 15 * GIB, 16 * GIB), (GIB, GIB));
    a.uncharge(0, GIB);
}

/// A region that cannot be used never leaves the process uncapped: it keeps its own cap
/// (one line says so), or refuses everything in strict mode.
#[test]
fn bad_region_keeps_the_own_cap_with_one_line() {
    take_lines();
    let (_dir, path) = tmp("corrupt");
    std::fs::write(&path, vec![7u8; 100]).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let c = shared(Some("1GiB"), &path);
    assert!(c.try_charge(0, 100 * GIB, Api::CudaMalloc).is_err());
    assert_eq!(c.try_charge(0, GIB / 2, Api::CudaMalloc), Ok(()));
    assert_eq!(c.adjust_meminfo(0, 16 * GIB, 16 * GIB), (GIB / 2, GIB));
    let lines = take_lines();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        lines[0].contains("not usable") && lines[0].contains("keeps its own cap"),
        "{}",
        lines[0]
    );
    // An unwritable place.
    let c = shared(Some("1GiB"), std::path::Path::new("/proc/no/such/dir/r"));
    assert!(c.try_charge(0, 100 * GIB, Api::CudaMalloc).is_err());
    let lines = take_lines();
    assert!(
        lines[0].contains("VRAMSHIM_SHARED=\"test\"") && lines[0].contains("cannot create it"),
        "{}",
        lines[0]
    );
    // Strict: everything refused, said once.
    let mut s = settings("1GiB");
    s.shared = Some(("test".into(), path.clone()));
    s.strict = true;
    let c = Cap::new(s, queries(SIM2), capture);
    assert!(c.try_charge(0, 1, Api::CudaMalloc).is_err());
    assert!(c.try_charge(0, 1, Api::CuMemAlloc).is_err());
    assert_eq!(c.adjust_meminfo(0, 16 * GIB, 16 * GIB).0, 0);
    let lines = take_lines();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("VRAMSHIM_CAP_STRICT=1"), "{}", lines[0]);
    // Strict without a VRAMSHIM_CAP of its own (a member that joins the group's cap): it
    // has no cap to keep either, so everything is refused too.
    let mut s = settings("1GiB");
    s.spec = CapSpec::none();
    s.cap_text = None;
    s.shared = Some(("test".into(), path.clone()));
    s.strict = true;
    let c = Cap::new(s, queries(SIM2), capture);
    assert!(c.try_charge(0, 1, Api::CudaMalloc).is_err());
    assert!(c.try_charge(1, 1, Api::CuMemAlloc).is_err());
    assert_eq!(c.adjust_meminfo(0, 16 * GIB, 16 * GIB), (0, 16 * GIB));
    let lines = take_lines();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("VRAMSHIM_CAP_STRICT=1"), "{}", lines[0]);
    // The fault switch makes an unusable region mean pass-through (the tests above would
    // fail).
    let mut s = settings("1GiB");
    s.shared = Some(("test".into(), path));
    s.fault = Fault::SquatPassThrough;
    let c = Cap::new(s, queries(SIM2), capture);
    assert_eq!(c.try_charge(0, 100 * GIB, Api::CudaMalloc), Ok(()));
    assert!(take_lines()[0].contains("pass-through"));
}

/// Allocations are charged the device's footprint: pages of their own rounded to 2 MiB,
/// packed ones a shared page once per page.
#[test]
fn charges_are_device_footprints() {
    const MIB: u64 = 1 << 20;
    let c = private("16MiB");
    // 1 MiB + 1 B costs a whole page: 8 of them fill 16 MiB.
    for _ in 0..8 {
        let ch = c.charge_alloc(0, MIB + 1, Api::CudaMalloc).unwrap();
        assert_eq!(ch, 2 * MIB);
    }
    assert!(c.charge_alloc(0, MIB + 1, Api::CudaMalloc).is_err());
    assert_eq!(c.in_use(0), 16 * MIB);
    let c = private("16MiB");
    // Packed allocations in one page: the page is charged once, freed with the last.
    let page = 0x7f00_0000_0000u64;
    let a = c.charge_alloc(0, 1024, Api::CudaMalloc).unwrap();
    let a = c.settle_alloc(0, page, 1024, a, Api::CudaMalloc);
    let b = c.charge_alloc(0, 1024, Api::CudaMalloc).unwrap();
    let b = c.settle_alloc(0, page + 1024, 1024, b, Api::CudaMalloc);
    assert_eq!((a, b), (PACKED_CHARGE, PACKED_CHARGE));
    assert_eq!(c.in_use(0), 2 * MIB);
    let o = c.charge_alloc(0, 1024, Api::CudaMalloc).unwrap();
    let o = c.settle_alloc(0, page + (2 * MIB), 1024, o, Api::CudaMalloc);
    assert_eq!(c.in_use(0), 4 * MIB);
    c.uncharge_entry(0, page, a);
    assert_eq!(c.in_use(0), 4 * MIB);
    c.uncharge_entry(0, page + 1024, b);
    assert_eq!(c.in_use(0), 2 * MIB);
    c.uncharge_entry(0, page + 2 * MIB, o);
    assert_eq!(c.in_use(0), 0);
    // VMM handles are exact; the fault charges requested bytes.
    assert_eq!(c.charge_alloc(0, 6 * MIB, Api::CuMemCreate), Ok(6 * MIB));
    let mut s = settings("16MiB");
    s.fault = Fault::RequestedBytes;
    let c = Cap::new(s, queries(SIM2), capture);
    assert_eq!(c.charge_alloc(0, MIB + 1, Api::CudaMalloc), Ok(MIB + 1));
}

/// The context charge is checked: with the cap full it waits, and the next allocation is
/// refused until both fit; the total never passes the cap.
#[test]
fn context_charge_never_passes_the_cap() {
    take_lines();
    let c = private("1GiB");
    c.try_charge(0, GIB - (100 << 20), Api::CudaMalloc).unwrap();
    c.on_context_created(0, 10 * GIB, 10 * GIB - (300 << 20));
    assert!(c.in_use(0) <= GIB, "{}", c.in_use(0));
    assert_eq!(c.context_charged(0), 0);
    // What memory queries report counts it already.
    assert_eq!(c.adjust_meminfo(0, 16 * GIB, 16 * GIB).0, 0);
    assert!(c.try_charge(0, 1 << 20, Api::CudaMalloc).is_err());
    c.uncharge(0, GIB - (100 << 20));
    c.try_charge(0, 1 << 20, Api::CudaMalloc).unwrap();
    assert_eq!(c.context_charged(0), 300 << 20);
    assert_eq!(c.in_use(0), (300 << 20) + (1 << 20));
    // Unchecked (the fault switch): the total passes the cap.
    let mut s = settings("1GiB");
    s.fault = Fault::UncheckedContext;
    let c = Cap::new(s, queries(SIM2), capture);
    c.try_charge(0, GIB - (100 << 20), Api::CudaMalloc).unwrap();
    c.on_context_created(0, 10 * GIB, 10 * GIB - (300 << 20));
    assert!(c.in_use(0) > GIB);
}

/// A member that gets no slot is refused (the group's cap holds), with one line.
#[test]
fn a_member_without_a_slot_is_refused() {
    take_lines();
    let (_dir, path) = tmp("full");
    let r = Region::open_or_create(&path, &parse_cap("1GiB").unwrap())
        .unwrap()
        .0;
    let me = ProcessKey::current().unwrap();
    // Fill every slot with live keys of this very process (never reclaimed).
    let mut n = 0;
    while r.claim_slot(me, 0).is_some() {
        n += 1;
    }
    assert_eq!(n, vramshim_region::MAX_SLOTS);
    let c = shared(Some("1GiB"), &path);
    assert!(c.try_charge(0, 1 << 20, Api::CudaMalloc).is_err());
    assert!(c.try_charge(0, 1 << 20, Api::CudaMalloc).is_err());
    let lines = take_lines();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("no free process slot") && lines[0].contains("refused"));
    let mut s = settings("1GiB");
    s.shared = Some(("test".into(), path));
    s.fault = Fault::SlotsUncapped;
    let c = Cap::new(s, queries(SIM2), capture);
    assert_eq!(c.try_charge(0, 100 * GIB, Api::CudaMalloc), Ok(()));
}

#[test]
fn shared_fork_child_gets_its_own_slot() {
    let (_dir, path) = tmp("fork");
    let c = shared(Some("1GiB"), &path);
    c.try_charge(0, GIB / 2, Api::CudaMalloc).unwrap();
    let first = c.slot.load(SeqCst);
    c.on_fork_child();
    c.try_charge(0, GIB / 4, Api::CudaMalloc).unwrap();
    assert_ne!(c.slot.load(SeqCst), first);
    let snap = Region::open(&path).unwrap().snapshot();
    assert_eq!(snap.processes.len(), 2);
    assert_eq!(snap.totals[0], GIB / 2 + GIB / 4);
}

fn ctx_300m(_: i32) -> Option<u64> {
    Some(300 << 20)
}

/// SIM2's devices, where the driver says a context holds 300 MiB.
const CTX_300M: DeviceQueries = DeviceQueries {
    process_used: ctx_300m,
    ..SIM2
};

#[test]
fn context_footprint_is_measured_on_first_touch() {
    let q = CTX_300M;
    let c = Cap::new(settings("4GiB"), queries(q), capture);
    assert_eq!(
        c.adjust_meminfo(0, 15 * GIB, 16 * GIB),
        (4 * GIB - (300 << 20), 4 * GIB)
    );
    assert_eq!(c.context_charged(0), 300 << 20);
    // Measured once.
    c.try_charge(0, GIB, Api::CudaMalloc).unwrap();
    assert_eq!(c.context_charged(0), 300 << 20);
    assert_eq!(c.in_use(0), GIB + (300 << 20));
    // Excluded: nothing charged.
    let mut s = settings("4GiB");
    s.context = ContextMode::Exclude;
    let c = Cap::new(s, queries(q), capture);
    c.try_charge(0, GIB, Api::CudaMalloc).unwrap();
    assert_eq!(c.in_use(0), GIB);
    // Uncapped device: nothing charged.
    let c = Cap::new(settings("1=1GiB"), queries(q), capture);
    c.try_charge(0, GIB, Api::CudaMalloc).unwrap();
    assert_eq!(c.context_charged(0), 0);
}

#[test]
fn a_context_is_charged_once_whoever_measures_it() {
    let q = CTX_300M;
    let c = Cap::new(settings("4GiB"), queries(q), capture);
    c.try_charge(0, GIB, Api::CudaMalloc).unwrap();
    c.on_context_created(0, 10 * GIB, 10 * GIB - (300 << 20));
    assert_eq!(c.context_charged(0), 300 << 20);
    c.on_context_destroyed(0);
    assert_eq!(c.in_use(0), GIB);
    // A new context: reported by the core this time, then not measured again; the driver's
    // per-process figure (300 MiB: a context just created holds no allocation yet, whatever
    // the cap charged before) wins over the free-memory delta, which other processes move too.
    c.on_context_created(0, 10 * GIB, 10 * GIB - (200 << 20));
    c.try_charge(0, 1, Api::CudaMalloc).unwrap();
    assert_eq!(c.context_charged(0), 300 << 20);
    // Without a per-process figure the delta is what there is.
    let c = Cap::new(settings("4GiB"), queries(SIM2), capture);
    c.on_context_created(0, 10 * GIB, 10 * GIB - (200 << 20));
    assert_eq!(c.context_charged(0), 200 << 20);
}

/// After exec (same pid and start time, new image) the old image's slot is freed.
#[test]
fn exec_frees_the_replaced_images_slot() {
    let (_dir, path) = tmp("exec");
    let before = shared(Some("1GiB"), &path);
    before.try_charge(0, GIB / 2, Api::CudaMalloc).unwrap();
    let after = shared(Some("1GiB"), &path);
    after.try_charge(0, GIB, Api::CudaMalloc).unwrap();
    assert_eq!(after.in_use(0), GIB);
    assert_eq!(Region::open(&path).unwrap().snapshot().processes.len(), 1);
}

fn pools_empty(_: i32, _: u64) -> Option<u64> {
    Some(0)
}
fn pools_keep_some(_: i32, _: u64) -> Option<u64> {
    Some(4096)
}

/// A stream-ordered free keeps its charge (the driver's pool may cache the block) until a
/// request would be refused and the pools are emptied; then the request is served. While
/// the pools cannot be emptied (a capture, or something stays cached) the charge stays and
/// the request is refused. `async-uncharge` gives the charge back at once.
#[test]
fn stream_ordered_frees_stay_charged_until_the_pools_are_emptied() {
    let mib = 1u64 << 20;
    for (settle, served) in [
        (pools_empty as fn(i32, u64) -> Option<u64>, true),
        (pools_keep_some, false),
        (no_pools_here, false),
    ] {
        let q = DeviceQueries {
            settle_pools: settle,
            ..SIM2
        };
        let c = Cap::new(settings("64MiB"), queries(q), capture);
        let a = c.charge_alloc(0, 48 * mib, Api::CudaMallocAsync).unwrap();
        c.uncharge_freed(0, 0x1000_0000, a, true);
        assert_eq!((c.in_use(0), c.pool_cached(0)), (48 * mib, 48 * mib));
        // Fits beside the cached block: no settling needed, the charge stays.
        let b = c.charge_alloc(0, 16 * mib, Api::CudaMallocAsync).unwrap();
        c.uncharge_freed(0, 0x2000_0000, b, true);
        assert_eq!(c.pool_cached(0), 64 * mib);
        let r = c.charge_alloc(0, 32 * mib, Api::CudaMalloc);
        assert_eq!(r.is_ok(), served, "{r:?}");
        if served {
            assert_eq!((c.in_use(0), c.pool_cached(0)), (32 * mib, 0));
        } else {
            assert_eq!((c.in_use(0), c.pool_cached(0)), (64 * mib, 64 * mib));
        }
    }
    // Plain frees give back at once; so does everything with the fault switch.
    let c = Cap::new(settings("64MiB"), queries(SIM2), capture);
    let a = c.charge_alloc(0, 48 * mib, Api::CudaMalloc).unwrap();
    c.uncharge_freed(0, 0x1000_0000, a, false);
    assert_eq!(c.in_use(0), 0);
    let mut s = settings("64MiB");
    s.fault = Fault::AsyncUncharge;
    let c = Cap::new(s, queries(SIM2), capture);
    let a = c.charge_alloc(0, 48 * mib, Api::CudaMallocAsync).unwrap();
    c.uncharge_freed(0, 0x1000_0000, a, true);
    assert_eq!((c.in_use(0), c.pool_cached(0)), (0, 0));
    // The context going takes its pools with it.
    let c = Cap::new(settings("64MiB"), queries(SIM2), capture);
    let a = c.charge_alloc(0, 48 * mib, Api::CudaMallocAsync).unwrap();
    c.uncharge_freed(0, 0x1000_0000, a, true);
    c.on_context_destroyed(0);
    assert_eq!((c.in_use(0), c.pool_cached(0)), (0, 0));
}

/// Other tools' per-device limits can name devices the process does not see (HAMi's
/// `CUDA_DEVICE_MEMORY_LIMIT_15` on a 2-GPU node): with a shared group they still cap the
/// process; only a `VRAMSHIM_CAP` list of its own is checked against the devices it sees.
#[test]
fn other_tools_limits_past_the_devices_seen_still_cap_a_group_member() {
    take_lines();
    let (_dir, path) = tmp("tool-limits");
    let list: Vec<String> = (0..16)
        .map(|d| format!("{d}={}GiB", if d == 0 { 4 } else { 8 }))
        .collect();
    let mut s = settings(&list.join(","));
    s.cap_text = None;
    s.origin = std::array::from_fn(|d| {
        Some(if d == 0 {
            "CUDA_DEVICE_MEMORY_LIMIT_0=\"4g\"".to_string()
        } else {
            "GPU_MEMORY_LIMIT=\"8g\"".to_string()
        })
    });
    s.shared = Some(("test".into(), path.to_path_buf()));
    let c = Cap::new(s, queries(SIM2), capture);
    assert!(c.try_charge(0, 4 * GIB, Api::CudaMalloc).is_ok());
    assert!(
        c.try_charge(0, 1, Api::CudaMalloc).is_err(),
        "a group member ran uncapped: {:?}",
        take_lines()
    );
    assert!(
        !take_lines().iter().any(|l| l.contains("pass-through")),
        "no pass-through line expected"
    );
}
