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
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use crate::run;

/// The shipped allocation stream (RMM logging CSV, from shared/traces).
const TRACE_NAME: &str = "vit_train.rmm.csv";
const TRACE_CSV: &[u8] = include_bytes!("../data/vit_train.rmm.csv");

/// Driver-call latencies the simulated GPU injects so that its timings model a real device
/// (orders of magnitude from the literature cited in the docs; labelled as modelled).
const SIM_LATENCY: &str = "cuMemAlloc=50us,cuMemFree=50us,cuMemCreate=20us,cuMemRelease=10us,cuMemMap=10us,cuMemUnmap=10us,cuMemSetAccess=5us,cuMemAddressReserve=5us,cuMemAddressFree=5us,cuCtxSynchronize=20us";

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
enum Gpu {
    Real { name: String },
    Sim { dir: PathBuf },
}

impl Gpu {
    fn describe(&self) -> String {
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
    Na(String),
}

impl Cell {
    fn text(&self) -> String {
        match self {
            Cell::Val(s) => s.clone(),
            Cell::Na(why) => format!("n/a ({why})"),
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
}

impl Row {
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
        }
    }
}

pub fn main(args: Args) -> Result<ExitCode, String> {
    let t0 = Instant::now();
    let work = match &args.work_dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("vramshim-demo-{}", unsafe { libc::getuid() })),
    };
    std::fs::create_dir_all(&work)
        .map_err(|e| format!("demo: cannot create {}: {e}", work.display()))?;
    let csv = work.join(TRACE_NAME);
    std::fs::write(&csv, TRACE_CSV)
        .map_err(|e| format!("demo: cannot write {}: {e}", csv.display()))?;

    let gpu = detect_gpu(args.sim)?;
    let lib = run::find_library()?;
    let stats = csv_stats(TRACE_CSV);
    println!("vramshim demo: {}", gpu.describe());
    println!(
        "workload: {TRACE_NAME} (ViT training, recorded from PyTorch): {} allocations, peak live {}",
        stats.allocs,
        bytes(stats.peak_live)
    );
    let cap_low = stats.peak_live / 10 * 8;
    let cap_pool = stats.peak_live + stats.peak_live / 20;

    let replay = replay_program(&work, &gpu);
    let rows = match &replay {
        Err(why) => {
            println!("the log-replay workload is not available: {why}");
            vec![
                Row::empty(
                    "(a)",
                    "plain cudaMalloc/cudaFree".into(),
                    "replay workload not built yet",
                ),
                Row::empty(
                    "(b)",
                    format!("capped at {} (80% of peak)", bytes(cap_low)),
                    "replay workload not built yet",
                ),
                Row::empty(
                    "(c)",
                    format!("pool=stitch, cap {} (peak + 5%)", bytes(cap_pool)),
                    "replay workload not built yet",
                ),
                whatif_caching(&csv, cap_pool),
            ]
        }
        Ok(bin) => {
            let runs = [
                ("(a)", "plain cudaMalloc/cudaFree".to_string(), vec![]),
                (
                    "(b)",
                    format!("capped at {} (80% of peak)", bytes(cap_low)),
                    vec![("VRAMSHIM_CAP", cap_low.to_string())],
                ),
                (
                    "(c)",
                    format!("pool=stitch, cap {} (peak + 5%)", bytes(cap_pool)),
                    vec![
                        ("VRAMSHIM_CAP", cap_pool.to_string()),
                        ("VRAMSHIM_POOL", "stitch".to_string()),
                    ],
                ),
            ];
            let mut rows = Vec::new();
            for (label, what, env) in runs {
                eprint!("running {label} {what} ... ");
                let r = live_run(&gpu, &lib, bin, &csv, &work, label, &env);
                eprintln!("{}", r.outcome.text());
                rows.push(r);
            }
            rows.push(whatif_caching(&csv, cap_pool));
            rows
        }
    };

    let table = render_table(&rows);
    println!();
    print!("{table}");
    if gpu.is_sim() {
        println!("times: modelled on the simulated GPU (driver latencies injected: {SIM_LATENCY})");
    }
    let html = render_html(&gpu, &rows, &stats, &work);
    std::fs::write(&args.output, html)
        .map_err(|e| format!("demo: cannot write {}: {e}", args.output.display()))?;
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
fn detect_gpu(force_sim: bool) -> Result<Gpu, String> {
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

/// The log-replay workload (tests/workloads, by sim-runtime). Not wired yet.
fn replay_program(_work: &Path, _gpu: &Gpu) -> Result<PathBuf, String> {
    Err("not built yet".into())
}

struct Measured {
    status: Option<i32>,
    stdout: String,
    stderr: String,
    wall: Duration,
}

fn live_run(
    gpu: &Gpu,
    lib: &Path,
    bin: &Path,
    csv: &Path,
    work: &Path,
    label: &'static str,
    env: &[(&str, String)],
) -> Row {
    let tag = label.trim_matches(|c| c == '(' || c == ')');
    let trace = work.join(format!("{tag}.vramtrace"));
    let _ = std::fs::remove_file(&trace);
    let mut cmd = Command::new(bin);
    cmd.arg(csv);
    cmd.env("LD_PRELOAD", lib)
        .env("VRAMSHIM_TRACE", &trace)
        .env_remove("VRAMSHIM_CAP")
        .env_remove("VRAMSHIM_SHARED")
        .env_remove("VRAMSHIM_POOL")
        .env_remove("VRAMSHIM_STACKS");
    for (k, v) in env {
        cmd.env(k, v);
    }
    if let Gpu::Sim { dir } = gpu {
        cmd.env("LD_LIBRARY_PATH", dir)
            .env(
                "VRAMSIM_NAME",
                format!("vramshim-demo-{}-{tag}", std::process::id()),
            )
            .env("VRAMSIM_LATENCY", SIM_LATENCY);
    }
    let what = env
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ");
    let start = Instant::now();
    let out = cmd.stdin(Stdio::null()).output();
    let wall = start.elapsed();
    let mut row = Row::empty(label, what, "not measured");
    let m = match out {
        Ok(o) => Measured {
            status: o.status.code(),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
            wall,
        },
        Err(e) => {
            row.outcome = Cell::Na(format!("cannot start {}: {e}", bin.display()));
            return row;
        }
    };
    row.time = Cell::Val(format!("{:.2} s", m.wall.as_secs_f64()));
    row.outcome = Cell::Val(match m.status {
        Some(0) => "completed".into(),
        Some(c) => format!("stopped (exit {c})"),
        None => "killed".into(),
    });
    let _ = (&m.stdout, &m.stderr);
    row
}

// ---------------------------------------------------------------------------------------------
// The what-if replay (analyzer's replay code over the pool crate's caching model).

fn whatif_caching(_csv: &Path, cap: u64) -> Row {
    Row::empty(
        "(d)",
        format!(
            "what-if: PyTorch caching-allocator model, cap {}",
            bytes(cap)
        ),
        "what-if replay not built yet",
    )
}

// ---------------------------------------------------------------------------------------------
// The shipped log.

struct CsvStats {
    allocs: u64,
    peak_live: u64,
}

/// Allocation count and peak live requested bytes of an RMM log (the physical lower bound
/// any allocator needs to complete it).
fn csv_stats(data: &[u8]) -> CsvStats {
    let text = String::from_utf8_lossy(data);
    let mut live: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
    let (mut cur, mut peak, mut allocs) = (0u64, 0u64, 0u64);
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        if f.len() < 5 {
            continue;
        }
        let size: u64 = f[4].trim().parse().unwrap_or(0);
        match f[2] {
            "allocate" => {
                allocs += 1;
                live.insert(f[3], size);
                cur += size;
                peak = peak.max(cur);
            }
            "free" => {
                if let Some(s) = live.remove(f[3]) {
                    cur -= s;
                }
            }
            _ => {}
        }
    }
    CsvStats {
        allocs,
        peak_live: peak,
    }
}

// ---------------------------------------------------------------------------------------------
// Output.

fn bytes(n: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", U[i])
    }
}

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

fn cells(r: &Row) -> [String; 8] {
    [
        r.label.to_string(),
        r.outcome.text(),
        r.peak.text(),
        r.reserved.text(),
        r.driver_calls.text(),
        r.syncs.text(),
        r.refusals.text(),
        r.time.text(),
    ]
}

fn render_table(rows: &[Row]) -> String {
    let body: Vec<[String; 8]> = rows.iter().map(cells).collect();
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
            .map(|(i, c)| format!("{c:<0$}", w[i]))
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
    }
    out
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn render_html(gpu: &Gpu, rows: &[Row], stats: &CsvStats, _work: &Path) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>vramshim demo</title>\
         <style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}\
         td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}td:first-child,th:first-child{{text-align:left}}</style>\
         </head><body><h1>vramshim demo</h1><p>{}</p><p>Workload: {TRACE_NAME}: {} allocations, peak live {}.</p>\
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
        h.push_str("<tr>");
        for c in cells(r) {
            let _ = write!(h, "<td>{}</td>", esc(&c));
        }
        h.push_str("</tr>");
    }
    h.push_str("</table><ul>");
    for r in rows {
        let _ = write!(h, "<li>{} {}</li>", r.label, esc(&r.what));
    }
    h.push_str("</ul></body></html>\n");
    h
}

/// Three lines describing a trace (the analyzer's summary once it lands).
pub fn trace_summary_lines(_path: &Path) -> Result<Vec<String>, String> {
    Err("the trace reader is not built yet".into())
}
