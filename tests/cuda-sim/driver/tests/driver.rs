//! Integration tests of the simulated libcuda.so.1: a C program (tests/c/drvcheck.c) reaches
//! the built library the way the real runtime does (dlopen + cuGetProcAddress_v2) and runs one
//! scenario per process, each on its own simulated device (unique VRAMSIM_NAME).
//!
//! Build the library first: `cargo build --release -p vramsim-driver` (scripts/test does).

use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

fn dirs() -> &'static (PathBuf, PathBuf) {
    static D: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    D.get_or_init(|| {
        let profile = vramshim_testkit::profile_dir();
        let built = profile.join("libvramsim_driver.so");
        assert!(
            built.exists(),
            "{} is missing: run `cargo build --release -p vramsim-driver` first",
            built.display()
        );
        let dir = profile.join("vramsim-driver-tests");
        std::fs::create_dir_all(&dir).unwrap();
        for name in ["libcuda.so.1", "libcuda.so"] {
            // Made under a private name and renamed: concurrent test runs may share the dir.
            let tmp = dir.join(format!("{name}.{}", std::process::id()));
            let _ = std::fs::remove_file(&tmp);
            std::os::unix::fs::symlink(&built, &tmp).unwrap();
            std::fs::rename(&tmp, dir.join(name)).unwrap();
        }
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/drvcheck.c");
        let exe = dir.join("drvcheck");
        let tmp = dir.join(format!("drvcheck.{}", std::process::id()));
        let out = Command::new("gcc")
            .args(["-Wall", "-Werror", "-O1", "-o"])
            .arg(&tmp)
            .arg(&src)
            .args(["-ldl", "-lpthread"])
            .output()
            .expect("gcc");
        assert!(
            out.status.success(),
            "gcc failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::rename(&tmp, &exe).unwrap();
        (dir, exe)
    })
}

/// A device name no other test uses; its region is removed when the guard drops.
struct Device(String);

impl Device {
    fn new(tag: &str) -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        Device(format!("drvtest-{tag}-{}-{n}", std::process::id()))
    }
    fn stats(&self) -> vramsim_devstate::DeviceState {
        vramsim_devstate::DeviceState::open(&self.0).expect("device region")
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(vramsim_devstate::DeviceState::path(&self.0));
    }
}

fn command(dev: &Device, args: &[&str], env: &[(&str, &str)]) -> Command {
    let (dir, exe) = dirs();
    let mut c = Command::new(exe);
    c.env_remove("LD_PRELOAD");
    c.args(args)
        .env("LD_LIBRARY_PATH", dir)
        .env("VRAMSIM_NAME", &dev.0)
        .env_remove("VRAMSIM_MEMORY")
        .env_remove("VRAMSIM_DEVICES")
        .env_remove("VRAMSIM_CONTEXT_OVERHEAD")
        .env_remove("VRAMSIM_STREAM_DELAY")
        .env_remove("VRAMSIM_LATENCY")
        .env_remove("VRAMSIM_FAIL");
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

fn run(dev: &Device, args: &[&str], env: &[(&str, &str)]) -> Output {
    command(dev, args, env).output().expect("run drvcheck")
}

fn ok(dev: &Device, args: &[&str], env: &[(&str, &str)]) -> Output {
    let out = run(dev, args, env);
    assert!(
        out.status.success(),
        "drvcheck {args:?} failed ({:?}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn field(out: &Output, key: &str) -> u64 {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {}", String::from_utf8_lossy(&out.stdout)))
}

const MIB: u64 = 1 << 20;

#[test]
fn error_codes_packing_and_copies() {
    let d = Device::new("basic");
    ok(
        &d,
        &["basic"],
        &[("VRAMSIM_DEVICES", "2"), ("VRAMSIM_MEMORY", "1GiB")],
    );
}

/// CUDA_VISIBLE_DEVICES renumbers the devices this process sees; the devices themselves (PCI
/// bus id, UUID, name, the memory an allocation takes) stay the physical ones, as NVML numbers
/// them.
#[test]
fn cuda_visible_devices_renumbers_ordinals_but_not_devices() {
    let d = Device::new("visible");
    let uuid0 = |phys: u32| vramsim_devstate::device_uuid(&d.0, phys)[0];
    let base = [("VRAMSIM_DEVICES", "3"), ("VRAMSIM_CONTEXT_OVERHEAD", "0")];
    let with = |cvd: &str| {
        let mut env = base.to_vec();
        env.push(("CUDA_VISIBLE_DEVICES", cvd));
        String::from_utf8_lossy(&ok(&d, &["visible", "16"], &env).stdout).into_owned()
    };
    let out = with("2,0");
    let want = [
        "count 2".to_string(),
        format!(
            "ordinal 0 bus 00000000:03:00.0 uuid0 {:02x} name vramsim GPU 2 (simulated)",
            uuid0(2)
        ),
        format!(
            "ordinal 1 bus 00000000:01:00.0 uuid0 {:02x} name vramsim GPU 0 (simulated)",
            uuid0(0)
        ),
        "physical 0 used_by_self_mib 0".to_string(),
        "physical 1 used_by_self_mib 0".to_string(),
        "physical 2 used_by_self_mib 16".to_string(),
    ];
    for line in &want {
        assert!(out.lines().any(|l| l == line), "missing {line:?} in\n{out}");
    }
    // A UUID prefix names the same device; the list ends at the first entry that is no device.
    let uuid = vramsim_devstate::uuid_string(&vramsim_devstate::device_uuid(&d.0, 1));
    let out = with(&format!("{},7,0", &uuid[..12]));
    assert!(out.contains("count 1\n"), "{out}");
    assert!(out.contains("physical 1 used_by_self_mib 16"), "{out}");
    // Nothing visible: cuInit says there is no device (100), as a real driver does.
    assert!(with("").contains("cuInit 100"));
    assert!(with("0,0").contains("cuInit 100"));
}

#[test]
fn get_proc_address_versions_and_ptsz() {
    let d = Device::new("procaddr");
    ok(&d, &["procaddr"], &[]);
}

#[test]
fn get_proc_address_returns_own_symbols_under_a_preload() {
    let (dir, _) = dirs();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/fake_preload.c");
    let lib = dir.join(format!("libfakepre.{}.so", std::process::id()));
    let out = Command::new("gcc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let d = Device::new("procaddr-pre");
    ok(&d, &["procaddr"], &[("LD_PRELOAD", lib.to_str().unwrap())]);
    let _ = std::fs::remove_file(lib);
}

#[test]
fn capacity_refusal_and_high_water() {
    let d = Device::new("capacity");
    ok(
        &d,
        &["capacity"],
        &[
            ("VRAMSIM_MEMORY", "64MiB"),
            ("VRAMSIM_CONTEXT_OVERHEAD", "0"),
        ],
    );
    // The process exited: the device got everything back; the high-water mark stays.
    let s = d.stats();
    assert_eq!(s.used(0), 0);
    assert_eq!(s.high_water(0), 64 * MIB);
}

#[test]
fn vmm_aliasing_export_import_and_release_rules() {
    let d = Device::new("vmm");
    ok(&d, &["vmm_alias"], &[]);
}

#[test]
fn unmapped_access_faults() {
    let d = Device::new("fault");
    let out = run(&d, &["vmm_fault"], &[]);
    assert_eq!(out.status.signal(), Some(libc::SIGSEGV), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("touching"));
}

#[test]
fn mapped_without_access_faults() {
    let d = Device::new("noaccess");
    let out = run(&d, &["vmm_noaccess"], &[]);
    assert_eq!(out.status.signal(), Some(libc::SIGSEGV), "{out:?}");
}

#[test]
fn streams_and_events_are_asynchronous() {
    let d = Device::new("async");
    ok(&d, &["async"], &[]);
}

#[test]
fn streams_with_injected_delay() {
    let d = Device::new("async-delay");
    ok(&d, &["async"], &[("VRAMSIM_STREAM_DELAY", "2ms")]);
    // An event behind delayed work is pending right after its record (the margin is seconds,
    // no duration is measured) and complete after a synchronization.
    let d = Device::new("delay");
    ok(&d, &["delay"], &[("VRAMSIM_STREAM_DELAY", "1500ms")]);
}

#[test]
fn threads_with_streams_do_not_deadlock_or_corrupt() {
    let d = Device::new("threads");
    ok(&d, &["threads"], &[("VRAMSIM_STREAM_DELAY", "20us")]);
}

#[test]
fn stream_capture_status_and_unsafe_calls() {
    let d = Device::new("capture");
    ok(&d, &["capture"], &[]);
}

/// A stream-ordered free in a capture of memory no allocation node returned (pool memory
/// allocated before the capture, `cuMemAlloc` memory, mapped virtual memory): refused with
/// CUDA_ERROR_INVALID_VALUE, the capture going on (a graph allocation and its free still
/// captured after it, the end giving a graph), the memory not freed, as a real driver answers.
#[test]
fn a_captured_free_of_memory_the_graph_did_not_allocate_is_refused() {
    let d = Device::new("capture_free");
    ok(&d, &["capture_free"], &[]);
}

#[test]
fn forked_child_cannot_use_cuda_and_parent_keeps_its_memory() {
    let d = Device::new("fork");
    ok(&d, &["fork"], &[]);
}

#[test]
fn stream_ordered_pools() {
    let d = Device::new("pools");
    ok(&d, &["pools"], &[]);
}

#[test]
fn memory_pool_created_without_a_context() {
    let d = Device::new("pool-no-ctx");
    ok(&d, &["pool_no_context"], &[]);
}

#[test]
fn fail_injection_nth_and_after() {
    let d = Device::new("inject");
    ok(
        &d,
        &["inject"],
        &[("VRAMSIM_FAIL", "cuMemAlloc:nth=3,cuMemCreate:after=4MiB")],
    );
}

#[test]
fn latency_injection_keeps_results() {
    let d = Device::new("latency");
    ok(
        &d,
        &["basic"],
        &[
            ("VRAMSIM_DEVICES", "2"),
            ("VRAMSIM_MEMORY", "1GiB"),
            ("VRAMSIM_LATENCY", "cuMemAlloc=200us,cuMemcpyHtoD=1ms,*=1us"),
        ],
    );
}

fn assert_one_warning(out: &Output, var: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected one line on stderr, got: {err}");
    assert!(
        lines[0].contains(var) && lines[0].contains("expected"),
        "{}",
        lines[0]
    );
}

#[test]
fn bad_configuration_prints_one_line_and_uses_defaults() {
    let d = Device::new("badmem");
    let out = ok(&d, &["total"], &[("VRAMSIM_MEMORY", "lots")]);
    assert_one_warning(&out, "VRAMSIM_MEMORY");
    assert_eq!(field(&out, "total"), 16 << 30);

    for (var, bad) in [
        ("VRAMSIM_LATENCY", "cuMemAlloc=fast"),
        ("VRAMSIM_FAIL", "cuMemCreate:sometimes"),
        ("VRAMSIM_DEVICES", "99"),
        ("VRAMSIM_STREAM_DELAY", "5"),
        ("VRAMSIM_CONTEXT_OVERHEAD", "-1"),
    ] {
        let d = Device::new("bad");
        let out = ok(&d, &["total"], &[(var, bad)]);
        assert_one_warning(&out, var);
    }
}

/// Starts a process holding `mib` on the device; it exits when its stdin closes.
fn holder(d: &Device, mib: u64, env: &[(&str, &str)]) -> std::process::Child {
    let mut child = command(d, &["hold", &mib.to_string()], env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn holder");
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready", "holder did not start");
    child
}

#[test]
fn two_processes_share_one_device_and_dead_ones_are_reclaimed() {
    let d = Device::new("share");
    let env = [
        ("VRAMSIM_MEMORY", "256MiB"),
        ("VRAMSIM_CONTEXT_OVERHEAD", "8MiB"),
    ];
    let mut a = holder(&d, 100, &env);
    // B sees A's 100 MiB + A's context, and its own context, in free memory.
    let out = ok(&d, &["probe", "200"], &env);
    assert_eq!(field(&out, "free"), (256 - 100 - 8 - 8) * MIB);
    assert_eq!(
        field(&out, "alloc"),
        2,
        "together they would exceed the device"
    );
    let out = ok(&d, &["probe", "140"], &env);
    assert_eq!(field(&out, "alloc"), 0);
    assert!(field(&out, "high") <= 256 * MIB);
    // The device's own view while A lives.
    let s = d.stats();
    assert_eq!(s.used(0), 108 * MIB);
    assert_eq!(s.processes().len(), 1);
    // A dies without cleaning up: the next process gets everything back.
    a.kill().unwrap();
    a.wait().unwrap();
    let out = ok(&d, &["probe", "200"], &env);
    assert_eq!(field(&out, "free"), (256 - 8) * MIB);
    assert_eq!(field(&out, "alloc"), 0);
    assert!(s.high_water(0) <= 256 * MIB);
    assert_eq!(s.used(0), 0);
}

#[test]
fn concurrent_processes_never_exceed_capacity() {
    let d = Device::new("race");
    let env = [
        ("VRAMSIM_MEMORY", "128MiB"),
        ("VRAMSIM_CONTEXT_OVERHEAD", "0"),
    ];
    let holders: Vec<_> = (0..4).map(|_| holder(&d, 30, &env)).collect();
    let out = ok(&d, &["probe", "16"], &env);
    // 4 x 30 MiB held: 8 MiB left, so 16 MiB is refused.
    assert_eq!(field(&out, "alloc"), 2);
    let s = d.stats();
    assert_eq!(s.used(0), 120 * MIB);
    assert!(s.high_water(0) <= 128 * MIB);
    for mut h in holders {
        drop(h.stdin.take());
        h.wait().unwrap();
    }
    assert_eq!(s.used(0), 0);
}

#[test]
fn vramsim_smi_prints_the_device() {
    let d = Device::new("smi");
    let mut h = holder(&d, 10, &[("VRAMSIM_CONTEXT_OVERHEAD", "0")]);
    let smi = vramshim_testkit::profile_dir().join("vramsim-smi");
    let out = Command::new(&smi).arg(&d.0).output().expect("vramsim-smi");
    assert!(out.status.success());
    let json = String::from_utf8_lossy(&out.stdout);
    assert!(json.contains(&format!("\"used\":[{}]", 10 * MIB)), "{json}");
    assert!(json.contains(&format!("\"pid\":{}", h.id())), "{json}");
    drop(h.stdin.take());
    h.wait().unwrap();
    let missing = Command::new(&smi)
        .arg("no-such-device-xyz")
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(1));
}
