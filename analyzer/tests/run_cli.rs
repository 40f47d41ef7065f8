//! `vramshim run`: exit status, signal forwarding, LD_PRELOAD handling, variables, finding the
//! library (next to the executable, in an install prefix, through VRAMSHIM_LIB) and the message
//! when it cannot be found.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

mod common;
use common::compile_c;

const VRAMSHIM: &str = env!("CARGO_BIN_EXE_vramshim");

/// A fresh directory, removed (with the copies of the binary made in it) when dropped.
fn tmpdir(tag: &str) -> vramshim_testkit::TempDir {
    vramshim_testkit::TempDir::new(&format!("run-{tag}"))
}

/// A real (empty) shared object, so LD_PRELOAD loads it without complaint and the tests of
/// the launcher do not depend on the interposer's state.
fn empty_so(name: &str) -> PathBuf {
    static DIR: OnceLock<vramshim_testkit::TempDir> = OnceLock::new();
    static LOCK: Mutex<()> = Mutex::new(());
    let dir = DIR.get_or_init(|| tmpdir("so"));
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let p = dir.join(name);
    if !p.exists() {
        let src = dir.join("empty.c");
        std::fs::write(&src, "int vramshim_test_empty_so;\n").unwrap();
        let tmp = dir.join(format!("{name}.tmp"));
        let st = Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&tmp)
            .arg(&src)
            .status()
            .expect("cc (gcc) is needed to build a test shared object");
        assert!(st.success());
        std::fs::rename(&tmp, &p).unwrap();
    }
    p
}

/// `vramshim` with a clean environment for the launcher's own variables.
fn vramshim() -> Command {
    let mut c = Command::new(VRAMSHIM);
    c.env_remove("LD_PRELOAD")
        .env_remove("PYTORCH_NO_CUDA_MEMORY_CACHING")
        .env_remove("PYTORCH_ALLOC_CONF")
        .env_remove("PYTORCH_CUDA_ALLOC_CONF")
        .env("VRAMSHIM_LIB", empty_so("libvramshim.so"));
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if k.starts_with("VRAMSHIM_") && k != "VRAMSHIM_LIB" {
            c.env_remove(k);
        }
    }
    c
}

fn output(c: &mut Command) -> (i32, String, String) {
    let o = c.output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn exit_status_is_the_commands() {
    for code in [0, 1, 7, 42, 255] {
        let (rc, _, err) =
            output(vramshim().args(["run", "--", "sh", "-c", &format!("exit {code}")]));
        assert_eq!(rc, code, "stderr: {err}");
    }
    // Without `--` as well.
    let (rc, _, _) = output(vramshim().args(["run", "sh", "-c", "exit 5"]));
    assert_eq!(rc, 5);
}

#[test]
fn killed_by_a_signal_gives_128_plus_signal_like_a_shell() {
    let (rc, _, _) = output(vramshim().args(["run", "--", "sh", "-c", "kill -TERM $$"]));
    assert_eq!(rc, 128 + 15);
    let (rc, _, _) = output(vramshim().args(["run", "--", "sh", "-c", "kill -KILL $$"]));
    assert_eq!(rc, 128 + 9);
}

#[test]
fn command_not_found_is_127() {
    let (rc, _, err) = output(vramshim().args(["run", "--", "/nonexistent/vramshim-no-such-cmd"]));
    assert_eq!(rc, 127);
    assert!(err.contains("cannot start"), "{err}");
}

#[test]
fn signals_are_forwarded_to_the_child() {
    let script = r#"
for s in INT TERM HUP QUIT USR1 USR2; do trap "echo got $s" $s; done
echo ready
i=0
while [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done
echo timeout
"#;
    let mut child = vramshim()
        .args(["run", "--", "sh", "-c", script])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    for (sig, name) in [
        (libc::SIGINT, "INT"),
        (libc::SIGTERM, "TERM"),
        (libc::SIGHUP, "HUP"),
        (libc::SIGQUIT, "QUIT"),
        (libc::SIGUSR1, "USR1"),
        (libc::SIGUSR2, "USR2"),
    ] {
        unsafe { libc::kill(pid, sig) };
        let line = lines.next().unwrap().unwrap();
        assert_eq!(
            line,
            format!("got {name}"),
            "signal {name} was not forwarded"
        );
    }
    // The launcher survived all of them and still waits for its child: end the child for real.
    let out = Command::new("pkill")
        .args(["-KILL", "-P", &pid.to_string()])
        .status();
    if out.map(|s| !s.success()).unwrap_or(true) {
        // No pkill: kill the launcher's children through /proc.
        kill_children(pid);
    }
    let st = child.wait().unwrap();
    assert_eq!(st.code(), Some(128 + 9));
}

fn kill_children(ppid: libc::pid_t) {
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<libc::pid_t>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let parent: libc::pid_t = after.split(' ').nth(1).unwrap().parse().unwrap();
        if parent == ppid {
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

#[test]
fn a_child_that_traps_sigterm_reports_it_and_its_status_comes_back() {
    let script =
        r#"trap 'echo "child got SIGTERM"; exit 3' TERM; echo ready; while :; do sleep 0.05; done"#;
    let mut child = vramshim()
        .args(["run", "--", "sh", "-c", script])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(lines.next().unwrap().unwrap(), "child got SIGTERM");
    assert_eq!(child.wait().unwrap().code(), Some(3));
}

#[test]
fn existing_ld_preload_is_kept_and_ours_appended() {
    let other = empty_so("libother.so");
    let ours = empty_so("libvramshim.so");
    let (rc, out, err) = output(vramshim().env("LD_PRELOAD", &other).args([
        "run",
        "--",
        "sh",
        "-c",
        "echo \"$LD_PRELOAD\"",
    ]));
    assert_eq!(rc, 0, "{err}");
    assert_eq!(
        out.trim(),
        format!("{}:{}", other.display(), ours.display()),
        "LD_PRELOAD must keep the existing entry first and append libvramshim.so"
    );
}

#[test]
fn every_flag_sets_its_variable() {
    let dir = tmpdir("vars");
    let (rc, out, err) = output(vramshim().current_dir(&dir).args([
        "run",
        "--cap",
        "0.5",
        "--shared",
        "team",
        "--pool",
        "stitch",
        "--trace",
        "job-%p.vramtrace",
        "--stacks",
        "16",
        "--log",
        "debug",
        "--",
        "env",
    ]));
    assert_eq!(rc, 0, "{err}");
    let has = |kv: &str| out.lines().any(|l| l == kv);
    assert!(has("VRAMSHIM_CAP=0.5"), "{out}");
    assert!(has("VRAMSHIM_SHARED=team"));
    assert!(has("VRAMSHIM_POOL=stitch"));
    assert!(has("VRAMSHIM_STACKS=16"));
    assert!(has("VRAMSHIM_LOG=debug"));
    // The trace path is made absolute, so a child that changes directory still writes it here.
    let canon = dir.canonicalize().unwrap();
    assert!(
        has(&format!(
            "VRAMSHIM_TRACE={}/job-%p.vramtrace",
            dir.display()
        )) || has(&format!(
            "VRAMSHIM_TRACE={}/job-%p.vramtrace",
            canon.display()
        )),
        "{out}"
    );
    // --pool stitch routes PyTorch's tensors to the pool, stream-ordered, under both names.
    assert!(has("PYTORCH_ALLOC_CONF=backend:cudaMallocAsync"), "{out}");
    assert!(
        has("PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync"),
        "{out}"
    );
    assert!(
        !out.lines()
            .any(|l| l.starts_with("PYTORCH_NO_CUDA_MEMORY_CACHING="))
    );
    // Flags not given set nothing.
    let (_, out, _) = output(vramshim().args(["run", "--", "env"]));
    assert!(!out.lines().any(|l| l.starts_with("VRAMSHIM_CAP=")));
    assert!(!out.lines().any(|l| l.starts_with("PYTORCH_")), "{out}");
}

#[test]
fn pytorch_caching_opt_outs_are_respected() {
    let (_, out, _) = output(
        vramshim()
            .env("PYTORCH_NO_CUDA_MEMORY_CACHING", "0")
            .args(["run", "--pool", "stitch", "--", "env"]),
    );
    assert!(
        out.lines().any(|l| l == "PYTORCH_NO_CUDA_MEMORY_CACHING=0"),
        "the user's value wins"
    );
    let (_, out, _) = output(vramshim().args([
        "run",
        "--pool",
        "stitch",
        "--keep-torch-caching",
        "--",
        "env",
    ]));
    assert!(
        !out.lines()
            .any(|l| l.starts_with("PYTORCH_NO_CUDA_MEMORY_CACHING="))
    );
}

/// The note on a PYTORCH_NO_CUDA_MEMORY_CACHING the user set offers only a remedy that works:
/// `--pytorch-route async`, which it offered, keeps the setting all the same; unsetting it
/// routes the tensors.
#[test]
fn the_kept_no_caching_note_offers_what_works() {
    for route in [
        &["--pool", "stitch"][..],
        &["--pool", "stitch", "--pytorch-route", "async"],
    ] {
        let (v, err) = env_of(
            route,
            &[("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")],
            "PYTORCH_",
        );
        assert_eq!(v, ["PYTORCH_NO_CUDA_MEMORY_CACHING=1"], "{route:?}: {err}");
        assert!(err.contains("unset it to route tensors"), "{err}");
        assert!(
            !err.contains("--pytorch-route async"),
            "{route:?}: a remedy that does not work: {err}"
        );
    }
    let (v, _) = env_of(&["--pool", "stitch"], &[], "PYTORCH_");
    assert!(
        v.iter().any(|l| l.contains("backend:cudaMallocAsync")),
        "{v:?}"
    );
}

/// The variables `vramshim run ARGS -- env` gives its command (with `vars` set around it)
/// whose names start with `prefix`, and its stderr.
fn env_of(args: &[&str], vars: &[(&str, &str)], prefix: &str) -> (Vec<String>, String) {
    let mut c = vramshim();
    c.envs(vars.iter().copied())
        .arg("run")
        .args(args)
        .args(["--", "env"]);
    let (rc, out, err) = output(&mut c);
    assert_eq!(rc, 0, "{args:?}: {err}");
    let mut v: Vec<String> = out
        .lines()
        .filter(|l| l.starts_with(prefix))
        .map(str::to_string)
        .collect();
    v.sort();
    (v, err)
}

#[test]
fn pytorch_routes_by_flag_and_variable() {
    let pool = ["--pool", "stitch"];
    let asyncr = [
        "PYTORCH_ALLOC_CONF=backend:cudaMallocAsync",
        "PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync",
    ];
    let (v, err) = env_of(&pool, &[], "PYTORCH_");
    assert_eq!(v, asyncr);
    assert!(err.is_empty(), "nothing to say: {err}");
    let (v, _) = env_of(&["--pool", "stitch-tight"], &[], "PYTORCH_");
    assert_eq!(v, asyncr);
    let (v, _) = env_of(
        &["--pool", "stitch", "--pytorch-route", "uncached"],
        &[],
        "PYTORCH_",
    );
    assert_eq!(v, ["PYTORCH_NO_CUDA_MEMORY_CACHING=1"]);
    let (v, _) = env_of(
        &["--pool", "stitch", "--pytorch-route", "native"],
        &[],
        "PYTORCH_",
    );
    assert!(v.is_empty(), "{v:?}");
    let (v, _) = env_of(&pool, &[("VRAMSHIM_PYTORCH_ROUTE", "uncached")], "PYTORCH_");
    assert_eq!(v, ["PYTORCH_NO_CUDA_MEMORY_CACHING=1"]);
    // the flag wins over the variable
    let (v, _) = env_of(
        &["--pool", "stitch", "--pytorch-route", "async"],
        &[("VRAMSHIM_PYTORCH_ROUTE", "uncached")],
        "PYTORCH_",
    );
    assert_eq!(v, asyncr);
    // without the pool nothing is routed
    let (v, _) = env_of(&["--pool", "off"], &[], "PYTORCH_");
    assert!(v.is_empty(), "{v:?}");
}

#[test]
fn pytorch_settings_the_user_made_are_merged_or_kept() {
    let pool = ["--pool", "stitch"];
    // other options kept, native-only ones dropped with one line
    let (v, err) = env_of(
        &pool,
        &[(
            "PYTORCH_CUDA_ALLOC_CONF",
            "expandable_segments:True,pinned_num_register_threads:4",
        )],
        "PYTORCH_",
    );
    let merged = "backend:cudaMallocAsync,pinned_num_register_threads:4";
    assert_eq!(
        v,
        [
            format!("PYTORCH_ALLOC_CONF={merged}"),
            format!("PYTORCH_CUDA_ALLOC_CONF={merged}")
        ]
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("expandable_segments:True"), "{err}");
    // a backend the user chose is respected, and said so
    let (v, err) = env_of(
        &pool,
        &[("PYTORCH_ALLOC_CONF", "backend:native")],
        "PYTORCH_",
    );
    assert_eq!(v, ["PYTORCH_ALLOC_CONF=backend:native"]);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("backend:native"), "{err}");
}

#[test]
fn pool_budget_flag_sets_its_variable_and_implies_the_pool() {
    let (v, _) = env_of(&["--pool-budget", "10%"], &[], "VRAMSHIM_POOL");
    assert_eq!(v, ["VRAMSHIM_POOL=stitch", "VRAMSHIM_POOL_BUDGET=10%"]);
    let (v, _) = env_of(
        &["--pool", "stitch-tight", "--pool-budget", "0.2"],
        &[],
        "VRAMSHIM_POOL",
    );
    assert_eq!(
        v,
        ["VRAMSHIM_POOL=stitch-tight", "VRAMSHIM_POOL_BUDGET=0.2"]
    );
}

#[test]
fn bad_pool_budget_and_route_are_refused_before_running() {
    for (args, env, needle) in [
        (vec!["--pool-budget", "lots"], None, "5%"),
        (
            vec!["--pool", "off", "--pool-budget", "0.1"],
            None,
            "--pool off",
        ),
        (
            vec!["--pool", "stitch"],
            Some(("VRAMSHIM_PYTORCH_ROUTE", "fast")),
            "async, uncached, native",
        ),
    ] {
        let mut c = vramshim();
        c.envs(env).arg("run").args(&args).args(["--", "true"]);
        let (rc, _, err) = output(&mut c);
        assert_eq!(rc, 2, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    }
}

#[test]
fn bad_flag_values_are_refused_before_running() {
    let (rc, _, err) = output(vramshim().args(["run", "--pool", "magic", "--", "true"]));
    assert_ne!(rc, 0);
    assert!(err.contains("stitch"), "{err}");
    // A group name that names no region: one line with the accepted forms, nothing run.
    let dir = tmpdir("bad-shared");
    let ran = dir.join("ran");
    let (rc, _, err) = output(
        vramshim()
            .args(["run", "--shared", "bad/name", "--", "touch"])
            .arg(&ran),
    );
    assert_eq!(rc, 2, "{err}");
    assert!(
        err.contains("--shared \"bad/name\" is not valid")
            && err.contains("accepted: a name of 1 to 64"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(!ran.exists(), "the program ran");
}

/// `output()`, retried while the kernel says "text file busy": a test thread that forks while
/// another one is still writing its copy of the executable holds the file open for writing
/// until its child execs.
trait RetryOutput {
    fn retry_output(&mut self) -> std::process::Output;
}

impl RetryOutput for Command {
    fn retry_output(&mut self) -> std::process::Output {
        for _ in 0..200 {
            match self.output() {
                Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                r => return r.unwrap(),
            }
        }
        self.output().unwrap()
    }
}

/// A copy of the `vramshim` executable in `<prefix>/bin`, so discovery relative to the
/// executable is tested without anything next to cargo's copy interfering.
fn lone_exe(prefix: &Path) -> PathBuf {
    std::fs::create_dir_all(prefix.join("bin")).unwrap();
    let exe = prefix.join("bin/vramshim");
    std::fs::copy(VRAMSHIM, &exe).unwrap();
    exe
}

#[test]
fn clear_message_when_the_library_cannot_be_found() {
    let prefix = tmpdir("nolib");
    let exe = lone_exe(&prefix);
    let o = Command::new(&exe)
        .env_remove("VRAMSHIM_LIB")
        .args(["run", "--", "true"])
        .retry_output();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("cannot find libvramshim.so"), "{err}");
    // It lists where it looked and how to fix it.
    assert!(
        err.contains(&format!("{}/bin/libvramshim.so", prefix.display())),
        "{err}"
    );
    assert!(
        err.contains(&format!("{}/lib/vramshim/libvramshim.so", prefix.display())),
        "{err}"
    );
    assert!(err.contains("VRAMSHIM_LIB"), "{err}");
    assert!(err.contains("install.sh"), "{err}");
    assert!(err.contains("cargo build"), "{err}");

    // A VRAMSHIM_LIB that points nowhere is named.
    let o = Command::new(&exe)
        .env("VRAMSHIM_LIB", "/nonexistent/libvramshim.so")
        .args(["run", "--", "true"])
        .retry_output();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        err.contains("VRAMSHIM_LIB=/nonexistent/libvramshim.so"),
        "{err}"
    );
}

#[test]
fn library_and_simulated_gpu_found_in_an_install_layout() {
    for libdir in ["lib/vramshim", "lib"] {
        let prefix = tmpdir(&format!("layout-{}", libdir.replace('/', "-")));
        let exe = lone_exe(&prefix);
        std::fs::create_dir_all(prefix.join(libdir).join("cuda-sim")).unwrap();
        // An empty library named `name` at `rel` below the library folder.
        let put = |name: &str, rel: &str| {
            std::fs::copy(empty_so(name), prefix.join(libdir).join(rel)).unwrap();
        };
        // The installed command, with nothing of the test's environment pointing at a library.
        let run = |args: &[&str], script: &str| {
            Command::new(&exe)
                .env_remove("VRAMSHIM_LIB")
                .env_remove("LD_PRELOAD")
                .args(args)
                .args(["--", "sh", "-c", script])
                .retry_output()
        };
        put("libvramshim.so", "libvramshim.so");
        put("libcuda.so.1", "cuda-sim/libcuda.so.1");
        let o = run(
            &["run", "--sim=2GiB"],
            "echo \"$LD_PRELOAD\"; echo \"$LD_LIBRARY_PATH\"; echo \"$VRAMSIM_MEMORY\"",
        );
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let l: Vec<&str> = out.lines().collect();
        assert_eq!(
            l[0],
            format!("{}/{libdir}/libvramshim.so", prefix.display())
        );
        // The driver alone first (the program's own runtime runs), cuda-sim's runtimes last
        // for programs that bring none.
        let sim = format!("{}/{libdir}/cuda-sim", prefix.display());
        let path: Vec<&str> = l[1].split(':').collect();
        assert_eq!(
            path.first(),
            Some(&format!("{sim}/driver").as_str()),
            "{}",
            l[1]
        );
        assert_eq!(path.last(), Some(&sim.as_str()), "{}", l[1]);
        assert_eq!(
            std::fs::read_link(format!("{sim}/driver/libcuda.so.1")).unwrap(),
            Path::new("../libcuda.so.1")
        );
        assert!(!Path::new(&format!("{sim}/driver/libcudart.so.12")).exists());
        // handed to cuda-sim as bytes, read as every size of vramshim is
        assert_eq!(l[2], (2u64 << 30).to_string());

        // --preload-runtime: the substitution, cuda-sim first and its runtime preloaded.
        put("libcudart.so.12", "cuda-sim/libcudart.so.12");
        let o = run(
            &["run", "--sim", "--preload-runtime"],
            "echo \"$LD_PRELOAD\"; echo \"$LD_LIBRARY_PATH\"",
        );
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let l: Vec<&str> = out.lines().collect();
        assert_eq!(
            l[0],
            format!(
                "{}/{libdir}/libvramshim.so:{sim}/libcudart.so.12",
                prefix.display()
            )
        );
        assert_eq!(l[1].split(':').next(), Some(sim.as_str()), "{}", l[1]);
    }
}

/// `--sim=SIZE` reads sizes as `--cap` and `replay` do (`GB` is 10^9 bytes: cuda-sim itself
/// reads it as 2^30) and refuses, before the command starts, a size cuda-sim would ignore
/// with a line of its own and replace by its default.
#[test]
fn sim_size_is_read_as_every_size_and_a_bad_one_refused() {
    let script = "echo \"$VRAMSIM_MEMORY\"";
    for (size, bytes) in [
        ("8GB", "8000000000"),
        ("8G", "8589934592"),
        ("1.5GiB", "1610612736"),
        ("512MiB", "536870912"),
        ("1073741824", "1073741824"),
    ] {
        let o = vramshim()
            .args(["run", &format!("--sim={size}"), "--", "sh", "-c", script])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{size}: {err}");
        assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), bytes, "{size}");
    }
    for bad in ["lots", "1.5", "-1GiB", "0", "8XB"] {
        let o = vramshim()
            .args([
                "run",
                &format!("--sim={bad}"),
                "--",
                "sh",
                "-c",
                "echo started",
            ])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{bad}: {err}");
        assert!(o.stdout.is_empty(), "{bad}: the command started");
        assert_eq!(err.lines().count(), 1, "{bad}: one line wanted: {err}");
        assert!(
            err.contains(&format!("--sim=\"{bad}\" is not valid")),
            "{err}"
        );
        assert!(
            err.contains("16GiB") || err.contains("8GiB"),
            "no accepted form: {err}"
        );
    }
}

#[test]
fn preload_runtime_needs_sim() {
    let o = Command::new(VRAMSHIM)
        .args(["run", "--preload-runtime", "--", "true"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("--preload-runtime needs --sim"), "{err}");
    let o = Command::new(VRAMSHIM)
        .args(["run", "--sim", "--preload-runtime=11", "--", "true"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("12") && err.contains("13"), "{err}");
}

fn cargo_target_dir() -> PathBuf {
    // <target>/<profile>/vramshim
    Path::new(VRAMSHIM)
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf()
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// `scripts/install.sh --help` prints its header comment, all of it and nothing else (it
/// printed the script's first line of code, `set -euo pipefail`, as help).
#[test]
fn install_help_is_its_header_comment() {
    let o = Command::new(repo_root().join("scripts/install.sh"))
        .arg("--help")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}");
    let last = out.lines().last().unwrap_or_default();
    assert!(
        out.contains("Usage: scripts/install.sh [--prefix DIR] [--no-build]"),
        "{out}"
    );
    assert_eq!(
        last, "Honours CARGO_TARGET_DIR (reuses an existing build).",
        "{out}"
    );
    assert!(!out.contains("set -e") && !out.contains("#!"), "{out}");
}

#[test]
fn library_found_after_install_into_a_temporary_prefix_and_reinstall_is_safe() {
    let prefix = tmpdir("install");
    let install = || {
        let o = Command::new(repo_root().join("scripts/install.sh"))
            .arg("--prefix")
            .arg(prefix.path())
            .env("CARGO_TARGET_DIR", cargo_target_dir())
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "install.sh failed:\n{}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    };
    install();
    let exe = prefix.join("bin/vramshim");
    let lib = prefix.join("lib/vramshim/libvramshim.so");
    assert!(exe.is_file() && lib.is_file());

    // The installed command finds the installed library without any flag or variable, and
    // keeps running a job while a second install replaces the files under it.
    let mut job = Command::new(&exe)
        .env_remove("VRAMSHIM_LIB")
        .env_remove("LD_PRELOAD")
        .args([
            "run",
            "--",
            "sh",
            "-c",
            "echo \"$LD_PRELOAD\"; read _; exit 4",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(job.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), lib.display().to_string());

    use std::os::unix::fs::MetadataExt;
    let inode_before = std::fs::metadata(&lib).unwrap().ino();
    install();
    let inode_after = std::fs::metadata(&lib).unwrap().ino();
    assert_ne!(
        inode_before, inode_after,
        "a reinstall must replace the file (rename), not rewrite it in place"
    );
    drop(job.stdin.take()); // EOF: the job's `read` returns
    let deadline = Instant::now() + Duration::from_secs(30);
    while job.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        job.wait().unwrap().code(),
        Some(4),
        "the job running during the reinstall survives"
    );

    let o = Command::new(&exe)
        .env_remove("VRAMSHIM_LIB")
        .env_remove("LD_PRELOAD")
        .args(["run", "--", "sh", "-c", "echo \"$LD_PRELOAD\""])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        lib.display().to_string()
    );
    let _ = std::fs::remove_dir_all(&prefix);
}

/// A small CUDA program (cudart through dlopen, so it needs no headers): four 1 MiB
/// cudaMalloc, then their cudaFree; exit 2 when an allocation fails.
fn cuda_program() -> PathBuf {
    // The directory is kept with the program (removed when the test process exits).
    static EXE: OnceLock<(vramshim_testkit::TempDir, PathBuf)> = OnceLock::new();
    EXE.get_or_init(|| {
        let dir = tmpdir("cudaprog");
        let exe = compile_c(
            &dir,
            "four",
            r#"#include <dlfcn.h>
#include <stdio.h>
#include <stddef.h>
int main(void) {
    void *h = dlopen("libcudart.so.12", RTLD_NOW);
    if (!h) { fprintf(stderr, "no libcudart.so.12: %s\n", dlerror()); return 1; }
    int (*m)(void **, size_t) = (int (*)(void **, size_t))dlsym(h, "cudaMalloc");
    int (*f)(void *) = (int (*)(void *))dlsym(h, "cudaFree");
    void *p[4] = {0};
    int rc = 0;
    for (int i = 0; i < 4; i++)
        if (m(&p[i], 1 << 20) != 0) { printf("alloc %d refused\n", i); rc = 2; break; }
    for (int i = 0; i < 4; i++)
        if (p[i]) f(p[i]);
    return rc;
}
"#,
        );
        (dir, exe)
    })
    .1
    .clone()
}

fn built_library() -> PathBuf {
    let lib = Path::new(VRAMSHIM).parent().unwrap().join("libvramshim.so");
    assert!(
        lib.is_file(),
        "{} is not built: build the workspace first (cargo build --release --workspace, as scripts/test does)",
        lib.display()
    );
    lib
}

#[test]
fn traced_run_on_the_simulated_gpu_reports_the_trace_and_a_summary() {
    built_library();
    let dir = tmpdir("traced");
    let o = vramshim()
        .env_remove("VRAMSHIM_LIB")
        .env(
            "VRAMSIM_NAME",
            format!("vramshim-run-test-{}", std::process::id()),
        )
        .current_dir(&dir)
        .args(["run", "--sim", "--trace", "t-%p.vramtrace", "--"])
        .arg(cuda_program())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let traces: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "vramtrace"))
        .collect();
    assert_eq!(traces.len(), 1, "one trace written: {traces:?}\n{err}");
    let name = traces[0]
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert!(
        err.contains("vramshim: trace: ") && err.contains(&name),
        "{err}"
    );
    assert!(
        err.contains("4 allocations (4.00 MiB)") || err.contains("4 allocations ("),
        "{err}"
    );
    assert!(err.contains("peak in use"), "{err}");
    assert!(err.contains("at exit"), "{err}");
}

/// A trace path the library refuses (a symbolic link, which it never follows; a file of the
/// user's that is no earlier trace) is left as it was and the program runs untraced: the
/// launcher then lists no trace (it listed the link's target, or the other file, as "the
/// trace", and tried to summarize it), and an earlier trace that the run replaces is listed.
#[test]
fn a_refused_trace_path_is_not_reported_as_the_runs_trace() {
    built_library();
    let dir = tmpdir("refused-trace");
    std::fs::write(dir.join("target.txt"), "secret\n").unwrap();
    std::os::unix::fs::symlink("target.txt", dir.join("link.vramtrace")).unwrap();
    std::fs::write(dir.join("notes.txt"), "not a trace\n").unwrap();
    let run = |path: &str| {
        let o = vramshim()
            .env_remove("VRAMSHIM_LIB")
            .env(
                "VRAMSIM_NAME",
                format!("vramshim-run-refused-{}", std::process::id()),
            )
            .current_dir(&dir)
            .args(["run", "--sim", "--trace", path, "--"])
            .arg(cuda_program())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert_eq!(o.status.code(), Some(0), "{err}");
        err
    };
    for (path, why) in [
        ("link.vramtrace", "symbolic link"),
        ("notes.txt", "not an earlier output"),
    ] {
        let err = run(path);
        assert!(err.contains(why), "the library's line: {err}");
        assert!(
            !err.contains("vramshim: trace: ") && !err.contains("cannot summarize"),
            "{path} listed as the run's trace:\n{err}"
        );
        assert!(err.contains("vramshim: no trace was written at"), "{err}");
    }
    assert_eq!(
        std::fs::read_to_string(dir.join("target.txt")).unwrap(),
        "secret\n"
    );
    // An earlier trace at the path is the run's to replace, and is listed.
    let first = run("t.vramtrace");
    assert!(first.contains("vramshim: trace: "), "{first}");
    let again = run("t.vramtrace");
    assert!(again.contains("vramshim: trace: "), "{again}");
    assert!(again.contains("peak in use"), "{again}");
}

#[test]
fn the_cap_flag_reaches_the_library() {
    built_library();
    let o = vramshim()
        .env_remove("VRAMSHIM_LIB")
        .env(
            "VRAMSIM_NAME",
            format!("vramshim-run-cap-{}", std::process::id()),
        )
        // The simulated context takes no memory, so the cap is about the 1 MiB blocks only.
        .env("VRAMSIM_CONTEXT_OVERHEAD", "0")
        .args(["run", "--sim", "--cap", "2MiB", "--"])
        .arg(cuda_program())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(2),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // 1 MiB blocks are packed two to a 2 MiB page by the driver, and the cap charges the
    // device's footprint: the first takes a page; the second could share it, but the cap
    // cannot know where the driver will put it and reserves a page of its own, which a
    // 2 MiB cap has no room for.
    assert!(
        out.contains("alloc 1 refused"),
        "the second 1 MiB allocation may need a second page, over a 2 MiB cap: {out}"
    );
}

/// A signal that lands after the child was reaped reaches no process that got the child's
/// pid since: the launcher signals through a pidfd. `VRAMSHIM_RUN_FAULT=late-clear` keeps the
/// launcher forwarding for 3 s after the reap (the window held open); in a pid namespace of
/// its own (tests/data/pid_reuse.c) a decoy is given the child's pid and the launcher gets
/// SIGTERM. Where no pid namespace can be made (neither as root nor in a user namespace), it
/// says so and checks nothing, unless `VRAMSHIM_REQUIRE_PIDNS=1` (`.ci/run` sets it): then it
/// fails.
#[test]
fn a_signal_after_the_child_was_reaped_reaches_no_other_process() {
    let dir = tmpdir("pid-reuse");
    let exe = compile_c(&dir, "pid_reuse", include_str!("data/pid_reuse.c"));
    let mut child = Command::new(&exe)
        .arg(VRAMSHIM)
        .env("VRAMSHIM_LIB", empty_so("libvramshim.so"))
        .env_remove("LD_PRELOAD")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let end = Instant::now() + Duration::from_secs(90);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < end, "pid_reuse did not finish in 90 s");
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut out).unwrap();
    if status.code() == Some(77) {
        let required = std::env::var("VRAMSHIM_REQUIRE_PIDNS").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "VRAMSHIM_REQUIRE_PIDNS=1 but no pid namespace could be made (root, or unprivileged user namespaces, are needed): {out}"
        );
        eprintln!("not checked: {out}");
        return;
    }
    assert!(
        status.success() && out.contains("untouched"),
        "{status:?}: {out}"
    );
}

/// A library installed under a path with a space (or a colon): the loader splits `LD_PRELOAD`
/// there and loads the path's first part instead, a name any other user may create when it
/// lies in `/tmp`, and the job runs that file's code without vramshim. Refused with one line
/// naming the path; the file planted at the first part never runs.
#[test]
fn a_library_path_the_loader_would_split_is_refused() {
    let d = tmpdir("split");
    let mark = d.join("planted-code-ran");
    let src = d.join("planted.c");
    std::fs::write(
        &src,
        format!(
            "#include <fcntl.h>\n__attribute__((constructor)) static void planted(void) {{ open({:?}, O_CREAT | O_WRONLY, 0600); }}\n",
            mark.display().to_string()
        ),
    )
    .unwrap();
    for (dir, planted) in [("my tools", "my"), ("a:b", "a")] {
        let st = Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(d.join(planted))
            .arg(&src)
            .status()
            .unwrap();
        assert!(st.success());
        std::fs::create_dir(d.join(dir)).unwrap();
        let lib = d.join(dir).join("libvramshim.so");
        std::fs::copy(empty_so("libvramshim.so"), &lib).unwrap();
        let (rc, _, err) = output(
            vramshim()
                .env("VRAMSHIM_LIB", &lib)
                .args(["run", "--", "true"]),
        );
        assert!(
            !mark.exists(),
            "the file planted at {planted} ran in the job"
        );
        assert_eq!(rc, 2, "{err}");
        assert!(
            err.contains("separator in LD_PRELOAD")
                && err.contains(dir)
                && err.lines().count() == 1,
            "{err}"
        );
    }
}

/// The Python hook's directory (first on a traced job's `PYTHONPATH`) is made in the user's
/// runtime directory when that is private: the name stays on the `PYTHONPATH` of whatever the
/// job leaves running after the directory is removed, and in a world-writable `$TMPDIR`
/// another user could create it then. An `XDG_RUNTIME_DIR` open to others is not used.
#[test]
fn the_python_hook_lives_in_the_private_runtime_directory() {
    use std::os::unix::fs::PermissionsExt;
    let d = tmpdir("xdg");
    let (private, open, tmp) = (d.join("run"), d.join("open"), d.join("tmp"));
    for (dir, mode) in [(&private, 0o700), (&open, 0o777), (&tmp, 0o700)] {
        std::fs::create_dir(dir).unwrap();
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    for (xdg, parent) in [(&private, &private), (&open, &tmp)] {
        let (rc, out, err) = output(
            vramshim()
                .env("XDG_RUNTIME_DIR", xdg)
                .env("TMPDIR", &tmp)
                .arg("run")
                .arg("--trace")
                .arg(d.join("t.vramtrace"))
                .args(["--", "sh", "-c", "echo \"$PYTHONPATH\""]),
        );
        assert_eq!(rc, 0, "{err}");
        let hook = Path::new(out.trim().split(':').next().unwrap());
        assert_eq!(hook.parent(), Some(parent.as_path()), "{out}");
        assert!(
            hook.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("vramshim-pyhook-"),
            "{out}"
        );
        // removed when the job ended
        assert!(!hook.exists(), "{}", hook.display());
    }
}
