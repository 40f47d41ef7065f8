//! The `vramshim` command on a machine shared with a hostile user (docs/threat-model.md):
//! - the demo never runs a program another user planted, nor writes through their symlink,
//!   in the temp directory (the work directory is private and fresh);
//! - an output (`-o`) that is a symlink, a FIFO or another user's file is refused with one
//!   line and a non-zero exit, promptly, and left as it was.
//!
//! Run as root (CI) with `nobody` as the other user, and the other way round; as another
//! user the tests skip with a message. The `*_catch_*` tests run the same plants with
//! `VRAMSHIM_FILES_FAULT=unsafe` (the checks off) and show the damage, so these tests can fail.

use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use vramshim_testkit::users::{ROOT, User, as_user, nobody, root_or_skip, sticky_dir};

const VRAMSHIM: &str = env!("CARGO_BIN_EXE_vramshim");
const REPLAY_C: &str = include_str!("../../tests/workloads/replay/replay.c");
const CUDA_API_H: &str = include_str!("../../tests/workloads/include/cuda_api.h");
const PRECIOUS: &[u8] = b"precious\n";

fn sh_as(who: User, script: &str, args: &[&Path]) {
    let st = as_user(
        Command::new("sh").args(["-c", script, "sh"]).args(args),
        who,
    )
    .status()
    .unwrap();
    assert!(st.success(), "{} could not run {script}", who.name);
}

/// The demo's cache name for its replay program (what another user can compute too): on the
/// simulated GPU it links against the simulator's `libcudart.so.12`.
fn replay_hash(link_dir: &Path) -> String {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in REPLAY_C
        .bytes()
        .chain(CUDA_API_H.bytes())
        .chain(link_dir.to_string_lossy().bytes())
        .chain("libcudart.so.12".bytes())
    {
        h = (h ^ b as u64).wrapping_mul(0x100000001b3);
    }
    format!("replay-{h:016x}")
}

/// `planter` sets the trap a demo with a fixed work directory would walk into: that directory,
/// open to all, with a replay program that touches `marker` and the demo's log as a symlink
/// to a file of `job`. Runs the demo; returns what went wrong (empty: nothing).
fn demo_plant(job: User, fault: bool) -> Vec<String> {
    let planter = if job == ROOT { nobody() } else { ROOT };
    let tmp = sticky_dir(&format!("demo-{}-{fault}", job.name));
    let marker = tmp.join("marker");
    let victim = tmp.join("victim");
    std::fs::write(&victim, PRECIOUS).unwrap();
    std::os::unix::fs::chown(&victim, Some(job.uid), Some(job.gid)).unwrap();
    let sim = std::fs::canonicalize(Path::new(VRAMSHIM).parent().unwrap())
        .unwrap()
        .join("cuda-sim");
    let work = tmp.join(format!("vramshim-demo-{}", job.uid));
    let bin_dir = work.join(replay_hash(&sim));
    sh_as(
        planter,
        "mkdir -m 777 \"$1\" && mkdir -m 777 \"$2\" && printf '#!/bin/sh\\ntouch \"%s\"\\n' \"$3\" > \"$2/replay\" \
         && chmod 755 \"$2/replay\" && ln -s \"$4\" \"$1/vit_train.rmm.csv\"",
        &[&work, &bin_dir, &marker, &victim],
    );
    let out = tmp.join(format!("demo-{}.html", job.name));
    let mut cmd = Command::new(VRAMSHIM);
    cmd.args(["demo", "--sim", "-o"])
        .arg(&out)
        .current_dir(&tmp)
        .env("TMPDIR", &tmp)
        .env_remove("VRAMSHIM_FILES_FAULT")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if fault {
        cmd.env("VRAMSHIM_FILES_FAULT", "unsafe");
    }
    let o = as_user(&mut cmd, job).output().unwrap();
    let mut bad = Vec::new();
    if marker.exists() {
        bad.push(format!(
            "the demo of {} ran {}'s program",
            job.name, planter.name
        ));
    }
    if std::fs::read(&victim).unwrap() != PRECIOUS {
        bad.push(format!(
            "the demo of {} wrote through {}'s symlink",
            job.name, planter.name
        ));
    }
    if !fault && !o.status.success() {
        bad.push(format!(
            "the demo failed:\n{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    let _ = std::fs::remove_dir_all(&tmp);
    bad
}

#[test]
fn the_demo_never_runs_or_writes_through_what_another_user_planted() {
    if !root_or_skip("demo_plant") {
        return;
    }
    for job in [ROOT, nobody()] {
        let bad = demo_plant(job, false);
        assert!(bad.is_empty(), "{bad:#?}");
    }
}

/// The test above can fail: with the checks off the demo uses the planted directory, runs
/// the planted program and writes its log through the planted symlink.
#[test]
fn demo_plant_test_catches_a_shared_work_directory() {
    if !root_or_skip("demo_plant_fault") {
        return;
    }
    let bad = demo_plant(ROOT, true);
    assert_eq!(bad.len(), 2, "{bad:#?}");
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plant {
    Symlink,
    Fifo,
    /// A regular file of the other user.
    Foreign,
}

/// `vramshim synth -o P` with `what` planted at P by the other user; returns what went wrong.
fn output_plant(job: User, what: Plant, fault: bool) -> Option<String> {
    let planter = if job == ROOT { nobody() } else { ROOT };
    let tmp = sticky_dir(&format!("out-{}-{what:?}-{fault}", job.name));
    let victim = tmp.join("victim");
    std::fs::write(&victim, PRECIOUS).unwrap();
    std::os::unix::fs::chown(&victim, Some(job.uid), Some(job.gid)).unwrap();
    let p = tmp.join("out.vramtrace");
    let script = match what {
        Plant::Symlink => "ln -s \"$2\" \"$1\"",
        Plant::Fifo => "mkfifo -m 666 \"$1\"",
        Plant::Foreign => "printf 'precious\\n' > \"$1\" && chmod 666 \"$1\"",
    };
    sh_as(planter, script, &[&p, &victim]);
    let mut cmd = Command::new(VRAMSHIM);
    cmd.args(["synth", "--events", "1000", "-o"])
        .arg(&p)
        .env_remove("VRAMSHIM_FILES_FAULT")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if fault {
        cmd.env("VRAMSHIM_FILES_FAULT", "unsafe");
    }
    let mut child = as_user(&mut cmd, job).spawn().unwrap();
    // A hang is forever; the command takes well under a second.
    let bound = if fault && what == Plant::Fifo {
        Duration::from_secs(10)
    } else {
        Duration::from_secs(120)
    };
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if t0.elapsed() > bound {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let case = format!("{what:?} by {} at {}'s output", planter.name, job.name);
    let r = (|| {
        let Some(st) = status else {
            return Some(format!("{case}: hung"));
        };
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
        let m = std::fs::symlink_metadata(&p).unwrap();
        let intact = match what {
            Plant::Symlink => {
                m.file_type().is_symlink() && std::fs::read(&victim).unwrap() == PRECIOUS
            }
            Plant::Fifo => m.file_type().is_fifo(),
            Plant::Foreign => std::fs::read(&p).unwrap() == PRECIOUS,
        };
        if !intact {
            return Some(format!("{case}: written through"));
        }
        if st.success() {
            return Some(format!("{case}: exit 0 without writing"));
        }
        let why = match what {
            Plant::Symlink => "symbolic link",
            Plant::Fifo => "a FIFO",
            Plant::Foreign => "belongs to uid",
        };
        let lines: Vec<&str> = stderr.lines().collect();
        if lines.len() != 1 || !lines[0].contains(why) || !lines[0].contains("out.vramtrace") {
            return Some(format!(
                "{case}: want one line naming the path and {why:?}: {stderr}"
            ));
        }
        None
    })();
    let _ = std::fs::remove_dir_all(&tmp);
    r
}

#[test]
fn outputs_refuse_symlinks_fifos_and_other_users_files() {
    if !root_or_skip("output_plant") {
        return;
    }
    let mut bad = Vec::new();
    for job in [ROOT, nobody()] {
        for what in [Plant::Symlink, Plant::Fifo, Plant::Foreign] {
            bad.extend(output_plant(job, what, false));
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
}

/// The test above can fail: with the checks off, root's output goes through the symlink and
/// into nobody's file, and blocks on the FIFO.
#[test]
fn output_plant_test_catches_a_naive_open() {
    if !root_or_skip("output_plant_fault") {
        return;
    }
    for what in [Plant::Symlink, Plant::Fifo, Plant::Foreign] {
        let r = output_plant(ROOT, what, true);
        let want = if what == Plant::Fifo {
            "hung"
        } else {
            "written through"
        };
        assert!(
            r.as_deref().is_some_and(|r| r.contains(want)),
            "{what:?}: {r:?}"
        );
    }
}

/// An own regular file is replaced, as any `-o` does.
#[test]
fn an_own_output_file_is_replaced() {
    let tmp = sticky_dir("own");
    let p = tmp.join("out.vramtrace");
    std::fs::write(&p, PRECIOUS).unwrap();
    let o = Command::new(VRAMSHIM)
        .args(["synth", "--events", "1000", "-o"])
        .arg(&p)
        .env_remove("VRAMSHIM_FILES_FAULT")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        std::fs::read(&p)
            .unwrap()
            .starts_with(&vramshim_trace::MAGIC)
    );
    let _ = std::fs::remove_dir_all(&tmp);
}
