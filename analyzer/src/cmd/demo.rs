//! `vramshim demo`: the first thing a newcomer runs.
//!
//! Replays a real training allocation stream (ViT training, recorded from PyTorch, shipped in
//! `analyzer/data/`) through real `cudaMalloc`/`cudaFree` calls with the log-replay workload,
//! on the real GPU when there is one and on the simulated one otherwise:
//!   (a) plain; (b) under a cap below its peak: refused the way CUDA refuses, with the
//!   post-mortem; (c) pooled (`VRAMSHIM_POOL=stitch`) under a cap 5% above its peak live bytes;
//!   (d) the what-if replay of PyTorch's caching-allocator model under that same cap.
//! Prints the side-by-side table and writes `vramshim-demo.html`. Every number printed is
//! measured in this run; what cannot be measured (a part not built) is printed as such.

use std::ffi::CString;
use std::fmt::Write as _;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

use vramshim_pool::PolicyKind;
use vramshim_pool::replay;
use vramshim_pool::rmm_csv::{self, ParsedTrace};

use crate::cmd::run;
use vramshim_analyzer::files;
use vramshim_analyzer::render::html::esc;
use vramshim_analyzer::units::bytes;

/// Device size for the what-if model (only the cap limits it).
const DEVICE_TOTAL: u64 = 16 << 30;

/// The shipped allocation stream (RMM logging CSV; see tests/workloads/traces/README.md).
const TRACE_NAME: &str = "vit_train.rmm.csv";
const TRACE_CSV: &[u8] = include_bytes!("../../../tests/workloads/traces/vit_train.rmm.csv");
/// The log-replay workload, compiled with `cc` at demo time (cached in the work directory).
const REPLAY_C: &str = include_str!("../../../tests/workloads/replay/replay.c");
const CUDA_API_H: &str = include_str!("../../../tests/workloads/include/cuda_api.h");

/// Driver-call latencies the simulated GPU injects so that its timings model a real device
/// (orders of magnitude from the literature cited in the docs; labelled as modelled).
pub(crate) const SIM_LATENCY: &str = "cuMemAlloc=50us,cuMemFree=50us,cuMemCreate=20us,cuMemRelease=10us,cuMemMap=10us,cuMemUnmap=10us,cuMemSetAccess=5us,cuMemAddressReserve=5us,cuMemAddressFree=5us,cuCtxSynchronize=20us";

#[derive(clap::Args)]
pub struct Args {
    /// Where to write the HTML report.
    #[arg(short, long, default_value = "vramshim-demo.html")]
    pub output: PathBuf,
    /// Directory for the replayed log, the workload and the traces of each run (kept, so
    /// `vramshim summary`/`report` can be run on them afterwards).
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
    /// Use the simulated GPU even when a real one is present.
    #[arg(long)]
    pub sim: bool,
}

/// Where the demo runs.
#[derive(Clone, Debug)]
pub(crate) enum Gpu {
    Real { name: String },
    Sim { dir: PathBuf },
}

impl Gpu {
    pub(crate) fn describe(&self) -> String {
        match self {
            Gpu::Real { name } => format!("real GPU: {name}"),
            Gpu::Sim { dir } => format!(
                "simulated GPU (no CUDA device found; cuda-sim from {}); times are modelled, not measured on hardware",
                dir.display()
            ),
        }
    }
    fn is_sim(&self) -> bool {
        matches!(self, Gpu::Sim { .. })
    }
}

/// A table cell: a measured value, or why there is none.
#[derive(Clone, Debug)]
enum Cell {
    Val(String),
    Bytes(u64),
    Num(u64),
    Na(String),
}

impl Cell {
    fn text(&self) -> String {
        match self {
            Cell::Na(why) => format!("n/a ({why})"),
            _ => self.short(),
        }
    }
    fn value(&self) -> Option<u64> {
        match self {
            Cell::Bytes(n) | Cell::Num(n) => Some(*n),
            _ => None,
        }
    }
    fn short(&self) -> String {
        match self {
            Cell::Val(s) => s.clone(),
            Cell::Bytes(n) => bytes(*n),
            Cell::Num(n) => n.to_string(),
            Cell::Na(_) => "n/a".into(),
        }
    }
    fn na(why: &str) -> Cell {
        Cell::Na(why.to_string())
    }
}

struct Row {
    label: &'static str,
    what: String,
    outcome: Cell,
    peak: Cell,
    reserved: Cell,
    driver_calls: Cell,
    syncs: Cell,
    refusals: Cell,
    time: Cell,
    completed: bool,
    /// The cap the run was under, if any.
    cap: Option<u64>,
    /// One line explaining the outcome (the refusal, the post-mortem), when there is one.
    detail: String,
    /// The analyzer's post-mortem of a refused run.
    post_mortem: String,
    trace: Option<PathBuf>,
    stderr: String,
}

impl Row {
    /// The measured columns, in `HEADERS` order after the label.
    fn cells(&self) -> [&Cell; 7] {
        [
            &self.outcome,
            &self.peak,
            &self.reserved,
            &self.driver_calls,
            &self.syncs,
            &self.refusals,
            &self.time,
        ]
    }
    fn empty(label: &'static str, what: String, why: &str) -> Row {
        Row {
            label,
            what,
            outcome: Cell::na(why),
            peak: Cell::na(why),
            reserved: Cell::na(why),
            driver_calls: Cell::na(why),
            syncs: Cell::na(why),
            refusals: Cell::na(why),
            time: Cell::na(why),
            completed: false,
            cap: None,
            detail: String::new(),
            post_mortem: String::new(),
            trace: None,
            stderr: String::new(),
        }
    }
}

pub fn main(args: Args) -> Result<ExitCode, String> {
    let t0 = Instant::now();
    // A private directory of this run (or the user's own, checked): the replay program is
    // built in it and run from it, so no other user may have a way in.
    let work = match &args.work_dir {
        Some(d) => files::own_work_dir(d),
        None if files::fault_unsafe() => {
            // SAFETY: getuid has no preconditions.
            let d =
                std::env::temp_dir().join(format!("vramshim-demo-{}", unsafe { libc::getuid() }));
            std::fs::create_dir_all(&d)
                .map(|_| d.clone())
                .map_err(|e| format!("cannot create {}: {e}", d.display()))
        }
        None => files::private_temp_dir("vramshim-demo"),
    }
    .map_err(|e| format!("demo: {e}"))?;
    let csv = work.join(TRACE_NAME);
    files::write_output(&csv, TRACE_CSV).map_err(|e| format!("demo: {e}"))?;

    let gpu = detect_gpu(args.sim)?;
    let lib = run::find_library()?;
    let parsed = rmm_csv::parse(&String::from_utf8_lossy(TRACE_CSV)).ok();
    let stats = CsvStats {
        allocs: parsed.as_ref().map_or(0, |p| p.allocs),
        peak_live: parsed.as_ref().map_or(0, |p| replay::peak_live(&p.events)),
    };
    if stats.peak_live == 0 {
        return Err(format!("demo: the shipped log {TRACE_NAME} did not parse"));
    }
    println!("vramshim demo: {}", gpu.describe());
    println!(
        "workload: {TRACE_NAME} (ViT training, recorded from PyTorch): {} allocations, peak live {}",
        stats.allocs,
        bytes(stats.peak_live)
    );
    let cap_low = stats.peak_live / 10 * 8;
    let five = stats.peak_live + stats.peak_live / 20;

    let runs: [(&'static str, Option<u64>, bool); 3] = [
        ("(a)", None, false),
        ("(b)", Some(cap_low), false),
        ("(c)", Some(five), true),
    ];
    let describe = |label: &str, cap: Option<u64>| match (label, cap) {
        ("(b)", Some(c)) => format!("capped at {} (80% of peak)", bytes(c)),
        ("(c)", Some(c)) => format!(
            "pool=stitch, cap {} (peak + {:.1}%)",
            bytes(c),
            (c as f64 / stats.peak_live as f64 - 1.0) * 100.0
        ),
        _ => "plain cudaMalloc/cudaFree".into(),
    };
    let replay = replay_program(&work, &gpu);
    if let Err(why) = &replay {
        println!("the log-replay workload is not available: {why}");
    }
    let mut rows = Vec::new();
    let mut cap_pool = five;
    for (label, cap, pooled) in runs {
        let mut row = match &replay {
            Err(_) => Row::empty(label, describe(label, cap), "replay workload not built"),
            Ok(bin) => {
                // The pooled run starts at peak + 5%; if the pool cannot complete under it,
                // the cap goes up in 2 MiB steps (each step a real run) and the table says so.
                let mut cap = cap;
                let mut tries = 0;
                loop {
                    let mut env = Vec::new();
                    if let Some(c) = cap {
                        env.push(("VRAMSHIM_CAP", c.to_string()));
                    }
                    if pooled {
                        env.push(("VRAMSHIM_POOL", "stitch".to_string()));
                    }
                    let what = describe(label, cap);
                    eprint!("running {label} {what} ... ");
                    let mut r = live_run(&gpu, &lib, bin, &csv, &work, label, what, &env);
                    eprintln!("{}", r.outcome.text());
                    tries += 1;
                    let retry = pooled && !r.completed && r.refusals.value().is_some_and(|n| n > 0);
                    if retry && tries < 16 {
                        cap = cap.map(|c| c + (2 << 20));
                        continue;
                    }
                    if pooled && tries > 1 {
                        r.detail = format!(
                            "refused under peak + 5% ({}); the smallest cap it completed under, in 2 MiB steps ({tries} runs), is shown",
                            bytes(five)
                        );
                    }
                    if let Some(c) = cap.filter(|_| pooled) {
                        cap_pool = c;
                    }
                    break r;
                }
            }
        };
        row.cap = match label {
            "(b)" => Some(cap_low),
            "(c)" => Some(cap_pool),
            _ => None,
        };
        rows.push(row);
    }
    let mut d = whatif_caching(&parsed, DEVICE_TOTAL, cap_pool);
    d.cap = Some(cap_pool);
    rows.push(d);

    let table = render_table(&rows);
    println!();
    print!("{table}");
    if gpu.is_sim() {
        println!(
            "driver calls and syncs: counted by the simulated driver itself (each cuMemFree waits for the device, so it counts as a sync)"
        );
        println!("times: modelled on the simulated GPU (driver latencies injected: {SIM_LATENCY})");
    }
    println!("caps count the workload's allocations only (VRAMSHIM_CAP_CONTEXT=exclude)");
    for r in rows.iter().filter(|r| !r.post_mortem.is_empty()) {
        println!();
        println!(
            "{} post-mortem (vramshim summary {}):",
            r.label,
            r.trace
                .as_ref()
                .map_or(String::new(), |t| t.display().to_string())
        );
        print!("{}", r.post_mortem);
    }
    let html = render_html(&gpu, &rows, &stats);
    files::write_output(&args.output, html.as_bytes()).map_err(|e| format!("demo: {e}"))?;
    println!();
    println!("report: {}", args.output.display());
    println!(
        "traces: {} (try: vramshim summary {}/b.vramtrace)",
        work.display(),
        work.display()
    );
    println!("demo took {:.1} s", t0.elapsed().as_secs_f64());
    Ok(ExitCode::SUCCESS)
}

// ---------------------------------------------------------------------------------------------
// Where to run.

/// The real GPU when `libcuda.so.1` (not the simulated one) loads and reports a device;
/// otherwise the simulated GPU next to this executable.
pub(crate) fn detect_gpu(force_sim: bool) -> Result<Gpu, String> {
    if !force_sim && let Some(name) = real_gpu() {
        return Ok(Gpu::Real { name });
    }
    let dir = run::find_sim_dir()
        .map_err(|e| format!("demo: no CUDA device here and no simulated GPU either: {e}"))?;
    Ok(Gpu::Sim { dir })
}

/// Probes the driver in this process: dlopen `libcuda.so.1`, `cuInit(0)`, `cuDeviceGetCount`.
/// A driver that resolves into a `cuda-sim` directory is the simulator, not a GPU.
fn real_gpu() -> Option<String> {
    type CuInit = unsafe extern "C" fn(u32) -> i32;
    type CuCount = unsafe extern "C" fn(*mut i32) -> i32;
    type CuGet = unsafe extern "C" fn(*mut i32, i32) -> i32;
    type CuName = unsafe extern "C" fn(*mut libc::c_char, i32, i32) -> i32;
    unsafe {
        let lib = CString::new("libcuda.so.1").ok()?;
        let h = libc::dlopen(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        if h.is_null() {
            return None;
        }
        let sym = |n: &str| {
            let c = CString::new(n).ok()?;
            let p = libc::dlsym(h, c.as_ptr());
            (!p.is_null()).then_some(p)
        };
        let init = sym("cuInit")?;
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(init, &mut info) != 0 && !info.dli_fname.is_null() {
            let path = std::ffi::CStr::from_ptr(info.dli_fname)
                .to_string_lossy()
                .into_owned();
            let real = std::fs::canonicalize(&path).unwrap_or_else(|_| PathBuf::from(&path));
            if path.contains("cuda-sim") || real.to_string_lossy().contains("cuda-sim") {
                return None;
            }
        }
        let init: CuInit = std::mem::transmute(init);
        let count: CuCount = std::mem::transmute(sym("cuDeviceGetCount")?);
        if init(0) != 0 {
            return None;
        }
        let mut n = 0;
        if count(&mut n) != 0 || n <= 0 {
            return None;
        }
        let mut name = "CUDA device 0".to_string();
        if let (Some(get), Some(getname)) = (sym("cuDeviceGet"), sym("cuDeviceGetName")) {
            let get: CuGet = std::mem::transmute(get);
            let getname: CuName = std::mem::transmute(getname);
            let mut dev = 0;
            let mut buf = [0 as libc::c_char; 256];
            if get(&mut dev, 0) == 0 && getname(buf.as_mut_ptr(), 255, dev) == 0 {
                name = std::ffi::CStr::from_ptr(buf.as_ptr())
                    .to_string_lossy()
                    .into_owned();
            }
        }
        Some(name)
    }
}

// ---------------------------------------------------------------------------------------------
// The live runs.

/// The log-replay workload (`tests/workloads/replay/replay.c`), compiled once into the work
/// directory with `cc` and linked against `libcudart.so.12` (the simulated one, or the real
/// one on a GPU machine; they share soname and symbol versions), or NVIDIA's
/// `libcudart.so.13` where a machine has only that. `work` must be a directory
/// only this user can write ([`files::private_temp_dir`], [`files::own_work_dir`]); a program
/// already there is run only if [`files::check_runnable`] says nobody else can have put it
/// there.
pub(crate) fn replay_program(work: &Path, gpu: &Gpu) -> Result<PathBuf, String> {
    let (link_dir, soname) = match gpu {
        Gpu::Sim { dir } => (dir.clone(), CUDART_SONAMES[0]),
        Gpu::Real { .. } => real_cudart()
            .map(|r| (r.dir, r.soname))
            .or_else(|| run::find_sim_dir().ok().map(|d| (d, CUDART_SONAMES[0])))
            .ok_or(
                "no libcudart.so.12 or libcudart.so.13 to link the replay workload against \
                 (install the CUDA toolkit or runtime, e.g. pip install nvidia-cuda-runtime-cu12)",
            )?,
    };
    let mut h: u64 = 0xcbf29ce484222325;
    for b in REPLAY_C
        .bytes()
        .chain(CUDA_API_H.bytes())
        .chain(link_dir.to_string_lossy().bytes())
        .chain(soname.bytes())
    {
        h = (h ^ b as u64).wrapping_mul(0x100000001b3);
    }
    let dir = work.join(format!("replay-{h:016x}"));
    let exe = dir.join("replay");
    if files::fault_unsafe() {
        if exe.is_file() {
            return Ok(exe);
        }
    } else if std::fs::symlink_metadata(&exe).is_ok() {
        files::check_runnable(&exe)?;
        return Ok(exe);
    }
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot create {}: {e}", dir.display())),
    }
    if !files::fault_unsafe() {
        files::check_trusted(&dir)?;
    }
    files::write_output(&dir.join("replay.c"), REPLAY_C.as_bytes())?;
    files::write_output(&dir.join("cuda_api.h"), CUDA_API_H.as_bytes())?;
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let tmp = dir.join(format!(".replay.{}", std::process::id()));
    let out = Command::new(&cc)
        .args(["-O2", "-std=gnu11", "-o"])
        .arg(&tmp)
        .arg(dir.join("replay.c"))
        .arg(format!("-I{}", dir.display()))
        .arg(format!("-L{}", link_dir.display()))
        .arg(format!("-l:{soname}"))
        .args(["-ldl", "-lpthread"])
        .output()
        .map_err(|e| format!("cannot run the C compiler `{cc}` (install gcc, or set CC): {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "compiling the replay workload failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    std::fs::rename(&tmp, &exe).map_err(|e| e.to_string())?;
    Ok(exe)
}

/// NVIDIA's CUDA runtime on a GPU machine: the directory that holds it and its soname.
pub(crate) struct RealCudart {
    pub dir: PathBuf,
    pub soname: &'static str,
}

/// The sonames of NVIDIA's runtime the replay workload can link against, in order of
/// preference: a 12.x runtime also runs on a 13.x driver, not the other way round. The calls
/// the workload makes (`cudaMalloc`, `cudaFreeAsync`, `cudaMemcpy`, ...) have one ABI in both.
const CUDART_SONAMES: [&str; 2] = ["libcudart.so.12", "libcudart.so.13"];

/// Prints the library directory of each NVIDIA runtime wheel the system Python has.
const FIND_RUNTIME_WHEELS: &str = "
import importlib.util, os
for name in ('nvidia.cuda_runtime', 'nvidia.cu13'):
    try:
        spec = importlib.util.find_spec(name)
    except Exception:
        spec = None
    if spec and spec.submodule_search_locations:
        print(os.path.join(list(spec.submodule_search_locations)[0], 'lib'))
";

/// Finds NVIDIA's runtime on a GPU machine: the CUDA toolkit, the system's library directory,
/// or the `nvidia-cuda-runtime` wheel of the system Python (the cu12 wheel's `nvidia/cuda_runtime/lib`,
/// the cu13 wheel's `nvidia/cu13/lib`). `None` if nothing is found.
pub(crate) fn real_cudart() -> Option<RealCudart> {
    let mut dirs: Vec<PathBuf> = [
        "/usr/local/cuda/lib64",
        "/usr/local/cuda/targets/x86_64-linux/lib",
        "/usr/lib/x86_64-linux-gnu",
    ]
    .iter()
    .map(PathBuf::from)
    .collect();
    dirs.extend(runtime_wheel_dirs());
    CUDART_SONAMES.iter().find_map(|soname| {
        dirs.iter()
            .find(|d| d.join(soname).is_file())
            .map(|d| RealCudart {
                dir: d.clone(),
                soname,
            })
    })
}

/// The library directories of the NVIDIA runtime wheels the system Python has. Python runs
/// in `/` with `PYTHONSAFEPATH=1`: `python3 -c` looks for modules in its current directory
/// first, and finding `nvidia.cuda_runtime` imports the `nvidia` package, so a package
/// another user planted where vramshim was started (`/tmp`, a shared project directory) would
/// run its `__init__.py` as this user, or name a runtime of its own for the replay to load.
fn runtime_wheel_dirs() -> Vec<PathBuf> {
    let Ok(o) = Command::new("python3")
        .args(["-c", FIND_RUNTIME_WHEELS])
        .current_dir("/")
        .env("PYTHONSAFEPATH", "1")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
    else {
        return Vec::new();
    };
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| PathBuf::from(l.trim()))
        .filter(|p| p.is_absolute())
        .collect()
}

/// The summary line the replay workload ends its stdout with (`replay: events=N ... ns=N`).
#[derive(Debug, Default)]
pub(crate) struct ReplayLine {
    pub allocs: u64,
    pub failed: u64,
    pub first_failure: i64,
    pub peak_live: u64,
    pub mismatches: u64,
    pub ns: u64,
}

pub(crate) fn parse_replay_line(stdout: &str) -> Option<ReplayLine> {
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with("replay: events="))?;
    let mut r = ReplayLine::default();
    for kv in line.trim_start_matches("replay:").split_whitespace() {
        let (k, v) = kv.split_once('=')?;
        match k {
            "allocs" => r.allocs = v.parse().ok()?,
            "failed" => r.failed = v.parse().ok()?,
            "first_failure" => r.first_failure = v.parse().ok()?,
            "peak_live" => r.peak_live = v.parse().ok()?,
            "mismatches" => r.mismatches = v.parse().ok()?,
            "ns" => r.ns = v.parse().ok()?,
            _ => {}
        }
    }
    Some(r)
}

/// Where the simulated device's own accounting tool is (`vramsim-smi`).
fn smi_program(sim_dir: &Path) -> Option<PathBuf> {
    let mut c = vec![sim_dir.join("vramsim-smi")];
    if let Some(p) = sim_dir.parent() {
        c.push(p.join("vramsim-smi"));
    }
    c.extend(
        run::search_dirs()
            .into_iter()
            .map(|d| d.join("vramsim-smi")),
    );
    c.into_iter().find(|p| p.is_file())
}

/// The simulated device's high-water mark of device 0 (what the driver really handed out,
/// page rounding included), read from its own accounting, then the device is removed.
pub(crate) fn sim_high_water(sim_dir: &Path, name: &str) -> Result<u64, String> {
    let smi = smi_program(sim_dir).ok_or("vramsim-smi not built")?;
    let out = Command::new(&smi)
        .arg(name)
        .output()
        .map_err(|e| e.to_string())?;
    let json: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("vramsim-smi output: {e}"))?;
    if let Some(file) = json["file"].as_str() {
        let _ = std::fs::remove_file(file);
    }
    json["high_water"][0]
        .as_u64()
        .ok_or_else(|| "vramsim-smi gave no high_water".into())
}

#[allow(clippy::too_many_arguments)]
fn live_run(
    gpu: &Gpu,
    lib: &Path,
    bin: &Path,
    csv: &Path,
    work: &Path,
    label: &'static str,
    what: String,
    env: &[(&str, String)],
) -> Row {
    let tag = label.trim_matches(|c| c == '(' || c == ')');
    let trace = work.join(format!("{tag}.vramtrace"));
    let _ = std::fs::remove_file(&trace);
    let mut cmd = Command::new(bin);
    cmd.args(["--pattern", "memcpy", "--stop-on-failure"])
        .arg(csv);
    cmd.env("LD_PRELOAD", lib)
        .env("VRAMSHIM_TRACE", &trace)
        .env_remove("VRAMSHIM_CAP")
        .env_remove("VRAMSHIM_SHARED")
        .env_remove("VRAMSHIM_POOL")
        .env_remove("VRAMSHIM_STACKS")
        // The caps are about the workload's allocations, not the CUDA context's own memory.
        .env("VRAMSHIM_CAP_CONTEXT", "exclude");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let sim_name = format!("vramshim-demo-{}-{tag}", std::process::id());
    match gpu {
        Gpu::Sim { dir } => {
            cmd.env("LD_LIBRARY_PATH", dir)
                .env("VRAMSIM_NAME", &sim_name)
                .env("VRAMSIM_CONTEXT_OVERHEAD", "0")
                .env("VRAMSIM_LATENCY", SIM_LATENCY)
                // One stderr line per driver call: the device's own count of calls and syncs.
                .env("VRAMSIM_DEBUG", "1");
        }
        Gpu::Real { .. } => {
            if let Some(r) = real_cudart() {
                let mut v = r.dir.into_os_string();
                if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
                    v.push(":");
                    v.push(old);
                }
                cmd.env("LD_LIBRARY_PATH", v);
            }
        }
    }
    let start = Instant::now();
    let out = cmd.stdin(Stdio::null()).output();
    let wall = start.elapsed();
    let mut row = Row::empty(label, what, "not measured");
    row.trace = Some(trace.clone());
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            row.outcome = Cell::Na(format!("cannot start {}: {e}", bin.display()));
            return row;
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    row.stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    row.time = Cell::Val(format!("{:.2} s", wall.as_secs_f64()));
    let Some(r) = parse_replay_line(&stdout) else {
        row.outcome = Cell::Na(format!(
            "the workload ended without its summary line (status {:?}); stderr: {}",
            out.status.code(),
            row.stderr.lines().last().unwrap_or("")
        ));
        return row;
    };
    row.time = Cell::Val(format!("{:.2} s", r.ns as f64 / 1e9));
    row.peak = Cell::Bytes(r.peak_live);
    row.refusals = Cell::Num(r.failed);
    row.completed = r.failed == 0 && r.mismatches == 0 && out.status.success();
    row.outcome = Cell::Val(if row.completed {
        format!("completed ({} allocations)", r.allocs)
    } else if r.failed > 0 {
        let code = row
            .stderr
            .lines()
            .find(|l| l.starts_with("replay: event") && l.contains("failed"))
            .and_then(|l| l.rsplit_once("failed: "))
            .map(|(_, c)| c.to_string())
            .unwrap_or_else(|| "out of memory".into());
        row.detail = format!("the process saw {code}");
        format!("refused at allocation {}", r.first_failure)
    } else if r.mismatches > 0 {
        format!("DATA CORRUPTED ({} mismatches)", r.mismatches)
    } else {
        format!("failed (exit {:?})", out.status.code())
    });
    // Reserved as every command reports it: computed from the trace's events.
    row.reserved = match trace_peak_reserved(&trace) {
        Ok(Some(b)) => Cell::Bytes(b),
        Ok(None) => Cell::na("no device memory in the trace"),
        Err(e) => Cell::Na(e),
    };
    if let Gpu::Sim { dir } = gpu {
        // Reading the simulated device's accounting also removes the device.
        let _ = sim_high_water(dir, &sim_name);
        let (calls, syncs) = sim_driver_counts(&row.stderr);
        row.driver_calls = Cell::Num(calls);
        row.syncs = Cell::Num(syncs);
    } else {
        // On a real GPU the driver is not observable per call.
        let why = "counted by the simulated driver only (vramshim demo --sim)";
        row.driver_calls = Cell::na(why);
        row.syncs = Cell::na(why);
    }
    if r.failed > 0 {
        match post_mortem(&trace) {
            Ok(pm) => row.post_mortem = pm,
            Err(e) => row.post_mortem = format!("  (no post-mortem: {e})\n"),
        }
    }
    row
}

/// Memory-management driver calls and device synchronizations in the simulated driver's
/// call log (`VRAMSIM_DEBUG=1`: `vramsim: NAME -> RESULT` per call). A `cuMemFree` waits for
/// the device, so it counts as a sync too (as CUDA's `cudaFree` does).
pub(crate) fn sim_driver_counts(stderr: &str) -> (u64, u64) {
    const MEM: [&str; 9] = [
        "cuMemAlloc",
        "cuMemFree",
        "cuMemCreate",
        "cuMemRelease",
        "cuMemMap",
        "cuMemUnmap",
        "cuMemSetAccess",
        "cuMemAddressReserve",
        "cuMemAddressFree",
    ];
    const SYNC: [&str; 4] = [
        "cuCtxSynchronize",
        "cuStreamSynchronize",
        "cuEventSynchronize",
        "cuMemFree",
    ];
    let (mut calls, mut syncs) = (0, 0);
    for line in stderr.lines() {
        let Some(rest) = line.strip_prefix("vramsim: ") else {
            continue;
        };
        let Some((name, _)) = rest.split_once(" -> ") else {
            continue;
        };
        let base = name.trim_end_matches("_ptsz");
        let base = match base.rfind("_v") {
            Some(i) if base[i + 2..].bytes().all(|b| b.is_ascii_digit()) && i + 2 < base.len() => {
                &base[..i]
            }
            _ => base,
        };
        if base.starts_with("cuMemFreeHost") || base.starts_with("cuMemAllocHost") {
            continue;
        }
        if MEM.iter().any(|m| {
            base == *m
                || base == format!("{m}Async")
                || base == format!("{m}Pitch")
                || base == format!("{m}Managed")
                || base == format!("{m}FromPoolAsync")
        }) {
            calls += 1;
        }
        if SYNC.contains(&base) {
            syncs += 1;
        }
    }
    (calls, syncs)
}

/// Peak reserved bytes of device 0 as the analyzer computes them from the trace's events.
pub(crate) fn trace_peak_reserved(trace: &Path) -> Result<Option<u64>, String> {
    use vramshim_analyzer::analysis::{self, Options};
    let opts = Options {
        progress: false,
        ..Options::default()
    };
    let r = analysis::analyze(vramshim_analyzer::input::open(trace)?, &opts)?;
    Ok(r.devices
        .iter()
        .find(|d| d.device == 0)
        .and_then(|d| d.peak_reserved.as_ref())
        .map(|p| p.bytes))
}

/// The analyzer's post-mortem of every refusal in a trace, as `vramshim summary` prints it.
fn post_mortem(trace: &Path) -> Result<String, String> {
    use vramshim_analyzer::analysis::{self, Options};
    use vramshim_analyzer::{input, render, whatif};
    let opts = Options {
        top: 5,
        progress: false,
        ..Options::default()
    };
    let mut r = analysis::analyze(input::open(trace)?, &opts)?;
    whatif::judge_post_mortems(trace, &mut r)?;
    let mut out = String::new();
    let mut n = 0;
    for d in &r.devices {
        for pm in &d.post_mortems {
            n += 1;
            render::text::post_mortem(n, pm, &mut out);
        }
    }
    if n == 0 {
        return Err(format!("the trace {} records no refusal", trace.display()));
    }
    Ok(out)
}

/// Three lines describing a trace for `vramshim run`: what was allocated, the peak, the end.
pub fn trace_summary_lines(path: &Path) -> Result<Vec<String>, String> {
    use vramshim_analyzer::analysis::{self, Options};
    use vramshim_analyzer::units::duration_ns;
    let opts = Options {
        top: 1,
        progress: false,
        max_post_mortems: 1,
        ..Options::default()
    };
    let r = analysis::analyze(vramshim_analyzer::input::open(path)?, &opts)?;
    let devs: Vec<_> = r.devices.iter().filter(|d| d.device >= 0).collect();
    // A failed start-up explains everything after it: it comes first.
    let failed: Vec<String> = r
        .failed_calls
        .iter()
        .take(3)
        .map(|f| format!("CUDA failed: {}", f.describe()))
        .collect();
    if devs.is_empty() {
        let mut lines = failed;
        lines.push(format!(
            "pid {}: no device memory was allocated ({} events in {})",
            r.process.pid,
            r.events,
            duration_ns(r.duration_ns)
        ));
        return Ok(lines);
    }
    let (allocs, bytes_alloc, failed_allocs, refusals, ooms) =
        devs.iter().fold((0, 0, 0, 0, 0), |a, d| {
            (
                a.0 + d.allocs,
                a.1 + d.bytes_allocated,
                a.2 + d.failed_allocs,
                a.3 + d.refusals,
                a.4 + d.ooms,
            )
        });
    let mut lines = failed;
    lines.push(format!(
        "pid {}: {allocs} allocations ({}) on {} device(s) in {}; {failed_allocs} failed ({refusals} refused by the cap, {} out of device memory)",
        r.process.pid,
        bytes(bytes_alloc),
        devs.len(),
        duration_ns(r.duration_ns),
        ooms.saturating_sub(refusals)
    ));
    let peak = devs.iter().max_by_key(|d| d.peak_in_use.bytes).unwrap();
    let mut l = format!(
        "peak in use {} on device {} at +{} ({} live allocations)",
        bytes(peak.peak_in_use.bytes),
        peak.device,
        duration_ns(peak.peak_in_use.offset_ns),
        peak.peak_in_use.live_allocations
    );
    if let Some(pr) = &peak.peak_reserved {
        let _ = write!(l, "; peak reserved {}", bytes(pr.bytes));
    }
    if let Some(c) = peak.cap {
        let _ = write!(l, "; cap {}", bytes(c));
        if let Some(s) = &peak.cap_source {
            let _ = write!(l, " (set by {s})");
        }
    }
    lines.push(l);
    let (live, leaks) = devs
        .iter()
        .fold((0, 0), |a, d| (a.0 + d.in_use_at_exit, a.1 + d.leaks.count));
    lines.push(match vramshim_analyzer::render::text::end_note(&r) {
        None => format!("at exit: {} still allocated in {leaks} allocation(s)", bytes(live)),
        Some(why) => format!(
            "at the end of the trace: {} allocated in {leaks} allocation(s) ({why}: frees after it are missing, so these are not leaks)",
            bytes(live)
        ),
    });
    Ok(lines)
}

// ---------------------------------------------------------------------------------------------
// The what-if replay: the pool crate's model of PyTorch's caching allocator, the same code
// `vramshim replay --pool caching` runs.

fn whatif_caching(parsed: &Option<ParsedTrace>, device_total: u64, cap: u64) -> Row {
    let what = format!(
        "what-if: PyTorch caching-allocator model, cap {}",
        bytes(cap)
    );
    let Some(parsed) = parsed else {
        return Row::empty("(d)", what, "the shipped log did not parse");
    };
    let r = replay::run(&parsed.events, PolicyKind::Caching, device_total, Some(cap));
    let mut row = Row::empty("(d)", what, "a model: no device time");
    row.completed = r.completed;
    row.outcome = Cell::Val(match &r.first_failure {
        None => format!("completed ({} allocations)", r.allocs_done),
        Some(f) => {
            row.detail = format!("the model's refusal: {}", f.why);
            format!("refused at allocation {} ({})", f.index, bytes(f.size))
        }
    });
    row.peak = Cell::Bytes(r.peak_live);
    row.reserved = Cell::Bytes(r.peak_reserved);
    row.driver_calls = Cell::Num(r.driver_calls);
    row.syncs = Cell::Num(r.syncs);
    row.refusals = Cell::Num(u64::from(r.first_failure.is_some()));
    row
}

struct CsvStats {
    allocs: u64,
    peak_live: u64,
}

// ---------------------------------------------------------------------------------------------
// Output.

const HEADERS: [&str; 8] = [
    "run",
    "outcome",
    "peak in use",
    "reserved",
    "driver calls",
    "syncs",
    "refusals",
    "time",
];

/// Every n/a cell's reason, once, with the cells it applies to.
fn na_notes(rows: &[Row]) -> Vec<String> {
    let mut notes: Vec<(String, Vec<String>)> = Vec::new();
    for r in rows {
        for (i, c) in r.cells().iter().enumerate() {
            if let Cell::Na(why) = c {
                let at = format!("{} {}", r.label, HEADERS[i + 1]);
                match notes.iter_mut().find(|(w, _)| w == why) {
                    Some((_, v)) => v.push(at),
                    None => notes.push((why.clone(), vec![at])),
                }
            }
        }
    }
    notes
        .into_iter()
        .map(|(why, at)| format!("n/a: {why} ({})", at.join(", ")))
        .collect()
}

fn render_table(rows: &[Row]) -> String {
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            std::iter::once(r.label.to_string())
                .chain(r.cells().iter().map(|c| c.short()))
                .collect()
        })
        .collect();
    let mut w = HEADERS.map(|h| h.len());
    for r in &body {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let mut out = String::new();
    let line = |cols: &[String], out: &mut String| {
        let parts: Vec<String> = cols
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let pad = " ".repeat(w[i].saturating_sub(c.chars().count()));
                if i < 2 {
                    format!("{c}{pad}")
                } else {
                    format!("{pad}{c}")
                }
            })
            .collect();
        let _ = writeln!(out, "{}", parts.join("  ").trim_end());
    };
    line(&HEADERS.map(String::from), &mut out);
    line(&w.map(|n| "-".repeat(n)), &mut out);
    for r in &body {
        line(r, &mut out);
    }
    for r in rows {
        let _ = writeln!(out, "{} {}", r.label, r.what);
        if !r.detail.is_empty() {
            let _ = writeln!(out, "    {}", r.detail);
        }
    }
    for n in na_notes(rows) {
        let _ = writeln!(out, "{n}");
    }
    out
}

/// `vramshim-demo.html`: the demo's table, charts and post-mortems, followed by the analyzer's
/// report (`vramshim report`) of the live runs' traces.
fn render_html(gpu: &Gpu, rows: &[Row], stats: &CsvStats) -> String {
    let demo = demo_section(gpu, rows, stats);
    let traces: Vec<&Path> = rows
        .iter()
        .filter_map(|r| r.trace.as_deref())
        .filter(|t| t.is_file())
        .collect();
    match analyzer_page(&traces) {
        Ok(page) if page.contains("<main>") => page
            .replacen("<title>vramshim report", "<title>vramshim demo", 1)
            .replacen("<h1>vramshim report</h1>", "<h1>vramshim demo</h1>", 1)
            .replacen(
                "<main>",
                &format!(
                    "<main>{demo}<h2 class=\"demo-traces\">The runs' traces (vramshim report)</h2>"
                ),
                1,
            ),
        other => format!(
            "<!doctype html><html><head><meta charset=\"utf-8\"><title>vramshim demo</title></head>\
             <body><h1>vramshim demo</h1>{demo}<p>(no trace report: {})</p></body></html>\n",
            esc(&other
                .err()
                .unwrap_or_else(|| "unexpected page layout".into()))
        ),
    }
}

/// The analyzer's HTML report of several traces side by side.
fn analyzer_page(traces: &[&Path]) -> Result<String, String> {
    use vramshim_analyzer::analysis::Options;
    use vramshim_analyzer::render;
    if traces.is_empty() {
        return Err("no trace was written".into());
    }
    let opts = Options {
        progress: false,
        ..Options::default()
    };
    let a = vramshim_analyzer::analyze_traces(traces, &opts, true)?;
    Ok(render::html::page(&a.reports, None, &[]))
}

fn demo_section(gpu: &Gpu, rows: &[Row], stats: &CsvStats) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        "<section id=\"demo\"><style>#demo{{font-family:sans-serif}}#demo table{{border-collapse:collapse}}\
         #demo td,#demo th{{border:1px solid #ccc;padding:4px 8px;text-align:right;white-space:nowrap}}#demo svg{{display:block;margin:1em 0}}#demo pre{{white-space:pre-wrap}}\
         #demo td:first-child,#demo th:first-child,#demo td:nth-child(2),#demo th:nth-child(2){{text-align:left}}</style>\
         <p>{}</p><p>Workload: {TRACE_NAME}: {} allocations, peak live {}.</p>\
         <table id=\"demo-table\"><tr>",
        esc(&gpu.describe()),
        stats.allocs,
        bytes(stats.peak_live)
    );
    for hd in HEADERS {
        let _ = write!(h, "<th>{}</th>", esc(hd));
    }
    h.push_str("</tr>");
    for r in rows {
        let _ = write!(h, "<tr><td>{}</td>", r.label);
        for c in r.cells() {
            let _ = write!(h, "<td>{}</td>", esc(&c.short()));
        }
        h.push_str("</tr>");
    }
    h.push_str("</table>");
    if gpu.is_sim() {
        h.push_str(
            "<p>Driver calls and syncs are counted by the simulated driver itself (each cuMemFree waits for the device, \
             so it counts as a sync). Times are modelled on the simulated GPU (injected driver latencies).</p>",
        );
    }
    for r in rows.iter().filter(|r| !r.post_mortem.is_empty()) {
        let _ = write!(
            h,
            "<h2>{} post-mortem</h2><pre class=\"post-mortem\">{}</pre>",
            r.label,
            esc(&r.post_mortem)
        );
    }
    h.push_str(&memory_chart(rows));
    h.push_str(&calls_chart(rows));
    h.push_str("<ul>");
    for r in rows {
        let _ = write!(h, "<li>{} {}", r.label, esc(&r.what));
        if !r.detail.is_empty() {
            let _ = write!(h, "<br><small>{}</small>", esc(&r.detail));
        }
        h.push_str("</li>");
    }
    for n in na_notes(rows) {
        let _ = write!(h, "<li>{}</li>", esc(&n));
    }
    h.push_str("</ul></section>");
    h
}

/// Horizontal bars per run: peak in use and reserved, with the run's cap marked.
fn memory_chart(rows: &[Row]) -> String {
    let max = rows
        .iter()
        .flat_map(|r| [r.peak.value(), r.reserved.value(), r.cap])
        .flatten()
        .max()
        .unwrap_or(0);
    if max == 0 {
        return String::new();
    }
    let (w, left, bar) = (760.0, 60.0, 14.0);
    let scale = |v: u64| (w - left - 110.0) * v as f64 / max as f64;
    let mut svg = String::new();
    let height = 30.0 + rows.len() as f64 * (2.0 * bar + 14.0);
    let _ = write!(
        svg,
        "<h2>Device memory per run</h2><svg class=\"chart\" id=\"memory-chart\" width=\"{w}\" height=\"{height}\" \
         xmlns=\"http://www.w3.org/2000/svg\" font-family=\"sans-serif\" font-size=\"12\">\
         <rect x=\"{left}\" y=\"4\" width=\"10\" height=\"10\" fill=\"#4c78a8\"/><text x=\"{}\" y=\"13\">peak in use</text>\
         <rect x=\"{}\" y=\"4\" width=\"10\" height=\"10\" fill=\"#f58518\"/><text x=\"{}\" y=\"13\">reserved</text>\
         <line x1=\"{}\" y1=\"9\" x2=\"{}\" y2=\"9\" stroke=\"#d62728\" stroke-width=\"2\"/><text x=\"{}\" y=\"13\">cap</text>",
        left + 14.0,
        left + 100.0,
        left + 114.0,
        left + 180.0,
        left + 195.0,
        left + 200.0
    );
    for (i, r) in rows.iter().enumerate() {
        let y = 24.0 + i as f64 * (2.0 * bar + 14.0);
        let _ = write!(
            svg,
            "<text x=\"4\" y=\"{}\">{}</text>",
            y + bar + 4.0,
            r.label
        );
        for (k, (v, color)) in [(r.peak.value(), "#4c78a8"), (r.reserved.value(), "#f58518")]
            .into_iter()
            .enumerate()
        {
            let yy = y + k as f64 * bar;
            match v {
                Some(v) => {
                    let _ = write!(
                        svg,
                        "<rect x=\"{left}\" y=\"{yy}\" width=\"{:.1}\" height=\"{}\" fill=\"{color}\"/>\
                         <text x=\"{:.1}\" y=\"{}\">{}</text>",
                        scale(v).max(1.0),
                        bar - 2.0,
                        left + scale(v) + 4.0,
                        yy + bar - 4.0,
                        bytes(v)
                    );
                }
                None => {
                    let _ = write!(
                        svg,
                        "<text x=\"{left}\" y=\"{}\" fill=\"#888\">n/a</text>",
                        yy + bar - 4.0
                    );
                }
            }
        }
        if let Some(c) = r.cap {
            let x = left + scale(c);
            let _ = write!(
                svg,
                "<line x1=\"{x:.1}\" y1=\"{}\" x2=\"{x:.1}\" y2=\"{}\" stroke=\"#d62728\" stroke-width=\"2\"/>",
                y - 2.0,
                y + 2.0 * bar
            );
        }
    }
    svg.push_str("</svg>");
    svg
}

/// Driver calls and syncs per run (log scale would hide nothing here: plain vs pooled differ
/// by orders of magnitude, so the bars are labelled).
fn calls_chart(rows: &[Row]) -> String {
    let max = rows
        .iter()
        .flat_map(|r| [r.driver_calls.value(), r.syncs.value()])
        .flatten()
        .max()
        .unwrap_or(0);
    if max == 0 {
        return String::new();
    }
    let (w, left, bar) = (760.0, 60.0, 14.0);
    let scale = |v: u64| (w - left - 90.0) * v as f64 / max as f64;
    let height = 30.0 + rows.len() as f64 * (2.0 * bar + 14.0);
    let mut svg = format!(
        "<h2>Driver calls and device syncs per run</h2><svg class=\"chart\" id=\"calls-chart\" width=\"{w}\" height=\"{height}\" \
         xmlns=\"http://www.w3.org/2000/svg\" font-family=\"sans-serif\" font-size=\"12\">\
         <rect x=\"{left}\" y=\"4\" width=\"10\" height=\"10\" fill=\"#54a24b\"/><text x=\"{}\" y=\"13\">driver calls</text>\
         <rect x=\"{}\" y=\"4\" width=\"10\" height=\"10\" fill=\"#b279a2\"/><text x=\"{}\" y=\"13\">syncs</text>",
        left + 14.0,
        left + 100.0,
        left + 114.0
    );
    for (i, r) in rows.iter().enumerate() {
        let y = 24.0 + i as f64 * (2.0 * bar + 14.0);
        let _ = write!(
            svg,
            "<text x=\"4\" y=\"{}\">{}</text>",
            y + bar + 4.0,
            r.label
        );
        for (k, (v, color)) in [
            (r.driver_calls.value(), "#54a24b"),
            (r.syncs.value(), "#b279a2"),
        ]
        .into_iter()
        .enumerate()
        {
            let yy = y + k as f64 * bar;
            let (width, label) = match v {
                Some(v) => (scale(v).max(1.0), v.to_string()),
                None => (0.0, "n/a".to_string()),
            };
            let _ = write!(
                svg,
                "<rect x=\"{left}\" y=\"{yy}\" width=\"{width:.1}\" height=\"{}\" fill=\"{color}\"/>\
                 <text x=\"{:.1}\" y=\"{}\">{label}</text>",
                bar - 2.0,
                left + width + 4.0,
                yy + bar - 4.0
            );
        }
    }
    svg.push_str("</svg>");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Run by [`a_package_planted_where_vramshim_runs_is_not_imported`] as a child process in
    /// the planted directory (a test cannot change its own process's directory): prints what
    /// [`runtime_wheel_dirs`] found.
    #[test]
    fn wheel_dirs_child() {
        if std::env::var_os("VRAMSHIM_TEST_WHEEL_CHILD").is_none() {
            return;
        }
        for d in runtime_wheel_dirs() {
            println!("wheel dir: {}", d.display());
        }
    }

    /// A `nvidia` package planted in the directory vramshim runs in, with a runtime wheel's
    /// layout: its `__init__.py` never runs and its library directory is not offered.
    #[test]
    fn a_package_planted_where_vramshim_runs_is_not_imported() {
        if Command::new("python3").arg("-V").output().is_err() {
            eprintln!("skipped: no python3");
            return;
        }
        let d = vramshim_testkit::TempDir::new("wheel-plant");
        let lib = d.join("nvidia/cuda_runtime/lib");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::write(lib.join("libcudart.so.12"), b"planted").unwrap();
        let mark = d.join("planted-code-ran");
        std::fs::write(
            d.join("nvidia/__init__.py"),
            format!("open({:?}, 'w').close()\n", mark.display().to_string()),
        )
        .unwrap();
        let out = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "cmd::demo::tests::wheel_dirs_child",
                "--nocapture",
            ])
            .env("VRAMSHIM_TEST_WHEEL_CHILD", "1")
            .current_dir(&*d)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        assert!(
            text.contains("1 passed"),
            "the child test did not run: {text}"
        );
        assert!(!mark.exists(), "the planted package's __init__.py ran");
        assert!(!text.contains(&lib.display().to_string()), "{text}");
    }

    /// Text from outside the demo (the GPU's name, a post-mortem naming a file, a run's
    /// detail) is escaped in its page, quotes included.
    #[test]
    fn the_page_escapes_markup_and_quotes() {
        let gpu = Gpu::Real {
            name: "<b>\"A100\" & 'x'</b>".into(),
        };
        let row = Row {
            label: "(a)",
            what: "plain \"what\"".into(),
            outcome: Cell::Val("completed".into()),
            peak: Cell::Bytes(1 << 20),
            reserved: Cell::Bytes(2 << 20),
            driver_calls: Cell::Num(3),
            syncs: Cell::Num(1),
            refusals: Cell::Num(0),
            time: Cell::Val("1 s".into()),
            completed: true,
            cap: None,
            detail: "detail 'd'".into(),
            post_mortem: "ran out in \"/tmp/x'y.vramtrace\"".into(),
            trace: None,
            stderr: String::new(),
        };
        let stats = CsvStats {
            allocs: 1,
            peak_live: 1 << 20,
        };
        let h = demo_section(&gpu, &[row], &stats);
        for want in [
            "real GPU: &lt;b&gt;&quot;A100&quot; &amp; &#39;x&#39;&lt;/b&gt;",
            "plain &quot;what&quot;",
            "detail &#39;d&#39;",
            "ran out in &quot;/tmp/x&#39;y.vramtrace&quot;",
        ] {
            assert!(h.contains(want), "{want} not in {h}");
        }
        for raw in ["\"A100\"", "\"what\"", "'d'", "x'y"] {
            assert!(!h.contains(raw), "{raw} unescaped in {h}");
        }
    }
}
