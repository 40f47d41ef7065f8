//! The tracer end to end on the simulated GPU: C programs under `LD_PRELOAD=libvramshim.so`
//! with `VRAMSHIM_TRACE` set.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use vramshim_testkit::{
    Link, compile_c, compile_c_to, interposer_lib, preload, run, sim_command, temp_dir,
};
use vramshim_trace::{AllocKind, Api, Event, MemOp, codes};
use vramshim_trace_tests::{now_ns, only_trace, read, source, traces_in};

fn ops(events: &[Event]) -> Vec<(bool, MemOp)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Alloc(m) => Some((true, m.clone())),
            Event::Free(m) => Some((false, m.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn every_call_in_order_with_fields() {
    let exe = compile_c(
        "trace_basic",
        &[&source("trace_basic.c")],
        Link::SharedRuntime,
    );
    let dir = temp_dir("trace_basic");
    let pattern = dir.join("t-%p-%h.vramtrace");
    let mut cmd = sim_command(&exe, "trace_basic");
    preload(&mut cmd, &interposer_lib()).env("VRAMSHIM_TRACE", &pattern);
    let t_start = now_ns();
    let out = run(&mut cmd);
    let t_end = now_ns();
    out.assert_success();
    let files = traces_in(&dir);
    assert_eq!(files.len(), 1, "{files:?}");
    let name = files[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(!name.contains('%'), "{name}");
    let r = read(&files[0]);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(
        r.truncation, None,
        "clean exit must end with the end record"
    );
    assert!(r.end.is_some());
    assert!(name.contains(&r.header.pid.to_string()), "{name}");
    assert!(
        r.header.cmdline[0].ends_with("trace_basic"),
        "{:?}",
        r.header.cmdline
    );
    assert!(r.header.config.iter().any(|(k, _)| k == "VRAMSHIM_TRACE"));
    assert!(r.header.start_mono_ns >= t_start && r.header.start_mono_ns <= t_end);
    let devs: Vec<_> = r
        .header
        .devices
        .iter()
        .cloned()
        .chain(r.events.iter().filter_map(|e| match e {
            Event::Device(d) => Some(d.clone()),
            _ => None,
        }))
        .collect();
    assert!(!devs.is_empty() && devs[0].total_bytes > 0, "{devs:?}");

    // Expected calls, from the program's own output.
    let mut want = Vec::new();
    let mut meminfo = None;
    for l in out.stdout.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f[0] == "meminfo" {
            meminfo = Some((f[1].parse::<u64>().unwrap(), f[2].parse::<u64>().unwrap()));
            continue;
        }
        let size: u64 = f[1].parse().unwrap();
        let ptr = u64::from_str_radix(f[2].trim_start_matches("0x"), 16).unwrap_or(0);
        let rc: i32 = f[3].parse().unwrap();
        want.push((f[0].to_string(), size, ptr, rc));
    }
    // Only the calls of interest (the runtime may add its own driver-level events? no: one
    // request, one event), keyed by our distinctive sizes.
    let got: Vec<(bool, MemOp)> = ops(&r.events)
        .into_iter()
        .filter(|(_, m)| [10001, 20002, 30003, 40004, 1 << 50].contains(&m.size))
        .collect();
    assert_eq!(got.len(), want.len(), "got {got:#?}\nwant {want:?}");
    let mut last_t = 0;
    for ((is_alloc, m), (op, size, ptr, rc)) in got.iter().zip(&want) {
        assert_eq!(*is_alloc, op.starts_with("alloc"), "{op}: {m:?}");
        assert_eq!(m.size, *size, "{op}");
        assert_eq!(m.result, *rc, "{op}: {m:?}");
        if *rc == 0 {
            assert_eq!(m.addr, *ptr, "{op}: {m:?}");
        }
        assert!(m.t_ns >= last_t, "out of order: {m:?}");
        assert!(m.t_ns >= t_start && m.t_ns <= t_end);
        last_t = m.t_ns;
        let (api, kind) = match op.as_str() {
            "alloc" => (Api::CudaMalloc, AllocKind::Runtime),
            "free" => (Api::CudaFree, AllocKind::Runtime),
            "alloc_async" => (Api::CudaMallocAsync, AllocKind::Async),
            "free_async" => (Api::CudaFreeAsync, AllocKind::Async),
            "alloc_host" => (Api::CudaMallocHost, AllocKind::Host),
            "free_host" => (Api::CudaFreeHost, AllocKind::Host),
            _ => unreachable!(),
        };
        assert_eq!(m.api, api, "{op}: {m:?}");
        assert_eq!(m.kind, kind, "{op}: {m:?}");
        if kind == AllocKind::Host {
            assert_eq!(m.device, -1, "{op}: {m:?}");
        } else {
            assert_eq!(m.device, 0, "{op}: {m:?}");
        }
        if api == Api::CudaMallocAsync || api == Api::CudaFreeAsync {
            assert_ne!(m.stream, 0, "{op}: {m:?}");
        }
        assert!(m.tid > 0);
    }
    // The OOM is a real device refusal.
    let oom = &got.iter().find(|(_, m)| m.size == 1 << 50).unwrap().1;
    assert_eq!(oom.result, codes::OUT_OF_MEMORY);
    assert_eq!(oom.addr, 0);
    // The memory-info query, with what was answered.
    let (free, total) = meminfo.unwrap();
    assert!(r.events.iter().any(|e| matches!(e,
        Event::MemInfo { api: Api::CudaMemGetInfo, free: f, total: t, result: 0, .. } if *f == free && *t == total)),
        "no MemInfo({free}, {total}) in {:#?}", r.events);
    // Thread start, module map (the executable itself), counters.
    assert!(
        r.events
            .iter()
            .any(|e| matches!(e, Event::ThreadStart { .. }))
    );
    assert!(
        r.events
            .iter()
            .any(|e| matches!(e, Event::Module { path, .. } if path.ends_with("trace_basic")))
    );
    assert!(!r.events.iter().any(|e| matches!(e, Event::Lost { .. })));
}

#[test]
fn stacks_are_recorded_and_deduplicated() {
    let exe = compile_c(
        "trace_loop_stacks",
        &[&source("trace_loop.c")],
        Link::SharedRuntime,
    );
    let dir = temp_dir("trace_stacks");
    let mut cmd = sim_command(&exe, "trace_stacks");
    preload(&mut cmd, &interposer_lib())
        .env("VRAMSHIM_TRACE", dir.join("s.vramtrace"))
        .env("VRAMSHIM_STACKS", "16")
        .arg("50");
    run(&mut cmd).assert_success();
    let r = read(&dir.join("s.vramtrace"));
    let stacks: Vec<(u32, Vec<u64>)> = r
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Stack { id, frames } => Some((*id, frames.clone())),
            _ => None,
        })
        .collect();
    let mods: Vec<(u64, u64, String)> = r
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Module {
                base, size, path, ..
            } => Some((*base, *size, path.clone())),
            _ => None,
        })
        .collect();
    let o = ops(&r.events);
    assert_eq!(o.iter().filter(|(a, m)| *a && m.size >= 4096).count(), 50);
    // Every op has a stack; the loop has one call site per API, so few distinct stacks.
    assert!(o.iter().all(|(_, m)| m.stack != 0), "{o:?}");
    assert!(
        !stacks.is_empty() && stacks.len() <= 8,
        "{} stacks",
        stacks.len()
    );
    for (_, m) in &o {
        assert!(stacks.iter().any(|(id, _)| *id == m.stack));
    }
    // The innermost frame is outside libvramshim and inside a known module; some frame is in
    // the workload's executable (its main).
    for (_, frames) in &stacks {
        assert!(!frames.is_empty() && frames.len() <= 16);
        let in_module = |ip: u64| mods.iter().find(|(b, s, _)| ip >= *b && ip < b + s);
        let inner = in_module(frames[0])
            .map(|m| m.2.clone())
            .unwrap_or_default();
        assert!(!inner.contains("libvramshim"), "{inner}");
        assert!(
            frames
                .iter()
                .any(|ip| in_module(*ip - 1).is_some_and(|m| m.2.ends_with("trace_loop_stacks"))),
            "no frame in the executable: {frames:x?} {mods:?}"
        );
    }
}

/// Runs `trace_loop` traced for 1.5 s, SIGKILLs it and reads what it left: the trace, and
/// when the program's last pair returned (its progress file survives the kill).
fn killed_loop(tag: &str, fault: Option<&str>) -> (vramshim_trace_tests::Read, u64, u64) {
    let exe = compile_c(
        "trace_loop",
        &[&source("trace_loop.c")],
        Link::SharedRuntime,
    );
    let dir = temp_dir(tag);
    let path = dir.join("k.vramtrace");
    let progress = dir.join("progress");
    let mut cmd = sim_command(&exe, tag);
    preload(&mut cmd, &interposer_lib())
        .env("VRAMSHIM_TRACE", &path)
        .env("TRACE_LOOP_PROGRESS", &progress)
        .stdout(Stdio::piped());
    if let Some(f) = fault {
        cmd.env("VRAMSHIM_TRACE_FAULT", f);
    }
    let mut child = cmd.spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    std::thread::sleep(Duration::from_millis(1500));
    let kill_t = now_ns();
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let st = child.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&st),
        Some(libc::SIGKILL)
    );
    let p = std::fs::read(&progress).unwrap();
    let last_call = u64::from_ne_bytes(p[..8].try_into().unwrap());
    // kill_t is read just before kill(2): the program may finish a call in the microseconds
    // the signal takes to land.
    assert!(
        last_call > 0 && last_call < kill_t + 10_000_000,
        "{last_call} {kill_t}"
    );
    (read(&path), last_call, kill_t)
}

#[test]
fn sigkill_leaves_a_trace_readable_to_within_100ms() {
    let (r, last_call, kill_t) = killed_loop("trace_kill", None);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    let t = r.truncation.expect("a killed process leaves no end record");
    let msg = t.to_string();
    assert!(msg.contains("killed") || msg.contains("torn"), "{msg}");
    let o = ops(&r.events);
    assert!(o.len() > 100, "only {} events", o.len());
    let last = o.iter().map(|(_, m)| m.t_ns).max().unwrap();
    assert!(last < kill_t + 10_000_000);
    // The writer drains every 50 ms: of what the program did, nothing older than 100 ms
    // before the kill is missing. (Measured from the program's own last call, not from the
    // kill: on a loaded machine the program itself may not have run in the last 100 ms.)
    let gap_ms = last_call.saturating_sub(last) as f64 / 1e6;
    assert!(
        gap_ms <= 100.0,
        "last event {gap_ms:.1} ms before the program's last call ({:.1} ms before the kill)",
        (kill_t - last) as f64 / 1e6
    );
    // And what is there is complete: allocs and frees alternate, sizes 4096 + i % 1000.
    for (i, pair) in o.chunks(2).enumerate() {
        assert!(pair[0].0 && pair[0].1.size == 4096 + (i as u64 % 1000));
        if let Some(f) = pair.get(1) {
            assert!(!f.0 && f.1.addr == pair[0].1.addr);
        }
    }
}

/// The test above can fail: with the writer's periodic drain switched off
/// (`VRAMSHIM_TRACE_FAULT=no-tick`), a killed process leaves far more than 100 ms unwritten.
#[test]
fn sigkill_test_catches_a_writer_that_does_not_drain() {
    let (r, last_call, _) = killed_loop("trace_kill_fault", Some("no-tick"));
    let last = ops(&r.events).iter().map(|(_, m)| m.t_ns).max();
    let lost_ms = last.map_or(f64::INFINITY, |l| last_call.saturating_sub(l) as f64 / 1e6);
    assert!(
        lost_ms > 100.0,
        "only {lost_ms:.1} ms lost without the drain"
    );
}

#[test]
fn forked_child_writes_its_own_file() {
    let dir = temp_dir("trace_fork");
    let exe = dir.join("trace_fork");
    compile_c_to(
        &exe,
        &[&source("trace_fork.c")],
        Link::SharedRuntime,
        &["-l:libnvidia-ml.so.1"],
    );
    let mut cmd = sim_command(&exe, "trace_fork");
    preload(&mut cmd, &interposer_lib()).env("VRAMSHIM_TRACE", dir.join("f-%p.vramtrace"));
    let out = run(&mut cmd);
    out.assert_success();
    let pid_of = |who: &str| -> u32 {
        out.stdout
            .lines()
            .find_map(|l| l.strip_prefix(who).map(|p| p.trim().parse().unwrap()))
            .unwrap()
    };
    let (parent, child) = (pid_of("parent "), pid_of("child "));
    let files = traces_in(&dir);
    assert_eq!(files.len(), 2, "{files:?}");
    let p = read(&dir.join(format!("f-{parent}.vramtrace")));
    let c = read(&dir.join(format!("f-{child}.vramtrace")));
    assert_eq!(p.header.pid, parent);
    assert_eq!(c.header.pid, child);
    assert_eq!(c.header.ppid, parent);
    assert_eq!(p.truncation, None);
    assert_eq!(c.truncation, None);
    let sizes = |r: &vramshim_trace_tests::Read| -> Vec<u64> {
        ops(&r.events)
            .iter()
            .filter(|(a, _)| *a)
            .map(|(_, m)| m.size)
            .collect()
    };
    assert_eq!(sizes(&p), vec![10001, 30003]);
    // The child's file holds only the child's calls: the parent's buffered NVML query (made
    // before the fork) is in the parent's file and not re-flushed by the child.
    assert_eq!(sizes(&c), vec![20002]);
    let nvml = |r: &vramshim_trace_tests::Read| {
        r.events
            .iter()
            .filter(|e| {
                matches!(
                    e,
                    Event::MemInfo {
                        api: Api::NvmlDeviceGetMemoryInfo,
                        ..
                    }
                )
            })
            .count()
    };
    assert_eq!(nvml(&p), 1);
    assert_eq!(nvml(&c), 0);
}

#[test]
fn a_second_process_never_truncates_a_running_ones_trace() {
    let looper = compile_c(
        "trace_loop_excl",
        &[&source("trace_loop.c")],
        Link::SharedRuntime,
    );
    let basic = compile_c(
        "trace_basic_excl",
        &[&source("trace_basic.c")],
        Link::SharedRuntime,
    );
    let dir = temp_dir("trace_excl");
    let path = dir.join("same.vramtrace");
    let mut cmd = sim_command(&looper, "trace_excl");
    preload(&mut cmd, &interposer_lib())
        .env("VRAMSHIM_TRACE", &path)
        .stdout(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    std::thread::sleep(Duration::from_millis(200));
    let mut cmd = sim_command(&basic, "trace_excl2");
    preload(&mut cmd, &interposer_lib()).env("VRAMSHIM_TRACE", &path);
    let out = run(&mut cmd);
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
    out.assert_success();
    assert!(
        out.stderr.contains("belongs to running process"),
        "{}",
        out.stderr
    );
    let files = traces_in(&dir);
    let others: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(files.len(), 1, "{others:?}");
    let first = read(&path);
    assert_eq!(first.header.pid, child.id());
    assert!(ops(&first.events).len() > 10);
    let second = others
        .iter()
        .find(|n| n.starts_with("same.vramtrace."))
        .unwrap();
    let second = read(&dir.join(second));
    assert_ne!(second.header.pid, child.id());
    assert_eq!(second.truncation, None);
}

#[test]
fn counters_carry_the_cap_and_the_pools_reservation() {
    let exe = compile_c(
        "trace_loop_cap",
        &[&source("trace_loop.c")],
        Link::SharedRuntime,
    );
    let dir = temp_dir("trace_counters");
    let path = dir.join("c.vramtrace");
    let mut cmd = sim_command(&exe, "trace_counters");
    preload(&mut cmd, &interposer_lib())
        .env("VRAMSHIM_TRACE", &path)
        .env("VRAMSHIM_CAP", "0.5")
        .env("VRAMSHIM_POOL", "stitch")
        .arg("300");
    run(&mut cmd).assert_success();
    let r = read(&path);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    let total = r
        .header
        .devices
        .iter()
        .chain(r.events.iter().filter_map(|e| match e {
            Event::Device(d) => Some(d),
            _ => None,
        }))
        .find(|d| d.index == 0)
        .map(|d| d.total_bytes)
        .expect("device 0 described");
    let counters: Vec<(u64, u64, u64)> = r
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Counter {
                device: 0,
                live_bytes,
                reserved_bytes,
                cap,
                ..
            } => Some((*live_bytes, *reserved_bytes, *cap)),
            _ => None,
        })
        .collect();
    assert!(!counters.is_empty());
    assert!(
        counters.iter().any(|c| c.2 == total / 2),
        "{counters:?} (total {total})"
    );
    assert!(counters.iter().any(|c| c.1 >= 2 << 20), "{counters:?}");
    assert!(counters.iter().all(|c| c.1 >= c.0), "{counters:?}");
}

/// `Device` records name the physical GPU behind each ordinal, so traces of several ranks or
/// processes can be lined up: two simulated devices have two different UUIDs, and under
/// `CUDA_VISIBLE_DEVICES=1,0` ordinal 0 carries the UUID ordinal 1 had without it.
#[test]
fn device_records_carry_each_gpus_uuid() {
    let exe = compile_c(
        "trace_basic",
        &[&source("trace_basic.c")],
        Link::SharedRuntime,
    );
    // Both runs on one simulated machine (its UUIDs derive from its name).
    let machine = vramshim_testkit::unique_name("trace_uuid");
    let uuids = |visible: Option<&str>, tag: &str| -> Vec<(i32, Option<[u8; 16]>)> {
        let dir = temp_dir(tag);
        let mut cmd = sim_command(&exe, "trace_uuid");
        preload(&mut cmd, &interposer_lib())
            .env("VRAMSIM_NAME", &machine)
            .env("VRAMSHIM_TRACE", dir.join("t.vramtrace"))
            .env("VRAMSIM_DEVICES", "2");
        match visible {
            Some(v) => cmd.env("CUDA_VISIBLE_DEVICES", v),
            None => cmd.env_remove("CUDA_VISIBLE_DEVICES"),
        };
        run(&mut cmd).assert_success();
        let r = only_trace(&dir, &format!("{visible:?}"));
        let mut v: Vec<_> = r
            .events
            .iter()
            .filter_map(|e| match e {
                Event::Device(d) => Some((d.index, d.uuid)),
                _ => None,
            })
            .collect();
        v.sort();
        v.dedup();
        v
    };
    let plain = uuids(None, "trace_uuid_plain");
    assert_eq!(
        plain.iter().map(|d| d.0).collect::<Vec<_>>(),
        [0, 1],
        "{plain:?}"
    );
    let (u0, u1) = (
        plain[0].1.expect("uuid of 0"),
        plain[1].1.expect("uuid of 1"),
    );
    assert_ne!(u0, u1);
    let swapped = uuids(Some("1,0"), "trace_uuid_swapped");
    assert_eq!(swapped, [(0, Some(u1)), (1, Some(u0))], "{plain:?}");
}
