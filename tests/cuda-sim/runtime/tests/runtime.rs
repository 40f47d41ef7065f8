//! The simulated runtime (libcudart.so.12/.13, libcudart_static.a) driven by real C programs
//! on the simulated driver. Needs the simulated GPU built (scripts/test does it).

use std::path::Path;
use std::process::Command;
use vramshim_testkit::{
    Link, RunOutput, compile_c, compile_c_to, real_cudart12_dir, run, sim_command, sim_dir,
    temp_dir,
};

const BASIC: &str = "tests/workloads/sim/rt_basic.c";

/// `tests/workloads/sim/{program}.c` built as `exe` against `link` and run on the simulated
/// GPU with `env`: it exits 0 and prints "{program}: ok".
fn sim_program_ok(exe: &str, program: &str, link: Link, env: &[(&str, &str)]) -> RunOutput {
    let bin = compile_c(exe, &[&format!("tests/workloads/sim/{program}.c")], link);
    let out = run(sim_command(&bin, exe).envs(env.iter().copied()));
    out.assert_success();
    assert!(
        out.stdout.contains(&format!("{program}: ok")),
        "{}",
        out.stdout
    );
    out
}

fn readelf(args: &[&str], file: &Path) -> String {
    let o = Command::new("readelf")
        .args(args)
        .arg(file)
        .output()
        .expect("readelf");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn layout_has_every_library_under_its_real_name() {
    let d = sim_dir();
    for f in [
        "libcuda.so.1",
        "libcuda.so",
        "libcudart.so.12",
        "libcudart.so.13",
        "libcudart_static.a",
        "libnvidia-ml.so.1",
    ] {
        assert!(d.join(f).exists(), "{f} missing in {}", d.display());
    }
    assert_eq!(
        std::fs::read_link(d.join("libcuda.so")).unwrap(),
        Path::new("libcuda.so.1")
    );
}

#[test]
fn shared_runtimes_have_soname_and_version_node() {
    for v in ["12", "13"] {
        let lib = sim_dir().join(format!("libcudart.so.{v}"));
        let dynamic = readelf(&["-d", "-W"], &lib);
        assert!(
            dynamic.contains(&format!("Library soname: [libcudart.so.{v}]")),
            "{dynamic}"
        );
        assert!(
            !dynamic.contains("libcuda.so"),
            "the runtime must not link libcuda: {dynamic}"
        );
        let syms = readelf(&["--dyn-syms", "-W"], &lib);
        for f in [
            "cudaMalloc",
            "cudaFree",
            "cudaMallocAsync_ptsz",
            "cudaGetDriverEntryPointByVersion",
        ] {
            assert!(
                syms.contains(&format!(" {f}@@libcudart.so.{v}")),
                "{f} not versioned in .so.{v}"
            );
        }
        // Nothing of Rust's leaks out: every defined dynamic symbol is versioned.
        for line in syms
            .lines()
            .filter(|l| l.contains(" FUNC ") && !l.contains(" UND "))
        {
            assert!(
                line.contains("@@libcudart.so."),
                "unversioned export: {line}"
            );
        }
    }
}

#[test]
fn c_program_linked_against_shared_runtime_12() {
    let exe = compile_c("rt_basic12", &[BASIC], Link::SharedRuntime);
    let out = run(&mut sim_command(&exe, "rt_basic12"));
    out.assert_success();
    assert!(out.stdout.contains("runtime=12090"), "{}", out.stdout);
    assert!(out.stdout.contains("rt_basic: ok"));
    assert!(out.stderr.is_empty(), "unexpected stderr: {}", out.stderr);
}

#[test]
fn c_program_linked_against_shared_runtime_13() {
    let exe = compile_c("rt_basic13", &[BASIC], Link::SharedRuntime13);
    let out = run(&mut sim_command(&exe, "rt_basic13"));
    out.assert_success();
    assert!(out.stdout.contains("runtime=13000"), "{}", out.stdout);
}

#[test]
fn c_program_linked_against_static_runtime() {
    let exe = compile_c("rt_basic_static", &[BASIC], Link::StaticRuntime);
    let needed = readelf(&["-d"], &exe);
    assert!(
        !needed.contains("libcudart"),
        "static runtime must not need libcudart: {needed}"
    );
    let out = run(&mut sim_command(&exe, "rt_basic_static"));
    out.assert_success();
    assert!(out.stdout.contains("runtime=12090") && out.stdout.contains("rt_basic: ok"));
}

#[test]
fn device_properties_come_from_the_driver() {
    let exe = compile_c("rt_props", &[BASIC], Link::SharedRuntime);
    for (mem, bytes) in [("2GiB", "2147483648"), ("3GiB", "3221225472")] {
        let out = run(sim_command(&exe, "rt_props").env("VRAMSIM_MEMORY", mem));
        out.assert_success();
        assert!(
            out.stdout.contains(&format!("totalGlobalMem={bytes}")),
            "{}",
            out.stdout
        );
    }
}

#[test]
fn error_codes_and_last_error_semantics() {
    let exe = compile_c(
        "rt_errors",
        &["tests/workloads/sim/rt_errors.c"],
        Link::SharedRuntime,
    );
    let out = run(sim_command(&exe, "rt_errors").arg("panic"));
    out.assert_success();
    assert!(out.stdout.contains("rt_errors: ok"));
    // The deliberate panic is reported on stderr but does not cross the C ABI.
    assert!(out.stderr.contains("deliberate panic"), "{}", out.stderr);
}

#[test]
fn driver_entry_points_select_ptsz_and_version() {
    sim_program_ok("rt_entry", "rt_entry", Link::SharedRuntime, &[]);
    sim_program_ok("rt_entry13", "rt_entry", Link::SharedRuntime13, &[]);
}

#[test]
fn dlopened_runtime_resolves_by_version_node() {
    let exe = compile_c(
        "dl_runtime",
        &["tests/workloads/sim/dl_runtime.c"],
        Link::Dl,
    );
    for v in ["12", "13"] {
        let lib = format!("libcudart.so.{v}");
        let out = run(sim_command(&exe, "dl_runtime").args([&lib, &lib]));
        out.assert_success();
        assert!(
            out.stdout.contains(&format!("runtime={v}")),
            "{}",
            out.stdout
        );
    }
}

#[test]
fn without_a_driver_every_call_is_insufficient_driver() {
    // Only the runtime on the library path: dlopen("libcuda.so.1") fails.
    let probe = Command::new("sh")
        .args(["-c", "ldconfig -p 2>/dev/null | grep -q 'libcuda.so.1 '"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if probe {
        eprintln!("SKIP: a system libcuda.so.1 is installed; cannot test the no-driver case here");
        return;
    }
    let dir = temp_dir("no_driver_lib");
    std::fs::copy(
        sim_dir().join("libcudart.so.12"),
        dir.join("libcudart.so.12"),
    )
    .unwrap();
    let runtime_only = [("LD_LIBRARY_PATH", dir.to_str().expect("a UTF-8 path"))];
    sim_program_ok("no_driver", "no_driver", Link::SharedRuntime, &runtime_only);
}

/// Issue 2, Deliver 4: a program linked at build time against NVIDIA's real libcudart.so.12
/// (12.9 wheel, no rpath) runs unchanged on the simulated stack.
#[test]
fn program_built_against_real_libcudart_runs_on_the_simulated_stack() {
    let real = match real_cudart12_dir() {
        Ok(d) => d,
        Err(why) => {
            eprintln!("SKIP: NVIDIA's libcudart.so.12 is not available: {why}");
            return;
        }
    };
    let exe = temp_dir("real_cudart").join("rt_basic_real");
    let l = format!("-L{}", real.display());
    compile_c_to(
        &exe,
        &[BASIC],
        Link::Dl,
        &["-DREAL_CUDART", &l, "-l:libcudart.so.12"],
    );
    // It really references NVIDIA's versioned symbols, and has no rpath.
    let dynsyms = readelf(&["--dyn-syms", "-W"], &exe);
    assert!(dynsyms.contains("cudaMalloc@libcudart.so.12"), "{dynsyms}");
    let dynamic = readelf(&["-d"], &exe);
    assert!(
        !dynamic.contains("RPATH") && !dynamic.contains("RUNPATH"),
        "{dynamic}"
    );
    let out = run(&mut sim_command(&exe, "rt_real"));
    out.assert_success();
    assert!(out.stdout.contains("rt_basic: ok"), "{}", out.stdout);
    assert!(
        !out.stderr.contains("no version information available"),
        "glibc complained about symbol versions: {}",
        out.stderr
    );
    assert!(out.stderr.is_empty(), "unexpected stderr: {}", out.stderr);
}

#[test]
fn device_reset_frees_the_context_and_reinitializes() {
    sim_program_ok("rt_reset", "rt_reset", Link::SharedRuntime, &[]);
}

#[test]
fn two_devices_current_device_per_thread() {
    let devices = [("VRAMSIM_DEVICES", "2")];
    sim_program_ok("rt_multi", "rt_multi", Link::SharedRuntime, &devices);
}

#[test]
fn capture_ipc_pointer_attributes_and_pools() {
    for (name, link) in [
        ("rt_more12", Link::SharedRuntime),
        ("rt_more13", Link::SharedRuntime13),
    ] {
        sim_program_ok(name, "rt_more", link, &[]);
    }
}

/// A capture forbids potentially unsafe calls to the threads CUDA's rules say (by the calling
/// thread's interaction mode); the virtual-memory calls are not among them, and
/// cudaDeviceSynchronize is refused by every capture; waits on events of an ended capture and
/// across two captures are refused as a real driver refuses them.
#[test]
fn capture_modes_decide_which_threads_a_capture_forbids() {
    sim_program_ok("capture_modes", "capture_modes", Link::SharedRuntime, &[]);
}

/// A stream-ordered allocation during capture is a graph allocation node: fixed address,
/// live from a launch until a free node, a free outside the graph or the next launch with
/// `AutoFreeOnLaunch`; a graph that left it live is not launched again before it is freed;
/// graph memory attributes follow; an invalidated capture's nodes go with it.
#[test]
fn graph_allocation_nodes_live_from_launch_to_free() {
    sim_program_ok("graph_memory", "graph_memory", Link::SharedRuntime, &[]);
}

/// The runtime reaches the driver only through `cuGetProcAddress_v2` (base names, minimum
/// versions, per-thread flag for `_ptsz`): a stand-in libcuda.so.1 exporting nothing else,
/// logging every lookup and forwarding to the simulated driver, is enough for it.
#[test]
fn runtime_reaches_the_driver_only_through_cu_get_proc_address_v2() {
    let dir = temp_dir("logging_driver");
    compile_c_to(
        &dir.join("libcuda.so.1"),
        &["tests/workloads/sim/logging_driver.c"],
        Link::Dl,
        &["-shared", "-fPIC", "-Wl,-soname,libcuda.so.1"],
    );
    let nm = readelf(&["--dyn-syms", "-W"], &dir.join("libcuda.so.1"));
    assert!(
        !nm.contains(" cuInit"),
        "the stand-in must export cuGetProcAddress_v2 only"
    );
    std::fs::copy(
        sim_dir().join("libcudart.so.12"),
        dir.join("libcudart.so.12"),
    )
    .unwrap();
    let exe = compile_c("rt_basic_logged", &[BASIC], Link::SharedRuntime);
    let out = run(sim_command(&exe, "rt_logged")
        .env("LD_LIBRARY_PATH", &dir)
        .env("VRAMSIM_REAL_LIBCUDA", sim_dir().join("libcuda.so.1")));
    out.assert_success();
    for lookup in [
        "lookup cuInit 2000 0",
        "lookup cuMemAlloc 3020 0",
        "lookup cuMemFree 3020 0",
        "lookup cuMemAllocAsync 11020 0",
        "lookup cuMemAllocAsync 11020 2",
        "lookup cuMemFreeAsync 11020 2",
        "lookup cuMemAllocFromPoolAsync 11020 2",
        "lookup cuDevicePrimaryCtxRetain 7000 0",
        "lookup cuDeviceTotalMem 3020 0",
    ] {
        assert!(
            out.stderr.lines().any(|l| l == lookup),
            "no '{lookup}' in:\n{}",
            out.stderr
        );
    }
    // Base names only: never a versioned or _ptsz name.
    for l in out.stderr.lines().filter(|l| l.starts_with("lookup ")) {
        let name = l.split_whitespace().nth(1).unwrap();
        assert!(
            !name.ends_with("_v2") && !name.ends_with("_ptsz"),
            "looked up a variant name: {l}"
        );
    }
}

#[test]
fn pools_host_registration_ipc_peer_copies_callbacks() {
    let devices = [("VRAMSIM_DEVICES", "2")];
    sim_program_ok("rt_extra", "rt_extra", Link::SharedRuntime, &devices);
}

#[test]
fn concurrent_first_calls_initialize_once() {
    let exe = compile_c(
        "rt_threads",
        &["tests/workloads/sim/rt_threads.c"],
        Link::SharedRuntime,
    );
    let out = run(sim_command(&exe, "rt_threads").env("VRAMSIM_CONTEXT_OVERHEAD", "100MiB"));
    out.assert_success();
    let used: u64 = out
        .field("rt_threads: ok", "used")
        .unwrap()
        .parse()
        .unwrap();
    let mib = 1u64 << 20;
    // One context (100 MiB) plus 16 x 1 MiB, not one context per thread.
    assert!((116 * mib..200 * mib).contains(&used), "used {used}");
}

#[test]
fn a_driver_older_than_the_runtime_is_insufficient() {
    // libcudart.so.13 on a driver that reports 12.9.
    let exe = compile_c(
        "old_driver",
        &["tests/workloads/sim/no_driver.c"],
        Link::SharedRuntime13,
    );
    let out = run(sim_command(&exe, "old_driver")
        .env("VRAMSIM_DRIVER_VERSION", "12090")
        .arg("12090"));
    out.assert_success();
    // The same driver is fine for libcudart.so.12.
    let exe = compile_c("old_driver12", &[BASIC], Link::SharedRuntime);
    run(sim_command(&exe, "old_driver12").env("VRAMSIM_DRIVER_VERSION", "12090")).assert_success();
}

#[test]
fn kernels_registration_launches_and_captured_graphs() {
    for (name, link) in [
        ("rt_kernels12", Link::SharedRuntime),
        ("rt_kernels13", Link::SharedRuntime13),
    ] {
        sim_program_ok(name, "rt_kernels", link, &[]);
    }
}
