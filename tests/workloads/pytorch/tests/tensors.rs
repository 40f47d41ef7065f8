//! Tensor-level events from PyTorch's default caching allocator in an unmodified job started
//! with `vramshim run --trace` (the Python startup hook, the tracker attached to the
//! allocator, Python stacks named in the trace), on the simulated GPU with PyTorch 2.15.
//! Skipped with one line without PyTorch (VRAMSHIM_TORCH_TESTS=1 makes that a failure).
//!
//! `VRAMSHIM_TORCH_FAULT=drop` set for the test run (passed on to the jobs) drops the tensor
//! events: the attribution tests then fail.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use vramshim_pytorch_tests::{printed, torch_or_skip, vramshim_run_command};
use vramshim_testkit::{RunOutput, run, temp_dir};
use vramshim_trace::{Event, PyFrame, TorchOp, TraceReader, torch_action as act};

/// What a trace holds at tensor level.
#[derive(Default)]
struct Tensors {
    ops: Vec<TorchOp>,
    codes: HashMap<u32, (String, String)>,
    stacks: HashMap<u32, Vec<PyFrame>>,
    clean_end: bool,
}

impl Tensors {
    fn read(file: &Path) -> Tensors {
        Tensors::read_with(file, true).expect("read trace")
    }

    /// What a trace its process is still writing holds so far: None while it cannot be
    /// opened, and up to the first error.
    fn read_so_far(file: &Path) -> Option<Tensors> {
        Tensors::read_with(file, false)
    }

    /// `strict`: a trace that cannot be opened or has an error a reader cannot go on after
    /// panics (else: None, or what came before the error).
    fn read_with(file: &Path, strict: bool) -> Option<Tensors> {
        let mut t = Tensors::default();
        let mut r = match TraceReader::open(file) {
            Ok(r) => r,
            Err(e) if strict => panic!("open trace {}: {e}", file.display()),
            Err(_) => return None,
        };
        let mut ev = Event::Lost { t_ns: 0, count: 0 };
        loop {
            match r.next_into(&mut ev) {
                Ok(true) => match std::mem::replace(&mut ev, Event::Lost { t_ns: 0, count: 0 }) {
                    Event::Torch(op) => t.ops.push(op),
                    Event::PyCode {
                        id, file, function, ..
                    } => {
                        t.codes.insert(id, (file, function));
                    }
                    Event::PyStack { id, frames } => {
                        t.stacks.insert(id, frames);
                    }
                    _ => {}
                },
                Ok(false) => break,
                Err(e) if strict => assert!(e.is_recoverable(), "{e}"),
                Err(_) => break,
            }
        }
        t.clean_end = r.end_time().is_some();
        Some(t)
    }

    /// `function (file:line)` of the innermost frame of `stack` in the test's script.
    fn site(&self, stack: u32) -> Option<String> {
        self.stacks.get(&stack)?.iter().find_map(|f| {
            let (file, func) = self.codes.get(&f.code)?;
            file.ends_with("job.py").then(|| {
                // List comprehensions are functions of their own before Python 3.12.
                let func = func.split(".<locals>").next().unwrap_or(func);
                format!("{func} (job.py:{})", f.line)
            })
        })
    }

    /// Blocks allocated and not freed, by address.
    fn live(&self) -> HashMap<(i32, u64), &TorchOp> {
        let mut live = HashMap::new();
        for op in &self.ops {
            match op.action {
                act::ALLOC => {
                    live.insert((op.device, op.addr), op);
                }
                act::FREE_COMPLETED => {
                    live.remove(&(op.device, op.addr));
                }
                _ => {}
            }
        }
        live
    }
}

fn traced(py: &Path, name: &str, script: &str, flags: &[&str]) -> (RunOutput, PathBuf) {
    traced_with(py, name, script, flags, &[])
}

fn traced_with(
    py: &Path,
    name: &str,
    script: &str,
    flags: &[&str],
    env: &[(&str, &str)],
) -> (RunOutput, PathBuf) {
    let (mut c, file) = traced_command(py, name, script, flags, env);
    (run(&mut c), file)
}

/// The command [`traced_with`] runs (the job in a directory of its own, its working
/// directory), and the trace it writes.
fn traced_command(
    py: &Path,
    name: &str,
    script: &str,
    flags: &[&str],
    env: &[(&str, &str)],
) -> (Command, PathBuf) {
    let dir = temp_dir(name);
    let job = dir.join("job.py");
    std::fs::write(&job, script).expect("write job");
    let file = dir.join("t.vramtrace");
    let mut args = vec!["--trace", file.to_str().expect("utf-8 path")];
    args.extend_from_slice(flags);
    let mut c = vramshim_run_command(py, name, &args);
    // The fault switch, set for the test run, is passed on to the job (the test command
    // starts from an environment without VRAMSHIM_* variables).
    for fault in ["VRAMSHIM_TORCH_FAULT", "VRAMSHIM_PYFRAMES_FAULT"] {
        if let Ok(v) = std::env::var(fault) {
            c.env(fault, v);
        }
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c.arg(&job).current_dir(&dir);
    (c, file)
}

const REUSE: &str = "\
import torch

def warmup():
    xs = [torch.empty(1 << 20, dtype=torch.uint8, device='cuda') for _ in range(8)]
    del xs

def make_activations():
    return [torch.empty(1 << 20, dtype=torch.uint8, device='cuda') for _ in range(8)]

warmup()
acts = make_activations()
print('allocated', torch.cuda.memory_allocated())
";

/// Tensors that reuse the cached segments `warmup` created are attributed to
/// `make_activations`, which holds them, with its line; the segments (cudaMalloc'd while
/// warmup ran) are named in each tensor's event.
#[test]
fn tensors_are_attributed_to_the_function_that_holds_them() {
    let Some(py) = torch_or_skip("tensors_are_attributed_to_the_function_that_holds_them") else {
        return;
    };
    let (out, file) = traced(&py, "torch_tensors_reuse", REUSE, &[]);
    out.assert_success();
    assert!(out.stdout.contains("allocated 8388608"), "{}", out.stdout);
    let t = Tensors::read(&file);
    assert!(t.clean_end);
    let live = t.live();
    assert_eq!(
        live.len(),
        8,
        "8 live tensors expected at exit, found {} ({} tensor events; stderr:\n{})",
        live.len(),
        t.ops.len(),
        out.stderr
    );
    for op in live.values() {
        assert_eq!(op.size, 1 << 20);
        assert_eq!(
            t.site(op.stack).as_deref(),
            Some("make_activations (job.py:8)"),
            "{op:?}"
        );
        assert_ne!(op.segment, 0, "{op:?}");
    }
    // Every segment the live tensors lie in was created by warmup's allocations: reused, not
    // new.
    let created_by_warmup: Vec<u64> = t
        .ops
        .iter()
        .filter(|o| {
            o.action == act::ALLOC && t.site(o.stack).as_deref() == Some("warmup (job.py:4)")
        })
        .map(|o| o.segment)
        .collect();
    assert_eq!(created_by_warmup.len(), 8);
    for op in live.values() {
        assert!(created_by_warmup.contains(&op.segment), "{op:?}");
    }
    let segments: Vec<_> = t
        .ops
        .iter()
        .filter(|o| o.action == act::SEGMENT_ALLOC)
        .collect();
    assert_eq!(segments.len(), 4, "4 segments of 2 MiB: {segments:?}");
}

const REUSED_CODE: &str = "\
import gc
import torch

seen, reused, keep = set(), 0, []
for i in range(32):
    ns = {'torch': torch}
    src = 'def f_%02d():\\n    return torch.empty(%d, dtype=torch.uint8, device=\"cuda\")\\n'
    exec(compile(src % (i, (i + 1) << 10), 'job.py', 'exec'), ns)
    f = ns['f_%02d' % i]
    reused += id(f.__code__) in seen
    seen.add(id(f.__code__))
    keep.append(f())
    del f, ns
    gc.collect()  # the function and its globals form a cycle
print('reused', reused)
";

/// Functions created and freed in a loop, whose code objects come back at the same
/// addresses (and run in frames at the same place, at the same instruction): each tensor
/// is still named after the function that allocated it, so the tracker's table of stacks
/// seen never takes one stack for another (`VRAMSHIM_PYFRAMES_FAULT=noident`, which
/// identifies code objects by address alone, makes this fail).
#[test]
fn tensors_of_reused_code_addresses_are_named_again() {
    let Some(py) = torch_or_skip("tensors_of_reused_code_addresses_are_named_again") else {
        return;
    };
    let (out, file) = traced(&py, "torch_tensors_code_reuse", REUSED_CODE, &[]);
    out.assert_success();
    let reused: u32 = printed(&out.stdout, "reused ");
    assert!(
        reused > 0,
        "no code object came back at a freed one's address: the test shows nothing"
    );
    let t = Tensors::read(&file);
    let live = t.live();
    assert_eq!(live.len(), 32, "{} tensor events", t.ops.len());
    let wrong: Vec<String> = live
        .values()
        .filter_map(|op| {
            let want = format!("f_{:02} (job.py:2)", (op.size >> 10) - 1);
            let got = t.site(op.stack);
            (got.as_deref() != Some(want.as_str()))
                .then(|| format!("{} bytes: {got:?}, not {want}", op.size))
        })
        .collect();
    assert!(wrong.is_empty(), "{} misnamed: {wrong:#?}", wrong.len());
}

/// With `--stacks`, the segments PyTorch asks the driver for carry the Python frames of the
/// request that made PyTorch grow (warmup's), merged with the native frames; and the tensor
/// events' times lie within the trace (they are trace times, like every event's).
#[test]
fn segments_carry_python_frames_with_stacks() {
    let Some(py) = torch_or_skip("segments_carry_python_frames_with_stacks") else {
        return;
    };
    let (out, file) = traced(&py, "torch_tensors_stacks", REUSE, &["--stacks", "16"]);
    out.assert_success();
    let mut r = TraceReader::open(&file).expect("open trace");
    let mut ev = Event::Lost { t_ns: 0, count: 0 };
    let (mut segs, mut stacks, mut codes, mut torch_times) =
        (Vec::new(), HashMap::new(), HashMap::new(), Vec::new());
    loop {
        match r.next_into(&mut ev) {
            Ok(true) => match std::mem::replace(&mut ev, Event::Lost { t_ns: 0, count: 0 }) {
                Event::Alloc(m) if m.size == 2 << 20 => segs.push(m),
                Event::Stack { id, frames } => {
                    stacks.insert(id, frames);
                }
                Event::PyCode {
                    id, file, function, ..
                } => {
                    codes.insert(id, (file, function));
                }
                Event::Torch(op) => torch_times.push(op.t_ns),
                _ => {}
            },
            Ok(false) => break,
            Err(e) => assert!(e.is_recoverable(), "{e}"),
        }
    }
    let end = r.end_time().expect("a complete trace");
    assert_eq!(segs.len(), 4, "4 segments of 2 MiB");
    for m in &segs {
        let frames = stacks.get(&m.stack).expect("the segment's stack");
        let python: Vec<String> = frames
            .iter()
            .filter(|&&f| f >> 63 == 1)
            .filter_map(|&f| {
                let (file, func) = codes.get(&(((f >> 32) & 0x7fff_ffff) as u32))?;
                file.ends_with("job.py").then(|| {
                    let func = func.split(".<locals>").next().unwrap_or(func);
                    format!("{func} (job.py:{})", f as u32)
                })
            })
            .collect();
        assert_eq!(
            python.first().map(String::as_str),
            Some("warmup (job.py:4)"),
            "{python:?}"
        );
        assert!(frames[0] >> 63 == 0, "native frames first");
    }
    assert!(!torch_times.is_empty());
    for t in torch_times {
        assert!(
            t <= end,
            "a tensor event at {t} ns, after the trace's end at {end} ns"
        );
    }
}

const HISTORY_STATE: &str = "\
import torch

def make():
    return [torch.empty(1 << 20, dtype=torch.uint8, device='cuda') for _ in range(8)]

xs = make()
print('history', torch._C._cuda_isHistoryEnabled())
";

/// By default the tensors' Python lines come from libvramshim.so's own frame reader:
/// PyTorch's memory history (and its costly stack capture) stays off. With that reader off
/// (`VRAMSHIM_PY_STACKS=0`) the hook switches PyTorch's capture on instead, and the lines
/// are the same.
#[test]
fn tensor_lines_without_and_with_pytorchs_stack_capture() {
    let Some(py) = torch_or_skip("tensor_lines_without_and_with_pytorchs_stack_capture") else {
        return;
    };
    for (name, env, history) in [
        ("torch_lines_own", &[][..], "history False"),
        (
            "torch_lines_pytorch",
            &[("VRAMSHIM_PY_STACKS", "0")][..],
            "history True",
        ),
    ] {
        let (out, file) = traced_with(&py, name, HISTORY_STATE, &[], env);
        out.assert_success();
        assert!(out.stdout.contains(history), "{name}: {}", out.stdout);
        let t = Tensors::read(&file);
        let sites: Vec<_> = t.live().values().map(|o| t.site(o.stack)).collect();
        assert_eq!(sites.len(), 8, "{name}");
        assert!(
            sites
                .iter()
                .all(|s| s.as_deref() == Some("make (job.py:4)")),
            "{name}: {sites:?}"
        );
    }
}

fn history_job(mode: &str) -> String {
    format!(
        "\
import torch
MODE = '{mode}'

def first():
    return [torch.empty(1 << 20, dtype=torch.uint8, device='cuda') for _ in range(8)]

def second():
    return [torch.empty(1 << 20, dtype=torch.uint8, device='cuda') for _ in range(8)]

if MODE == 'before':
    torch.cuda.memory._record_memory_history(max_entries=100000)
a = first()
if MODE == 'off':
    torch.cuda.memory._record_memory_history(None)
b = second()
s = torch.cuda.memory._snapshot()
print('entries', sum(len(t) for t in s['device_traces']))
"
    )
}

/// A job that records PyTorch's memory history itself keeps its settings (the hook does not
/// shrink its ring to one entry; one line says so), and its tensors still carry their lines.
#[test]
fn the_jobs_own_memory_history_is_kept() {
    let Some(py) = torch_or_skip("the_jobs_own_memory_history_is_kept") else {
        return;
    };
    let (out, file) = traced(&py, "torch_history_before", &history_job("before"), &[]);
    out.assert_success();
    let entries: usize = printed(&out.stdout, "entries ");
    assert!(
        entries >= 16,
        "the job's history holds {entries} entries: its ring was replaced"
    );
    assert!(
        out.stderr
            .contains("the job records PyTorch's memory history itself"),
        "{}",
        out.stderr
    );
    let t = Tensors::read(&file);
    let sites: Vec<_> = t.live().values().map(|o| t.site(o.stack)).collect();
    assert_eq!(sites.len(), 16);
    assert!(
        sites.contains(&Some("first (job.py:5)".into())),
        "{sites:?}"
    );
    assert!(
        sites.contains(&Some("second (job.py:8)".into())),
        "{sites:?}"
    );
}

/// A job that turns PyTorch's memory history off does not turn off the tensor events'
/// Python lines.
#[test]
fn history_turned_off_by_the_job_keeps_the_lines() {
    let Some(py) = torch_or_skip("history_turned_off_by_the_job_keeps_the_lines") else {
        return;
    };
    let (out, file) = traced(&py, "torch_history_off", &history_job("off"), &[]);
    out.assert_success();
    let t = Tensors::read(&file);
    let live = t.live();
    assert_eq!(live.len(), 16);
    let second = live
        .values()
        .filter(|o| t.site(o.stack).as_deref() == Some("second (job.py:8)"))
        .count();
    assert_eq!(
        second, 8,
        "tensors allocated after the job's _record_memory_history(None)"
    );
}

/// Under `--pool stitch` PyTorch runs its cudaMallocAsync allocator, which has no trace
/// tracker (one line says so), but asks the driver for every tensor: with `--stacks`, each
/// live tensor is named by the Python line that allocated it.
#[test]
fn async_allocator_tensors_are_named_by_their_stacks() {
    let Some(py) = torch_or_skip("async_allocator_tensors_are_named_by_their_stacks") else {
        return;
    };
    let flags = ["--pool", "stitch", "--stacks", "16"];
    let (out, file) = traced(&py, "torch_tensors_async", REUSE, &flags);
    out.assert_success();
    assert!(
        out.stderr.contains("which has no trace tracker"),
        "{}",
        out.stderr
    );
    let exe = vramshim_testkit::vramshim_exe();
    let o = run(std::process::Command::new(&exe)
        .arg("summary")
        .arg("--json")
        .arg(&file));
    o.assert_success();
    let j: serde_json::Value = serde_json::from_str(&o.stdout).expect("summary JSON");
    let leaks = &j["traces"][0]["devices"][0]["leaks"]["top_allocations"];
    let sites: Vec<&str> = leaks
        .as_array()
        .expect("live allocations at exit")
        .iter()
        .filter(|a| a["size"].as_u64() == Some(1 << 20))
        .filter_map(|a| a["site"].as_str())
        .collect();
    assert_eq!(sites.len(), 8, "{leaks}");
    assert!(
        sites.iter().all(|s| *s == "make_activations (job.py:8)"),
        "{sites:?}"
    );
}

/// `--no-python-hook` and `VRAMSHIM_PYTHON_HOOK=0` leave the job at segment level.
#[test]
fn the_hook_can_be_turned_off() {
    let Some(py) = torch_or_skip("the_hook_can_be_turned_off") else {
        return;
    };
    let (out, file) = traced(&py, "torch_tensors_nohook", REUSE, &["--no-python-hook"]);
    out.assert_success();
    assert!(Tensors::read(&file).ops.is_empty());
    let dir = temp_dir("torch_tensors_nohook_var");
    let job = dir.join("job.py");
    std::fs::write(&job, REUSE).expect("write job");
    let file = dir.join("t.vramtrace");
    let mut c = vramshim_run_command(
        &py,
        "torch_tensors_nohook_var",
        &["--trace", file.to_str().expect("utf-8")],
    );
    c.env("VRAMSHIM_PYTHON_HOOK", "0").arg(&job);
    run(&mut c).assert_success();
    assert!(Tensors::read(&file).ops.is_empty());
}

/// Killed with SIGKILL mid-script: the trace read afterwards still has the tensors and the
/// function that allocated them, whether their stacks were read by libvramshim.so (named at
/// once) or captured by PyTorch (`VRAMSHIM_PY_STACKS=0`: named by the hook's thread, which
/// must wake for them while the job runs: at exit it is too late).
#[test]
fn sigkill_keeps_the_named_tensors() {
    let Some(py) = torch_or_skip("sigkill_keeps_the_named_tensors") else {
        return;
    };
    // The job kills itself once the test, reading the trace while it is written, finds the
    // tensors named there (it creates `go` in the job's directory).
    let script = "\
import os, signal, time
import torch

def load_weights():
    return [torch.empty(3 << 20, dtype=torch.uint8, device='cuda') for _ in range(4)]

# CUDA started and the hook's thread waiting before the tensors come.
torch.cuda.init()
time.sleep(0.5)
w = load_weights()
deadline = time.monotonic() + 120
while not os.path.exists('go'):
    if time.monotonic() > deadline:
        print('no go after 120 s', flush=True)
        raise SystemExit(1)
    time.sleep(0.01)
os.kill(os.getpid(), signal.SIGKILL)
";
    let named = |t: &Tensors| {
        let live = t.live();
        live.len() == 4
            && live
                .values()
                .all(|op| t.site(op.stack).as_deref() == Some("load_weights (job.py:5)"))
    };
    for (name, env) in [
        ("torch_tensors_kill", &[][..]),
        (
            "torch_tensors_kill_captured",
            &[("VRAMSHIM_PY_STACKS", "0")][..],
        ),
    ] {
        let (mut c, file) = traced_command(&py, name, script, &[], env);
        let dir = file.parent().expect("the job's directory").to_path_buf();
        let log = |n: &str| std::fs::File::create(dir.join(n)).expect("log file");
        let mut child = c
            .stdin(Stdio::null())
            .stdout(log("stdout"))
            .stderr(log("stderr"))
            .spawn()
            .expect("start vramshim run");
        // Bounded: a trace that never names them fails below, with what it holds.
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut running = true;
        while Instant::now() < deadline {
            if Tensors::read_so_far(&file).is_some_and(|t| named(&t)) {
                break;
            }
            if child.try_wait().expect("wait for vramshim run").is_some() {
                running = false;
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        std::fs::write(dir.join("go"), b"").expect("write go");
        let status = child.wait().expect("wait for vramshim run");
        let out = |n: &str| std::fs::read_to_string(dir.join(n)).unwrap_or_default();
        let (stdout, stderr) = (out("stdout"), out("stderr"));
        assert!(running, "{name}: the job ended early: {stdout}\n{stderr}");
        // `vramshim run` exits as a shell does for a job killed by signal 9.
        assert_eq!(status.code(), Some(128 + 9), "{name}: {stdout}\n{stderr}");
        let t = Tensors::read(&file);
        assert!(
            !t.clean_end,
            "{name}: a killed process writes no end record"
        );
        let live = t.live();
        assert_eq!(live.len(), 4, "{name}: {} tensor events", t.ops.len());
        for op in live.values() {
            assert_eq!(
                t.site(op.stack).as_deref(),
                Some("load_weights (job.py:5)"),
                "{name}: {op:?}"
            );
        }
    }
}

/// A forward and backward pass (autograd runs the backward on its own device thread): the
/// job ends, and the tensors autograd allocated are in the trace.
#[test]
fn backward_pass_is_traced_without_hang() {
    let Some(py) = torch_or_skip("backward_pass_is_traced_without_hang") else {
        return;
    };
    let script = "\
import threading
import torch

def model():
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).to('cuda')

def step(m, opt):
    x = torch.randn(32, 64, device='cuda')
    y = torch.randint(0, 10, (32,), device='cuda')
    loss = torch.nn.functional.cross_entropy(m(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()

m = model()
opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
for _ in range(3):
    step(m, opt)
torch.cuda.synchronize()
print('main tid', threading.get_native_id())
";
    // With call stacks: autograd's threads (no Python frames) walk theirs too.
    let (out, file) = traced(&py, "torch_tensors_backward", script, &["--stacks", "16"]);
    out.assert_success();
    let main: u32 = printed(&out.stdout, "main tid ");
    let t = Tensors::read(&file);
    let allocs: Vec<_> = t.ops.iter().filter(|o| o.action == act::ALLOC).collect();
    assert!(
        allocs
            .iter()
            .any(|o| t.site(o.stack).is_some_and(|s| s.starts_with("model ("))),
        "the parameters are attributed to model()"
    );
    assert!(
        allocs
            .iter()
            .any(|o| t.site(o.stack).is_some_and(|s| s.starts_with("step ("))),
        "the forward's activations are attributed to step()"
    );
    // Gradients are allocated by autograd's device thread.
    assert!(
        allocs.iter().any(|o| o.tid != main),
        "no allocation from autograd's thread: {:?}",
        allocs.iter().map(|o| o.tid).collect::<Vec<_>>()
    );
}

/// Python programs without CUDA are unaffected: one that never imports torch, and one that
/// uses torch on the CPU only; a `sitecustomize` of the job's own still runs.
#[test]
fn python_without_cuda_is_unaffected() {
    let Some(py) = torch_or_skip("python_without_cuda_is_unaffected") else {
        return;
    };
    let dir = temp_dir("torch_tensors_nocuda");
    let own = dir.join("own");
    std::fs::create_dir_all(&own).unwrap();
    std::fs::write(
        own.join("sitecustomize.py"),
        "import os\nos.environ['OWN_SITE'] = 'yes'\n",
    )
    .unwrap();
    for (name, script, expect) in [
        (
            "plain",
            "import os, sys\nprint('plain', os.environ.get('OWN_SITE'), 'torch' in sys.modules)\n",
            "plain yes False",
        ),
        (
            "cpu",
            "import os, torch\nprint('cpu', os.environ.get('OWN_SITE'), int(torch.ones(3).sum()))\n",
            "cpu yes 3",
        ),
    ] {
        let job = dir.join(format!("{name}.py"));
        std::fs::write(&job, script).unwrap();
        let file = dir.join(format!("{name}.vramtrace"));
        let mut c = vramshim_run_command(
            &py,
            &format!("torch_tensors_nocuda_{name}"),
            &["--trace", file.to_str().unwrap()],
        );
        c.env("PYTHONPATH", &own).arg(&job);
        let out = run(&mut c);
        out.assert_success();
        assert_eq!(out.stdout.trim(), expect, "{}", out.stderr);
        assert!(
            !out.stderr.contains("tensor-level") && !out.stderr.contains("Traceback"),
            "{}",
            out.stderr
        );
        assert!(!file.exists() || Tensors::read(&file).ops.is_empty());
    }
}

/// Out of memory under a cap: `vramshim summary` names the Python line that asked
/// (`load_weights`), the function holding the tensors (`make_activations`, in segments
/// `warmup` created), and what PyTorch cached; the JSON post-mortem's site is that line.
#[test]
fn summary_names_the_lines_of_an_oom() {
    let Some(py) = torch_or_skip("summary_names_the_lines_of_an_oom") else {
        return;
    };
    let script = "\
import torch

def warmup():
    xs = [torch.empty(4 << 20, dtype=torch.uint8, device='cuda') for _ in range(8)]
    del xs

def make_activations():
    return [torch.empty(4 << 20, dtype=torch.uint8, device='cuda') for _ in range(8)]

def load_weights():
    return torch.empty(64 << 20, dtype=torch.uint8, device='cuda')

warmup()
acts = make_activations()
w = load_weights()
";
    let (out, file) = traced(&py, "torch_tensors_oom", script, &["--cap", "64MiB"]);
    assert_eq!(out.code(), Some(1), "the job dies of OOM: {}", out.stderr);
    assert!(out.stderr.contains("OutOfMemoryError"), "{}", out.stderr);
    let exe = vramshim_testkit::vramshim_exe();
    let text = run(std::process::Command::new(&exe).arg("summary").arg(&file));
    text.assert_success();
    let s = &text.stdout;
    assert!(
        s.contains("PyTorch could not allocate 64.0 MiB at load_weights (job.py:11)"),
        "{s}"
    );
    assert!(
        s.contains("32.0 MiB in      8 tensors  make_activations (job.py:8)"),
        "{s}"
    );
    assert!(
        s.contains("of which 8.00 MiB cached (free inside segments)"),
        "{s}"
    );
    let json = run(std::process::Command::new(&exe)
        .args(["summary", "--json"])
        .arg(&file));
    json.assert_success();
    let j: serde_json::Value = serde_json::from_str(&json.stdout).expect("JSON");
    let pms = &j["traces"][0]["devices"][0]["post_mortems"];
    let pm = pms
        .as_array()
        .and_then(|a| a.iter().find(|p| !p["torch"].is_null()))
        .unwrap_or_else(|| panic!("no post-mortem with tensors: {pms}"));
    assert_eq!(pm["site"], "load_weights (job.py:11)");
    assert_eq!(
        pm["torch"]["holders"][0]["site"],
        "make_activations (job.py:8)"
    );
    assert_eq!(pm["torch"]["cached"], 8 << 20);
    assert_eq!(
        pm["torch"]["segments"][0]["holders"][0]["site"],
        "make_activations (job.py:8)"
    );
}
