//! Limits set for other tools cap a process that only preloads the library: HAMi-core's
//! `CUDA_DEVICE_MEMORY_LIMIT` / `CUDA_DEVICE_MEMORY_LIMIT_<N>`, KAI's `GPU_MEMORY_LIMIT`,
//! NVIDIA's `NVIDIA_GPU_MEMORY_LIMIT`, a cgroup's `dmem.max` (a fake cgroup tree pointed to
//! by `VRAMSHIM_CGROUP_ROOT`) and NVML's memory limits (`nvmlDeviceGetMemoryLimits_v1`,
//! set in cuda-sim by `VRAMSIM_NVML_MEMORY_LIMITS`). Each alone caps every allocation path and the memory queries;
//! with two sources the smallest binds and every message names it; `VRAMSHIM_CAP` replaces the
//! variables but not a smaller kernel limit. `VRAMSHIM_CAP_FAULT=ignore-limits` (the library
//! ignores them) is caught by the same checks.
//!
//! Runs tests/workloads/cap/cap_probe.c on the simulated GPU (build as for cap_sim.rs).

use std::path::{Path, PathBuf};

use vramshim_testkit::{RunOutput, run, sim_command, temp_dir, unique_name};

mod common;
use common::{MIB, fields, lib, num, probe, probe_on_sim};

/// Every variable this file sets, removed from what the test process passes on.
const LIMIT_VARS: &[&str] = &[
    "CUDA_DEVICE_MEMORY_LIMIT",
    "CUDA_DEVICE_MEMORY_LIMIT_0",
    "CUDA_DEVICE_MEMORY_LIMIT_1",
    "GPU_MEMORY_LIMIT",
    "NVIDIA_GPU_MEMORY_LIMIT",
    "VRAMSIM_NVML_MEMORY_LIMITS",
];

/// The probe with only `LD_PRELOAD` and `env` (no `VRAMSHIM_*` unless given), on a simulated
/// device of its own (`devices` of them).
fn probe_run(args: &[&str], env: &[(&str, &str)], devices: u32, name: &str) -> RunOutput {
    probe_on_sim(name, |c| {
        for v in LIMIT_VARS {
            c.env_remove(v);
        }
        // The context's own memory (cuda-sim: 300 MiB by default) would fill these small caps.
        c.env("VRAMSIM_CONTEXT_OVERHEAD", "0")
            .env("VRAMSIM_DEVICES", devices.to_string())
            .env("LD_PRELOAD", lib())
            .args(args);
        for (k, v) in env {
            c.env(k, v);
        }
    })
}

const PATHS: &[&str] = &[
    "cudaMalloc",
    "cudaMallocAsync",
    "cudaMallocPitch",
    "cudaMallocManaged",
    "cuMemAlloc",
    "cuMemAllocAsync",
    "cuMemCreate",
];

/// Every path refused above `cap` and served below it on `dev`; the memory queries report
/// `cap` as the total; the one refusal line and the start line name `source`. Returns the
/// problems found (empty: capped as asked).
fn capped_by(env: &[(&str, &str)], dev: u32, cap: u64, source: &str, name: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let below = (cap - 8 * MIB).to_string();
    let above = (cap + 8 * MIB).to_string();
    let d = dev.to_string();
    let out = probe_run(&["paths", &below, &above, &d], env, dev + 1, name);
    out.assert_success();
    for p in PATHS {
        let f = fields(&out, "path=", &format!("path={p} "));
        if num(&f, "above") != 2 {
            problems.push(format!("{p} above the cap was not refused: {f:?}"));
        }
        if num(&f, "below") != 0 {
            problems.push(format!("{p} below the cap was refused: {f:?}"));
        }
    }
    let refusal: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("refused:"))
        .collect();
    if refusal.len() != 1 || !refusal[0].contains(&format!("(set by {source}")) {
        problems.push(format!(
            "the refusal line does not name {source}:\n{}",
            out.stderr
        ));
    }
    let start: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("cap from "))
        .collect();
    if start.len() != 1 || !start[0].contains(source) {
        problems.push(format!(
            "no one start line naming {source}:\n{}",
            out.stderr
        ));
    }
    let info = probe_run(&["info", &d], env, dev + 1, name);
    info.assert_success();
    let f = fields(&info, "info", "");
    for k in ["cuda_total", "cu_total", "nvml_total"] {
        if num(&f, k) != cap {
            problems.push(format!("{k} is {} instead of the cap {cap}", num(&f, k)));
        }
    }
    problems
}

fn assert_capped(env: &[(&str, &str)], dev: u32, cap: u64, source: &str, name: &str) {
    let p = capped_by(env, dev, cap, source, name);
    assert!(p.is_empty(), "{env:?}:\n{}", p.join("\n"));
}

#[test]
fn each_variable_alone_caps_a_process_that_only_preloads_the_library() {
    assert_capped(
        &[("CUDA_DEVICE_MEMORY_LIMIT", "256m")],
        0,
        256 * MIB,
        "CUDA_DEVICE_MEMORY_LIMIT=\"256m\"",
        "lim-hami",
    );
    assert_capped(
        &[("CUDA_DEVICE_MEMORY_LIMIT_1", "192m")],
        1,
        192 * MIB,
        "CUDA_DEVICE_MEMORY_LIMIT_1=\"192m\"",
        "lim-hami1",
    );
    assert_capped(
        &[("GPU_MEMORY_LIMIT", "268435456")],
        0,
        256 * MIB,
        "GPU_MEMORY_LIMIT=\"268435456\"",
        "lim-kai",
    );
    assert_capped(
        &[("NVIDIA_GPU_MEMORY_LIMIT", "320MiB")],
        0,
        320 * MIB,
        "NVIDIA_GPU_MEMORY_LIMIT=\"320MiB\"",
        "lim-nvidia",
    );
}

#[test]
fn with_two_sources_the_smallest_binds_and_is_named() {
    // HAMi's global limit and KAI's: KAI's is smaller.
    assert_capped(
        &[
            ("CUDA_DEVICE_MEMORY_LIMIT", "512m"),
            ("GPU_MEMORY_LIMIT", "268435456"),
        ],
        0,
        256 * MIB,
        "GPU_MEMORY_LIMIT=\"268435456\"",
        "lim-two",
    );
    // The per-device form replaces the global one for its device, as in HAMi-core.
    assert_capped(
        &[
            ("CUDA_DEVICE_MEMORY_LIMIT", "128m"),
            ("CUDA_DEVICE_MEMORY_LIMIT_1", "384m"),
            ("NVIDIA_GPU_MEMORY_LIMIT", "1GiB"),
        ],
        1,
        384 * MIB,
        "CUDA_DEVICE_MEMORY_LIMIT_1=\"384m\"",
        "lim-perdev",
    );
    // VRAMSHIM_CAP replaces the variables (even a smaller one), and the start line says so.
    let env = [
        ("VRAMSHIM_CAP", "320MiB"),
        ("CUDA_DEVICE_MEMORY_LIMIT", "128m"),
    ];
    assert_capped(&env, 0, 320 * MIB, "VRAMSHIM_CAP=\"320MiB\"", "lim-ours");
    let out = probe_run(&["info", "0"], &env, 1, "lim-ours-line");
    assert!(
        out.stderr
            .contains("VRAMSHIM_CAP replaces CUDA_DEVICE_MEMORY_LIMIT=\"128m\""),
        "{}",
        out.stderr
    );
}

#[test]
fn a_bad_value_is_one_line_and_the_other_limits_still_bind() {
    let env = [
        ("CUDA_DEVICE_MEMORY_LIMIT", "24Gi"),
        ("GPU_MEMORY_LIMIT", "268435456"),
    ];
    assert_capped(
        &env,
        0,
        256 * MIB,
        "GPU_MEMORY_LIMIT=\"268435456\"",
        "lim-bad",
    );
    let out = probe_run(&["info", "0"], &env, 1, "lim-bad-line");
    let bad: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("CUDA_DEVICE_MEMORY_LIMIT=\"24Gi\" is not valid"))
        .collect();
    assert_eq!(bad.len(), 1, "{}", out.stderr);
    assert!(bad[0].contains("256m, 24g"), "{}", bad[0]);
    assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
}

/// A fake cgroup v2 tree under a temporary directory, with the test process's own cgroup
/// path (the probe inherits it), holding `max` and `min` as its dmem files.
fn fake_cgroup(name: &str, max: &str, min: Option<&str>) -> PathBuf {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let path = own
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .expect("a cgroup v2 line in /proc/self/cgroup")
        .trim()
        .trim_start_matches('/')
        .to_string();
    let root = temp_dir(name).join("cgroup");
    let dir = root.join(&path);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("dmem.max"), max).unwrap();
    if let Some(m) = min {
        std::fs::write(dir.join("dmem.min"), m).unwrap();
    }
    // A parent's looser limit: the smallest on the way up binds.
    if dir != root {
        std::fs::write(
            dir.parent().unwrap().join("dmem.max"),
            "drm/0000:01:00.0/vram0 1073741824\n",
        )
        .unwrap();
    }
    root
}

fn root_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn a_cgroup_dmem_max_is_honoured_and_named() {
    // cuda-sim's device 0 sits at PCI 00000000:01:00.0.
    let root = fake_cgroup(
        "lim-dmem",
        "drm/0000:01:00.0/vram0 201326592\ndrm/0000:7f:00.0/vram0 1048576\n",
        Some("drm/0000:01:00.0/vram0 67108864\n"),
    );
    let file = root.join(
        std::fs::read_to_string("/proc/self/cgroup")
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("0::"))
            .unwrap()
            .trim()
            .trim_start_matches('/'),
    );
    let source = format!("cgroup {}", file.join("dmem.max").display());
    let env = [("VRAMSHIM_CGROUP_ROOT", root_str(&root))];
    assert_capped(&env, 0, 192 * MIB, &source, "lim-dmem-alone");
    // The start line reports the soft limit and the region no device matches.
    let out = probe_run(&["info", "0"], &env, 1, "lim-dmem-line");
    assert!(
        out.stderr
            .contains("dmem.min drm/0000:01:00.0/vram0 64 MiB"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr
            .contains("drm/0000:7f:00.0/vram0 matches no device"),
        "{}",
        out.stderr
    );
    // Smaller than a variable: the kernel's limit binds and is named.
    let env2 = [
        ("VRAMSHIM_CGROUP_ROOT", root_str(&root)),
        ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
    ];
    assert_capped(&env2, 0, 192 * MIB, &source, "lim-dmem-var");
    // VRAMSHIM_CAP does not lift a kernel limit below it.
    let env3 = [
        ("VRAMSHIM_CGROUP_ROOT", root_str(&root)),
        ("VRAMSHIM_CAP", "512MiB"),
    ];
    assert_capped(&env3, 0, 192 * MIB, &source, "lim-dmem-ours");
    // Larger than a variable: the variable binds.
    let env4 = [
        ("VRAMSHIM_CGROUP_ROOT", root_str(&root)),
        ("GPU_MEMORY_LIMIT", "134217728"),
    ];
    assert_capped(
        &env4,
        0,
        128 * MIB,
        "GPU_MEMORY_LIMIT=\"134217728\"",
        "lim-dmem-kai",
    );
}

#[test]
fn an_nvml_hard_limit_is_honoured_and_named() {
    let nvml = ("VRAMSIM_NVML_MEMORY_LIMITS", "0=192MiB/64MiB");
    let source = "NVML memory limit (hard) (192 MiB on device 0)";
    assert_capped(&[nvml], 0, 192 * MIB, source, "lim-nvml-alone");
    // The start line reports the soft limit; a device NVML gives no limit is not capped.
    let out = probe_run(&["info", "0"], &[nvml], 1, "lim-nvml-line");
    assert!(
        out.stderr
            .contains("NVML memory limit (soft) of NVML device 0 64 MiB (reported, not a bound)"),
        "{}",
        out.stderr
    );
    // The second device: NVML's limit of device 1 only.
    let one = ("VRAMSIM_NVML_MEMORY_LIMITS", "1=160MiB");
    assert_capped(
        &[one],
        1,
        160 * MIB,
        "NVML memory limit (hard) (160 MiB on device 1)",
        "lim-nvml-dev1",
    );
    // Smaller than a variable or VRAMSHIM_CAP: NVML's binds and is named.
    assert_capped(
        &[nvml, ("CUDA_DEVICE_MEMORY_LIMIT", "1g")],
        0,
        192 * MIB,
        source,
        "lim-nvml-var",
    );
    assert_capped(
        &[nvml, ("VRAMSHIM_CAP", "512MiB")],
        0,
        192 * MIB,
        source,
        "lim-nvml-ours",
    );
    // Larger than a variable: the variable binds.
    assert_capped(
        &[nvml, ("GPU_MEMORY_LIMIT", "134217728")],
        0,
        128 * MIB,
        "GPU_MEMORY_LIMIT=\"134217728\"",
        "lim-nvml-kai",
    );
    // Larger than a cgroup's dmem.max: the kernel's binds.
    let root = fake_cgroup("lim-nvml-dmem", "drm/0000:01:00.0/vram0 167772160\n", None);
    assert_capped(
        &[nvml, ("VRAMSHIM_CGROUP_ROOT", root_str(&root))],
        0,
        160 * MIB,
        "cgroup ",
        "lim-nvml-dmem",
    );
}

/// With the library told to ignore the limits (`VRAMSHIM_CAP_FAULT=ignore-limits`), the same
/// checks see the process uncapped: they would catch a library that dropped them.
#[test]
fn the_checks_catch_a_library_that_ignores_the_limits() {
    let root = fake_cgroup("lim-fault", "drm/0000:01:00.0/vram0 201326592\n", None);
    for (env, cap, source) in [
        (
            vec![("CUDA_DEVICE_MEMORY_LIMIT", "256m")],
            256 * MIB,
            "CUDA_DEVICE_MEMORY_LIMIT=\"256m\"".to_string(),
        ),
        (
            vec![("GPU_MEMORY_LIMIT", "268435456")],
            256 * MIB,
            "GPU_MEMORY_LIMIT=\"268435456\"".to_string(),
        ),
        (
            vec![("NVIDIA_GPU_MEMORY_LIMIT", "320MiB")],
            320 * MIB,
            "NVIDIA_GPU_MEMORY_LIMIT=\"320MiB\"".to_string(),
        ),
        (
            vec![("VRAMSHIM_CGROUP_ROOT", root_str(&root))],
            192 * MIB,
            "cgroup ".to_string(),
        ),
        (
            vec![("VRAMSIM_NVML_MEMORY_LIMITS", "0=192MiB")],
            192 * MIB,
            "NVML memory limit (hard)".to_string(),
        ),
    ] {
        let mut env = env;
        env.push(("VRAMSHIM_CAP_FAULT", "ignore-limits"));
        let p = capped_by(&env, 0, cap, &source, "lim-fault");
        assert!(
            p.iter()
                .any(|l| l.contains("above the cap was not refused")),
            "{env:?}: the fault went unnoticed: {p:?}"
        );
    }
}

/// The trace carries the limits in force: `vramshim summary` (the device's cap line, the
/// post-mortem, the JSON) and the lines `vramshim run` prints after a traced run name the
/// source that bound.
#[test]
fn summary_and_the_run_line_name_the_source_that_bound() {
    let (trace, _) = traced_refusal(
        &[
            ("CUDA_DEVICE_MEMORY_LIMIT", "512m"),
            ("GPU_MEMORY_LIMIT", "268435456"),
        ],
        "GPU_MEMORY_LIMIT=\"268435456\"",
        "lim-summary",
    );
    assert!(
        header_limits(&trace).contains(
            &"devices=all bytes=268435456 kind=tool source=GPU_MEMORY_LIMIT=\"268435456\""
                .to_string()
        ),
        "{:?}",
        header_limits(&trace)
    );
}

/// NVML's hard limit (the driver's, as NVIDIA's container toolkit sets it) and a group's
/// budget are in the trace's limits too, each with where it came from, and named the same
/// way.
#[test]
fn nvml_limits_and_a_groups_budget_are_named_from_the_trace() {
    // The header is written with the first event, after the cap's set-up mapped NVML's
    // limit to the CUDA device; it still names NVML's index, as a header written before
    // the set-up does (one rule: the trace names a limit the same way whenever written).
    let nvml = "NVML memory limit (hard) (256 MiB on NVML device 0)";
    let (trace, text) = traced_refusal(
        &[("VRAMSIM_NVML_MEMORY_LIMITS", "0=256MiB/64MiB")],
        nvml,
        "lim-summary-nvml",
    );
    assert!(
        text.contains(&format!(
            "cap limit from NVML (the driver): 256 MiB on NVML device 0 ({nvml})"
        )),
        "{text}"
    );
    let entries = header_limits(&trace);
    assert!(
        entries.contains(&format!(
            "devices=nvml:0 bytes=268435456 kind=nvml source={nvml}"
        )),
        "{entries:?}"
    );
    // NVML's limit binds; the cgroup's larger one on the same device is listed beside it
    // (by CUDA ordinal: the header follows the set-up), both named by source, so that a
    // reader sees every limit on the device, not only the smaller.
    let root = fake_cgroup(
        "lim-summary-nvml-dmem",
        "drm/0000:01:00.0/vram0 536870912\n",
        None,
    );
    let (trace, _) = traced_refusal(
        &[
            ("VRAMSIM_NVML_MEMORY_LIMITS", "0=256MiB/64MiB"),
            ("VRAMSHIM_CGROUP_ROOT", root_str(&root)),
        ],
        nvml,
        "lim-summary-nvml-dmem",
    );
    let entries = header_limits(&trace);
    assert!(
        entries.contains(&format!(
            "devices=nvml:0 bytes=268435456 kind=nvml source={nvml}"
        )) && entries.iter().any(|e| e
            .starts_with("devices=0 bytes=536870912 kind=cgroup source=cgroup ")
            && e.ends_with("(drm/0000:01:00.0/vram0 512 MiB)")),
        "{entries:?}"
    );
    // A member of a group whose budget (256 MiB) is below its own VRAMSHIM_CAP.
    let region = temp_dir("lim-summary-group").join("group");
    vramshim_region::Region::open_or_create(
        &region,
        &vramshim_region::spec::parse_cap("256MiB").unwrap(),
    )
    .unwrap();
    let name = region.display().to_string();
    let group =
        format!("VRAMSHIM_CAP=\"268435456\" of the budget shared by VRAMSHIM_SHARED=\"{name}\"");
    let (trace, text) = traced_refusal(
        &[("VRAMSHIM_CAP", "512MiB"), ("VRAMSHIM_SHARED", &name)],
        &group,
        "lim-summary-group",
    );
    assert!(
        text.contains(&format!(
            "cap limit from the group's budget: 256 MiB on every device ({group})"
        )) && text.contains(
            "cap limit from VRAMSHIM_CAP: 512 MiB on every device (VRAMSHIM_CAP=\"512MiB\")"
        ),
        "{text}"
    );
    let entries = header_limits(&trace);
    assert!(
        entries.contains(&format!(
            "devices=all bytes=268435456 kind=group source={group}"
        )) && entries.contains(
            &"devices=all bytes=536870912 kind=env source=VRAMSHIM_CAP=\"512MiB\"".into()
        ),
        "{entries:?}"
    );
}

/// The trace header's `cap.limit` entries.
fn header_limits(trace: &Path) -> Vec<String> {
    let r = vramshim_trace::TraceReader::open(trace).unwrap();
    r.header()
        .config
        .iter()
        .filter(|(k, _)| k == "cap.limit")
        .map(|(_, v)| v.clone())
        .collect()
}

/// Runs the probe under `vramshim run --sim --trace` with `env`, a 100 MiB request served and
/// a 300 MiB one refused by a cap of 256 MiB whose source is `source`; checks that the run
/// line, `vramshim summary` (text and JSON) name it; returns the trace and the summary text.
fn traced_refusal(env: &[(&str, &str)], source: &str, name: &str) -> (PathBuf, String) {
    let vramshim = vramshim_testkit::vramshim_exe();
    let dir = temp_dir(name);
    let trace = dir.join("t.vramtrace");
    // A clean environment (with VRAMSHIM_TEST_PASS's switches), as for the probe.
    let mut c = sim_command(&vramshim, name);
    for v in LIMIT_VARS {
        c.env_remove(v);
    }
    let below = (100 * MIB).to_string();
    let above = (300 * MIB).to_string();
    c.env("VRAMSIM_NAME", unique_name(name))
        .env("VRAMSIM_CONTEXT_OVERHEAD", "0")
        .env("VRAMSHIM_NO_PROGRESS", "1")
        .envs(env.iter().copied())
        .args(["run", "--sim", "--trace"])
        .arg(&trace)
        .arg("--")
        .arg(probe())
        .args(["paths", &below, &above]);
    let out = run(&mut c);
    out.assert_success();
    assert!(
        out.stderr
            .contains(&format!("cap 256 MiB (set by {source})")),
        "the run line does not name the source:\n{}",
        out.stderr
    );
    let text = run(std::process::Command::new(&vramshim)
        .env("VRAMSHIM_NO_PROGRESS", "1")
        .arg("summary")
        .arg("--no-whatif")
        .arg(&trace));
    text.assert_success();
    assert!(
        text.stdout
            .contains(&format!("cap 256 MiB (set by {source}):")),
        "{}",
        text.stdout
    );
    assert!(
        text.stdout.contains(&format!("set by {source}")) && text.stdout.contains("REFUSED"),
        "{}",
        text.stdout
    );
    let json = run(std::process::Command::new(&vramshim)
        .env("VRAMSHIM_NO_PROGRESS", "1")
        .args(["summary", "--json", "--no-whatif"])
        .arg(&trace));
    json.assert_success();
    let quoted = json_string(source);
    assert!(
        json.stdout.contains(&format!("\"cap_source\": {quoted}")),
        "{}",
        json.stdout
    );
    (trace, text.stdout)
}

/// `s` as a JSON string literal (quotes and backslashes escaped).
fn json_string(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}
