//! The trace path under attack (docs/threat-model.md): a FIFO, a symbolic link or a file that
//! is not a trace at `VRAMSHIM_TRACE`, planted by the job's own user or by another user, in a
//! sticky world-writable directory like /tmp; and FIFOs planted at the `%p` name a job will
//! use. The job must complete (bounded wait), nothing planted may be followed, blocked on or
//! overwritten, and the library says so in one line with tracing off.
//!
//! The jobs run as root and as `nobody` (the tests run as root in CI; as another user they
//! skip with a message). `hostile_path_tests_catch_a_naive_open` runs the same plants with
//! `VRAMSHIM_TRACE_FAULT=unsafe-open` (the trace opened the naive way) and shows that every
//! one of them then does damage, so the checks here can fail.

use std::ffi::CString;
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use vramshim_testkit::users::{ROOT, User, as_user, nobody, root_or_skip, sticky_dir};
use vramshim_testkit::{Link, compile_c, interposer_lib, preload, sim_command, temp_dir};
use vramshim_trace_tests::{read, source};

/// A generous bound for a job that takes well under a second: a hang is forever.
const JOB_BOUND: Duration = Duration::from_secs(120);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plant {
    Fifo,
    /// A symbolic link to a file of the job's user.
    Symlink,
    /// A regular file that is not a trace.
    NotATrace,
}

const PLANTS: [Plant; 3] = [Plant::Fifo, Plant::Symlink, Plant::NotATrace];
const PRECIOUS: &str = "precious: not a trace\n";

/// `who` plants `what` at `path` (a symbolic link points at `victim`).
fn plant(who: User, what: Plant, path: &Path, victim: &Path) {
    let script = match what {
        Plant::Fifo => "mkfifo -m 666 \"$1\"",
        Plant::Symlink => "ln -s \"$2\" \"$1\"",
        Plant::NotATrace => "printf 'precious: not a trace\\n' > \"$1\" && chmod 666 \"$1\"",
    };
    let st = as_user(
        Command::new("sh")
            .args(["-c", script, "sh"])
            .arg(path)
            .arg(victim),
        who,
    )
    .status()
    .unwrap();
    assert!(
        st.success(),
        "{} could not plant {what:?} at {path:?}",
        who.name
    );
}

/// A file of `owner` holding [`PRECIOUS`], for a symbolic link to point at.
fn victim(dir: &Path, owner: User) -> PathBuf {
    let v = dir.join(format!("victim-of-{}", owner.name));
    std::fs::write(&v, PRECIOUS).unwrap();
    std::fs::set_permissions(&v, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::os::unix::fs::chown(&v, Some(owner.uid), Some(owner.gid)).unwrap();
    v
}

fn workload() -> PathBuf {
    compile_c(
        "trace_basic",
        &[&source("trace_basic.c")],
        Link::SharedRuntime,
    )
}

fn traced(exe: &Path, pattern: &Path, who: User, fault: bool, tag: &str) -> Command {
    let mut cmd = sim_command(exe, tag);
    preload(&mut cmd, &interposer_lib()).env("VRAMSHIM_TRACE", pattern);
    if fault {
        cmd.env("VRAMSHIM_TRACE_FAULT", "unsafe-open");
    }
    as_user(&mut cmd, who);
    cmd.stdout(Stdio::null()).stderr(Stdio::piped());
    cmd
}

/// Removes the simulated device a job of `who` left in /dev/shm (`scripts/test` sweeps only
/// its own user's).
fn forget_device(cmd: &Command, who: User) {
    if let Some(Some(name)) = cmd
        .get_envs()
        .find(|(k, _)| *k == "VRAMSIM_NAME")
        .map(|(_, v)| v)
    {
        let f = format!("/dev/shm/vramsim-{}-{}", who.uid, name.to_string_lossy());
        let _ = std::fs::remove_file(f);
    }
}

/// How a job ended.
#[derive(Debug)]
enum End {
    Exited {
        ok: bool,
        stderr: String,
    },
    /// Still running at the bound (killed then).
    Hung,
}

/// Waits for `child` up to `bound`; kills it past that.
fn wait_bounded(mut child: Child, bound: Duration) -> End {
    let t0 = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            let mut stderr = String::new();
            std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
            return End::Exited {
                ok: st.success(),
                stderr,
            };
        }
        if t0.elapsed() > bound {
            let _ = child.kill();
            let _ = child.wait();
            return End::Hung;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// True once some process holds the FIFO open for reading (or waits in its open): what a
/// naive trace open does before it blocks for good.
fn fifo_has_reader(p: &Path) -> bool {
    let c = CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path; the descriptor is closed at once.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_WRONLY | libc::O_NONBLOCK) };
    if fd >= 0 {
        // SAFETY: our own descriptor.
        unsafe { libc::close(fd) };
    }
    fd >= 0
}

/// What the plant looks like after the job: unchanged?
fn plant_intact(what: Plant, path: &Path, victim: &Path) -> Result<(), String> {
    let m = std::fs::symlink_metadata(path).map_err(|e| format!("{path:?}: {e}"))?;
    match what {
        Plant::Fifo if m.file_type().is_fifo() => Ok(()),
        Plant::Symlink if m.file_type().is_symlink() => {
            let v = std::fs::read(victim).unwrap();
            if v == PRECIOUS.as_bytes() {
                Ok(())
            } else {
                Err(format!(
                    "the symlink's target {victim:?} was written ({} bytes)",
                    v.len()
                ))
            }
        }
        Plant::NotATrace if m.file_type().is_file() => {
            let v = std::fs::read(path).unwrap();
            if v == PRECIOUS.as_bytes() {
                Ok(())
            } else {
                Err(format!("{path:?} was overwritten ({} bytes)", v.len()))
            }
        }
        _ => Err(format!("{path:?} was replaced: now {:?}", m.file_type())),
    }
}

/// The one line the library must print for a refused path, and its reason.
fn assert_one_line(stderr: &str, path: &Path, what: Plant, planter: User, job: User) {
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("VRAMSHIM_TRACE"))
        .collect();
    assert_eq!(lines.len(), 1, "want one line, got:\n{stderr}");
    let l = lines[0];
    assert!(
        l.contains(&path.display().to_string()) && l.contains("tracing is off"),
        "{l}"
    );
    let why = if planter != job {
        // Another user's entry: refused as a symlink/FIFO before its owner is looked at.
        match what {
            Plant::Fifo => "a FIFO",
            Plant::Symlink => "symbolic link",
            Plant::NotATrace => "belongs to uid",
        }
    } else {
        match what {
            Plant::Fifo => "a FIFO",
            Plant::Symlink => "symbolic link",
            Plant::NotATrace => "not overwritten",
        }
    };
    assert!(l.contains(why), "want {why:?} in: {l}");
}

/// Every plant at a fixed trace path, by the job's user and by the other user; returns what
/// went wrong (empty: all protected).
fn plants_at_a_fixed_path(job: User, fault: bool) -> Vec<String> {
    let other = if job == ROOT { nobody() } else { ROOT };
    let exe = workload();
    let mut bad = Vec::new();
    for planter in [job, other] {
        for what in PLANTS {
            let tag = format!("hostile-{}-{}-{what:?}", job.name, planter.name);
            let dir = sticky_dir(&tag);
            let v = victim(&dir, job);
            let path = dir.join("job.vramtrace");
            plant(planter, what, &path, &v);
            let mut cmd = traced(&exe, &path, job, fault, &tag);
            let child = cmd.spawn().unwrap();
            let case = format!(
                "{what:?} planted by {} for {}'s job",
                planter.name, job.name
            );
            let end = if fault && what == Plant::Fifo {
                // The naive open waits for a writer forever: once it reads the FIFO, the hang
                // is shown (no need to wait out the bound).
                let t0 = Instant::now();
                while !fifo_has_reader(&path) && t0.elapsed() < JOB_BOUND {
                    std::thread::sleep(Duration::from_millis(20));
                }
                std::thread::sleep(Duration::from_millis(500));
                wait_bounded(child, Duration::ZERO)
            } else {
                wait_bounded(child, JOB_BOUND)
            };
            match end {
                End::Hung => bad.push(format!("{case}: the job hung")),
                End::Exited { ok: false, stderr } => {
                    bad.push(format!("{case}: the job failed:\n{stderr}"))
                }
                End::Exited { ok: true, stderr } => {
                    if let Err(e) = plant_intact(what, &path, &v) {
                        bad.push(format!("{case}: {e}"));
                    } else if !fault {
                        assert_one_line(&stderr, &path, what, planter, job);
                    }
                }
            }
            forget_device(&cmd, job);
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    bad
}

#[test]
fn plants_at_the_trace_path_are_never_followed_blocked_on_or_overwritten_root_job() {
    if !root_or_skip("root_job") {
        return;
    }
    let bad = plants_at_a_fixed_path(ROOT, false);
    assert!(bad.is_empty(), "{bad:#?}");
}

#[test]
fn plants_at_the_trace_path_are_never_followed_blocked_on_or_overwritten_nobody_job() {
    if !root_or_skip("nobody_job") {
        return;
    }
    let bad = plants_at_a_fixed_path(nobody(), false);
    assert!(bad.is_empty(), "{bad:#?}");
}

/// The tests above can fail: with the trace opened the naive way, every plant does damage
/// (the FIFO hangs the job, the symlink's target and the other file are overwritten).
#[test]
fn hostile_path_tests_catch_a_naive_open() {
    if !root_or_skip("naive_open") {
        return;
    }
    let bad = plants_at_a_fixed_path(ROOT, true);
    assert_eq!(bad.len(), 6, "every plant must do damage: {bad:#?}");
    for what in ["Fifo", "Symlink", "NotATrace"] {
        assert_eq!(
            bad.iter().filter(|b| b.starts_with(what)).count(),
            2,
            "{bad:#?}"
        );
    }
}

/// An earlier trace of the job's own user is replaced (the normal case stays normal).
#[test]
fn an_earlier_trace_of_ours_is_replaced() {
    let exe = workload();
    let dir = temp_dir("hostile-replace");
    let path = dir.join("job.vramtrace");
    for round in 0..2 {
        let mut cmd = traced(&exe, &path, ROOT, false, "hostile-replace");
        // As whoever runs the tests.
        // SAFETY: getuid/getgid have no preconditions.
        let me = unsafe { (libc::getuid(), libc::getgid()) };
        let cmd = as_user(
            &mut cmd,
            User {
                uid: me.0,
                gid: me.1,
                name: "me",
            },
        );
        match wait_bounded(cmd.spawn().unwrap(), JOB_BOUND) {
            End::Exited { ok: true, stderr } => {
                assert!(
                    !stderr.contains("VRAMSHIM_TRACE"),
                    "round {round}: {stderr}"
                )
            }
            e => panic!("round {round}: {e:?}"),
        }
        let r = read(&path);
        assert!(r.end.is_some(), "round {round}");
    }
}

/// Another user plants FIFOs at the `%p` name the job will use, in a sticky directory: the
/// job learns its pid only when it runs, so the plant happens after the job has started
/// (held in a shell that execs the workload, keeping its pid) and before its first CUDA call.
fn fifo_at_the_pid_name(job: User, fault: bool) -> Result<(), String> {
    let planter = if job == ROOT { nobody() } else { ROOT };
    let exe = workload();
    let tag = format!("hostile-pid-{}", job.name);
    let dir = sticky_dir(&tag);
    let pattern = dir.join("job-%p.vramtrace");
    let mut cmd = traced(Path::new("sh"), &pattern, job, fault, &tag);
    cmd.args(["-c", "read _ && exec \"$0\""])
        .arg(&exe)
        .stdin(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let path = dir.join(format!("job-{}.vramtrace", child.id()));
    plant(planter, Plant::Fifo, &path, Path::new("/"));
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let end = if fault {
        let t0 = Instant::now();
        while !fifo_has_reader(&path) && t0.elapsed() < JOB_BOUND {
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(500));
        wait_bounded(child, Duration::ZERO)
    } else {
        wait_bounded(child, JOB_BOUND)
    };
    let r = match end {
        End::Hung => Err(format!("{}'s job hung on the FIFO at {path:?}", job.name)),
        End::Exited { ok: false, stderr } => Err(format!("the job failed:\n{stderr}")),
        End::Exited { ok: true, stderr } => {
            plant_intact(Plant::Fifo, &path, Path::new("/"))?;
            assert_one_line(&stderr, &path, Plant::Fifo, planter, job);
            Ok(())
        }
    };
    forget_device(&cmd, job);
    let _ = std::fs::remove_dir_all(&dir);
    r
}

#[test]
fn a_fifo_planted_at_the_pid_name_never_blocks_the_job() {
    if !root_or_skip("pid_fifo") {
        return;
    }
    for job in [ROOT, nobody()] {
        if let Err(e) = fifo_at_the_pid_name(job, false) {
            panic!("{e}");
        }
    }
}

/// The test above can fail: opened the naive way, the planted FIFO hangs the job.
#[test]
fn pid_fifo_test_catches_a_naive_open() {
    if !root_or_skip("pid_fifo_naive") {
        return;
    }
    let e = fifo_at_the_pid_name(ROOT, true).expect_err("the naive open must hang");
    assert!(e.contains("hung"), "{e}");
}
