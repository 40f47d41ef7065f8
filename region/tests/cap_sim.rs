//! The cap, end to end: real C programs (tests/workloads/cap/cap_probe.c) under
//! `LD_PRELOAD=libvramshim.so` on the simulated GPU. Where a bound is checked, it is checked
//! from the simulated device's own accounting (vramsim-devstate's high-water mark), not ours.
//!
//! Needs the workspace built (`scripts/test` does it; or `cargo build --release -p
//! vramshim-interposer -p vramshim-analyzer -p vramsim-driver -p vramsim-nvml -p
//! vramsim-runtime12 -p vramsim-runtime13 -p vramsim-runtime-static`).
//! `VRAMSHIM_TEST_HAMMER_SECS` sets the length of each concurrency run (default 3 s).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use vramshim_region::{ProcessKey, Region};
use vramshim_testkit::{Link, RunOutput, compile_c, run, sim_command, unique_name};

mod common;
use common::{GIB, MIB, fields, lib, num, probe, probe_on_sim};

fn capped(args: &[&str], env: &[(&str, &str)], name: &str) -> RunOutput {
    on_sim(args, env, Some(&lib()), name)
}

/// Runs the probe on a simulated device of its own, removed afterwards.
fn on_sim(args: &[&str], env: &[(&str, &str)], preload: Option<&Path>, name: &str) -> RunOutput {
    probe_on_sim(name, |c| {
        c.args(args);
        for (k, v) in env {
            c.env(k, v);
        }
        if let Some(l) = preload {
            c.env("LD_PRELOAD", l);
        }
    })
}

/// Lines vramshim itself wrote on stderr.
fn our_lines(out: &RunOutput) -> Vec<&str> {
    out.stderr
        .lines()
        .filter(|l| l.starts_with("vramshim"))
        .collect()
}

const RUNTIME_PATHS: &[&str] = &[
    "cudaMalloc",
    "cudaMallocAsync",
    "cudaMallocFromPoolAsync",
    "cudaMallocPitch",
    "cudaMalloc3D",
    "cudaMallocManaged",
];
const DRIVER_PATHS: &[&str] = &[
    "cuMemAlloc",
    "cuMemAllocPitch",
    "cuMemAllocManaged",
    "cuMemAllocAsync",
    "cuMemAllocFromPoolAsync",
    "cuMemCreate",
];

fn check_paths(out: &RunOutput, dev: u32) {
    out.assert_success();
    for p in RUNTIME_PATHS.iter().chain(DRIVER_PATHS) {
        let f = fields(out, "path=", &format!("path={p} "));
        assert_eq!(
            num(&f, "above"),
            2,
            "{p} above the cap on device {dev} must be refused with the OOM code: {f:?}"
        );
        assert_eq!(
            num(&f, "below"),
            0,
            "{p} below the cap on device {dev} must succeed: {f:?}"
        );
        if RUNTIME_PATHS.contains(p) {
            assert_eq!(
                num(&f, "peek"),
                2,
                "{p}: cudaPeekAtLastError after the refusal: {f:?}"
            );
            assert_eq!(
                num(&f, "last"),
                2,
                "{p}: cudaGetLastError after the refusal: {f:?}"
            );
            assert_eq!(
                num(&f, "after"),
                0,
                "{p}: cudaGetLastError clears it: {f:?}"
            );
        }
    }
    let refusals: Vec<_> = our_lines(out)
        .into_iter()
        .filter(|l| l.contains("refused"))
        .collect();
    assert_eq!(
        refusals.len(),
        1,
        "one line for the first refusal only:\n{}",
        out.stderr
    );
    assert!(refusals[0].contains("VRAMSHIM_CAP"), "{}", refusals[0]);
}

#[test]
fn every_path_is_refused_above_the_cap_and_served_below() {
    let above = (GIB + 16 * MIB).to_string();
    let below = (512 * MIB).to_string();
    // Without the cap the simulated 16 GiB device serves the larger request on every path.
    let plain = on_sim(&["paths", &below, &above], &[], None, "cap-paths-plain");
    plain.assert_success();
    for p in RUNTIME_PATHS.iter().chain(DRIVER_PATHS) {
        assert_eq!(
            num(&fields(&plain, "path=", &format!("path={p} ")), "above"),
            0,
            "{p} without a cap"
        );
    }
    let out = capped(
        &["paths", &below, &above],
        &[("VRAMSHIM_CAP", "1GiB")],
        "cap-paths",
    );
    check_paths(&out, 0);
    let l = our_lines(&out)
        .into_iter()
        .find(|l| l.contains("refused"))
        .unwrap()
        .to_string();
    assert!(
        l.contains("cudaMalloc") && l.contains("1.02 GiB") && l.contains("cap 1 GiB"),
        "{l}"
    );
    // The same with the cap as a fraction of the 16 GiB device.
    let out = capped(
        &["paths", &below, &above],
        &[("VRAMSHIM_CAP", "0.0625")],
        "cap-paths-frac",
    );
    check_paths(&out, 0);
    // And through a shared region.
    let shared = unique_name("paths");
    let out = capped(
        &["paths", &below, &above],
        &[("VRAMSHIM_CAP", "1GiB"), ("VRAMSHIM_SHARED", &shared)],
        "cap-paths-shared",
    );
    check_paths(&out, 0);
    let _ = std::fs::remove_file(vramshim_region::spec::shared_path(&shared, uid()).unwrap());
}

#[test]
fn host_memory_is_never_charged() {
    let out = capped(
        &["host", &(2 * GIB).to_string()],
        &[("VRAMSHIM_CAP", "1GiB")],
        "cap-host",
    );
    out.assert_success();
    let f = fields(&out, "host", "");
    assert_eq!(
        (num(&f, "cudaMallocHost"), num(&f, "cuMemCreate_host")),
        (0, 0),
        "{}",
        out.stderr
    );
}

fn info(env: &[(&str, &str)], dev: u32, name: &str) -> Vec<(String, String)> {
    let out = capped(&["info", &dev.to_string()], env, name);
    out.assert_success();
    fields(&out, "info", "")
}

/// The probe's `info` fields that hold the device's total memory, one per query.
const TOTALS: &[&str] = &[
    "cuda_total",
    "cu_total",
    "cu_devtotal",
    "prop_total",
    "nvml_total",
    "nvml2_total",
];

#[test]
fn memory_information_reports_the_cap_everywhere() {
    for cap in ["4GiB", "0.25", "25%"] {
        let f = info(&[("VRAMSHIM_CAP", cap)], 0, "cap-info");
        for k in TOTALS {
            assert_eq!(num(&f, k), 4 * GIB, "{k} with VRAMSHIM_CAP={cap}: {f:?}");
        }
        for k in ["cuda_free", "cu_free", "nvml_free", "nvml2_free"] {
            assert!(num(&f, k) <= 4 * GIB, "{k} within the cap: {f:?}");
        }
        assert_eq!(
            num(&f, "nvml_used") + num(&f, "nvml_free"),
            4 * GIB,
            "{f:?}"
        );
        assert_eq!(
            num(&f, "nvml2_used") + num(&f, "nvml2_free") + num(&f, "nvml2_reserved"),
            4 * GIB,
            "{f:?}"
        );
    }
    // Uncapped: the real numbers.
    let f = info(&[], 0, "cap-info-plain");
    assert_eq!(num(&f, "cuda_total"), 16 * GIB);
}

/// The context's footprint (cuda-sim: VRAMSIM_CONTEXT_OVERHEAD) counts against the cap by
/// default, measured from the driver's per-process accounting; `exclude` opts out.
#[test]
fn context_memory_counts_against_the_cap_unless_excluded() {
    let ctx = 300 * MIB;
    let f = info(
        &[
            ("VRAMSHIM_CAP", "4GiB"),
            ("VRAMSIM_CONTEXT_OVERHEAD", "300MiB"),
        ],
        0,
        "cap-ctx",
    );
    assert_eq!(num(&f, "cuda_free"), 4 * GIB - ctx, "{f:?}");
    assert_eq!(num(&f, "nvml_used"), ctx, "{f:?}");
    // Still counted when the process's device 0 is another physical device (NVML, which
    // ignores CUDA_VISIBLE_DEVICES, numbers it 1).
    let f = info(
        &[
            ("VRAMSHIM_CAP", "4GiB"),
            ("VRAMSIM_CONTEXT_OVERHEAD", "300MiB"),
            ("VRAMSIM_DEVICES", "2"),
            ("CUDA_VISIBLE_DEVICES", "1"),
        ],
        0,
        "cap-ctx-cvd",
    );
    assert_eq!(num(&f, "cuda_free"), 4 * GIB - ctx, "{f:?}");
    let f = info(
        &[
            ("VRAMSHIM_CAP", "4GiB"),
            ("VRAMSIM_CONTEXT_OVERHEAD", "300MiB"),
            ("VRAMSHIM_CAP_CONTEXT", "exclude"),
        ],
        0,
        "cap-ctx-ex",
    );
    assert_eq!(num(&f, "cuda_free"), 4 * GIB, "{f:?}");
    // With the context counted, the whole cap minus the context is what allocations get.
    let env = [
        ("VRAMSHIM_CAP", "1GiB"),
        ("VRAMSIM_CONTEXT_OVERHEAD", "300MiB"),
    ];
    let out = capped(
        &[
            "paths",
            &(GIB - ctx).to_string(),
            &(GIB - ctx + 16 * MIB).to_string(),
        ],
        &env,
        "cap-ctx-paths",
    );
    out.assert_success();
    for p in ["cudaMalloc", "cuMemAlloc", "cuMemCreate"] {
        let f = fields(&out, "path=", &format!("path={p} "));
        assert_eq!((num(&f, "above"), num(&f, "below")), (2, 0), "{p}: {f:?}");
    }
}

/// JAX/XLA preallocate a fraction of the total memory cudaMemGetInfo reports.
#[test]
fn preallocation_sized_from_meminfo_takes_its_share_of_the_cap() {
    let out = capped(
        &["prealloc", "75"],
        &[("VRAMSHIM_CAP", "4GiB")],
        "cap-prealloc",
    );
    out.assert_success();
    let f = fields(&out, "prealloc", "");
    assert_eq!(num(&f, "total"), 4 * GIB);
    assert_eq!(num(&f, "size"), 3 * GIB);
    assert_eq!(num(&f, "rc"), 0);
}

#[test]
fn caps_per_device_on_two_devices() {
    let env = [("VRAMSHIM_CAP", "0=1GiB,1=2GiB"), ("VRAMSIM_DEVICES", "2")];
    assert_eq!(num(&info(&env, 0, "cap-2dev"), "cuda_total"), GIB);
    let f = info(&env, 1, "cap-2dev");
    assert_eq!(num(&f, "cuda_total"), 2 * GIB);
    assert_eq!(num(&f, "nvml_total"), 2 * GIB);
    let out = capped(
        &[
            "paths",
            &GIB.to_string(),
            &(2 * GIB + 16 * MIB).to_string(),
            "1",
        ],
        &env,
        "cap-2dev-paths",
    );
    check_paths(&out, 1);
    // Device 1 uncapped when only device 0 is listed.
    let f = info(
        &[("VRAMSHIM_CAP", "0=1GiB"), ("VRAMSIM_DEVICES", "2")],
        1,
        "cap-2dev-one",
    );
    assert_eq!(num(&f, "cuda_total"), 16 * GIB);
}

/// Each bad value: one clear line naming the variable, then pass-through (the 1 GiB + 16 MiB
/// request that a cap of 1 GiB would refuse is served), never a crash.
#[test]
fn bad_configuration_is_one_line_and_pass_through() {
    let above = (GIB + 16 * MIB).to_string();
    let below = (512 * MIB).to_string();
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[("VRAMSHIM_CAP", "1.5")], "VRAMSHIM_CAP=\"1.5\""),
        (&[("VRAMSHIM_CAP", "-1")], "VRAMSHIM_CAP=\"-1\""),
        (&[("VRAMSHIM_CAP", "abc")], "VRAMSHIM_CAP=\"abc\""),
        (&[("VRAMSHIM_CAP", "0=")], "VRAMSHIM_CAP=\"0=\""),
        (&[("VRAMSHIM_CAP", "0=1GiB,3=1GiB")], "names device 3"),
    ];
    for (env, needle) in cases {
        let out = capped(&["paths", &below, &above], env, "cap-bad");
        out.assert_success();
        let lines = our_lines(&out);
        assert_eq!(lines.len(), 1, "{env:?}: exactly one line:\n{}", out.stderr);
        assert!(
            lines[0].contains(needle) && lines[0].contains("pass-through"),
            "{env:?}: {}",
            lines[0]
        );
        for p in RUNTIME_PATHS.iter().chain(DRIVER_PATHS) {
            assert_eq!(
                num(&fields(&out, "path=", &format!("path={p} ")), "above"),
                0,
                "{env:?} {p}: pass-through"
            );
        }
    }
}

/// A `VRAMSHIM_SHARED` that names no region is a group cap that cannot be kept: it fails
/// closed as an unusable region does. One line names the value, why and the accepted forms;
/// the process keeps its own cap (from `VRAMSHIM_CAP` or another tool's limit), or with
/// `VRAMSHIM_CAP_STRICT=1` is refused everything; without a cap of its own it runs without
/// one, said in the same line. (`VRAMSHIM_CAP_FAULT=squat-pass-through` makes it pass-through.)
#[test]
fn a_bad_shared_name_fails_closed() {
    let above = (GIB + 16 * MIB).to_string();
    let below = (512 * MIB).to_string();
    let args = ["paths", below.as_str(), above.as_str()];
    let forms = "accepted: a name of 1 to 64 letters, digits";
    let long = "x".repeat(65);
    let bad = "VRAMSHIM_SHARED=\"bad/name\": not a valid name";
    // (variables, (below, above) answers on every path, what the one line says)
    type Case<'a> = (&'a [(&'a str, &'a str)], (u64, u64), &'a [&'a str]);
    let cases: &[Case] = &[
        (
            &[("VRAMSHIM_CAP", "1GiB"), ("VRAMSHIM_SHARED", "bad/name")],
            (0, 2),
            &[bad, "keeps its own cap VRAMSHIM_CAP=\"1GiB\""],
        ),
        (
            &[
                ("GPU_MEMORY_LIMIT", "1GiB"),
                ("VRAMSHIM_SHARED", "bad/name"),
            ],
            (0, 2),
            &[bad, "keeps its own cap GPU_MEMORY_LIMIT=\"1GiB\""],
        ),
        // Strict: nothing at all is served.
        (
            &[
                ("VRAMSHIM_CAP", "1GiB"),
                ("VRAMSHIM_SHARED", "bad/name"),
                ("VRAMSHIM_CAP_STRICT", "1"),
            ],
            (2, 2),
            &[bad, "VRAMSHIM_CAP_STRICT=1: every device allocation"],
        ),
        // No cap of its own: nothing to keep, and the line says so.
        (
            &[("VRAMSHIM_SHARED", long.as_str())],
            (0, 0),
            &["longer than 64", "no VRAMSHIM_CAP of its own to keep"],
        ),
    ];
    for (env, answers, says) in cases {
        let out = capped(&args, env, "cap-bad-shared");
        out.assert_success();
        for p in RUNTIME_PATHS.iter().chain(DRIVER_PATHS) {
            let f = fields(&out, "path=", &format!("path={p} "));
            let got = (num(&f, "below"), num(&f, "above"));
            assert_eq!(got, *answers, "{env:?} {p}: {f:?}");
        }
        let lines: Vec<_> = our_lines(&out)
            .into_iter()
            .filter(|l| l.contains("VRAMSHIM_SHARED="))
            .collect();
        assert_eq!(lines.len(), 1, "{env:?}: one line:\n{}", out.stderr);
        assert!(
            lines[0].contains(forms) && says.iter().all(|n| lines[0].contains(n)),
            "{env:?}: {}",
            lines[0]
        );
    }
}

/// A region file that is corrupt, from another version, or not ours is refused, not trusted,
/// and the job stays capped (its own cap).
#[test]
fn corrupt_or_foreign_region_is_refused() {
    let above = (GIB + 16 * MIB).to_string();
    let dir = vramshim_testkit::temp_dir("cap-corrupt");
    let bad = dir.join("garbage");
    std::fs::write(&bad, vec![0x5au8; 64 << 10]).unwrap();
    std::fs::set_permissions(&bad, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let open = dir.join("open");
    Region::open_or_create(&open, &vramshim_region::spec::parse_cap("1GiB").unwrap()).unwrap();
    std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
    let unwritable = PathBuf::from("/proc/vramshim-nope/region");
    for (path, needle) in [
        (&bad, "not usable"),
        (&open, "readable or writable by others"),
        (&unwritable, "cannot create it"),
    ] {
        let p = path.display().to_string();
        let out = capped(
            &["paths", "1", &above],
            &[("VRAMSHIM_CAP", "1GiB"), ("VRAMSHIM_SHARED", &p)],
            "cap-corrupt",
        );
        out.assert_success();
        let lines = our_lines(&out);
        assert_eq!(
            lines.len(),
            2,
            "the region's line, the first refusal's: {}",
            out.stderr
        );
        assert!(lines[1].contains("refused"), "{}", lines[1]);
        assert!(
            lines[0].contains(needle) && lines[0].contains("keeps its own cap"),
            "{}",
            lines[0]
        );
        assert_eq!(num(&fields(&out, "path=", "path=cudaMalloc "), "above"), 2);
        assert_eq!(num(&fields(&out, "path=", "path=cudaMalloc "), "below"), 0);
    }
}

/// A member whose own cap is smaller than its group's keeps it, said in one line: every path
/// is refused above its own cap although the group has room, the refusal names its own cap,
/// and every memory query reports its own cap as the total.
#[test]
fn a_members_smaller_own_cap_binds() {
    let dir = vramshim_testkit::temp_dir("cap-member");
    let region = dir.join("group");
    Region::open_or_create(&region, &vramshim_region::spec::parse_cap("4GiB").unwrap()).unwrap();
    let p = region.display().to_string();
    let env = [("VRAMSHIM_CAP", "1GiB"), ("VRAMSHIM_SHARED", p.as_str())];
    let above = (GIB + 16 * MIB).to_string();
    let below = (512 * MIB).to_string();
    let out = capped(&["paths", &below, &above], &env, "cap-member");
    check_paths(&out, 0);
    let lines = our_lines(&out);
    let said: Vec<_> = lines.iter().filter(|l| l.contains("differs")).collect();
    assert_eq!(said.len(), 1, "{}", out.stderr);
    assert!(
        said[0].contains("VRAMSHIM_CAP=\"1GiB\" differs from the cap of the shared region")
            && said[0].contains("both apply and the stricter binds"),
        "{}",
        said[0]
    );
    let refusal = lines.iter().find(|l| l.contains("refused")).unwrap();
    assert!(
        refusal.contains("cap 1 GiB (set by VRAMSHIM_CAP=\"1GiB\", this process's own cap"),
        "{refusal}"
    );
    let f = info(&env, 0, "cap-member-info");
    for k in TOTALS {
        assert_eq!(num(&f, k), GIB, "{k}: {f:?}");
    }
}

// ------------------------------------------------------------------ fail closed

/// The squats another user (or a careless admin) can plant at a region's name.
#[derive(Clone, Copy, Debug)]
enum Squat {
    /// A regular file owned by another user (by the test's user when the job runs as
    /// `nobody`; by `nobody` when it runs as root).
    Foreign,
    Fifo,
    Symlink,
    Directory,
    /// A regular file of the job's own user, mode 0600, with garbage in it.
    Corrupt,
}

const SQUATS: [Squat; 5] = [
    Squat::Foreign,
    Squat::Fifo,
    Squat::Symlink,
    Squat::Directory,
    Squat::Corrupt,
];

const NOBODY: u32 = 65534;

fn chown(path: &Path, uid: u32) {
    let st = Command::new("chown")
        .args(["-h", &format!("{uid}:{uid}")])
        .arg(path)
        .status()
        .expect("chown");
    assert!(st.success(), "chown {}", path.display());
}

/// Plants `squat` at the region path of `name` for a job run by `job_uid`; returns the path.
fn plant(squat: Squat, name: &str, job_uid: u32) -> PathBuf {
    let path = vramshim_region::spec::shared_path(name, job_uid).unwrap();
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_dir(&path);
    match squat {
        Squat::Foreign => {
            std::fs::write(&path, vec![0u8; 4096]).unwrap();
            let other = if job_uid == NOBODY { 0 } else { NOBODY };
            if job_uid == NOBODY || uid() == 0 {
                chown(&path, other);
            }
        }
        Squat::Fifo => {
            let st = Command::new("mkfifo").arg(&path).status().unwrap();
            assert!(st.success());
        }
        Squat::Symlink => {
            // Dangling, and pointing at a file it would be harmful to write through.
            std::os::unix::fs::symlink("/etc/vramshim-squat-target", &path).unwrap();
        }
        Squat::Directory => std::fs::create_dir(&path).unwrap(),
        Squat::Corrupt => {
            std::fs::write(&path, vec![0x5au8; vramshim_region::LAYOUT_SIZE]).unwrap();
            if job_uid != uid() {
                chown(&path, job_uid);
            }
        }
    }
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .or_else(|e| {
            if matches!(squat, Squat::Symlink) {
                Ok(())
            } else {
                Err(e)
            }
        })
        .unwrap();
    path
}

fn unplant(path: &Path) {
    let _ = std::fs::remove_file(path);
    let _ = std::fs::remove_dir(path);
}

/// The probe's `paths` run with a cap of 1 GiB shared by `name`, as `nobody` when asked
/// (through setpriv; only possible as root).
fn paths_as(as_nobody: bool, env: &[(&str, &str)], tag: &str) -> RunOutput {
    let sim = unique_name(tag);
    let above = (GIB + 16 * MIB).to_string();
    let below = (512 * MIB).to_string();
    let mut c = if as_nobody {
        let mut c = sim_command("setpriv", tag);
        c.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
            .arg(probe());
        c
    } else {
        sim_command(probe(), tag)
    };
    c.env("VRAMSIM_NAME", &sim)
        .env("LD_PRELOAD", lib())
        .args(["paths", &below, &above]);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = run(&mut c);
    let dev_uid = if as_nobody { NOBODY } else { uid() };
    let dev = format!("/dev/shm/vramsim-{dev_uid}-{sim}");
    let _ = std::fs::remove_file(dev);
    out
}

/// The users a squat test runs the job as: the test's own, and `nobody` when root.
fn job_users() -> Vec<bool> {
    if uid() == 0 && Path::new("/usr/bin/setpriv").exists() {
        vec![false, true]
    } else {
        vec![false]
    }
}

/// Every kind of squat at the region's name, for a job run as root and as an unprivileged
/// user: the job stays capped (its own cap, one line), strict mode refuses everything, and
/// nothing is followed or blocked on (a FIFO would hang an open without O_NONBLOCK).
#[test]
fn a_squatted_region_never_leaves_the_job_uncapped() {
    for as_nobody in job_users() {
        let job_uid = if as_nobody { NOBODY } else { uid() };
        for squat in SQUATS {
            if matches!(squat, Squat::Foreign) && job_uid == uid() && uid() != 0 {
                continue; // an unprivileged test cannot make a file of another user
            }
            let name = unique_name("squat");
            let path = plant(squat, &name, job_uid);
            let env = [("VRAMSHIM_CAP", "1GiB"), ("VRAMSHIM_SHARED", name.as_str())];
            let out = paths_as(as_nobody, &env, "cap-squat");
            let what = format!("{squat:?} as uid {job_uid}");
            out.assert_success();
            let lines = our_lines(&out);
            assert_eq!(
                lines.len(),
                2,
                "{what}: the region's line, the refusal's\n{}",
                out.stderr
            );
            assert!(
                lines[0].contains("keeps its own cap"),
                "{what}: {}",
                lines[0]
            );
            for p in RUNTIME_PATHS.iter().chain(DRIVER_PATHS) {
                let f = fields(&out, "path=", &format!("path={p} "));
                assert_eq!(
                    (num(&f, "above"), num(&f, "below")),
                    (2, 0),
                    "{what}: {p} capped at 1 GiB: {f:?}"
                );
            }
            // Strict: every allocation refused.
            let mut strict = env.to_vec();
            strict.push(("VRAMSHIM_CAP_STRICT", "1"));
            let out = paths_as(as_nobody, &strict, "cap-squat-strict");
            out.assert_success();
            let f = fields(&out, "path=", "path=cudaMalloc ");
            assert_eq!(
                (num(&f, "above"), num(&f, "below")),
                (2, 2),
                "{what} strict"
            );
            assert!(
                our_lines(&out)[0].contains("VRAMSHIM_CAP_STRICT=1"),
                "{what}"
            );
            // The squat is untouched (nothing written through it).
            assert!(
                std::fs::symlink_metadata(&path).is_ok(),
                "{what}: the squat is still there"
            );
            assert!(!Path::new("/etc/vramshim-squat-target").exists());
            unplant(&path);
        }
    }
}

/// With the protection off (`VRAMSHIM_CAP_FAULT=squat-pass-through`) the same squat lets the
/// job pass its cap: the test above can fail.
#[test]
fn squat_pass_through_fault_escapes_the_cap() {
    let name = unique_name("squat-fault");
    let path = plant(Squat::Fifo, &name, uid());
    let env = [
        ("VRAMSHIM_CAP", "1GiB"),
        ("VRAMSHIM_SHARED", name.as_str()),
        ("VRAMSHIM_CAP_FAULT", "squat-pass-through"),
    ];
    let out = paths_as(false, &env, "cap-squat-fault");
    unplant(&path);
    out.assert_success();
    let f = fields(&out, "path=", "path=cudaMalloc ");
    assert_eq!(num(&f, "above"), 0, "uncapped: {f:?}");
}

/// 33 and more `VRAMSHIM_*` variables before `VRAMSHIM_CAP` (the environment is sorted
/// by name here, so `VRAMSHIM_A*` come first) cannot hide the cap; with a fixed table of
/// 32 (`VRAMSHIM_ENV_FAULT=first-32`) they do.
#[test]
fn no_number_of_variables_hides_the_cap() {
    let names: Vec<String> = (0..40).map(|i| format!("VRAMSHIM_A{i:03}")).collect();
    let mut env: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "x")).collect();
    env.push(("VRAMSHIM_CAP", "1GiB"));
    let out = capped(
        &[
            "paths",
            &(512 * MIB).to_string(),
            &(GIB + 16 * MIB).to_string(),
        ],
        &env,
        "cap-many-vars",
    );
    out.assert_success();
    let f = fields(&out, "path=", "path=cudaMalloc ");
    assert_eq!(
        (num(&f, "above"), num(&f, "below")),
        (2, 0),
        "capped: {f:?}"
    );
    env.push(("VRAMSHIM_ENV_FAULT", "first-32"));
    let out = capped(
        &[
            "paths",
            &(512 * MIB).to_string(),
            &(GIB + 16 * MIB).to_string(),
        ],
        &env,
        "cap-many-vars-fault",
    );
    out.assert_success();
    let f = fields(&out, "path=", "path=cudaMalloc ");
    assert_eq!(num(&f, "above"), 0, "the fault hides the cap: {f:?}");
}

/// 300 members of one group (forks of one probe, each holding 4 MiB) under a 1 GiB shared
/// cap: 256 get slots; the rest are refused instead of running uncapped, so the device
/// never holds more than the cap. With `VRAMSHIM_CAP_FAULT=slots-uncapped` it does.
#[test]
fn three_hundred_members_never_pass_the_group_cap() {
    for (fault, escapes) in [(None, false), (Some("slots-uncapped"), true)] {
        let g = Group::new("forks", GIB);
        // Allocations only: a context measured from the device's free memory (where the
        // driver does not list the process, as here with no context overhead) would count
        // the other members' allocations too.
        let mut extra = vec![("VRAMSHIM_CAP_CONTEXT", "exclude")];
        if let Some(f) = fault {
            extra.push(("VRAMSHIM_CAP_FAULT", f));
        }
        let out = run(&mut g.command(&["forks", "300", &(4 * MIB).to_string()], &extra));
        out.assert_success();
        let f = fields(&out, "forks", "");
        let hw = g.device().high_water(0);
        assert_eq!(num(&f, "other"), 0, "{f:?}\n{}", out.stderr);
        if escapes {
            assert!(hw > g.cap, "the fault lets the group pass its cap: {hw}");
        } else {
            assert!(hw <= g.cap, "device high water {hw} > cap {}", g.cap);
            let slot_lines = out
                .stderr
                .lines()
                .filter(|l| l.contains("no free process slot"))
                .count();
            // The 44 members past the 256 slots are refused, one line each; the others are
            // served (256 x 4 MiB = the cap).
            assert_eq!(slot_lines, 44, "one line per member past the slots");
            assert_eq!((num(&f, "ok"), num(&f, "refused")), (256, 44), "{f:?}");
        }
        assert_eq!(g.region_in_use(), 0);
        assert_eq!(g.device().used(0), 0);
    }
}

/// Allocations of every size class under a 16 MiB cap: the simulated device's own
/// high-water mark never passes the cap (the cap charges the device's footprint: packed
/// pages once, 2 MiB pages above 1 MiB), and cudaMemGetInfo agrees with the device. With
/// `VRAMSHIM_CAP_FAULT=requested-bytes` (requested sizes charged) it does pass.
#[test]
fn every_size_class_stays_within_the_cap_on_the_device() {
    let cap = 16 * MIB;
    // (size, device footprint of N allocations)
    type Footprint = fn(u64) -> u64;
    let classes: [(u64, Footprint); 6] = [
        (1024, |n| n.div_ceil(2048) * 2 * MIB),
        (MIB, |n| n.div_ceil(2) * 2 * MIB),
        (MIB + 1, |n| n * 2 * MIB),
        (2 * MIB - 1, |n| n * 2 * MIB),
        (2 * MIB, |n| n * 2 * MIB),
        (3 * MIB, |n| n * 4 * MIB),
    ];
    for (size, fp) in classes {
        for fault in [None, Some("requested-bytes")] {
            let sim = unique_name("cap-class");
            let mut c = sim_command(probe(), "cap-class");
            c.env("VRAMSIM_NAME", &sim)
                .env("VRAMSIM_CONTEXT_OVERHEAD", "0")
                .env("LD_PRELOAD", lib())
                .env("VRAMSHIM_CAP", cap.to_string())
                .args(["fill", &size.to_string(), "20000"]);
            if let Some(f) = fault {
                c.env("VRAMSHIM_CAP_FAULT", f);
            }
            let out = run(&mut c);
            let dev = vramsim_devstate::DeviceState::open(&sim).unwrap();
            let hw = dev.high_water(0);
            let used = dev.used(0);
            drop(dev);
            let _ = std::fs::remove_file(vramsim_devstate::DeviceState::path(&sim));
            out.assert_success();
            let f = fields(&out, "fill", "");
            let ok = num(&f, "ok");
            assert_eq!(used, 0, "size {size}: the device is empty after");
            if fault.is_some() {
                if fp(cap / size) > cap {
                    assert!(hw > cap, "size {size}: requested bytes pass the cap: {hw}");
                }
                continue;
            }
            assert_eq!(num(&f, "refused"), 1, "size {size}: {f:?}");
            assert!(hw <= cap, "size {size}: device high water {hw} > cap {cap}");
            assert_eq!(hw, fp(ok), "size {size}: {ok} allocations");
            assert!(
                fp(ok) + 2 * MIB > cap || size > MIB,
                "size {size}: the cap is used"
            );
            assert_eq!(num(&f, "free"), cap - fp(ok), "size {size}: cudaMemGetInfo");
        }
    }
}

/// The simulated device's accounting is exact across SIGKILLs, even of a process killed in
/// the middle of an update (`VRAMSIM_DEVSTATE_FAULT=pause` holds every update open for 2 ms):
/// with every process gone it reads zero. Without the repair (`no-repair`) it leaks.
#[test]
fn the_simulated_device_recovers_killed_processes_exactly() {
    for (fault, exact) in [("pause", true), ("pause,no-repair", false)] {
        let sim = unique_name("devstate-kill");
        let mut leaked = 0;
        for _ in 0..4 {
            let mut c = sim_command(probe(), "devstate-kill");
            c.env("VRAMSIM_NAME", &sim)
                .env("VRAMSIM_CONTEXT_OVERHEAD", "0")
                .env("VRAMSIM_DEVSTATE_FAULT", fault)
                .args(["hammer", "30", "4", &(8 * MIB).to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            let mut child = c.spawn().unwrap();
            std::thread::sleep(Duration::from_millis(400));
            kill(&mut child);
            // The next process to take the device's lock (this one, with the same switch)
            // finds its holder dead and repairs the totals (or, with no-repair, does not).
            let mut next = sim_command(probe(), "devstate-kill");
            next.env("VRAMSIM_NAME", &sim)
                .env("VRAMSIM_CONTEXT_OVERHEAD", "0")
                .env("VRAMSIM_DEVSTATE_FAULT", fault)
                .args(["fill", &(2 * MIB).to_string(), "1"]);
            run(&mut next).assert_success();
            let dev = vramsim_devstate::DeviceState::open(&sim).unwrap();
            leaked = dev.used(0);
            if leaked != 0 {
                break;
            }
        }
        let _ = std::fs::remove_file(vramsim_devstate::DeviceState::path(&sim));
        if exact {
            assert_eq!(leaked, 0, "bytes left with no process alive");
        } else {
            assert!(leaked > 0, "without the repair a kill mid-update leaks");
        }
    }
}

/// SIGKILL loops of group members with the context counted (`include`, 64 MiB each) and not
/// (`exclude`): the region's own peak never passes the cap (the context charge is checked),
/// and with every member gone both the region and the simulated device read zero.
/// `VRAMSHIM_CAP_FAULT=unchecked-context` lets the region pass the cap.
#[test]
fn sigkill_loops_never_pass_the_cap_with_or_without_context() {
    for (mode, fault) in [
        ("include", None),
        ("exclude", None),
        ("include", Some("unchecked-context")),
    ] {
        let g = Group::new("kill-ctx", 256 * MIB);
        let mut extra = vec![
            ("VRAMSHIM_CAP_CONTEXT", mode),
            ("VRAMSIM_CONTEXT_OVERHEAD", "64MiB"),
        ];
        if let Some(f) = fault {
            extra.push(("VRAMSHIM_CAP_FAULT", f));
        }
        let mut peak = 0;
        for _round in 0..3 {
            // Holders fill the cap, then more members start (each with a 64 MiB context)
            // and everyone is killed.
            let mut v = holders(&g, 3, &extra);
            let late = holders(&g, 2, &extra);
            v.extend(late);
            for c in &mut v {
                kill(c);
            }
            let r = Region::open(&g.region).unwrap();
            peak = peak.max(r.snapshot().peaks[0]);
        }
        let in_use = g.region_in_use();
        let dev = g.device();
        let used = dev.used(0);
        if fault.is_some() {
            assert!(peak > g.cap, "the unchecked context passes the cap: {peak}");
            continue;
        }
        assert!(peak <= g.cap, "{mode}: region peak {peak} > cap {}", g.cap);
        assert_eq!(in_use, 0, "{mode}: the region reads zero");
        assert_eq!(used, 0, "{mode}: the device reads zero");
        if mode == "exclude" {
            assert!(
                dev.high_water(0) <= g.cap + 5 * 64 * MIB,
                "{mode}: allocations within the cap"
            );
        }
    }
}

// ------------------------------------------------------------------ concurrency (shared cap)

fn uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(0)
}

fn hammer_secs() -> f64 {
    std::env::var("VRAMSHIM_TEST_HAMMER_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0)
}

struct Group {
    sim: String,
    shared: String,
    region: PathBuf,
    cap: u64,
}

impl Group {
    fn new(tag: &str, cap: u64) -> Group {
        let shared = unique_name(tag);
        let region = vramshim_region::spec::shared_path(&shared, uid()).unwrap();
        Group {
            sim: unique_name(tag),
            shared,
            region,
            cap,
        }
    }

    fn command(&self, args: &[&str], extra: &[(&str, &str)]) -> Command {
        let mut c = sim_command(probe(), "unused");
        c.env("VRAMSIM_NAME", &self.sim)
            .env("VRAMSIM_CONTEXT_OVERHEAD", "0")
            .env("LD_PRELOAD", lib())
            .env("VRAMSHIM_CAP", self.cap.to_string())
            .env("VRAMSHIM_SHARED", &self.shared)
            .args(args);
        for (k, v) in extra {
            c.env(k, v);
        }
        c
    }

    fn spawn(&self, args: &[&str], extra: &[(&str, &str)]) -> Child {
        self.command(args, extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn cap_probe")
    }

    fn device(&self) -> vramsim_devstate::DeviceState {
        vramsim_devstate::DeviceState::open(&self.sim).expect("simulated device region")
    }

    /// Reclaims dead slots as any process of the group would, then the bytes charged.
    fn region_in_use(&self) -> u64 {
        let r = Region::open(&self.region).expect("region");
        for _ in 0..100 {
            if r.reclaim(ProcessKey::current().unwrap()).pending_recount == 0 {
                break;
            }
        }
        r.in_use(0)
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.region);
        let _ = std::fs::remove_file(vramsim_devstate::DeviceState::path(&self.sim));
    }
}

/// Waits for every child with a deadline (a deadlock fails the test instead of hanging it).
fn wait_all(children: Vec<Child>, deadline: Duration) -> Vec<RunOutput> {
    let end = Instant::now() + deadline;
    children
        .into_iter()
        .map(|mut c| {
            loop {
                if c.try_wait().expect("wait").is_some() {
                    break;
                }
                if Instant::now() > end {
                    let _ = c.kill();
                    panic!("a capped process did not finish in {deadline:?}: deadlock?");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let o = c.wait_with_output().expect("output");
            RunOutput {
                status: o.status,
                stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
            }
        })
        .collect()
}

fn hammer_run(g: &Group, procs: usize, secs: f64, extra: &[(&str, &str)]) -> (u64, u64) {
    let s = format!("{secs}");
    let max = (g.cap / 8).to_string();
    let children: Vec<Child> = (0..procs)
        .map(|_| g.spawn(&["hammer", &s, "8", &max], extra))
        .collect();
    let outs = wait_all(children, Duration::from_secs_f64(secs + 120.0));
    let (mut ok, mut refused) = (0, 0);
    for o in &outs {
        o.assert_success();
        let f = fields(o, "hammer", "");
        assert_eq!(
            num(&f, "other"),
            0,
            "only successes and out-of-memory: {f:?}\n{}",
            o.stderr
        );
        ok += num(&f, "ok");
        refused += num(&f, "refused");
    }
    (ok, refused)
}

/// 8 processes x 8 threads under one shared cap: the simulated device never holds more than
/// the cap at any moment (its high-water mark), nothing deadlocks, the region ends at zero.
#[test]
fn eight_processes_never_pass_a_shared_cap() {
    let g = Group::new("hammer", 256 * MIB);
    let (ok, refused) = hammer_run(&g, 8, hammer_secs(), &[]);
    assert!(
        ok > 0 && refused > 0,
        "the run must reach the cap: ok={ok} refused={refused}"
    );
    let dev = g.device();
    assert!(
        dev.high_water(0) <= g.cap,
        "device high water {} > cap {}",
        dev.high_water(0),
        g.cap
    );
    assert_eq!(g.region_in_use(), 0, "the region reads zero after all exit");
    assert_eq!(dev.used(0), 0);
}

/// The same test catches a broken reservation (load/check/store instead of CAS).
#[test]
fn the_shared_hammer_catches_a_racy_reservation() {
    let mut caught = false;
    for _ in 0..3 {
        let g = Group::new("hammer-racy", 256 * MIB);
        hammer_run(
            &g,
            8,
            hammer_secs().min(2.0),
            &[("VRAMSHIM_CAP_FAULT", "racy-charge")],
        );
        if g.device().high_water(0) > g.cap {
            caught = true;
            break;
        }
    }
    assert!(
        caught,
        "a racy reservation was never caught passing the cap"
    );
}

/// Starts `n` processes that hammer for a second, then hold what they have and sleep, and
/// returns them once each has reported (so they are holding memory).
fn holders(g: &Group, n: usize, extra: &[(&str, &str)]) -> Vec<Child> {
    let max = (g.cap / 8).to_string();
    let mut v: Vec<Child> = (0..n)
        .map(|_| g.spawn(&["hammer", "1", "4", &max, "600"], extra))
        .collect();
    for c in &mut v {
        let mut line = String::new();
        BufReader::new(c.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.starts_with("hammer"), "holder said {line:?}");
    }
    v
}

fn kill(c: &mut Child) {
    c.kill().unwrap();
    c.wait().unwrap();
}

/// Processes SIGKILLed while holding memory give their share back: the survivors keep
/// hammering, the region reads zero at the end, and a newcomer gets the whole cap.
#[test]
fn sigkilled_processes_give_their_share_back() {
    let g = Group::new("hammer-kill", 256 * MIB);
    let mut held = holders(&g, 2, &[]);
    let r = Region::open(&g.region).unwrap();
    let snap = r.snapshot();
    let held_bytes: u64 = held
        .iter()
        .map(|c| {
            snap.processes
                .iter()
                .filter(|p| p.pid == c.id())
                .map(|p| p.used[0])
                .sum::<u64>()
        })
        .sum();
    assert!(held_bytes > 0, "holders hold memory: {snap:?}");
    let secs = hammer_secs();
    let s = format!("{secs}");
    let max = (g.cap / 8).to_string();
    let survivors: Vec<Child> = (0..6)
        .map(|_| g.spawn(&["hammer", &s, "8", &max], &[]))
        .collect();
    // Two more hammer and are killed in the middle of it (possibly between a reservation and
    // its slot update: the recount path).
    let mut victims: Vec<Child> = (0..2)
        .map(|_| g.spawn(&["hammer", &s, "8", &max], &[]))
        .collect();
    std::thread::sleep(Duration::from_secs_f64(secs / 3.0));
    for c in &mut held {
        kill(c);
    }
    std::thread::sleep(Duration::from_secs_f64(secs / 3.0));
    let victim_pids: Vec<u32> = victims.iter().map(|c| c.id()).collect();
    for c in &mut victims {
        kill(c);
    }
    // What the simulated device still holds for them: it frees a dead process's memory only
    // when it notices (a real driver frees it when the process dies).
    let dev = g.device();
    let killed_bytes: u64 = dev
        .processes()
        .iter()
        .filter(|p| victim_pids.contains(&p.pid))
        .map(|p| p.used.first().copied().unwrap_or(0))
        .sum();
    for o in wait_all(survivors, Duration::from_secs_f64(secs + 120.0)) {
        o.assert_success();
    }
    // So the device's high water may include the killed processes' memory once.
    let bound = g.cap + held_bytes + killed_bytes;
    assert!(
        dev.high_water(0) <= bound,
        "high water {} > cap {} + killed {} + {}",
        dev.high_water(0),
        g.cap,
        held_bytes,
        killed_bytes
    );
    assert_eq!(g.region_in_use(), 0, "the region reads zero after all exit");
    let out = run(&mut g.command(&["prealloc", "100"], &[]));
    out.assert_success();
    assert_eq!(
        num(&fields(&out, "prealloc", ""), "rc"),
        0,
        "a newcomer gets the whole cap:\n{}",
        out.stderr
    );
}

/// With reclaim disabled (test-only switch), a killed holder's share is lost: the newcomer
/// cannot have the whole cap. The test above would fail.
#[test]
fn without_reclaim_a_killed_share_is_lost() {
    let g = Group::new("hammer-noreclaim", 256 * MIB);
    let mut held = holders(&g, 1, &[]);
    for c in &mut held {
        kill(c);
    }
    let broken = run(&mut g.command(
        &["prealloc", "100"],
        &[("VRAMSHIM_CAP_FAULT", "no-reclaim")],
    ));
    broken.assert_success();
    assert_eq!(
        num(&fields(&broken, "prealloc", ""), "rc"),
        2,
        "{}",
        broken.stderr
    );
    let fixed = run(&mut g.command(&["prealloc", "100"], &[]));
    assert_eq!(
        num(&fields(&fixed, "prealloc", ""), "rc"),
        0,
        "{}",
        fixed.stderr
    );
}

/// What a group sharing a 1 GiB cap on a two-device machine does when its members see the
/// devices through different `CUDA_VISIBLE_DEVICES` (as launchers that give each rank "its"
/// GPU do): A (`1`) holds 768 MiB on its device 0 = physical 1. B (`0`) asks 768 MiB on its
/// device 0 = physical 0, where nobody holds anything. C (`0,1`) asks 512 MiB on its device
/// 1 = physical 1, where A's 768 MiB already are. Returns (B's code, C's code, what physical
/// device 1 holds while C runs).
fn visible_devices_group(extra: &[(&str, &str)]) -> (i32, i32, u64) {
    let g = Group::new("cvd", 1 << 30);
    let env = |cvd: &'static str| {
        let mut v: Vec<(&str, &str)> =
            vec![("VRAMSIM_DEVICES", "2"), ("CUDA_VISIBLE_DEVICES", cvd)];
        v.extend_from_slice(extra);
        v
    };
    let mut a = g.spawn(&["hold", &(768 * MIB).to_string(), "600"], &env("1"));
    let mut line = String::new();
    BufReader::new(a.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "hold rc=0", "A holds its 768 MiB");
    let rc = |out: &RunOutput| -> i32 {
        out.stdout
            .lines()
            .find_map(|l| l.strip_prefix("hold rc="))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{}\n{}", out.stdout, out.stderr))
    };
    let b = run(&mut g.command(&["hold", &(768 * MIB).to_string(), "0"], &env("0")));
    let dev = g.device();
    let c = g.command(&["hold", &(512 * MIB).to_string(), "2", "1"], &env("0,1"));
    let c = std::thread::scope(|s| {
        let h = s.spawn(|| {
            let mut c = c;
            run(&mut c)
        });
        let mut most = 0;
        while !h.is_finished() {
            most = most.max(dev.used(1));
            std::thread::sleep(Duration::from_millis(5));
        }
        (h.join().unwrap(), most)
    });
    kill(&mut a);
    (rc(&b), rc(&c.0), c.1)
}

/// The shared budget is per physical device: members that number the devices differently
/// still charge each device's own budget (region lines are keyed by the device's UUID).
#[test]
fn group_members_with_different_visible_devices_share_per_physical_device() {
    let (b, c, held) = visible_devices_group(&[]);
    assert_eq!(b, 0, "physical device 0 is free: B is served");
    assert_eq!(
        c, 2,
        "physical device 1 holds A's 768 MiB: C's 512 MiB pass the 1 GiB cap"
    );
    assert!(
        held <= 1 << 30,
        "physical device 1 held {held} bytes under a 1 GiB cap"
    );
}

/// Keyed by ordinal (the region layout before version 2; `VRAMSHIM_CAP_FAULT=ordinal-lines`)
/// the same group refuses B and lets C pass the cap: the test above can fail.
#[test]
fn ordinal_keyed_lines_charge_the_wrong_device() {
    let (b, c, held) = visible_devices_group(&[("VRAMSHIM_CAP_FAULT", "ordinal-lines")]);
    assert_eq!(b, 2, "B is charged against A's device");
    assert_eq!(c, 0, "C's request is counted on an empty line");
    assert!(
        held > 1 << 30,
        "physical device 1 went past the cap: {held}"
    );
}

/// `vramshim top --once --json` shows the processes sharing a region, their use and the cap.
#[test]
fn top_shows_the_group() {
    let vramshim = vramshim_testkit::vramshim_exe();
    let g = Group::new("top", 256 * MIB);
    let mut held = holders(&g, 2, &[]);
    let pids: Vec<u32> = held.iter().map(|c| c.id()).collect();
    let out = run(Command::new(&vramshim).args(["top", "--once", "--json", "--name", &g.shared]));
    out.assert_success();
    for p in &pids {
        assert!(
            out.stdout.contains(&format!("\"pid\": {p}")),
            "{}",
            out.stdout
        );
    }
    assert!(
        out.stdout.contains(&format!("\"cap\": \"{}\"", g.cap)),
        "{}",
        out.stdout
    );
    let text = run(Command::new(&vramshim).args(["top", "--once", "--name", &g.shared]));
    assert!(
        text.stdout.contains("cap_probe") && text.stdout.contains("256 MiB"),
        "{}",
        text.stdout
    );
    for c in &mut held {
        kill(c);
    }
    let out = run(Command::new(&vramshim).args(["top", "--once", "--json", "--name", &g.shared]));
    assert!(
        out.stdout.contains("\"processes\": []"),
        "looking reclaims the dead: {}",
        out.stdout
    );
    assert_eq!(g.region_in_use(), 0);
    let _ = Path::new(&g.region);
}

/// Every `VRAMSHIM_*` value that is not understood gets one line naming the variable and
/// the accepted forms: a `VRAMSHIM_CAP` or `VRAMSHIM_SHARED` that is not UTF-8 (never read
/// as unset), a share that rounds to 0 bytes (everything refused, never silently), and the
/// tracer's switches.
#[test]
fn values_not_understood_get_one_line_each() {
    use std::os::unix::ffi::OsStrExt;
    let bad = std::ffi::OsStr::from_bytes(b"1G\xffiB");
    for var in ["VRAMSHIM_CAP", "VRAMSHIM_SHARED"] {
        let sim = unique_name("cap-utf8");
        let mut c = sim_command(probe(), "cap-utf8");
        c.env("VRAMSIM_NAME", &sim)
            .env("LD_PRELOAD", lib())
            .env("VRAMSHIM_CAP", "1GiB")
            .env(var, bad)
            .args(["info", "0"]);
        let out = run(&mut c);
        let _ = std::fs::remove_file(vramsim_devstate::DeviceState::path(&sim));
        out.assert_success();
        let lines = our_lines(&out);
        assert_eq!(lines.len(), 1, "{var}: {}", out.stderr);
        assert!(
            lines[0].contains(&format!("{var}=")) && lines[0].contains("accepted"),
            "{var}: {}",
            lines[0]
        );
    }
    let out = capped(
        &["paths", "1", "2"],
        &[("VRAMSHIM_CAP", "0.000000000001")],
        "cap-tiny",
    );
    out.assert_success();
    assert!(
        our_lines(&out)
            .iter()
            .any(|l| l.contains("is 0 bytes of device 0") && l.contains("refused")),
        "{}",
        out.stderr
    );
    assert_eq!(num(&fields(&out, "path=", "path=cudaMalloc "), "below"), 2);
    let dir = vramshim_testkit::temp_dir("cap-env-trace");
    for (var, val) in [
        ("VRAMSHIM_TRACE_CLOCK", "wallclock"),
        ("VRAMSHIM_TRACE_LOCKS", "yes"),
        ("VRAMSHIM_TRACE_EXIT_FLUSH", "never"),
        ("VRAMSHIM_STACKS", "65"),
        ("VRAMSHIM_STACKS", "lots"),
    ] {
        let trace = dir.join("t.vramtrace");
        let t = trace.display().to_string();
        let out = on_sim(
            &["info", "0"],
            &[("VRAMSHIM_TRACE", t.as_str()), (var, val)],
            Some(&lib()),
            "cap-env-trace",
        );
        let _ = std::fs::remove_file(&trace);
        out.assert_success();
        let lines: Vec<&str> = our_lines(&out)
            .into_iter()
            .filter(|l| l.contains(var))
            .collect();
        assert_eq!(lines.len(), 1, "{var}={val}: {}", out.stderr);
        assert!(lines[0].contains("accepted"), "{var}={val}: {}", lines[0]);
    }
}

/// Stream-ordered allocations come from a driver pool that here keeps every freed block
/// cached (release threshold UINT64_MAX): under a 48 MiB cap, cycles of cudaMallocAsync /
/// cudaFreeAsync of ever-new sizes plus plain cudaMallocs never take the simulated device
/// past the cap (its own high-water mark), and every request, each well under the cap, is
/// served: the cap empties the pools before it would refuse. With
/// `VRAMSHIM_CAP_FAULT=async-uncharge` (a stream-ordered free gives its charge back at once)
/// the cached blocks pass the cap.
#[test]
fn blocks_cached_by_the_driver_pool_stay_within_the_cap() {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    let exe = EXE.get_or_init(|| {
        compile_c(
            "cap_async",
            &["tests/workloads/cap/cap_async.c"],
            Link::SharedRuntime,
        )
    });
    let cap = 48 * MIB;
    for fault in [None, Some("async-uncharge")] {
        let sim = unique_name("cap-async");
        let mut c = sim_command(exe.clone(), "cap-async");
        c.env("VRAMSIM_NAME", &sim)
            .env("VRAMSIM_CONTEXT_OVERHEAD", "0")
            .env("LD_PRELOAD", lib())
            .env("VRAMSHIM_CAP", cap.to_string())
            .arg("40");
        if let Some(f) = fault {
            c.env("VRAMSHIM_CAP_FAULT", f);
        }
        let out = run(&mut c);
        let dev = vramsim_devstate::DeviceState::open(&sim).unwrap();
        let hw = dev.high_water(0);
        drop(dev);
        let _ = std::fs::remove_file(vramsim_devstate::DeviceState::path(&sim));
        out.assert_success();
        let f = fields(&out, "async", "");
        if fault.is_some() {
            assert!(
                hw > cap,
                "async-uncharge: the pool's cache passes the cap: {hw}"
            );
            continue;
        }
        assert_eq!(
            (num(&f, "ok"), num(&f, "refused"), num(&f, "other")),
            (50, 0, 0),
            "{f:?}\n{}",
            out.stderr
        );
        assert!(hw <= cap, "device high water {hw} > cap {cap}");
        assert!(hw > cap / 2, "the cap is used: {hw}");
    }
}

// ------------------------------------------------------------------ the pool's pages

/// `key=value` pairs of one line of the probe's output.
type Fields = Vec<(String, String)>;

/// The probe's `poolmix` under a cap with the pool on: the `info` and `poolmix` lines and the
/// simulated device's high-water mark.
fn poolmix(cap: u64, ctx: u64, fault: Option<&str>) -> (Fields, Fields, u64) {
    let sim = unique_name("cap-poolmix");
    let mut c = sim_command(probe(), "cap-poolmix");
    c.env("VRAMSIM_NAME", &sim)
        .env("VRAMSIM_CONTEXT_OVERHEAD", ctx.to_string())
        .env("LD_PRELOAD", lib())
        .env("VRAMSHIM_CAP", cap.to_string())
        .env("VRAMSHIM_POOL", "stitch")
        .args([
            "poolmix",
            &(40 * MIB).to_string(),
            &(2 * MIB).to_string(),
            "1000",
        ]);
    if let Some(f) = fault {
        c.env("VRAMSHIM_CAP_FAULT", f);
    }
    let out = run(&mut c);
    let dev = vramsim_devstate::DeviceState::open(&sim).unwrap();
    let (hw, used) = (dev.high_water(0), dev.used(0));
    drop(dev);
    let _ = std::fs::remove_file(vramsim_devstate::DeviceState::path(&sim));
    out.assert_success();
    assert_eq!(used, 0, "the device is empty after");
    (fields(&out, "info", ""), fields(&out, "poolmix", ""), hw)
}

/// With the pool on (`VRAMSHIM_POOL=stitch`) the pages the pool holds, cached or live, are
/// charged: 40 MiB of pages the pool keeps cached after a cudaFree, beside allocations the
/// pool does not serve (cuMemAllocPitch), with no context charge and with a 16 MiB one. The
/// simulated device never holds more than the cap; memory queries count the cached pages; the
/// unpooled allocations get the whole cap (the pool gives its cached pages back before the cap
/// refuses); the pooled request after them is refused with the out-of-memory code. With
/// `VRAMSHIM_CAP_FAULT=pool-live-bytes` (pooled requests charged their live bytes, the pages
/// bounded by the process's own capped total only) the device passes the cap.
#[test]
fn the_pools_pages_count_against_the_cap() {
    let cap = 64 * MIB;
    let pooled = 40 * MIB;
    for ctx in [0, 16 * MIB] {
        let (info, f, hw) = poolmix(cap, ctx, None);
        assert!(hw <= cap, "ctx {ctx}: device high water {hw} > cap {cap}");
        assert_eq!(num(&f, "first"), 0, "{f:?}");
        for k in ["cuda_free", "cu_free", "nvml_free", "nvml2_free"] {
            assert_eq!(
                num(&info, k),
                cap - ctx - pooled,
                "ctx {ctx}: {k} counts the pool's cached pages: {info:?}"
            );
        }
        assert_eq!(num(&info, "nvml_used"), ctx + pooled, "{info:?}");
        assert_eq!(
            (num(&f, "ok"), num(&f, "refused"), num(&f, "other")),
            ((cap - ctx) / (2 * MIB), 1, 0),
            "ctx {ctx}: the unpooled allocations fill the cap: {f:?}"
        );
        assert_eq!(hw, cap, "ctx {ctx}");
        assert_eq!(num(&f, "free"), 0);
        assert_eq!(num(&f, "again"), 2, "the cap is full: refused");

        let (_, f, hw) = poolmix(cap, ctx, Some("pool-live-bytes"));
        assert!(
            hw > cap,
            "ctx {ctx}: pool-live-bytes lets the device pass the cap: {hw} ({f:?})"
        );
    }
}

/// Two members of a group, pool on: the first keeps 40 MiB of pages cached by its pool, the
/// second fills the rest of the shared 64 MiB cap with pooled requests. The cached pages count
/// for the group, so the simulated device never holds more than the cap; with
/// `VRAMSHIM_CAP_FAULT=pool-live-bytes` it holds the first member's cache on top of the cap.
#[test]
fn a_members_cached_pool_pages_count_for_the_group() {
    for fault in [None, Some("pool-live-bytes")] {
        let g = Group::new("poolgroup", 64 * MIB);
        let mut extra = vec![("VRAMSHIM_POOL", "stitch")];
        if let Some(f) = fault {
            extra.push(("VRAMSHIM_CAP_FAULT", f));
        }
        let mut a = g.spawn(
            &["poolmix", &(40 * MIB).to_string(), "0", "0", "60"],
            &extra,
        );
        let mut line = String::new();
        let mut r = BufReader::new(a.stdout.take().unwrap());
        while !line.starts_with("poolmix") {
            line.clear();
            assert!(
                r.read_line(&mut line).unwrap() > 0,
                "the first member ended"
            );
        }
        assert!(line.contains("first=0"), "{line}");
        let out = run(&mut g.command(&["fill", &(2 * MIB).to_string(), "1000"], &extra));
        kill(&mut a);
        out.assert_success();
        let f = fields(&out, "fill", "");
        let hw = g.device().high_water(0);
        if fault.is_some() {
            assert!(
                hw > g.cap,
                "the fault lets the group pass its cap: {hw} ({f:?})"
            );
            continue;
        }
        assert!(hw <= g.cap, "device high water {hw} > cap {}", g.cap);
        let refusals: Vec<_> = our_lines(&out)
            .into_iter()
            .filter(|l| l.contains("refused"))
            .collect();
        assert!(
            refusals.len() == 1 && refusals[0].contains("VRAMSHIM_SHARED"),
            "the pool's refusal is the cap's, said once: {refusals:?}"
        );
        assert_eq!(
            (num(&f, "ok"), num(&f, "refused"), num(&f, "other")),
            (12, 1, 0),
            "24 MiB left beside the first member's cached 40 MiB: {f:?}\n{}",
            out.stderr
        );
        assert_eq!(g.region_in_use(), 0);
        assert_eq!(g.device().used(0), 0);
    }
}

// ------------------------------------------------------------------ a line left mid-claim

/// A member SIGKILLed between claiming a device line of the shared region and publishing it
/// (`VRAMSHIM_CAP_FAULT=die-claiming-line`) leaves the line mid-claim. The next member takes
/// it over (the claim names a dead process) and is served in full, with no line about it, for
/// a group run as root and as `nobody`. With `no-claim-recovery` the next member waits for the
/// line, gives up, and its capped allocations on the device are refused.
#[test]
fn a_member_killed_claiming_a_line_does_not_block_the_group() {
    use std::os::unix::process::ExitStatusExt;
    for as_nobody in job_users() {
        for (fault, recovers) in [(None, true), (Some("no-claim-recovery"), false)] {
            let job_uid = if as_nobody { NOBODY } else { uid() };
            let shared = unique_name("claim-kill");
            let sim = unique_name("claim-kill");
            let member = |args: &[&str], fault: Option<&str>| -> RunOutput {
                let mut c = if as_nobody {
                    let mut c = sim_command("setpriv", "claim-kill");
                    c.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
                        .arg(probe());
                    c
                } else {
                    sim_command(probe(), "claim-kill")
                };
                c.env("VRAMSIM_NAME", &sim)
                    .env("VRAMSIM_CONTEXT_OVERHEAD", "0")
                    .env("LD_PRELOAD", lib())
                    .env("VRAMSHIM_CAP", (64 * MIB).to_string())
                    .env("VRAMSHIM_SHARED", &shared)
                    .args(args);
                if let Some(f) = fault {
                    c.env("VRAMSHIM_CAP_FAULT", f);
                }
                run(&mut c)
            };
            let what = format!("uid {job_uid}, {fault:?}");
            let victim = member(
                &["hold", &(2 * MIB).to_string(), "0"],
                Some("die-claiming-line"),
            );
            assert_eq!(
                victim.status.signal(),
                Some(9),
                "{what}: the member dies mid-claim\n{}",
                victim.stderr
            );
            let next = member(&["fill", &(2 * MIB).to_string(), "4"], fault);
            let _ = std::fs::remove_file(format!("/dev/shm/vramshim-{job_uid}-{shared}"));
            let _ = std::fs::remove_file(format!("/dev/shm/vramsim-{job_uid}-{sim}"));
            next.assert_success();
            let f = fields(&next, "fill", "");
            let stuck_line = our_lines(&next)
                .into_iter()
                .any(|l| l.contains("mid-claim"));
            if recovers {
                assert_eq!(
                    (num(&f, "ok"), num(&f, "refused")),
                    (4, 0),
                    "{what}: the next member is served: {f:?}\n{}",
                    next.stderr
                );
                assert!(!stuck_line, "{what}: {}", next.stderr);
            } else {
                assert_eq!(
                    (num(&f, "ok"), num(&f, "refused")),
                    (0, 1),
                    "{what}: without recovery the line stays stuck: {f:?}"
                );
                assert!(stuck_line, "{what}: one line says why\n{}", next.stderr);
            }
        }
    }
}
