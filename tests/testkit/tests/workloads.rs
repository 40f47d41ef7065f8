//! The workloads (replay, cudarc-app) and the layout scripts, on the simulated GPU.

use std::collections::HashMap;
use std::process::Command;
use vramshim_testkit::{
    profile_dir, replay_exe, repo_root, run, sim_command, sim_dir, temp_dir, trace_file,
};

/// What a faithful replay of an RMM CSV must report, computed independently of replay.c.
struct Expected {
    allocs: u64,
    frees: u64,
    skipped: u64,
    peak: u64,
}

fn expected(csv: &str) -> Expected {
    let text = std::fs::read_to_string(trace_file(csv)).unwrap();
    let mut live: HashMap<String, u64> = HashMap::new();
    let (mut cur, mut e) = (
        0u64,
        Expected {
            allocs: 0,
            frees: 0,
            skipped: 0,
            peak: 0,
        },
    );
    for line in text.lines().skip(1) {
        let c: Vec<&str> = line.split(',').collect();
        let (action, ptr, size) = (c[2], c[3].to_string(), c[4].parse::<u64>().unwrap());
        match action {
            "allocate" => {
                if let Some(old) = live.insert(ptr, size) {
                    cur -= old;
                }
                e.allocs += 1;
                cur += size;
                e.peak = e.peak.max(cur);
            }
            "free" => match live.remove(&ptr) {
                Some(s) => {
                    e.frees += 1;
                    cur -= s;
                }
                None => e.skipped += 1,
            },
            _ => {}
        }
    }
    e
}

fn num(out: &vramshim_testkit::RunOutput, key: &str) -> i64 {
    out.field("replay:", key)
        .unwrap_or_else(|| panic!("no {key}= in the summary: {}", out.stdout))
        .parse()
        .unwrap()
}

fn replay(name: &str, args: &[&str], env: &[(&str, &str)]) -> vramshim_testkit::RunOutput {
    let mut c = sim_command(replay_exe(), name);
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    run(&mut c)
}

fn check_complete(out: &vramshim_testkit::RunOutput, csv: &str) {
    out.assert_success();
    let e = expected(csv);
    assert_eq!(num(out, "allocs") as u64, e.allocs);
    assert_eq!(num(out, "frees") as u64, e.frees);
    assert_eq!(num(out, "skipped_frees") as u64, e.skipped);
    assert_eq!(num(out, "peak_live") as u64, e.peak);
    assert_eq!(num(out, "failed"), 0);
    assert_eq!(num(out, "first_failure"), -1);
    assert_eq!(num(out, "mismatches"), 0);
    assert_eq!(num(out, "live_at_end"), 0);
    assert!(num(out, "ns") > 0);
    // The summary is the last line of stdout.
    assert!(
        out.stdout
            .trim_end()
            .lines()
            .last()
            .unwrap()
            .starts_with("replay: events=")
    );
}

#[test]
fn replay_runtime_path_matches_the_trace() {
    let csv = "vit_train.rmm.csv";
    let t = trace_file(csv);
    let out = replay("replay_rt", &[t.to_str().unwrap()], &[]);
    check_complete(&out, csv);
}

#[test]
fn replay_async_with_copied_pattern() {
    let csv = "bert_serve.rmm.csv";
    let t = trace_file(csv);
    let out = replay(
        "replay_async",
        &["--async", "--pattern", "memcpy", t.to_str().unwrap()],
        &[],
    );
    check_complete(&out, csv);
}

#[test]
fn replay_driver_path_with_memset_pattern() {
    let csv = "vit_train.rmm.csv";
    let t = trace_file(csv);
    let out = replay(
        "replay_drv",
        &["--driver", "--pattern", "memset", t.to_str().unwrap()],
        &[],
    );
    check_complete(&out, csv);
}

#[test]
fn replay_reports_out_of_memory_on_a_small_device() {
    let csv = "t5_train.rmm.csv";
    let t = trace_file(csv);
    let t = t.to_str().unwrap();
    // 471 MiB of live data cannot fit next to the context on a 512 MiB device.
    let out = replay("replay_oom", &[t], &[("VRAMSIM_MEMORY", "512MiB")]);
    assert_eq!(out.code(), Some(2), "{}{}", out.stdout, out.stderr);
    let first = num(&out, "first_failure");
    assert!(first >= 0 && num(&out, "failed") > 0);
    assert!(
        out.stderr.contains("cudaErrorMemoryAllocation"),
        "{}",
        out.stderr
    );
    // --stop-on-failure stops right there.
    let out = replay(
        "replay_oom_stop",
        &["--stop-on-failure", "--quiet", t],
        &[("VRAMSIM_MEMORY", "512MiB")],
    );
    assert_eq!(out.code(), Some(2));
    assert_eq!(num(&out, "failed"), 1);
    assert_eq!(num(&out, "first_failure"), first);
    assert_eq!(num(&out, "events"), first);
    assert!(out.stderr.is_empty(), "--quiet: {}", out.stderr);
}

#[test]
fn replay_limit_and_repeat() {
    let t = trace_file("vit_train.rmm.csv");
    let out = replay(
        "replay_rep",
        &["--limit", "1000", "--repeat", "3", t.to_str().unwrap()],
        &[],
    );
    out.assert_success();
    assert_eq!(num(&out, "events"), 3000);
    let text = std::fs::read_to_string(&t).unwrap();
    let allocs = text
        .lines()
        .skip(1)
        .take(1000)
        .filter(|l| l.contains(",allocate,"))
        .count() as i64;
    assert_eq!(num(&out, "allocs"), 3 * allocs);
}

#[test]
fn replay_rejects_bad_input_with_one_clear_line() {
    let dir = temp_dir("replay_bad");
    let missing = dir.join("nope.csv");
    let out = replay("replay_bad", &[missing.to_str().unwrap()], &[]);
    assert_eq!(out.code(), Some(1));
    assert!(out.stderr.contains("nope.csv"), "{}", out.stderr);

    let bad = dir.join("bad.csv");
    std::fs::write(
        &bad,
        "Thread,Time,Action,Pointer,Size,Stream\n1,00:00:00.0,allocate,0x10,12x,0\n",
    )
    .unwrap();
    let out = replay("replay_bad", &[bad.to_str().unwrap()], &[]);
    assert_eq!(out.code(), Some(1));
    assert!(out.stderr.contains("bad.csv:2: bad size"), "{}", out.stderr);

    let out = replay(
        "replay_bad",
        &["--pattern", "zebra", bad.to_str().unwrap()],
        &[],
    );
    assert_eq!(out.code(), Some(1));
    assert!(out.stderr.contains("--pattern"), "{}", out.stderr);
}

#[test]
fn cudarc_safe_api_runs_on_the_simulated_gpu() {
    let exe = profile_dir().join("cudarc-app");
    assert!(
        exe.exists(),
        "{} is not built (cargo build --release -p cudarc-app)",
        exe.display()
    );
    let out = run(sim_command(&exe, "cudarc").arg("65536"));
    out.assert_success();
    assert!(
        out.stdout.contains("cudarc-app: ok elements=65536"),
        "{}",
        out.stdout
    );
}

#[test]
fn sim_layout_script_lays_out_the_same_files() {
    let sim = sim_dir();
    let profile = sim.parent().unwrap();
    let o = Command::new(repo_root().join("scripts/sim-layout"))
        .arg(profile)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        sim.canonicalize().unwrap().to_str().unwrap()
    );
}

#[test]
fn sim_run_runs_a_program_on_the_simulated_gpu() {
    let profile = profile_dir();
    let exe = replay_exe();
    let t = trace_file("vit_train.rmm.csv");
    let o = Command::new(repo_root().join("scripts/sim-run"))
        .args([
            "--memory",
            "1GiB",
            "--name",
            &vramshim_testkit::unique_name("simrun"),
            "--profile",
        ])
        .arg(&profile)
        .args([
            "--",
            exe.to_str().unwrap(),
            "--limit",
            "200",
            t.to_str().unwrap(),
        ])
        .env_remove("VRAMSIM_MEMORY")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("replay: events=200"));
}

#[test]
fn python_ctypes_program_runs_on_the_simulated_gpu() {
    let script = repo_root().join("tests/workloads/python/ctypes_alloc.py");
    let out = run(sim_command("python3", "ctypes").arg(script).arg("4194304"));
    out.assert_success();
    assert!(
        out.stdout.contains("ctypes: ok runtime=12090"),
        "{}",
        out.stdout
    );
}

/// A program whose DT_RPATH points at NVIDIA's real runtime (as PyTorch wheels do) ignores
/// LD_LIBRARY_PATH; `sim-run --preload-runtime` puts the simulated one in its place.
#[test]
fn sim_run_preload_runtime_beats_a_dt_rpath() {
    let real = match vramshim_testkit::real_cudart12_dir() {
        Ok(d) => d,
        Err(why) => {
            eprintln!("SKIP: NVIDIA's libcudart.so.12 is not available: {why}");
            return;
        }
    };
    let exe = temp_dir("rpath").join("rt_basic_rpath");
    let (l, rpath) = (
        format!("-L{}", real.display()),
        format!("-Wl,--disable-new-dtags,-rpath,{}", real.display()),
    );
    vramshim_testkit::compile_c_to(
        &exe,
        &["tests/workloads/sim/rt_basic.c"],
        vramshim_testkit::Link::Dl,
        &["-DREAL_CUDART", &l, "-l:libcudart.so.12", &rpath],
    );
    let sim_run = |extra: &[&str]| {
        let mut c = Command::new(repo_root().join("scripts/sim-run"));
        c.args([
            "--name",
            &vramshim_testkit::unique_name("rpath"),
            "--profile",
        ])
        .arg(profile_dir());
        c.args(extra).arg("--").arg(&exe).env_remove("LD_PRELOAD");
        c.output().unwrap()
    };
    // The real runtime cannot drive the simulated driver (private export tables).
    let o = sim_run(&[]);
    assert!(
        !o.status.success(),
        "the DT_RPATH runtime was expected to fail on cuda-sim"
    );
    let o = sim_run(&["--preload-runtime=12"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("rt_basic: ok"));
}
