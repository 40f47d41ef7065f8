//! NVIDIA's real runtime (12.9 and 13.2, shared and static) on cuda-sim's driver: allocation,
//! copy, free and memGetInfo round trips with no cuda-sim runtime loaded, plain and under
//! `vramshim run` with a trace, a cap and the pool.

use std::path::Path;

use vramshim_nvidia_tests::*;
use vramshim_testkit::{RunOutput, run, sim_command, temp_dir};
use vramshim_trace::{Event, TraceReader};

const MIB: u64 = 1 << 20;

/// The round-trip program on the driver-only directory (no runtime of cuda-sim's to be found).
fn plain(rt: Runtime, wheels: &Path, env: &[(&str, &str)]) -> RunOutput {
    let exe = build("cudart_roundtrip.c", rt, wheels, &[]);
    let mut c = sim_command(&exe, "nv-plain");
    c.env("LD_LIBRARY_PATH", driver_only_dir())
        .env("VRAMSIM_CONTEXT_OVERHEAD", "0")
        .args(["4", "1048576"]);
    for (k, v) in env {
        c.env(k, v);
    }
    run(&mut c)
}

#[test]
fn nvidia_runtimes_run_round_trips_on_the_simulated_driver() {
    let Some(wheels) = wheels_or_skip() else {
        return;
    };
    for rt in ALL {
        let out = plain(rt, &wheels, &[]);
        assert!(
            out.success() && out.stdout.contains("done"),
            "{rt:?}: {}\n{}",
            out.stdout,
            out.stderr
        );
        let o = &out.stdout;
        assert_eq!(field(o, "devices"), 1, "{rt:?}");
        assert_eq!(field(o, "runtime_version") / 1000, rt.major() as u64, "{o}");
        assert_eq!(field(o, "corrupt"), 0, "{rt:?}: data came back changed");
        let before = field(o, "free_before");
        assert_eq!(before - field(o, "free_allocated"), 4 * MIB, "{rt:?}: {o}");
        assert_eq!(field(o, "free_after"), before, "{rt:?}: everything freed");
        assert_nvidia_runtime_on_sim_driver(o, rt, &wheels);
    }
}

/// The private tables are what NVIDIA's runtime needs: refused, every runtime call fails with
/// cudaErrorSymbolNotFound (500); with the integrity check's keyed hash off by one bit, with
/// 103 ("integrity checks failed").
#[test]
fn the_runtime_needs_the_export_tables_and_checks_the_integrity_answer() {
    let Some(wheels) = wheels_or_skip() else {
        return;
    };
    for rt in ALL {
        for (fault, code) in [("refuse", 500), ("integrity", 103)] {
            let out = plain(rt, &wheels, &[("VRAMSIM_EXPORT_TABLES_FAULT", fault)]);
            assert_eq!(out.code(), Some(1), "{rt:?} {fault}: {}", out.stdout);
            assert!(
                out.stdout
                    .contains(&format!("error cudaGetDeviceCount(&count) -> {code} ")),
                "{rt:?} {fault}: {}",
                out.stdout
            );
        }
    }
}

/// `vramshim run --sim ...` of the round-trip program (its shared runtime found through its
/// DT_RPATH despite cuda-sim's runtimes on LD_LIBRARY_PATH).
fn under_vramshim(rt: Runtime, wheels: &Path, flags: &[&str], args: &[&str]) -> RunOutput {
    let exe = build("cudart_roundtrip.c", rt, wheels, &[]);
    let mut c = sim_command(vramshim_testkit::vramshim_exe(), "nv-run");
    c.env("VRAMSIM_CONTEXT_OVERHEAD", "0")
        .args(["run", "--sim"])
        .args(flags)
        .arg("--")
        .arg(&exe)
        .args(args);
    run(&mut c)
}

fn events(path: &Path) -> Vec<Event> {
    let r = TraceReader::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    r.map(|e| e.unwrap_or_else(|e| panic!("{}: {e:?}", path.display())))
        .collect()
}

#[test]
fn traced_every_allocation_once() {
    let Some(wheels) = wheels_or_skip() else {
        return;
    };
    for rt in ALL {
        let trace = temp_dir("nv-trace").join("t.vramtrace");
        let out = under_vramshim(
            rt,
            &wheels,
            &["--trace", trace.to_str().unwrap()],
            &["4", "1048576"],
        );
        assert!(out.success(), "{rt:?}: {}\n{}", out.stdout, out.stderr);
        assert_nvidia_runtime_on_sim_driver(&out.stdout, rt, &wheels);
        let ev = events(&trace);
        let allocs: Vec<_> = ev
            .iter()
            .filter_map(|e| match e {
                Event::Alloc(m) if m.result == 0 => Some(m),
                _ => None,
            })
            .collect();
        let frees = ev.iter().filter(|e| matches!(e, Event::Free(_))).count();
        // 4 buffers, then a temporary per buffer: 8 allocations of 1 MiB, each seen once.
        assert_eq!(allocs.len(), 8, "{rt:?}: {:#?}", allocs);
        assert!(allocs.iter().all(|m| m.size == MIB), "{rt:?}: {allocs:#?}");
        let mut addrs: Vec<u64> = allocs.iter().map(|m| m.addr).collect();
        addrs.sort();
        addrs.dedup();
        assert!(addrs.len() >= 4, "{rt:?}: {addrs:x?}");
        assert_eq!(frees, 8, "{rt:?}: every allocation freed once");
    }
}

#[test]
fn the_cap_refuses_with_out_of_memory() {
    let Some(wheels) = wheels_or_skip() else {
        return;
    };
    for rt in ALL {
        let out = under_vramshim(rt, &wheels, &["--cap", "2MiB"], &["4", "1048576"]);
        assert_eq!(
            out.code(),
            Some(1),
            "{rt:?}: {}\n{}",
            out.stdout,
            out.stderr
        );
        // The third 1 MiB buffer is over the 2 MiB cap: cudaErrorMemoryAllocation (2).
        assert!(
            out.stdout.contains("error cudaMalloc(&d[i], bytes) -> 2 "),
            "{rt:?}: {}\n{}",
            out.stdout,
            out.stderr
        );
    }
}

#[test]
fn data_intact_through_the_pool() {
    let Some(wheels) = wheels_or_skip() else {
        return;
    };
    for rt in ALL {
        let trace = temp_dir("nv-pool").join("t.vramtrace");
        let out = under_vramshim(
            rt,
            &wheels,
            &["--pool", "stitch", "--trace", trace.to_str().unwrap()],
            &["6", "3000000"],
        );
        assert!(out.success(), "{rt:?}: {}\n{}", out.stdout, out.stderr);
        assert_eq!(field(&out.stdout, "corrupt"), 0, "{rt:?}");
        assert_nvidia_runtime_on_sim_driver(&out.stdout, rt, &wheels);
        let pooled = events(&trace)
            .iter()
            .filter(|e| matches!(e, Event::Alloc(m) if m.result == 0))
            .count();
        assert_eq!(pooled, 12, "{rt:?}: each allocation once through the pool");
    }
}

/// The trace, the cap and the pool see the same driver under a preload: `libvramshim.so`
/// preloaded does not change which `libcuda.so.1` NVIDIA's runtime reaches.
#[test]
fn the_preload_does_not_change_the_driver_reached() {
    let Some(wheels) = wheels_or_skip() else {
        return;
    };
    for rt in ALL {
        let exe = build("cudart_roundtrip.c", rt, &wheels, &[]);
        let mut c = sim_command(&exe, "nv-preload");
        c.env("LD_LIBRARY_PATH", driver_only_dir())
            .env("LD_PRELOAD", vramshim_testkit::interposer_lib())
            .args(["2", "4096"]);
        let out = run(&mut c);
        assert!(out.success(), "{rt:?}: {}\n{}", out.stdout, out.stderr);
        assert_nvidia_runtime_on_sim_driver(&out.stdout, rt, &wheels);
    }
}

/// The integrity answer covers every device the runtime sees (their UUIDs and PCI ids): with
/// three simulated devices of which CUDA_VISIBLE_DEVICES shows two, in another order.
#[test]
fn the_integrity_answer_covers_the_visible_devices() {
    let Some(wheels) = wheels_or_skip() else {
        return;
    };
    for rt in ALL {
        let out = plain(
            rt,
            &wheels,
            &[("VRAMSIM_DEVICES", "3"), ("CUDA_VISIBLE_DEVICES", "2,0")],
        );
        assert!(out.success(), "{rt:?}: {}\n{}", out.stdout, out.stderr);
        assert_eq!(field(&out.stdout, "devices"), 2, "{rt:?}");
    }
}
