//! Interception: real programs on the simulated GPU, run with and without the preload; the
//! live table and counters (read in-process through `vramshim_counter`) must match what the
//! program did, and what the program observes must not change.

mod common;

use common::{both, build, preloaded};
use vramshim_testkit::Link;

/// `alloc_suite.c` built with `link` (and `flags`) runs the same with and without the
/// preload, and the preloaded run was interposed.
fn all_paths(exe: &str, link: Link, flags: &[&str], sim: &str) {
    let exe = build(exe, "alloc_suite.c", link, flags);
    let (_, pre) = both(&exe, &[], &[], sim);
    assert!(pre.stderr.contains("preloaded=1"), "{}", pre.stderr);
}

#[test]
fn shared_runtime_all_paths() {
    all_paths(
        "alloc_suite_shared",
        Link::SharedRuntime,
        &["-DLAYER_RUNTIME=1"],
        "ip-shared",
    );
}

#[test]
fn static_runtime_all_paths() {
    all_paths(
        "alloc_suite_static",
        Link::StaticRuntime,
        &["-DLAYER_RUNTIME=0"],
        "ip-static",
    );
}

#[test]
fn dlopen_runtime_all_paths() {
    let flags = ["-DLAYER_RUNTIME=1", "-DUSE_DLOPEN"];
    all_paths("alloc_suite_dl", Link::Dl, &flags, "ip-dlopen");
}

/// The device each allocation is charged to follows cudaSetDevice (through the PLT and
/// through dlsym), per thread.
#[test]
fn allocations_follow_device_switches() {
    let (_, pre) = common::build_both(
        "device_switch",
        "device_switch.c",
        Link::SharedRuntime,
        &[],
        &[("VRAMSIM_DEVICES", "2")],
        "ip-devswitch",
    );
    common::assert_lines(&pre, &["device_switch: ok"]);
}

/// The same test catches a remembered device that is not forgotten on a switch.
#[test]
fn device_switch_test_catches_a_stale_device() {
    let exe = build(
        "device_switch_f",
        "device_switch.c",
        Link::SharedRuntime,
        &[],
    );
    let out = preloaded(
        &exe,
        &[],
        &[("VRAMSIM_DEVICES", "2"), ("VRAMSHIM_DEVICE_FAULT", "stale")],
        "ip-devswitch-fault",
    );
    assert_eq!(out.code(), Some(3), "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains("counter live_bytes.1"),
        "{}",
        out.stderr
    );
}

#[test]
fn driver_api_via_cugetprocaddress() {
    let (plain, _) = common::build_both(
        "driver_api",
        "driver_api.c",
        Link::Dl,
        &[],
        &[],
        "ip-driver",
    );
    // A thread without a context gets the driver's own error, not a crash.
    common::assert_lines(&plain, &["no-context cuMemAlloc -> 201"]);
}

#[test]
fn vmm_charged_by_handle_and_location() {
    common::build_both("vmm", "vmm.c", Link::Dl, &[], &[], "ip-vmm");
}

#[test]
fn async_alloc_on_several_streams() {
    common::build_both(
        "async_streams",
        "async_streams.c",
        Link::SharedRuntime,
        &[],
        &[],
        "ip-async",
    );
}

#[test]
fn pool_allocations_charged_to_the_pools_device() {
    common::build_both(
        "pool_device",
        "pool_device.c",
        Link::SharedRuntime,
        &["-l:libcuda.so.1"],
        &[("VRAMSIM_DEVICES", "2")],
        "ip-pooldev",
    );
}

#[test]
fn driver_entry_points_as_pytorch_makes_them() {
    common::build_both(
        "entry_points",
        "entry_points.c",
        Link::SharedRuntime,
        &[],
        &[],
        "ip-entry",
    );
}

#[test]
fn cap_sees_every_path() {
    let exe = build("cap_wiring", "cap_wiring.c", Link::SharedRuntime, &[]);
    let out = common::preloaded(
        &exe,
        &[],
        &[
            ("VRAMSHIM_CAP", "64MiB"),
            ("VRAMSHIM_CAP_CONTEXT", "exclude"),
        ],
        "ip-cap",
    );
    out.assert_success();
    let cap = (64u64 << 20).to_string();
    common::assert_lines(
        &out,
        &[
            &format!("cudaMemGetInfo total={cap} free<=total 1"),
            &format!("totalGlobalMem={cap}"),
            &format!("cuDeviceTotalMem={cap}"),
            &format!("nvml total={cap} used+free==total 1"),
            "second 40MiB -> 2",
            "last error -> 2",
            "driver 40MiB -> 2",
            "free after 40MiB <= 24MiB 1",
            "cap_wiring: ok",
        ],
    );
}

#[test]
fn context_footprint_reaches_the_cap() {
    let exe = build("cap_context", "cap_wiring.c", Link::SharedRuntime, &[]);
    let out = common::preloaded(
        &exe,
        &["context"],
        &[
            ("VRAMSHIM_CAP", "1GiB"),
            ("VRAMSIM_CONTEXT_OVERHEAD", "100MiB"),
        ],
        "ip-ctx",
    );
    out.assert_success();
    let want = format!(
        "context: free={} total={}",
        (1u64 << 30) - (100 << 20),
        1u64 << 30
    );
    assert!(out.stdout.contains(&want), "{}\n{}", out.stdout, out.stderr);
    // Excluded: the context is not charged.
    let out = common::preloaded(
        &exe,
        &["context"],
        &[
            ("VRAMSHIM_CAP", "1GiB"),
            ("VRAMSHIM_CAP_CONTEXT", "exclude"),
            ("VRAMSIM_CONTEXT_OVERHEAD", "100MiB"),
        ],
        "ip-ctx",
    );
    let want = format!("context: free={} total={}", 1u64 << 30, 1u64 << 30);
    assert!(out.stdout.contains(&want), "{}\n{}", out.stdout, out.stderr);
}

#[test]
fn pool_layer_wiring() {
    let exe = build("pool_wiring", "pool_wiring.c", Link::SharedRuntime, &[]);
    // Without the pool: plain CUDA, identical either way.
    let (plain, _) = both(&exe, &[], &[], "ip-pool-off");
    common::assert_lines(&plain, &["pool_wiring: ok pooled=no"]);
    // With it (once the pool layer serves requests): pooled, IPC refused, data intact.
    let out = common::preloaded(&exe, &[], &[("VRAMSHIM_POOL", "stitch")], "ip-pool-on");
    out.assert_success();
    common::assert_lines(&out, &["pool_wiring: ok"]);
    if out.stdout.contains("pooled=yes") {
        common::assert_lines(&out, &["ipc=refused"]);
    }
}

/// NVML's indices are not CUDA's ordinals (a reordering libnvidia-ml.so.1 in front of the
/// simulated one, as with CUDA_VISIBLE_DEVICES): the capped NVML answer for a handle must
/// describe the CUDA device with the same PCI bus id.
#[test]
fn nvml_answers_follow_the_cuda_device_not_the_nvml_index() {
    let shim_dir = vramshim_testkit::temp_dir("nvml_reorder");
    vramshim_testkit::compile_c_to(
        &shim_dir.join("libnvidia-ml.so.1"),
        &["tests/workloads/interposer/nvml_reorder.c"],
        Link::Dl,
        &["-shared", "-fPIC", "-Wl,-soname,libnvidia-ml.so.1"],
    );
    let sim = vramshim_testkit::sim_dir();
    let exe = build(
        "nvml_order",
        "nvml_order.c",
        Link::SharedRuntime,
        &["-l:libcuda.so.1"],
    );
    let ld = format!("{}:{}", shim_dir.display(), sim.display());
    let real = sim.join("libnvidia-ml.so.1").display().to_string();
    let out = common::preloaded(
        &exe,
        &[],
        &[
            ("LD_LIBRARY_PATH", &ld),
            ("VRAMSIM_REAL_NVML", &real),
            ("VRAMSIM_DEVICES", "2"),
            ("VRAMSHIM_CAP", "1GiB"),
            ("VRAMSHIM_CAP_CONTEXT", "exclude"),
        ],
        "ip-nvml-order",
    );
    out.assert_success();
    let expect = |out: &vramshim_testkit::RunOutput| {
        common::assert_lines(
            out,
            &[
                "cuda 0: total=1024MiB used=64MiB v2 total=1024MiB used+reserved=64MiB",
                "cuda 1: total=1024MiB used=0MiB v2 total=1024MiB used+reserved=0MiB",
                "nvml_order: ok",
            ],
        )
    };
    expect(&out);
    // The same with the simulator's own CUDA_VISIBLE_DEVICES (CUDA's device 0 is physical
    // device 1, which NVML numbers 1).
    let out = common::preloaded(
        &exe,
        &[],
        &[
            ("VRAMSIM_DEVICES", "2"),
            ("CUDA_VISIBLE_DEVICES", "1,0"),
            ("VRAMSHIM_CAP", "1GiB"),
            ("VRAMSHIM_CAP_CONTEXT", "exclude"),
        ],
        "ip-nvml-cvd",
    );
    out.assert_success();
    expect(&out);
}
