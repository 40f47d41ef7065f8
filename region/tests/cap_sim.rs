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
use vramshim_testkit::{
    Link, RunOutput, compile_c, interposer_lib, profile_dir, run, sim_command, unique_name,
};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn lib() -> PathBuf {
    let l = interposer_lib();
    assert!(
        l.exists(),
        "{} is not built: cargo build --release -p vramshim-interposer",
        l.display()
    );
    l
}

fn probe() -> PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        compile_c(
            "cap_probe",
            &["tests/workloads/cap/cap_probe.c"],
            Link::SharedRuntime,
        )
    })
    .clone()
}

fn capped(args: &[&str], env: &[(&str, &str)], name: &str) -> RunOutput {
    on_sim(args, env, Some(&lib()), name)
}

/// Runs the probe on a simulated device of its own, removed afterwards.
fn on_sim(args: &[&str], env: &[(&str, &str)], preload: Option<&Path>, name: &str) -> RunOutput {
    let sim = unique_name(name);
    let mut c = sim_command(probe(), name);
    c.env("VRAMSIM_NAME", &sim).args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    if let Some(l) = preload {
        c.env("LD_PRELOAD", l);
    }
    let out = run(&mut c);
    let _ = std::fs::remove_file(vramsim_devstate::DeviceState::path(&sim));
    out
}

/// `key=value` pairs of the stdout line starting with `prefix` (and, if given, holding `has`).
fn fields(out: &RunOutput, prefix: &str, has: &str) -> Vec<(String, String)> {
    let line = out
        .stdout
        .lines()
        .find(|l| l.starts_with(prefix) && l.contains(has))
        .unwrap_or_else(|| panic!("no line {prefix}..{has} in\n{}\n{}", out.stdout, out.stderr));
    line.split_whitespace()
        .filter_map(|w| {
            w.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect()
}

fn num(f: &[(String, String)], key: &str) -> u64 {
    f.iter()
        .find(|(k, _)| k == key)
        .unwrap_or_else(|| panic!("no {key} in {f:?}"))
        .1
        .parse()
        .unwrap()
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

#[test]
fn memory_information_reports_the_cap_everywhere() {
    for cap in ["4GiB", "0.25", "25%"] {
        let f = info(&[("VRAMSHIM_CAP", cap)], 0, "cap-info");
        for k in [
            "cuda_total",
            "cu_total",
            "cu_devtotal",
            "prop_total",
            "nvml_total",
            "nvml2_total",
        ] {
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
        (
            &[
                ("VRAMSHIM_CAP", "1GiB"),
                ("VRAMSHIM_SHARED", "/proc/vramshim-nope/region"),
            ],
            "VRAMSHIM_SHARED",
        ),
        (
            &[("VRAMSHIM_CAP", "1GiB"), ("VRAMSHIM_SHARED", "bad/name")],
            "VRAMSHIM_SHARED=\"bad/name\"",
        ),
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

/// A region file that is corrupt, from another version, or not ours is refused, not trusted.
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
    for (path, needle) in [
        (&bad, "not usable"),
        (&open, "readable or writable by others"),
    ] {
        let p = path.display().to_string();
        let out = capped(
            &["paths", "1", &above],
            &[("VRAMSHIM_CAP", "1GiB"), ("VRAMSHIM_SHARED", &p)],
            "cap-corrupt",
        );
        out.assert_success();
        let lines = our_lines(&out);
        assert_eq!(lines.len(), 1, "{}", out.stderr);
        assert!(lines[0].contains(needle), "{}", lines[0]);
        assert_eq!(num(&fields(&out, "path=", "path=cudaMalloc "), "above"), 0);
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
    let vramshim = profile_dir().join("vramshim");
    assert!(
        vramshim.exists(),
        "{} is not built: cargo build --release -p vramshim-analyzer",
        vramshim.display()
    );
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
