//! Python frames in native call stacks (`VRAMSHIM_STACKS`, interposer/src/tracer/pyframes.rs):
//! a Python program that allocates through the CUDA runtime (ctypes, which releases the GIL
//! around the call, as PyTorch's operators do) gets its Python frames (function, file, line)
//! in the stack of each allocation, in place of the interpreter's eval-loop frames, on every
//! CPython installed on this machine (3.10 to 3.14; see `pythons`). CPython 3.14 comes from
//! `scripts/setup-cpython314`: `VRAMSHIM_CPYTHON314` names its interpreter (CI sets it, and a
//! missing or wrong one then fails the tests), else the one in that script's cache is used
//! when it is there.
//!
//! `VRAMSHIM_PYFRAMES_FAULT=noident` set for the test run (passed on to the jobs) names code
//! objects by their address alone: `reused_code_addresses_are_named_again` then fails.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

use vramshim_testkit::{RunOutput, interposer_lib, run, sim_command, sim_dir, temp_dir};
use vramshim_trace::{Event, TraceReader};

const PY_BIT: u64 = 1 << 63;

/// Every CPython 3.10+ with the GIL found here (see [`all_pythons`]): (version "3.X", path).
fn pythons() -> Vec<(String, PathBuf)> {
    let out: Vec<(String, PathBuf)> = all_pythons()
        .into_iter()
        .filter(|(_, ft, _)| !ft)
        .map(|(v, _, p)| (v, p))
        .collect();
    assert!(!out.is_empty(), "no CPython 3.10+ found");
    if let Some(p) = std::env::var_os("VRAMSHIM_CPYTHON314").map(PathBuf::from) {
        assert!(
            out.iter().any(|(v, c)| v == "3.14" && *c == p),
            "VRAMSHIM_CPYTHON314={} is not a CPython 3.14 (with the GIL) that runs here: {out:?}",
            p.display()
        );
    }
    out
}

/// Every CPython 3.10+ found here: `python3.X` and `python3.Xt` on PATH and in /usr/bin,
/// pyenv's versions, the PyTorch environment's, `scripts/setup-cpython314`'s. (version
/// "3.X", free-threaded, path), one per distinct executable.
fn all_pythons() -> Vec<(String, bool, PathBuf)> {
    let mut cands: Vec<PathBuf> = Vec::new();
    if let Some(p) = std::env::var_os("VRAMSHIM_CPYTHON314").map(PathBuf::from) {
        assert!(
            p.is_file(),
            "VRAMSHIM_CPYTHON314={}: no such interpreter (scripts/setup-cpython314 prints it)",
            p.display()
        );
        cands.push(p);
    } else {
        let cache = std::env::var_os("VRAMSHIM_CPYTHON_DIR")
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("XDG_CACHE_HOME")
                    .map(|c| PathBuf::from(c).join("vramshim/cpython"))
            })
            .or_else(|| {
                std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/vramshim/cpython"))
            });
        if let Some(Ok(rd)) = cache.map(std::fs::read_dir) {
            for e in rd.flatten() {
                cands.push(e.path().join("bin/python3.14"));
            }
        }
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path).chain([PathBuf::from("/usr/bin")]) {
        for m in 10..=14 {
            cands.push(dir.join(format!("python3.{m}")));
            cands.push(dir.join(format!("python3.{m}t")));
        }
    }
    let pyenv = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".pyenv")));
    if let Some(Ok(rd)) = pyenv.map(|p| std::fs::read_dir(p.join("versions"))) {
        for e in rd.flatten() {
            cands.push(e.path().join("bin/python3"));
        }
    }
    if let Ok(p) = vramshim_pytorch_tests::torch_python() {
        cands.push(p);
    }
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for c in cands {
        if !c.exists() {
            continue;
        }
        let o = Command::new(&c)
            .args([
                "-c",
                "import os, sys, sysconfig; print('%d.%d %s %s' % (sys.version_info[:2] + \
                 (sysconfig.get_config_var('Py_GIL_DISABLED') or 0, \
                 os.path.realpath(sys.executable))))",
            ])
            .env_remove("PYTHONPATH")
            .output();
        let Ok(o) = o else { continue };
        let v = String::from_utf8_lossy(&o.stdout).trim().to_string();
        let mut it = v.splitn(3, ' ');
        let (Some(ver), Some(ft), Some(real)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        let minor: u32 = ver
            .strip_prefix("3.")
            .and_then(|m| m.parse().ok())
            .unwrap_or(0);
        // A venv's python or a shim runs a base interpreter already listed.
        if minor < 10 || !seen.insert(real.to_string()) {
            continue;
        }
        out.push((ver.to_string(), ft != "0", c));
    }
    out.sort();
    out
}

/// What a trace holds: allocations (size, stack id), stacks, code objects.
#[derive(Default)]
struct Trace {
    allocs: Vec<(u64, u32)>,
    stacks: HashMap<u32, Vec<u64>>,
    codes: HashMap<u32, (String, String)>,
}

impl Trace {
    fn read(file: &Path) -> Trace {
        let mut t = Trace::default();
        let mut r = TraceReader::open(file).expect("open trace");
        let mut ev = Event::Lost { t_ns: 0, count: 0 };
        loop {
            match r.next_into(&mut ev) {
                Ok(true) => match std::mem::replace(&mut ev, Event::Lost { t_ns: 0, count: 0 }) {
                    Event::Alloc(m) => t.allocs.push((m.size, m.stack)),
                    Event::Stack { id, frames } => {
                        t.stacks.insert(id, frames);
                    }
                    Event::PyCode {
                        id, file, function, ..
                    } => {
                        t.codes.insert(id, (file, function));
                    }
                    _ => {}
                },
                Ok(false) => break,
                Err(e) => assert!(e.is_recoverable(), "{e}"),
            }
        }
        t
    }

    /// The Python frames of the stack of the allocation of `size` bytes, innermost first:
    /// (function's last name part, file's base name, line).
    fn py_frames(&self, size: u64) -> Vec<(String, String, u32)> {
        let (_, stack) = self
            .allocs
            .iter()
            .find(|(s, _)| *s == size)
            .unwrap_or_else(|| panic!("no allocation of {size} bytes"));
        let frames = self.stacks.get(stack).expect("stack record");
        frames
            .iter()
            .filter(|&&f| f & PY_BIT != 0)
            .map(|&f| {
                let id = ((f >> 32) & 0x7fff_ffff) as u32;
                let (file, func) = self.codes.get(&id).expect("PyCode record");
                let func = func.rsplit('.').next().unwrap_or(func).to_string();
                let base = file.rsplit('/').next().unwrap_or(file).to_string();
                (func, base, (f & 0xffff_ffff) as u32)
            })
            .collect()
    }
}

fn traced(py: &Path, name: &str, script: &str, env: &[(&str, &str)]) -> (RunOutput, PathBuf) {
    let dir = temp_dir(name);
    let job = dir.join("job.py");
    std::fs::write(&job, script).expect("write job");
    let file = dir.join("t.vramtrace");
    let mut c = sim_command(py, name);
    c.env("LD_PRELOAD", interposer_lib())
        .env("VRAMSHIM_TRACE", &file)
        .env("VRAMSHIM_STACKS", "16")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("PYTHONPATH");
    if let Ok(v) = std::env::var("VRAMSHIM_PYFRAMES_FAULT") {
        c.env("VRAMSHIM_PYFRAMES_FAULT", v);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c.arg(&job)
        .arg(sim_dir().join("libcudart.so.12"))
        .current_dir(&dir);
    (run(&mut c), file)
}

/// The line of `script` that holds `marker`.
fn line(script: &str, marker: &str) -> u32 {
    script
        .lines()
        .position(|l| l.contains(marker))
        .unwrap_or_else(|| panic!("{marker} not in the script")) as u32
        + 1
}

const JOB: &str = "\
import ctypes, sys, sysconfig, threading
rt = ctypes.CDLL(sys.argv[1])
rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
held = []

def leaf(n):
    p = ctypes.c_void_p()
    rc = rt.cudaMalloc(ctypes.byref(p), n)  # @leaf
    assert rc == 0, rc
    held.append(p)

def middle(n):
    leaf(n)  # @middle

def outer():
    for _ in range(3):
        middle(1 << 20)  # @outer-middle
    leaf(2 << 20)  # @outer-leaf

def gen():
    leaf(3 << 20)  # @gen
    yield 1

def in_thread():
    leaf(4 << 20)  # @thread

def immortal(f):
    # 3.14+ (with the GIL: its object header): the function's code object made immortal, as
    # CPython's own immortal objects are (a refcount with its high bit set, the immortal
    # flag): a frame then holds it by a tagged reference (the flag's bit set), which the
    # frame reader must untag.
    if sys.version_info >= (3, 14) and not sysconfig.get_config_var('Py_GIL_DISABLED'):
        co = f.__code__
        ctypes.c_uint32.from_address(id(co)).value = 3 << 30
        ctypes.c_uint16.from_address(id(co) + 6).value |= 1
        assert sys._is_immortal(co)
    return f

@immortal
def pinned():
    leaf(5 << 20)  # @pinned

outer()  # @main-outer
list(gen())  # @main-gen
t = threading.Thread(target=in_thread)
t.start()
t.join()
pinned()  # @main-pinned
print('ok')
";

/// On every CPython here: each allocation's stack holds its Python frames, innermost first,
/// with their lines, after the native frames of the runtime (in a generator, and on a thread
/// of `threading` too).
#[test]
fn python_frames_in_native_stacks_on_every_cpython() {
    let l = |m| line(JOB, m);
    for (ver, py) in pythons() {
        eprintln!("Python {ver}: {}", py.display());
        let name = format!("pyframes_{}", ver.replace('.', "_"));
        let (out, file) = traced(&py, &name, JOB, &[("VRAMSHIM_LOG", "debug")]);
        out.assert_success();
        assert!(
            !out.stderr.contains("Python frames off"),
            "{ver}: {}",
            out.stderr
        );
        // Every CPython here has a walk compiled for its layout (3.13: for the offsets its
        // 3.13.0 build publishes; a 3.13 that publishes others is read correctly, by the
        // walk that loads them, but slower: add its layout).
        assert!(
            out.stderr.contains(&format!(
                "Python {ver}: frames read by the walk compiled for its layout"
            )),
            "{ver}: {}",
            out.stderr
        );
        let t = Trace::read(&file);
        let job = |f: &str, n: u32| (f.to_string(), "job.py".to_string(), n);
        let want = [
            (
                1u64 << 20,
                vec![
                    job("leaf", l("@leaf")),
                    job("middle", l("@middle")),
                    job("outer", l("@outer-middle")),
                    job("<module>", l("@main-outer")),
                ],
            ),
            (
                2 << 20,
                vec![
                    job("leaf", l("@leaf")),
                    job("outer", l("@outer-leaf")),
                    job("<module>", l("@main-outer")),
                ],
            ),
            (
                3 << 20,
                vec![
                    job("leaf", l("@leaf")),
                    job("gen", l("@gen")),
                    job("<module>", l("@main-gen")),
                ],
            ),
            (
                5 << 20,
                vec![
                    job("leaf", l("@leaf")),
                    job("pinned", l("@pinned")),
                    job("<module>", l("@main-pinned")),
                ],
            ),
        ];
        for (size, frames) in want {
            assert_eq!(t.py_frames(size), frames, "Python {ver} ({})", py.display());
        }
        // The thread: leaf, in_thread, then threading's own frames.
        let th = t.py_frames(4 << 20);
        assert_eq!(
            th[..2],
            [job("leaf", l("@leaf")), job("in_thread", l("@thread"))],
            "Python {ver}: {th:?}"
        );
        assert!(
            th[2..].iter().all(|(_, f, _)| f == "threading.py") && th.len() > 2,
            "Python {ver}: {th:?}"
        );
        // Python frames follow the native frames of the runtime's cudaMalloc.
        let (_, sid) = t.allocs.iter().find(|(s, _)| *s == 1 << 20).unwrap();
        let frames = &t.stacks[sid];
        assert!(
            frames[0] & PY_BIT == 0,
            "Python {ver}: the innermost frame is native"
        );
        // The analyzer names each site by its innermost Python frame in the job's code.
        let exe = vramshim_testkit::vramshim_exe();
        let o = run(Command::new(&exe).arg("summary").arg("--json").arg(&file));
        o.assert_success();
        let j: serde_json::Value = serde_json::from_str(&o.stdout).expect("summary JSON");
        let sites: BTreeSet<&str> = j["traces"][0]["devices"][0]["leaks"]["top_allocations"]
            .as_array()
            .expect("top allocations")
            .iter()
            .filter_map(|a| a["site"].as_str())
            .collect();
        let leaf = format!("leaf (job.py:{})", l("@leaf"));
        assert_eq!(sites, BTreeSet::from([leaf.as_str()]), "Python {ver}");
    }
}

const REUSE: &str = "\
import ctypes, gc, sys
rt = ctypes.CDLL(sys.argv[1])
rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]

def alloc(n):
    p = ctypes.c_void_p()
    assert rt.cudaMalloc(ctypes.byref(p), n) == 0

seen, reused = set(), 0
for i in range(64):
    ns = {'alloc': alloc}
    exec(compile('def f_%02d(n):\\n    alloc(n)\\n' % i, 'gen.py', 'exec'), ns)
    f = ns['f_%02d' % i]
    reused += id(f.__code__) in seen
    seen.add(id(f.__code__))
    f((i + 1) << 16)
    del f, ns
    gc.collect()  # the function and its globals form a cycle
print('reused', reused)
";

/// Functions created and freed in a loop, whose code objects come back at the same
/// addresses: each allocation is still named after the function that made it.
#[test]
fn reused_code_addresses_are_named_again() {
    let mut misnamed = Vec::new();
    for (ver, py) in pythons() {
        let name = format!("pyframes_reuse_{}", ver.replace('.', "_"));
        let (out, file) = traced(&py, &name, REUSE, &[]);
        out.assert_success();
        let reused: u32 = out
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix("reused "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{}", out.stdout));
        assert!(
            reused > 0,
            "Python {ver}: no code object came back at a freed one's address: the test \
             shows nothing"
        );
        let t = Trace::read(&file);
        let wrong: Vec<String> = (0..64u64)
            .filter_map(|i| {
                let f = t.py_frames((i + 1) << 16);
                let got = f.get(1).map(|f| (f.0.clone(), f.1.clone(), f.2));
                (got != Some((format!("f_{i:02}"), "gen.py".into(), 2)))
                    .then(|| format!("allocation {i}: {got:?}"))
            })
            .collect();
        if !wrong.is_empty() {
            misnamed.push(format!(
                "Python {ver}: {} misnamed, e.g. {}",
                wrong.len(),
                wrong[0]
            ));
        }
    }
    assert!(misnamed.is_empty(), "{misnamed:#?}");
}

/// `VRAMSHIM_PY_STACKS=0`: native frames only; a program that is not Python is unaffected
/// (the C workloads' stacks are checked by the trace tests).
#[test]
fn python_frames_can_be_turned_off() {
    let (_, py) = pythons().remove(0);
    let (out, file) = traced(&py, "pyframes_off", JOB, &[("VRAMSHIM_PY_STACKS", "0")]);
    out.assert_success();
    let t = Trace::read(&file);
    assert!(!t.allocs.is_empty());
    assert!(
        t.stacks.values().flatten().all(|f| f & PY_BIT == 0),
        "a Python frame with VRAMSHIM_PY_STACKS=0"
    );
    assert!(t.codes.is_empty());
}

/// Offsets that do not fit the interpreter (`VRAMSHIM_PYFRAMES_FAULT=layout` shifts one) are
/// caught by the first walks, which read through the kernel and check what they find: one
/// line, native frames only, the job unharmed. (`VRAMSHIM_PYFRAMES_FAULT=layout-unchecked`
/// for the test run skips that check: no line, and the test fails.)
#[test]
fn a_wrong_frame_layout_is_refused_with_one_line() {
    let fault = std::env::var("VRAMSHIM_PYFRAMES_FAULT")
        .ok()
        .filter(|v| v.starts_with("layout"))
        .unwrap_or_else(|| "layout".into());
    for (ver, py) in pythons() {
        let name = format!("pyframes_layout_{}", ver.replace('.', "_"));
        let (out, file) = traced(&py, &name, JOB, &[("VRAMSHIM_PYFRAMES_FAULT", &fault)]);
        out.assert_success();
        assert_eq!(
            out.stderr.matches("Python frames off").count(),
            1,
            "Python {ver}: {}",
            out.stderr
        );
        let t = Trace::read(&file);
        assert_eq!(t.allocs.len(), 7, "Python {ver}");
        assert!(
            t.stacks.values().flatten().all(|f| f & PY_BIT == 0),
            "Python {ver}: a Python frame read with a wrong layout"
        );
    }
}

/// A free-threaded CPython (3.13t, 3.14t) is refused with one line: its frames are not read
/// (docs/configuration.md says why), the job runs unharmed and its stacks are native. Checks
/// every free-threaded build found here; with none (no package registry serves one for this
/// machine), one line says so and the refusal is checked by the interposer's unit tests
/// (`a_free_threaded_3_14_is_refused`) alone.
#[test]
fn a_free_threaded_python_is_refused_with_one_line() {
    let ft: Vec<(String, PathBuf)> = all_pythons()
        .into_iter()
        .filter(|(_, ft, _)| *ft)
        .map(|(v, _, p)| (v, p))
        .collect();
    if ft.is_empty() {
        eprintln!(
            "a_free_threaded_python_is_refused_with_one_line: no free-threaded CPython here: \
             nothing to run"
        );
    }
    for (ver, py) in ft {
        let name = format!("pyframes_ft_{}", ver.replace('.', "_"));
        let (out, file) = traced(&py, &name, JOB, &[]);
        out.assert_success();
        let lines: Vec<&str> = out
            .stderr
            .lines()
            .filter(|l| l.contains("Python frames off"))
            .collect();
        assert_eq!(lines.len(), 1, "Python {ver}t: {}", out.stderr);
        assert!(
            lines[0].contains("free-threaded"),
            "Python {ver}t: {}",
            lines[0]
        );
        let t = Trace::read(&file);
        assert_eq!(t.allocs.len(), 7, "Python {ver}t");
        assert!(
            t.stacks.values().flatten().all(|f| f & PY_BIT == 0),
            "Python {ver}t: a Python frame read from a free-threaded build"
        );
    }
}
