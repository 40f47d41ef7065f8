//! `analyze`'s in-order fast path gives exactly the report of the reorder window: same event
//! numbers (peaks, post-mortems) with untimed records spread over many window batches, same
//! warnings for torn and corrupt files; and it hands unsorted traces (and a device learned after
//! a post-mortem) to the window.

mod common;
use common::*;

use std::path::Path;

use vramshim_analyzer::analysis::{self, Options};
use vramshim_analyzer::input;
use vramshim_trace::{Api, DeviceInfo, Event, Header, MemOp, TraceWriter, codes, flags};

fn opts() -> Options {
    Options {
        progress: false,
        ..Options::default()
    }
}

fn op(t: u64, tid: u32, device: i32, addr: u64, size: u64, stack: u32, result: i32) -> MemOp {
    MemOp {
        tid,
        device,
        stack,
        latency_ns: 700,
        ..memop(t, Api::CudaMalloc, addr, size, result)
    }
}

fn header() -> Header {
    Header {
        pid: 7,
        host: "fast-path".into(),
        devices: vec![DeviceInfo {
            index: 0,
            name: "dev0".into(),
            total_bytes: 1 << 40,
            uuid: None,
        }],
        ..Default::default()
    }
}

/// A trace in time order over ~6 s: a live set that grows for 60% of the run and then shrinks
/// (one peak late in the run), stacks and modules every 25,000 events (so every window batch
/// releases untimed records ahead of held timed ones), a device learned early, device OOMs and a
/// cap refusal with its failed Alloc, over two devices.
fn in_order_events(n: u64, device_late: bool) -> Vec<Event> {
    let mut ev = Vec::new();
    let mut t = 1_000_000u64;
    let mut live: Vec<Vec<(u64, u64)>> = vec![Vec::new(), Vec::new()];
    let mut next = [0x7000_0000_0000u64, 0x7100_0000_0000u64];
    let mut x = 12345u64;
    let mut stacks = 0u32;
    for i in 0..n {
        t += 20_000;
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        if i % 25_000 == 7 {
            stacks += 1;
            ev.push(Event::Stack {
                id: stacks,
                frames: vec![0x5000 + stacks as u64, 0x6000],
            });
            ev.push(Event::Module {
                base: 0x1000_0000 * stacks as u64,
                size: 0x1000,
                file_offset: 0,
                path: format!("/lib/m{stacks}.so"),
            });
        }
        if i == 1_000 && !device_late {
            ev.push(Event::Device(DeviceInfo {
                index: 1,
                name: "dev1".into(),
                total_bytes: 1 << 36,
                uuid: None,
            }));
        }
        let d = (i % 2) as usize;
        if i % 40_000 == 39_999 {
            ev.push(Event::Alloc(op(
                t,
                9,
                d as i32,
                0,
                1 << 41,
                stacks,
                codes::OUT_OF_MEMORY,
            )));
            if device_late && i > 100_000 {
                ev.push(Event::Device(DeviceInfo {
                    index: 1,
                    name: "dev1".into(),
                    total_bytes: 1 << 36,
                    uuid: None,
                }));
            }
            continue;
        }
        if i == n / 2 {
            ev.push(Event::CapRefusal {
                t_ns: t,
                tid: 9,
                device: 0,
                api: Api::CudaMalloc,
                size: 1 << 35,
                in_use: 1 << 30,
                cap: 1 << 34,
            });
            let mut a = op(t, 9, 0, 0, 1 << 35, stacks, codes::OUT_OF_MEMORY);
            a.flags = flags::CAP_REFUSED;
            ev.push(Event::Alloc(a));
            continue;
        }
        let grow = i < n * 6 / 10;
        let alloc = live[d].is_empty() || (x >> 33) % 5 < if grow { 3 } else { 2 };
        if alloc {
            let size = 256 * (1 + (x >> 40) % 4096);
            let a = next[d];
            next[d] += size;
            live[d].push((a, size));
            ev.push(Event::Alloc(op(
                t,
                9 + (i % 3) as u32,
                d as i32,
                a,
                size,
                stacks,
                0,
            )));
        } else {
            let k = (x >> 20) as usize % live[d].len();
            let (a, size) = live[d].swap_remove(k);
            ev.push(Event::Free(op(t, 9, d as i32, a, size, stacks, 0)));
        }
    }
    ev
}

fn write(path: &Path, events: &[Event]) {
    let mut w = TraceWriter::new(Vec::new(), &header()).unwrap();
    for e in events {
        w.write(e).unwrap();
    }
    std::fs::write(path, w.finish().unwrap()).unwrap();
}

fn json(r: &analysis::TraceReport) -> serde_json::Value {
    serde_json::to_value(r).unwrap()
}

/// Both paths on `path`; returns whether the fast path took it.
fn agree(path: &Path) -> bool {
    let windowed = analysis::analyze_windowed(input::open(path).unwrap(), &opts()).unwrap();
    let fast = analysis::analyze(input::open(path).unwrap(), &opts()).unwrap();
    assert_eq!(json(&fast), json(&windowed), "{}", path.display());
    assert_eq!(fast.torn, windowed.torn);
    // `summary` runs without the memory-over-time chart: everything it prints is the same.
    let summary_opts = Options {
        timeline: false,
        ..opts()
    };
    let summary = analysis::analyze(input::open(path).unwrap(), &summary_opts).unwrap();
    assert_eq!(
        json(&summary),
        json(&fast),
        "{} without timeline",
        path.display()
    );
    analysis::analyze_in_order(input::open(path).unwrap(), &opts())
        .unwrap()
        .is_some()
}

#[test]
fn in_order_trace_numbers_events_like_the_window() {
    let d = scratch("fast-path");
    let p = d.join("in-order.vramtrace");
    write(&p, &in_order_events(300_000, false));
    assert!(agree(&p), "an in-order trace takes the fast path");
    let r = analysis::analyze(input::open(&p).unwrap(), &opts()).unwrap();
    // The numbers checked above are not trivially equal: untimed records came in late batches.
    let dev0 = &r.devices[0];
    assert!(
        dev0.peak_in_use.event_index > 100_000,
        "{}",
        dev0.peak_in_use.event_index
    );
    let pms: Vec<_> = r.devices.iter().flat_map(|d| &d.post_mortems).collect();
    assert!(pms.len() >= 5, "{}", pms.len());
    assert!(
        pms.iter()
            .any(|p| p.cause == "cap" && p.alloc_index.is_some())
    );
    assert!(pms.iter().any(|p| p.event_index > 200_000));
}

#[test]
fn torn_and_corrupt_files_warn_alike() {
    let d = scratch("fast-path-torn");
    let p = d.join("t.vramtrace");
    write(&p, &in_order_events(200_000, false));
    let bytes = std::fs::read(&p).unwrap();
    let torn = d.join("torn.vramtrace");
    std::fs::write(&torn, &bytes[..bytes.len() * 2 / 3]).unwrap();
    assert!(agree(&torn));
    assert!(
        analysis::analyze(input::open(&torn).unwrap(), &opts())
            .unwrap()
            .torn
    );
    // A flipped byte inside a middle frame: that frame is skipped with a warning.
    let mut bad = bytes.clone();
    let mid = bad.len() / 2;
    for b in &mut bad[mid..mid + 16] {
        *b ^= 0x5a;
    }
    let corrupt = d.join("corrupt.vramtrace");
    std::fs::write(&corrupt, &bad).unwrap();
    agree(&corrupt);
    let r = analysis::analyze(input::open(&corrupt).unwrap(), &opts()).unwrap();
    assert!(!r.warnings.is_empty());
}

#[test]
fn unsorted_traces_and_late_devices_go_through_the_window() {
    let d = scratch("fast-path-unsorted");
    // Two threads' buffers written out of time order (as the interposer's writer may).
    let mut events = in_order_events(150_000, false);
    let (head, tail) = events.split_at_mut(90_000);
    let moved: Vec<Event> = tail[..5_000].to_vec();
    let mut v: Vec<Event> = head.to_vec();
    let at = v.len() - 3_000;
    v.splice(at..at, moved);
    v.extend_from_slice(&tail[5_000..]);
    events = v;
    let p = d.join("unsorted.vramtrace");
    write(&p, &events);
    assert!(!agree(&p), "an unsorted trace falls back to the window");

    let p = d.join("device-late.vramtrace");
    write(&p, &in_order_events(150_000, true));
    assert!(
        !agree(&p),
        "a device learned after a post-mortem falls back"
    );
}

#[test]
fn synthetic_traces_agree() {
    let d = scratch("fast-path-synth");
    for (name, args) in [
        ("a", vec!["--events", "400000"]),
        (
            "b",
            vec!["--events", "200000", "--devices", "2", "--seed", "5"],
        ),
        ("c", vec!["--events", "300000", "--faithful"]),
        (
            "d",
            vec![
                "--events",
                "200000",
                "--faithful",
                "--unpooled",
                "--seed",
                "3",
            ],
        ),
    ] {
        let p = d.join(format!("{name}.vramtrace"));
        let mut a = vec!["synth", "-o", p.to_str().unwrap()];
        a.extend(args);
        ok(&d, &a);
        assert!(agree(&p));
    }
}
