use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use super::*;

/// A fresh directory, removed (with what the test made in it) when dropped.
fn tmpdir(tag: &str) -> vramshim_testkit::TempDir {
    vramshim_testkit::TempDir::new(&format!("region-{tag}"))
}

fn gib(n: u64) -> u64 {
    n << 30
}

fn caps(text: &str) -> CapSpec {
    spec::parse_cap(text).unwrap()
}

fn me() -> ProcessKey {
    ProcessKey::current().unwrap()
}

/// A key for a process that does not exist.
fn ghost(n: u32) -> ProcessKey {
    ProcessKey::new(u32::MAX - n, 1)
}

#[test]
fn layout_is_cache_line_sized() {
    assert_eq!(std::mem::size_of::<DeviceLine>(), 64);
    assert_eq!(std::mem::size_of::<Slot>() % 64, 0);
    assert_eq!(std::mem::align_of::<Layout>(), 64);
    assert!(page_len() >= LAYOUT_SIZE);
}

#[test]
fn create_then_attach_keeps_the_first_caps() {
    let dir = tmpdir("attach");
    let path = dir.join("r");
    let (a, how) = Region::open_or_create(&path, &caps("0=4GiB,1=0.5")).unwrap();
    assert_eq!(how, Opened::Created);
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.mode() & 0o777, 0o600);
    let (b, how) = Region::open_or_create(&path, &caps("1GiB")).unwrap();
    assert_eq!(how, Opened::Attached);
    assert_eq!(b.caps(), caps("0=4GiB,1=0.5"));
    assert_eq!(b.cap_text(), "0=4294967296,1=0.5");
    let s = a.claim_slot(me(), 1).unwrap();
    a.charge(s, 0, 100, gib(4), Check::Atomic).unwrap();
    assert_eq!(b.in_use(0), 100, "both mappings see one budget");
    // No temporary files are left behind.
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
}

#[test]
fn concurrent_creators_agree_on_one_region() {
    let dir = tmpdir("race");
    let path = Arc::new(dir.join("r"));
    let hs: Vec<_> = (0..8)
        .map(|i| {
            let p = Arc::clone(&path);
            std::thread::spawn(move || {
                let (r, how) = Region::open_or_create(&p, &caps(&format!("{}GiB", i + 1))).unwrap();
                (r.cap_text(), how)
            })
        })
        .collect();
    let results: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(
        results
            .iter()
            .filter(|(_, h)| *h == Opened::Created)
            .count(),
        1
    );
    assert!(results.iter().all(|(t, _)| *t == results[0].0));
}

#[test]
fn foreign_or_broken_files_are_refused() {
    let dir = tmpdir("refuse");
    // Readable by others.
    let p = dir.join("mode");
    Region::open_or_create(&p, &caps("1GiB")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = Region::open_or_create(&p, &caps("1GiB")).err().unwrap();
    assert!(matches!(e, RegionError::Mode { .. }), "{e}");
    assert!(e.to_string().contains("readable or writable by others"));
    // Garbage of the right size.
    let p = dir.join("garbage");
    std::fs::write(&p, vec![0xabu8; page_len()]).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    let e = Region::open(&p).err().unwrap();
    assert!(e.to_string().contains("not a vramshim cap region"), "{e}");
    // Another version (right magic, wrong size).
    let p = dir.join("v7");
    let mut bytes = vec![0u8; 8192];
    bytes[..8].copy_from_slice(&MAGIC.to_le_bytes());
    bytes[8..16].copy_from_slice(&7u64.to_le_bytes());
    std::fs::write(&p, bytes).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    let e = Region::open(&p).err().unwrap();
    assert!(e.to_string().contains("layout version 7"), "{e}");
    // Right size and magic, another version word (version 1 keyed devices by ordinal).
    let p = dir.join("v1");
    let (r, _) = Region::open_or_create(&p, &caps("1GiB")).unwrap();
    r.layout().header.version.store(1, SeqCst);
    let e = Region::open(&p).err().unwrap();
    assert!(
        e.to_string()
            .contains("layout version 1, this library reads version 3"),
        "{e}"
    );
    // A corrupt cap record.
    r.layout().header.version.store(VERSION, SeqCst);
    r.layout().header.cap_kind[2].store(9, SeqCst);
    let e = Region::open(&p).err().unwrap();
    assert!(e.to_string().contains("invalid cap record"), "{e}");
    // A symbolic link.
    let p = dir.join("link");
    std::os::unix::fs::symlink(dir.join("v3"), &p).unwrap();
    assert!(matches!(
        Region::open(&p),
        Err(RegionError::NotAFile { .. })
    ));
    // A directory.
    assert!(Region::open(&dir).is_err());
    // A FIFO: refused at once (opened non-blocking, its type checked on the open file).
    let p = dir.join("fifo");
    let st = std::process::Command::new("mkfifo")
        .arg(&p)
        .status()
        .unwrap();
    assert!(st.success());
    let (tx, rx) = std::sync::mpsc::channel();
    let q = p.clone();
    std::thread::spawn(move || {
        let _ = tx.send(matches!(
            Region::open_or_create(&q, &caps("1GiB")),
            Err(RegionError::NotAFile { .. })
        ));
    });
    assert_eq!(
        rx.recv_timeout(std::time::Duration::from_secs(60)),
        Ok(true),
        "a FIFO must be refused, never waited on"
    );
    // Another user's file (we run as root in CI; otherwise chown is not possible).
    if sys::euid() == 0 {
        let p = dir.join("other");
        Region::open_or_create(&p, &caps("1GiB")).unwrap();
        std::os::unix::fs::chown(&p, Some(65534), None).unwrap();
        let e = Region::open(&p).err().unwrap();
        assert!(
            matches!(e, RegionError::NotOwned { owner: 65534, .. }),
            "{e}"
        );
    }
    // An unwritable place.
    let e = Region::open_or_create(Path::new("/proc/vramshim-nope/r"), &caps("1GiB"))
        .err()
        .unwrap();
    assert!(e.to_string().contains("cannot create it"), "{e}");
}

fn gpu(n: u8) -> DeviceId {
    DeviceId([n; 16])
}

#[test]
fn lines_are_claimed_once_per_device_in_order() {
    let r = Region::anonymous(&caps("1GiB")).unwrap();
    assert_eq!(r.line_for(gpu(7)), Some(0));
    assert_eq!(r.line_for(gpu(3)), Some(1));
    assert_eq!(r.line_for(gpu(7)), Some(0));
    assert_eq!(r.line_for(DeviceId::ordinal(0)), Some(2));
    assert_ne!(DeviceId::ordinal(0), DeviceId::ordinal(1));
    let snap = r.snapshot();
    assert_eq!(snap.identities[0], Some(gpu(7)));
    assert_eq!(snap.identities[1], Some(gpu(3)));
    assert_eq!(snap.identities[3], None);
    for n in 100..(100 + MAX_DEVICES as u8 - 3) {
        assert!(r.line_for(gpu(n)).is_some());
    }
    assert_eq!(
        r.line_for(gpu(99)),
        None,
        "every line counts another device"
    );
    assert_eq!(r.line_for(gpu(3)), Some(1), "known devices keep their line");
}

fn set_claim(r: &Region, line: usize, word: u64) {
    r.layout().header.devices[line].claim.store(word, SeqCst);
}

/// A line left mid-claim by a process that died (its key recorded in the claim) is taken over
/// by the next scan, at once; with recovery off (`LineFaults::no_recovery`) the scan waits and
/// gives up, and the device has no line (its allocations would be refused). A claim that
/// names no owner is never taken over either.
#[test]
fn a_line_left_mid_claim_by_a_dead_process_is_taken_over() {
    let r = Region::anonymous(&caps("1GiB")).unwrap();
    set_claim(&r, 0, CLAIMED_BY | ghost(1).word());
    r.layout().header.devices[0].identity[0].store(12345, SeqCst);
    let stuck = LineFaults {
        no_recovery: true,
        ..LineFaults::default()
    };
    assert_eq!(r.line_for_with(gpu(5), stuck), None, "recovery off: stuck");
    assert_eq!(r.line_for(gpu(5)), Some(0), "taken over");
    assert_eq!(r.snapshot().identities[0], Some(gpu(5)));
    assert_eq!(r.line_for(gpu(6)), Some(1));
    // A reused pid (another start time) is not the claimer.
    let me = me();
    let impostor = ProcessKey::new(me.pid(), me.start_low() + 1);
    set_claim(&r, 2, CLAIMED_BY | impostor.word());
    assert_eq!(r.line_for(gpu(7)), Some(2));
    // No owner recorded: never taken over.
    set_claim(&r, 3, LINE_CLAIMING);
    assert_eq!(r.line_for(gpu(8)), None);
}

/// A claim by a live process is waited for, never taken over: the claimer's device gets the
/// line, the waiter's the next one.
#[test]
fn a_live_claim_is_waited_for() {
    let r = Arc::new(Region::anonymous(&caps("1GiB")).unwrap());
    set_claim(&r, 0, CLAIMED_BY | me().word());
    let r2 = r.clone();
    let publisher = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(100));
        let line = &r2.layout().header.devices[0];
        let w = gpu(1).words();
        line.identity[0].store(w[0], SeqCst);
        line.identity[1].store(w[1], SeqCst);
        line.claim.store(LINE_PUBLISHED, SeqCst);
    });
    assert_eq!(r.line_for(gpu(2)), Some(1));
    publisher.join().unwrap();
    assert_eq!(r.line_for(gpu(1)), Some(0));
    assert_eq!(r.snapshot().identities[0], Some(gpu(1)));
}

/// Threads of many "processes" asking for the lines of the same few devices at once agree on
/// one line per device (no device gets two budgets).
#[test]
fn racing_claims_agree_on_one_line_per_device() {
    for _ in 0..50 {
        let r = Arc::new(Region::anonymous(&caps("1GiB")).unwrap());
        let go = Arc::new(AtomicBool::new(false));
        let handles: Vec<_> = (0..8u8)
            .map(|t| {
                let (r, go) = (r.clone(), go.clone());
                std::thread::spawn(move || {
                    while !go.load(SeqCst) {
                        std::hint::spin_loop();
                    }
                    (0..4u8)
                        .map(|k| {
                            let dev = (k + t) % 4;
                            (dev, r.line_for(gpu(dev)).unwrap())
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        go.store(true, SeqCst);
        let mut line_of = [None; 4];
        for h in handles {
            for (dev, line) in h.join().unwrap() {
                let seen = line_of[dev as usize].get_or_insert(line);
                assert_eq!(*seen, line, "device {dev} got two lines");
            }
        }
        let mut lines: Vec<usize> = line_of.iter().map(|l| l.unwrap()).collect();
        lines.sort();
        assert_eq!(lines, vec![0, 1, 2, 3]);
    }
}

#[test]
fn charge_refuse_uncharge() {
    let r = Region::anonymous(&caps("1000")).unwrap();
    let s = r.claim_slot(me(), 1).unwrap();
    assert_eq!(r.charge(s, 0, 600, 1000, Check::Atomic), Ok(600));
    assert_eq!(r.charge(s, 0, 401, 1000, Check::Atomic), Err(600));
    assert_eq!(r.charge(s, 0, 400, 1000, Check::Atomic), Ok(1000));
    assert_eq!(r.charge(s, 0, 1, 1000, Check::Atomic), Err(1000));
    assert_eq!(r.charge(s, 0, u64::MAX, 1000, Check::Atomic), Err(1000));
    assert_eq!(r.uncharge(s, 0, 300), 300);
    assert_eq!(r.in_use(0), 700);
    // Never below zero, never more than the slot holds.
    assert_eq!(r.uncharge(s, 0, 10_000), 700);
    assert_eq!(r.in_use(0), 0);
    assert_eq!(r.uncharge(s, 0, 5), 0);
    assert_eq!(r.in_use(0), 0);
    // Devices are independent; an out-of-range device is refused.
    assert_eq!(r.charge(s, 3, 10, 1000, Check::Atomic), Ok(10));
    assert_eq!(r.in_use(0), 0);
    assert_eq!(r.charge(s, MAX_DEVICES, 10, 1000, Check::Atomic), Err(0));
    r.note_refusal(s, 3);
    let snap = r.snapshot();
    assert_eq!(snap.refusals[3], 1);
    assert_eq!(snap.peaks[0], 1000);
    assert_eq!(snap.processes.len(), 1);
    assert_eq!(snap.processes[0].used[3], 10);
    assert_eq!(snap.processes[0].refusals, 1);
}

#[test]
fn release_slot_gives_everything_back() {
    let r = Region::anonymous(&CapSpec::none()).unwrap();
    let s = r.claim_slot(me(), 1).unwrap();
    r.charge(s, 0, 5, MAX_BYTES, Check::Atomic).unwrap();
    r.charge(s, 1, 7, MAX_BYTES, Check::Atomic).unwrap();
    r.release_slot(s);
    assert_eq!((r.in_use(0), r.in_use(1)), (0, 0));
    assert!(r.snapshot().processes.is_empty());
}

#[test]
fn slots_run_out_and_come_back_after_reclaim() {
    let r = Region::anonymous(&CapSpec::none()).unwrap();
    for i in 0..MAX_SLOTS {
        assert!(r.claim_slot(ghost(i as u32), 1).is_some());
    }
    assert!(r.claim_slot(me(), 1).is_none());
    assert_eq!(r.reclaim(me()).slots, MAX_SLOTS);
    assert!(r.claim_slot(me(), 1).is_some());
}

#[test]
fn dead_process_share_is_given_back_exactly() {
    let r = Region::anonymous(&caps("1000")).unwrap();
    let live = r.claim_slot(me(), 1).unwrap();
    let dead = r.claim_slot(ghost(1), 1).unwrap();
    r.charge(live, 0, 100, 1000, Check::Atomic).unwrap();
    r.charge(dead, 0, 800, 1000, Check::Atomic).unwrap();
    r.charge(dead, 1, 50, 1000, Check::Atomic).unwrap();
    assert_eq!(r.charge(live, 0, 200, 1000, Check::Atomic), Err(900));
    let got = r.reclaim(me());
    assert_eq!(
        got,
        Reclaimed {
            slots: 1,
            bytes: 850,
            ambiguous: 0,
            pending_recount: 0
        }
    );
    assert_eq!((r.in_use(0), r.in_use(1)), (100, 0));
    assert_eq!(r.charge(live, 0, 200, 1000, Check::Atomic), Ok(300));
    assert_eq!(r.snapshot().processes.len(), 1);
}

/// pid reuse: a slot whose pid is alive but whose start time differs belongs to a dead process.
#[test]
fn reused_pid_does_not_keep_a_dead_share() {
    let r = Region::anonymous(&caps("1000")).unwrap();
    let me = me();
    let impostor = ProcessKey::new(me.pid(), me.start_low() ^ 1);
    let s = r.claim_slot(impostor, 1).unwrap();
    r.charge(s, 0, 700, 1000, Check::Atomic).unwrap();
    // Broken on purpose: liveness by pid only. The dead share stays.
    let broken = r.reclaim_with(ProcessKey::new(1, 1), &|k| k.alive(false));
    assert_eq!(broken.slots, 0);
    assert_eq!(
        r.in_use(0),
        700,
        "the pid-only check is fooled by pid reuse"
    );
    // The real check.
    assert_eq!(
        r.reclaim_with(ProcessKey::new(1, 1), &|k| k.alive(true))
            .bytes,
        700
    );
    assert_eq!(r.in_use(0), 0);
}

/// A process killed between the total's CAS and its slot update: the recount settles it.
#[test]
fn killed_mid_charge_is_settled_by_a_recount() {
    let r = Region::anonymous(&caps("1000")).unwrap();
    let live = r.claim_slot(me(), 1).unwrap();
    r.charge(live, 0, 100, 1000, Check::Atomic).unwrap();
    let dead = r.claim_slot(ghost(2), 1).unwrap();
    r.charge(dead, 0, 300, 1000, Check::Atomic).unwrap();
    // The dead process's last charge: inflight raised, total reserved, slot never updated.
    r.slot(dead).inflight.fetch_add(1, SeqCst);
    reserve(&r.device(0).total, 250, 1000).unwrap();
    assert_eq!(r.in_use(0), 650);
    let got = r.reclaim(me());
    assert_eq!((got.slots, got.ambiguous, got.pending_recount), (1, 1, 0));
    assert_eq!(r.in_use(0), 100, "only the live process's bytes remain");
    // Killed mid-uncharge (slot lowered, total not yet): same outcome.
    let dead = r.claim_slot(ghost(3), 1).unwrap();
    r.charge(dead, 0, 300, 1000, Check::Atomic).unwrap();
    r.slot(dead).inflight.fetch_add(1, SeqCst);
    r.slot(dead).used[0].fetch_sub(300, SeqCst);
    assert_eq!(r.in_use(0), 400);
    r.reclaim(me());
    assert_eq!(r.in_use(0), 100);
}

/// A reclaimer killed in the middle of a reclaim leaves a slot a later reclaim finishes.
#[test]
fn killed_reclaimer_is_finished_by_the_next() {
    let r = Region::anonymous(&caps("1000")).unwrap();
    let dead = r.claim_slot(ghost(4), 1).unwrap();
    r.charge(dead, 0, 300, 1000, Check::Atomic).unwrap();
    r.charge(dead, 1, 30, 1000, Check::Atomic).unwrap();
    // Reclaimer ghost(5) took it over, gave back device 0, then died.
    let s = r.slot(dead);
    s.key.store(REAP_FLAG | ghost(5).word(), SeqCst);
    s.inflight.store(1, SeqCst);
    release(&r.device(0).total, s.used[0].swap(0, SeqCst));
    assert_eq!((r.in_use(0), r.in_use(1)), (0, 30));
    let got = r.reclaim(me());
    assert_eq!((got.slots, got.ambiguous), (1, 1));
    assert_eq!((r.in_use(0), r.in_use(1)), (0, 0));
}

/// A live slot in the middle of an operation blocks the recount (it would lose that
/// operation); the mark stays until a later look finds the region quiet.
#[test]
fn recount_waits_for_quiet_and_never_loses_a_live_charge() {
    let r = Region::anonymous(&caps("1000")).unwrap();
    let live = r.claim_slot(me(), 1).unwrap();
    let dead = r.claim_slot(ghost(6), 1).unwrap();
    r.slot(dead).inflight.store(1, SeqCst);
    reserve(&r.device(0).total, 200, 1000).unwrap();
    // The live process is between its total CAS and its slot update.
    r.slot(live).inflight.fetch_add(1, SeqCst);
    reserve(&r.device(0).total, 100, 1000).unwrap();
    let got = r.reclaim(me());
    assert_ne!(got.pending_recount & 1, 0);
    assert_eq!(r.in_use(0), 300, "no recount while a charge is half done");
    r.slot(live).used[0].fetch_add(100, SeqCst);
    r.slot(live).inflight.fetch_sub(1, SeqCst);
    assert_eq!(r.reclaim(me()).pending_recount, 0);
    assert_eq!(r.in_use(0), 100);
}

/// Threads hammer one budget; an independent "device" counter checks the cap is never passed.
fn hammer(check: Check, threads: usize, iters: usize, cap: u64) -> (u64, u64) {
    let r = Arc::new(Region::anonymous(&CapSpec::none()).unwrap());
    let device = Arc::new(AtomicU64::new(0));
    let violations = Arc::new(AtomicU64::new(0));
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let (r, device, violations) =
                (Arc::clone(&r), Arc::clone(&device), Arc::clone(&violations));
            std::thread::spawn(move || {
                let s = r.claim_slot(ghost(100 + t as u32), 1).unwrap();
                let mut held: Vec<u64> = Vec::new();
                let mut rng = vramshim_testkit::XorShift(0x9e37_79b9_7f4a_7c15 ^ t as u64);
                for _ in 0..iters {
                    let x = rng.next_u64();
                    if !x.is_multiple_of(3) || held.is_empty() {
                        let b = 1 + x % (cap / 4);
                        if r.charge(s, 0, b, cap, check).is_ok() {
                            if device.fetch_add(b, SeqCst) + b > cap {
                                violations.fetch_add(1, SeqCst);
                            }
                            held.push(b);
                        }
                    } else {
                        let b = held.swap_remove((x as usize / 3) % held.len());
                        device.fetch_sub(b, SeqCst);
                        r.uncharge(s, 0, b);
                    }
                }
                for b in held {
                    device.fetch_sub(b, SeqCst);
                    r.uncharge(s, 0, b);
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    (violations.load(SeqCst), r.in_use(0))
}

#[test]
fn threads_never_pass_the_cap_and_end_at_zero() {
    let (violations, left) = hammer(Check::Atomic, 8, 50_000, 1 << 20);
    assert_eq!(violations, 0);
    assert_eq!(left, 0);
}

/// The same test with the CAS replaced by load/check/store must catch the violation.
#[test]
fn the_concurrency_test_catches_a_racy_reservation() {
    let mut caught = false;
    for _ in 0..50 {
        let (violations, _) = hammer(Check::Racy, 8, 20_000, 1 << 20);
        if violations > 0 {
            caught = true;
            break;
        }
    }
    assert!(caught, "a racy check was never caught passing the cap");
}

/// Charges, uncharges, dead slots (exact and killed mid-charge) and reclaims all at once:
/// the total always ends equal to what the live slots hold.
#[test]
fn reclaim_races_with_live_traffic() {
    let r = Arc::new(Region::anonymous(&CapSpec::none()).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..3)
        .map(|t| {
            let (r, stop) = (Arc::clone(&r), Arc::clone(&stop));
            std::thread::spawn(move || {
                let s = r
                    .claim_slot(ProcessKey::new(std::process::id(), me().start_low()), 1)
                    .unwrap();
                let mut n = 0u64;
                while !stop.load(SeqCst) {
                    n += 1;
                    let b = 1 + (n * 7919 + t) % 4096;
                    if r.charge(s, 0, b, MAX_BYTES, Check::Atomic).is_ok() {
                        r.uncharge(s, 0, b);
                    }
                    if n.is_multiple_of(5) {
                        r.charge(s, 0, 1, MAX_BYTES, Check::Atomic).unwrap();
                    }
                }
                s
            })
        })
        .collect();
    let reaper = {
        let r = Arc::clone(&r);
        std::thread::spawn(move || {
            for i in 0..300u32 {
                let d = r.claim_slot(ghost(1000 + i % 50), 1).unwrap();
                r.charge(d, 0, 1000, MAX_BYTES, Check::Atomic).unwrap();
                if i.is_multiple_of(2) {
                    r.slot(d).inflight.fetch_add(1, SeqCst);
                    reserve(&r.device(0).total, 77, MAX_BYTES).unwrap();
                }
                r.reclaim(ProcessKey::new(1, 1));
            }
        })
    };
    reaper.join().unwrap();
    stop.store(true, SeqCst);
    let slots: Vec<SlotIndex> = workers.into_iter().map(|h| h.join().unwrap()).collect();
    let mut pending = r.reclaim(ProcessKey::new(1, 1)).pending_recount;
    for _ in 0..100 {
        if pending == 0 {
            break;
        }
        pending = r.reclaim(ProcessKey::new(1, 1)).pending_recount;
    }
    assert_eq!(pending, 0);
    let held: u64 = slots.iter().map(|&s| r.slot_used(s, 0)).sum();
    assert_eq!(r.in_use(0), held);
}

/// After exec the pid and start time stay but the image (and its memory) is new: the slots
/// of the replaced image are freed, those of the current image are not.
#[test]
fn slots_of_a_replaced_image_are_freed() {
    let r = Region::anonymous(&caps("1000")).unwrap();
    let me = me();
    let old = r.claim_slot(me, 1).unwrap();
    r.set_image(old, 7);
    r.charge(old, 0, 600, 1000, Check::Atomic).unwrap();
    assert_eq!(r.reclaim(me).slots, 0, "alive, so a plain reclaim keeps it");
    assert_eq!(
        r.reclaim_replaced_images(me, 7).slots,
        0,
        "same image: kept"
    );
    let got = r.reclaim_replaced_images(me, 8);
    assert_eq!((got.slots, got.bytes), (1, 600));
    assert_eq!(r.in_use(0), 0);
    // A slot whose image is not recorded yet (being claimed) is left alone.
    let s = r.claim_slot(me, 1).unwrap();
    r.charge(s, 0, 5, 1000, Check::Atomic).unwrap();
    assert_eq!(r.reclaim_replaced_images(me, 8).slots, 0);
    assert_eq!(r.in_use(0), 5);
}
