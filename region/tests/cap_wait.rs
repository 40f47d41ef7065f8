//! `VRAMSHIM_ON_CAP=wait`, end to end: real C programs (tests/workloads/cap/cap_probe.c,
//! `waitpair`) sharing one cap under `LD_PRELOAD=libvramshim.so` on the simulated GPU.
//!
//! Needs the workspace built (`cargo build --release -p vramshim-interposer -p
//! vramshim-analyzer -p vramsim-driver -p vramsim-nvml -p vramsim-runtime12 -p
//! vramsim-runtime13 -p vramsim-runtime-static`). No test measures time: a wait that should
//! end at once runs with a timeout of minutes and the test's deadline (far shorter) catches
//! a hang. `VRAMSHIM_TEST_WAIT_FAULT=F` sets `VRAMSHIM_CAP_FAULT=F` in every member (to see
//! the tests fail with a property broken: `no-wait`, `wait-deadlock`, `no-reclaim`).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use vramshim_region::Region;
use vramshim_testkit::{interposer_lib, run, sim_command, unique_name};
use vramshim_trace::{Event, TraceReader, flags};

mod common;
use common::{GIB, MIB, probe};

/// Far longer than any test below may take: a wait that does not end at once hangs.
const LONG: &str = "wait:600s";
/// What a test allows before calling it a hang.
const DEADLINE: Duration = Duration::from_secs(120);

fn uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(0)
}

/// A group of processes sharing a 1 GiB cap on one simulated device.
struct Group {
    sim: String,
    shared: String,
    region: PathBuf,
    dir: vramshim_testkit::TempDir,
}

/// A member started by [`Group::start`], its output read line by line by a thread (so that
/// the test's deadline holds while it waits for a line).
struct Member {
    child: Child,
    out: Receiver<String>,
    lines: Vec<String>,
}

impl Member {
    /// Waits for a stdout line starting with `prefix` (the member reached that point), at
    /// most [`DEADLINE`]: a member that never gets there hangs, and fails the test.
    fn until(&mut self, prefix: &str) -> String {
        let end = Instant::now() + DEADLINE;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let Ok(l) = self.out.recv_timeout(left) else {
                let _ = self.child.kill();
                panic!(
                    "the member did not print {prefix:?} within {DEADLINE:?}: it hangs or died ({:?})",
                    self.lines
                );
            };
            self.lines.push(l.clone());
            if l.starts_with(prefix) {
                return l;
            }
        }
    }

    /// Waits for the end (a deadline: a hang fails the test), returns its stderr.
    fn finish(mut self, deadline: Instant) -> String {
        use std::io::Read;
        loop {
            if self.child.try_wait().expect("wait").is_some() {
                break;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!(
                    "a member did not finish in time: it hangs ({:?})",
                    self.lines
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        let status = self.child.wait().expect("status");
        assert!(status.success(), "member failed: {status}\n{err}");
        err
    }
}

/// A member left running by a failed test (it may wait for a file never written, or for
/// ten minutes) is killed with it.
impl Drop for Member {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Group {
    fn new(tag: &str) -> Group {
        let shared = unique_name(tag);
        let region = vramshim_region::spec::shared_path(&shared, uid()).unwrap();
        let dir = vramshim_testkit::TempDir::new(tag);
        Group {
            sim: unique_name(tag),
            shared,
            region,
            dir,
        }
    }

    fn start(&self, args: &[&str], env: &[(&str, &str)]) -> Member {
        self.start_as(probe(), args, env)
    }

    /// The probe under `vramshim run --on-cap ON_CAP` (the launcher's flag).
    fn start_run(&self, on_cap: &str, args: &[&str]) -> Member {
        let probe = probe();
        let mut a = vec!["run", "--on-cap", on_cap, "--", probe.to_str().unwrap()];
        a.extend_from_slice(args);
        self.start_as(vramshim_testkit::vramshim_exe(), &a, &[])
    }

    fn start_as(&self, exe: PathBuf, args: &[&str], env: &[(&str, &str)]) -> Member {
        let mut c = sim_command(exe, "unused");
        c.env("VRAMSIM_NAME", &self.sim)
            .env("VRAMSIM_CONTEXT_OVERHEAD", "0")
            .env("LD_PRELOAD", interposer_lib())
            .env("VRAMSHIM_CAP", GIB.to_string())
            .env("VRAMSHIM_SHARED", &self.shared)
            .env("VRAMSHIM_REGISTRY", "off")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // Break a property on purpose in every member, to see the tests catch it.
        if let Ok(f) = std::env::var("VRAMSHIM_TEST_WAIT_FAULT") {
            c.env("VRAMSHIM_CAP_FAULT", f);
        }
        for (k, v) in env {
            c.env(k, v);
        }
        let mut child = c.spawn().expect("spawn cap_probe");
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (tx, out) = channel();
        std::thread::spawn(move || {
            for l in stdout.lines().map_while(Result::ok) {
                if tx.send(l.trim().to_string()).is_err() {
                    break;
                }
            }
        });
        Member {
            child,
            out,
            lines: Vec::new(),
        }
    }

    /// Waits until `n` live members of the group have a request waiting (as `top` sees it).
    fn until_waiting(&self, n: usize) {
        let end = Instant::now() + DEADLINE;
        loop {
            if let Ok(r) = Region::open(&self.region) {
                let w = r
                    .snapshot()
                    .processes
                    .iter()
                    .filter(|p| p.alive && p.waiting != 0)
                    .count();
                if w >= n {
                    return;
                }
            }
            assert!(Instant::now() < end, "no member started waiting");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn device(&self) -> vramsim_devstate::DeviceState {
        vramsim_devstate::DeviceState::open(&self.sim).expect("simulated device region")
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.region);
        let _ = std::fs::remove_file(vramsim_devstate::DeviceState::path(&self.sim));
    }
}

fn field(line: &str, key: &str) -> i64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
}

/// The flags and result of the allocations of `size` bytes in a trace.
fn allocs_of(trace: &std::path::Path, size: u64) -> Vec<(u8, i32)> {
    let mut r = TraceReader::open(trace).expect("trace");
    let mut ev = Event::Lost { t_ns: 0, count: 0 };
    let mut out = Vec::new();
    while r.next_into(&mut ev).expect("decode") {
        if let Event::Alloc(m) = &ev
            && m.size == size
        {
            out.push((m.flags, m.result));
        }
    }
    out
}

/// One member holds 800 MiB of the 1 GiB cap for a while; another's 500 MiB request waits
/// and is served once the first frees (it exits), flagged in the trace as having waited,
/// shown by `vramshim top` while it waits; the device never holds more than the cap.
/// Returns the waiter's "second" line (under `fault`, a `VRAMSHIM_CAP_FAULT` on the waiter).
fn holder_then_waiter(fault: Option<&str>) -> (String, String, Vec<(u8, i32)>) {
    let g = Group::new("wait-served");
    let go = g.dir.join("go");
    let go_s = go.to_str().unwrap().to_string();
    let mut holder = g.start(
        &["waitpair", &(800 * MIB).to_string(), "0", &go_s, "0"],
        &[],
    );
    assert_eq!(holder.until("first"), "first rc=0");
    let trace = g.dir.join("waiter.vramtrace");
    let registry = g.dir.join("registry");
    let mut env = vec![
        ("VRAMSHIM_ON_CAP", LONG),
        ("VRAMSHIM_TRACE", trace.to_str().unwrap()),
        ("VRAMSHIM_REGISTRY", registry.to_str().unwrap()),
    ];
    if let Some(f) = fault {
        env.push(("VRAMSHIM_CAP_FAULT", f));
    }
    let mut waiter = g.start(&["waitpair", "0", &(500 * MIB).to_string(), "0", "0"], &env);
    waiter.until("first");
    let mut top = String::new();
    if fault.is_none() {
        g.until_waiting(1);
        let vramshim = vramshim_testkit::vramshim_exe();
        top = run(Command::new(&vramshim).args(["top", "--once", "--name", &g.shared])).stdout;
        // The exporter's gauge (the registry is published every 200 ms).
        let gauge = format!(
            "vramshim_process_waiting_on_cap{{pid=\"{}\",",
            waiter.child.id()
        );
        let end = Instant::now() + DEADLINE;
        loop {
            let scrape = run(Command::new(&vramshim).args([
                "exporter",
                "--once",
                "--no-nvml",
                "--registry",
                registry.to_str().unwrap(),
            ]))
            .stdout;
            if scrape
                .lines()
                .any(|l| l.starts_with(&gauge) && l.ends_with(" 1"))
            {
                break;
            }
            assert!(
                Instant::now() < end,
                "the exporter never showed the wait: {scrape}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    // Without waiting (`fault`), the waiter answers at once: read its answer before the
    // holder frees, or the request could come after the free and fit.
    let refused_at_once = fault.map(|_| waiter.until("second"));
    // The holder frees (and exits): the waiter is woken and served.
    std::fs::write(&go, b"").unwrap();
    let end = Instant::now() + DEADLINE;
    let second = refused_at_once.unwrap_or_else(|| waiter.until("second"));
    waiter.finish(end);
    holder.finish(end);
    assert!(
        g.device().high_water(0) <= GIB,
        "the device never held more than the cap"
    );
    (second, top, allocs_of(&trace, 500 * MIB))
}

#[test]
fn a_request_over_a_shared_cap_waits_until_a_member_frees() {
    let (second, top, allocs) = holder_then_waiter(None);
    assert_eq!(field(&second, "rc"), 0, "{second}");
    assert_eq!(allocs.len(), 1, "{allocs:?}");
    assert_eq!(allocs[0].1, 0);
    assert!(
        allocs[0].0 & flags::WAITED_ON_CAP != 0 && allocs[0].0 & flags::CAP_REFUSED == 0,
        "{allocs:?}"
    );
    assert!(top.contains("WAITING"), "{top}");
    assert!(
        top.lines()
            .any(|l| l.contains("cap_probe") && l.trim_end().ends_with("yes")),
        "top shows the waiting member: {top}"
    );
}

/// The same with waiting switched off (`VRAMSHIM_CAP_FAULT=no-wait`): refused at once. This
/// is what the test above catches.
#[test]
fn without_waiting_the_same_request_is_refused() {
    let (second, _, allocs) = holder_then_waiter(Some("no-wait"));
    assert_eq!(field(&second, "rc"), 2, "{second}");
    assert_eq!(allocs[0].0 & flags::WAITED_ON_CAP, 0);
}

/// Both members hold 400 MiB and want 400 MiB more: the first waits (the other could still
/// free), the second is the last to wait with nobody left to free and fails at once, saying
/// so; it then exits, and the first is served. No hang (both wait up to 10 minutes, the
/// test allows 2). With the check switched off (`VRAMSHIM_TEST_WAIT_FAULT=wait-deadlock`)
/// the two wait for each other until their timeouts, and the deadline fails.
#[test]
fn when_every_member_waits_the_last_one_fails_at_once() {
    let env = [("VRAMSHIM_ON_CAP", LONG)];
    let g = Group::new("wait-all");
    let go = g.dir.join("go");
    let go_s = go.to_str().unwrap().to_string();
    let size = (400 * MIB).to_string();
    let mut last = g.start(&["waitpair", &size, &size, &go_s, "0"], &env);
    assert_eq!(last.until("first"), "first rc=0");
    // `first` holds its 400 MiB and waits for 400 more (`last` holds, and is not waiting).
    let mut first = g.start(&["waitpair", &size, &size, "0", "0"], &env);
    assert_eq!(first.until("first"), "first rc=0");
    g.until_waiting(1);
    std::fs::write(&go, b"").unwrap();
    let end = Instant::now() + DEADLINE;
    let l = last.until("second");
    assert_eq!(field(&l, "rc"), 2, "the last to wait fails: {l}");
    let err = last.finish(end);
    assert!(
        err.contains("every member of the group holding memory on the device is waiting (2 waiting, this one last)"),
        "it says why: {err}"
    );
    assert_eq!(
        err.lines().filter(|l| l.contains("refused")).count(),
        1,
        "{err}"
    );
    let f = first.until("second");
    assert_eq!(
        field(&f, "rc"),
        0,
        "the first is served once the last exits: {f}"
    );
    first.finish(end);
    assert!(g.device().high_water(0) <= GIB);
}

/// A member killed while holding memory wakes nobody: the waiter (started with `vramshim run
/// --on-cap wait:600s`) notices on its timer, reclaims the dead member's share and is served.
#[test]
fn a_killed_holder_lets_the_waiter_in() {
    let g = Group::new("wait-kill");
    let mut holder = g.start(&["hold", &(800 * MIB).to_string(), "600"], &[]);
    assert_eq!(holder.until("hold"), "hold rc=0");
    // Through the launcher's flag this time.
    let mut waiter = g.start_run(LONG, &["waitpair", "0", &(500 * MIB).to_string(), "0", "0"]);
    g.until_waiting(1);
    holder.child.kill().unwrap();
    let _ = holder.child.wait();
    let end = Instant::now() + DEADLINE;
    let l = waiter.until("second");
    assert_eq!(field(&l, "rc"), 0, "{l}");
    waiter.finish(end);
}

/// A request made while its stream captures a graph never waits: refused at once (the
/// wait would be 10 minutes), saying why.
#[test]
fn never_waits_during_stream_capture() {
    let g = Group::new("wait-capture");
    let mut holder = g.start(&["hold", &(800 * MIB).to_string(), "600"], &[]);
    assert_eq!(holder.until("hold"), "hold rc=0");
    let mut waiter = g.start(
        &["waitpair", "0", &(500 * MIB).to_string(), "0", "0", "1"],
        &[("VRAMSHIM_ON_CAP", LONG)],
    );
    let end = Instant::now() + DEADLINE;
    let l = waiter.until("second");
    assert_eq!(field(&l, "rc"), 2, "{l}");
    let err = waiter.finish(end);
    assert!(err.contains("capturing a graph"), "{err}");
    holder.child.kill().unwrap();
    let _ = holder.child.wait();
}
