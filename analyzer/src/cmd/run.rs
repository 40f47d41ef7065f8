//! `vramshim run`: start a command under libvramshim.so.
//!
//! Finds the library without flags, appends it to `LD_PRELOAD` (keeping what is there), maps
//! every flag to its `VRAMSHIM_*` variable, forwards the usual termination signals to the
//! child, returns the child's exit status the way a shell does (128 + signal when it was
//! killed), and, when tracing, says where the trace is and what it holds.

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, ExitStatus};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::time::SystemTime;

use vramshim_analyzer::render::one_line;

/// Name of the preload library.
pub const LIB_NAME: &str = "libvramshim.so";
/// Directory name of the simulated CUDA stack's layout.
pub const SIM_DIR_NAME: &str = "cuda-sim";

/// The variables `run` reads itself and the library's variables that have no flag.
const AFTER_HELP: &str = "\
Environment:
  VRAMSHIM_LIB               libvramshim.so (or its directory); default: next to this
                             executable, then ../lib/vramshim/ and ../lib/ from it
  LD_PRELOAD                 kept: libvramshim.so is appended to it
The library's variables without a flag (set them in the environment):
  VRAMSHIM_CAP_CONTEXT       include (default) or exclude the CUDA context from the cap
  VRAMSHIM_PY_STACKS         0: call stacks without Python frames (default 1)
  VRAMSHIM_REGISTRY          off, or the node registry's absolute path
  VRAMSHIM_STATS             a file for the library's counters as JSON at exit
  VRAMSHIM_TRACE_CLOCK       monotonic: clock_gettime timestamps instead of the TSC
  VRAMSHIM_TRACE_LOCKS       1: buffers handed to the trace writer under a lock (default 0)
  VRAMSHIM_TRACE_EXIT_FLUSH  0: no trace flush inside _exit (default 1)
Every variable, its default and accepted forms: docs/configuration.md";

#[derive(clap::Args)]
#[command(trailing_var_arg = true, after_help = AFTER_HELP)]
pub struct Args {
    /// Cap device memory: a fraction of the device (0.9), a size (40GiB, 512MiB) or a
    /// per-device list (0=40GiB,1=0.5). Default: no cap. Sets VRAMSHIM_CAP.
    #[arg(long, value_name = "CAP")]
    pub cap: Option<String>,
    /// Refuse every device allocation where the cap cannot be enforced as asked (the shared
    /// region is unusable) instead of keeping the process's own cap. Sets VRAMSHIM_CAP_STRICT=1.
    #[arg(long)]
    pub cap_strict: bool,
    /// Share one cap budget with every process using the same NAME (1 to 64 of A-Z a-z 0-9 .
    /// _ -, or an absolute path). Default: none (a per-process cap). Sets VRAMSHIM_SHARED.
    #[arg(long, value_name = "NAME")]
    pub shared: Option<String>,
    /// What a request refused by the shared cap does: `fail` (default), or `wait[:TIMEOUT]`
    /// for members of the group to free (`wait:30s`, `wait:forever`; `wait` = 60 s). Sets
    /// VRAMSHIM_ON_CAP.
    #[arg(long, value_name = "fail|wait[:TIMEOUT]")]
    pub on_cap: Option<String>,
    /// Allocation pool: `stitch` (defragmenting pool, holding at most a budget over its recent
    /// peak of live bytes: see --pool-budget), `stitch-tight` (the same) or `off`. Default:
    /// off. Sets VRAMSHIM_POOL.
    #[arg(long, value_name = "POLICY", value_parser = ["stitch", "stitch-tight", "off"])]
    pub pool: Option<String>,
    /// What the pool may hold over its recent peak of live bytes: a ratio (0.05) or a
    /// percentage (5%, the default), or `off` (no budget: it caches until the device or the cap
    /// refuses); implies `--pool stitch`. Sets VRAMSHIM_POOL_BUDGET.
    #[arg(long, value_name = "RATIO")]
    pub pool_budget: Option<String>,
    /// Write a trace (`%p` = pid, `%h` = host, `%t` = start time, `%%` = %). Default: no
    /// trace. Sets VRAMSHIM_TRACE.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Record call stacks of N frames in the trace, at most 64. Default: 0 (no stacks). Sets
    /// VRAMSHIM_STACKS.
    #[arg(long, value_name = "N", value_parser = crate::cmd::numbers::frames)]
    pub stacks: Option<u32>,
    /// Stderr verbosity of the library. Default: warn. Sets VRAMSHIM_LOG.
    #[arg(long, value_name = "LEVEL", value_parser = ["off", "warn", "info", "debug"])]
    pub log: Option<String>,
    /// Run on the simulated GPU (no GPU needed); SIZE sets its memory (VRAMSIM_MEMORY, in
    /// bytes), read as every size of vramshim is: 16GiB, 16G (powers of 1024), 16GB (powers of
    /// 1000), 17179869184 (bytes). Default: cuda-sim's, 16 GiB.
    #[arg(long, value_name = "SIZE", num_args = 0..=1, require_equals = true, default_missing_value = "")]
    pub sim: Option<String>,
    /// With --sim, substitute cuda-sim's runtime for the program's own: preload its
    /// `libcudart.so.13` and `.so.12` (or only the one named: 12 or 13) and put all of
    /// `cuda-sim/` first on the library path. Without it the program's own runtime runs.
    #[arg(long, value_name = "VERSION", num_args = 0..=1, require_equals = true,
          default_missing_value = "all", value_parser = ["all", "12", "13"])]
    pub preload_runtime: Option<String>,
    /// With the pool, how PyTorch's tensors reach it: `async` (backend:cudaMallocAsync, the
    /// default), `uncached` (PYTORCH_NO_CUDA_MEMORY_CACHING=1) or `native` (PyTorch's cache in
    /// front of the pool). Default: VRAMSHIM_PYTORCH_ROUTE, else async.
    #[arg(long, value_name = "ROUTE", value_parser = ["async", "uncached", "native"])]
    pub pytorch_route: Option<String>,
    /// Same as `--pytorch-route native`.
    #[arg(long, conflicts_with = "pytorch_route")]
    pub keep_torch_caching: bool,
    /// With --trace, do not load vramshim's Python startup hook (which records PyTorch's
    /// tensors and their Python lines). Same as VRAMSHIM_PYTHON_HOOK=0.
    #[arg(long)]
    pub no_python_hook: bool,
    /// The command and its arguments.
    #[arg(required = true, num_args = 1.., allow_hyphen_values = true, value_name = "CMD")]
    pub cmd: Vec<OsString>,
}

pub fn main(args: Args) -> Result<ExitCode, String> {
    // Refused here, before anything starts: cuda-sim would ignore a size it cannot read (one
    // line, then its default size), and reads `GB` as powers of 1024 where every size of
    // vramshim reads powers of 1000; it is handed the byte count instead.
    let sim_bytes = match args.sim.as_deref() {
        Some(size) if !size.is_empty() => Some(sim_size(size)?),
        _ => None,
    };
    let lib = find_library()?;
    let mut cmd = Command::new(&args.cmd[0]);
    cmd.args(&args.cmd[1..]);

    let mut preload = vec![lib.clone()];
    if args.sim.is_some() {
        let sim = find_sim_dir()?;
        if let Some(bytes) = sim_bytes {
            cmd.env("VRAMSIM_MEMORY", bytes.to_string());
        }
        if let Some(which) = &args.preload_runtime {
            // The substitution: cuda-sim's runtime in place of the program's own. A runtime
            // that is already loaded satisfies every later dependency on its soname, even one
            // a DT_RPATH points elsewhere.
            set_library_path(&mut cmd, &sim, None);
            for rt in preloaded_runtimes(which) {
                let p = sim.join(rt);
                if p.exists() {
                    preload.push(p);
                }
            }
        } else {
            // The program's own runtime runs on cuda-sim's driver: only the driver and NVML
            // go first on the library path. cuda-sim's runtimes come last, for programs that
            // bring none of their own (found through DT_RPATH, a preload or a full path, a
            // program's own runtime wins).
            set_library_path(&mut cmd, &sim_driver_dir(&sim)?, Some(&sim));
        }
    } else if args.preload_runtime.is_some() {
        return Err(
            "run: --preload-runtime needs --sim (it substitutes the simulated GPU's \
                    runtime for the program's own)"
                .into(),
        );
    }
    cmd.env(
        "LD_PRELOAD",
        append_preload(std::env::var_os("LD_PRELOAD"), &preload),
    );

    if let Some(v) = &args.cap {
        // Refused here with the library's own line rather than after the program started.
        if let Err(reason) = vramshim_region::spec::parse_cap(v) {
            return Err(format!(
                "--cap \"{}\" is not valid ({reason}); {}",
                v.escape_debug(),
                vramshim_region::spec::CAP_FORMS
            ));
        }
        cmd.env("VRAMSHIM_CAP", v);
    }
    if args.cap_strict {
        cmd.env("VRAMSHIM_CAP_STRICT", "1");
    }
    if let Some(v) = &args.shared {
        // Refused here: the library would keep the process's own cap, not the group's.
        if let Err(reason) = vramshim_region::spec::shared_path(v, 0) {
            return Err(format!(
                "--shared \"{}\" is not valid ({reason}); {}",
                v.escape_debug(),
                vramshim_region::spec::SHARED_FORMS
            ));
        }
        cmd.env("VRAMSHIM_SHARED", v);
    }
    if let Some(v) = &args.on_cap {
        if let Err(why) = vramshim_region::wait::parse_on_cap(v) {
            return Err(format!(
                "--on-cap \"{}\" is not valid ({why}); {}",
                v.escape_debug(),
                vramshim_region::wait::FORMS
            ));
        }
        cmd.env("VRAMSHIM_ON_CAP", v);
    }
    let pool = pool_setting(&args)?;
    if let Some(v) = &pool {
        cmd.env("VRAMSHIM_POOL", v);
    }
    if let Some(v) = &args.pool_budget {
        cmd.env("VRAMSHIM_POOL_BUDGET", v);
    }
    if pool.as_deref().is_some_and(|p| p != "off") {
        route_pytorch(&mut cmd, &args)?;
    }
    let trace = args.trace.as_ref().map(|t| absolute(t));
    if let Some(t) = &trace {
        cmd.env("VRAMSHIM_TRACE", t);
    }
    if let Some(n) = args.stacks {
        cmd.env("VRAMSHIM_STACKS", n.to_string());
    }
    // Removed (dropped) once the job has ended.
    let _hook = if trace.is_some() && super::python_hook::wanted(args.no_python_hook) {
        super::python_hook::install(&mut cmd)
    } else {
        None
    };
    if let Some(v) = &args.log {
        cmd.env("VRAMSHIM_LOG", v);
    }

    // What the pattern already matches: a file the run leaves as it was (the library refused
    // to trace into it, or nothing ran) is not the run's trace.
    let before = trace.as_deref().map(Before::take).unwrap_or_default();
    let started = SystemTime::now();
    let status = match run_forwarding_signals(&mut cmd) {
        Ok((status, _pid)) => status,
        Err(e) => {
            eprintln!(
                "vramshim: run: cannot start {}: {e}",
                one_line(&args.cmd[0].to_string_lossy())
            );
            return Ok(ExitCode::from(
                if e.kind() == std::io::ErrorKind::NotFound {
                    127
                } else {
                    126
                },
            ));
        }
    };

    if let Some(t) = &trace {
        report_traces(t, started, &before);
    }
    Ok(ExitCode::from(shell_status(status)))
}

/// The simulated device's size from `--sim=SIZE`: a size as `--cap` reads one, not 0.
fn sim_size(size: &str) -> Result<u64, String> {
    match vramshim_analyzer::units::parse_size(size) {
        Ok(0) => Err(format!(
            "run: --sim={:?} is not valid (a device of 0 bytes); a size such as 16GiB, 16G, \
             16GB or 17179869184 (bytes)",
            size
        )),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("run: --sim={size:?} is not valid: {e}")),
    }
}

/// `VRAMSHIM_POOL` from `--pool` and `--pool-budget` (a budget implies the pool).
fn pool_setting(args: &Args) -> Result<Option<String>, String> {
    match (&args.pool, &args.pool_budget) {
        (Some(p), Some(_)) if p == "off" => Err(
            "run: --pool-budget needs the pool (--pool stitch or stitch-tight), not --pool off"
                .into(),
        ),
        (_, Some(b)) if vramshim_pool::stitch::Budget::parse_ratio(b).is_err() => Err(format!(
            "run: --pool-budget {b:?} is not a budget (accepted: {})",
            vramshim_pool::stitch::Budget::parse_ratio(b).unwrap_err()
        )),
        (None, Some(_)) => Ok(Some("stitch".into())),
        (p, _) => Ok(p.clone()),
    }
}

/// With the pool on, route PyTorch's tensors to it (see `pytorch_route`): the route from the
/// flags, else `VRAMSHIM_PYTORCH_ROUTE`, else `async`.
fn route_pytorch(cmd: &mut Command, args: &Args) -> Result<(), String> {
    use crate::cmd::pytorch_route::{ROUTE_VAR, Route, plan};
    let route = if args.keep_torch_caching {
        Route::Native
    } else if let Some(r) = &args.pytorch_route {
        Route::parse(r, "--pytorch-route")?
    } else {
        match std::env::var(ROUTE_VAR) {
            Ok(v) if !v.trim().is_empty() => Route::parse(&v, &format!("run: {ROUTE_VAR}"))?,
            _ => Route::Async,
        }
    };
    let p = plan(route, &|k| std::env::var(k).ok());
    for (k, v) in &p.set {
        cmd.env(k, v);
    }
    if let Some(note) = p.note {
        eprintln!("vramshim: run: {note}");
    }
    Ok(())
}

/// The exit status a shell would report: the code, or 128 + the signal that killed it.
pub fn shell_status(status: ExitStatus) -> u8 {
    if let Some(code) = status.code() {
        code as u8
    } else if let Some(sig) = status.signal() {
        (128 + sig) as u8
    } else {
        1
    }
}

// ---------------------------------------------------------------------------------------------
// Finding the library and the simulated GPU.

/// Where the running executable lives (`target/<profile>/` from cargo, `<prefix>/bin` installed).
fn exe_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let exe = exe.canonicalize().unwrap_or(exe);
    exe.parent().map(Path::to_path_buf)
}

/// Directories searched for the library and the `cuda-sim/` layout, in order: next to the
/// executable, then the install prefix relative to it (`../lib/vramshim`, `../lib`).
pub fn search_dirs() -> Vec<PathBuf> {
    let Some(dir) = exe_dir() else {
        return Vec::new();
    };
    let mut dirs = vec![dir.clone()];
    if let Some(prefix) = dir.parent() {
        dirs.push(prefix.join("lib/vramshim"));
        dirs.push(prefix.join("lib"));
    }
    dirs
}

/// Finds `libvramshim.so`: `VRAMSHIM_LIB` (a file or a directory holding it), else the
/// search directories. The error lists every place looked at and how to fix it.
pub fn find_library() -> Result<PathBuf, String> {
    let mut looked = Vec::new();
    if let Some(v) = std::env::var_os("VRAMSHIM_LIB").filter(|v| !v.is_empty()) {
        let p = PathBuf::from(&v);
        let p = if p.is_dir() { p.join(LIB_NAME) } else { p };
        if p.is_file() {
            let p = absolute(&p);
            return loader_safe(&p, "the library").map(|()| p);
        }
        return Err(format!(
            "VRAMSHIM_LIB={} but {} is not a file; point VRAMSHIM_LIB at libvramshim.so \
             (or unset it to search next to the vramshim executable)",
            v.to_string_lossy(),
            p.display()
        ));
    }
    looked.push("VRAMSHIM_LIB (not set)".to_string());
    for d in search_dirs() {
        let p = d.join(LIB_NAME);
        if p.is_file() {
            return loader_safe(&p, "the library").map(|()| p);
        }
        looked.push(p.display().to_string());
    }
    Err(format!(
        "cannot find {LIB_NAME}. Looked in:\n  {}\nFix: build it (cargo build --release -p vramshim-interposer, \
         it lands next to target/release/vramshim), install both with scripts/install.sh --prefix DIR, \
         or set VRAMSHIM_LIB=/path/to/{LIB_NAME}",
        looked.join("\n  ")
    ))
}

/// Finds the simulated CUDA stack's layout directory (`cuda-sim/` holding `libcuda.so.1`).
/// Next to a cargo build that has the simulated GPU's outputs but no layout yet, lays it out
/// (what `scripts/sim-layout` does), so `cargo build --release --workspace` is all it takes.
pub fn find_sim_dir() -> Result<PathBuf, String> {
    let dir = find_sim_layout()?;
    loader_safe(&dir, "the simulated GPU's directory").map(|()| dir)
}

/// Refuses a path the dynamic loader would cut in pieces: it splits `LD_PRELOAD` at colons
/// and white space and `LD_LIBRARY_PATH` at colons and semicolons, with no escape (ld.so(8)).
/// A library under `/tmp/my tools/` would be preloaded as `/tmp/my`, a name any other user
/// can create: the job would run that file's code, and run without vramshim (no cap).
pub fn loader_safe(p: &Path, what: &str) -> Result<(), String> {
    use std::os::unix::ffi::OsStrExt;
    let cut = |b: &u8| matches!(b, b':' | b';') || b.is_ascii_whitespace();
    match p.as_os_str().as_bytes().iter().find(|b| cut(b)) {
        None => Ok(()),
        Some(&b) => Err(format!(
            "{what} {} holds {:?}, which the dynamic loader takes for a separator in LD_PRELOAD \
             and LD_LIBRARY_PATH (it would load a part of the path instead, a file any user may \
             create): install vramshim under a path without colons, semicolons or white space, \
             or point VRAMSHIM_LIB at a copy of {LIB_NAME} there",
            vramshim_analyzer::render::one_line(&p.display().to_string()),
            b as char
        )),
    }
}

fn find_sim_layout() -> Result<PathBuf, String> {
    let mut looked = Vec::new();
    for d in search_dirs() {
        let p = d.join(SIM_DIR_NAME);
        let fresh = SIM_FILES.iter().all(|(name, src)| {
            let (dst, src) = (p.join(name), d.join(src));
            !src.exists() || !is_stale(&src, &dst)
        });
        if p.join("libcuda.so.1").is_file() && fresh {
            return Ok(p);
        }
        if d.join(SIM_FILES[0].1).is_file() {
            return lay_out_sim(&d);
        }
        looked.push(p.display().to_string());
    }
    Err(format!(
        "cannot find the simulated GPU ({SIM_DIR_NAME}/libcuda.so.1). Looked in:\n  {}\nFix: build the workspace \
         (cargo build --release --workspace) and lay it out with scripts/sim-layout, or install with \
         scripts/install.sh --prefix DIR",
        looked.join("\n  ")
    ))
}

/// `(name in the layout, cargo output it comes from)`, as in `scripts/sim-layout` and
/// `vramshim_testkit::SIM_FILES`.
const SIM_FILES: &[(&str, &str)] = &[
    ("libcuda.so.1", "libvramsim_driver.so"),
    ("libcudart.so.12", "libvramsim_runtime12.so"),
    ("libcudart.so.13", "libvramsim_runtime13.so"),
    ("libcudart_static.a", "libvramsim_runtime_static.a"),
    ("libnvidia-ml.so.1", "libvramsim_nvml.so"),
];
const SIM_LINKS: &[(&str, &str)] = &[
    ("libcuda.so", "libcuda.so.1"),
    ("libcudart.so", "libcudart.so.12"),
    ("libnvidia-ml.so", "libnvidia-ml.so.1"),
];

fn is_stale(src: &Path, dst: &Path) -> bool {
    let (Ok(s), Ok(d)) = (std::fs::metadata(src), std::fs::metadata(dst)) else {
        return true;
    };
    s.len() != d.len() || s.modified().ok() > d.modified().ok()
}

/// Copies the simulated GPU's cargo outputs in `profile` to `profile/cuda-sim/` under the
/// real libraries' names (each file written aside and renamed into place).
fn lay_out_sim(profile: &Path) -> Result<PathBuf, String> {
    let dir = profile.join(SIM_DIR_NAME);
    let err = |what: &str, p: &Path, e: std::io::Error| format!("{what} {}: {e}", p.display());
    std::fs::create_dir_all(&dir).map_err(|e| err("cannot create", &dir, e))?;
    let tag = std::process::id();
    for (name, src) in SIM_FILES {
        let (src, dst) = (profile.join(src), dir.join(name));
        if !src.exists() || !is_stale(&src, &dst) {
            continue;
        }
        let tmp = dir.join(format!(".{name}.{tag}.tmp"));
        std::fs::copy(&src, &tmp).map_err(|e| err("cannot copy to", &tmp, e))?;
        std::fs::rename(&tmp, &dst).map_err(|e| err("cannot rename to", &dst, e))?;
    }
    for (link, target) in SIM_LINKS {
        let p = dir.join(link);
        if std::fs::read_link(&p).ok().as_deref() == Some(Path::new(target)) {
            continue;
        }
        let tmp = dir.join(format!(".{link}.{tag}.tmp"));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(target, &tmp).map_err(|e| err("cannot link", &tmp, e))?;
        std::fs::rename(&tmp, &p).map_err(|e| err("cannot rename to", &p, e))?;
    }
    Ok(dir)
}

/// Directory of the layout holding only the simulated driver and NVML (symlinks to the
/// layout's copies), so that putting it on the library path leaves the runtime to the program.
pub const SIM_DRIVER_SUBDIR: &str = "driver";
const SIM_DRIVER_LINKS: &[(&str, &str)] = &[
    ("libcuda.so.1", "../libcuda.so.1"),
    ("libcuda.so", "../libcuda.so.1"),
    ("libnvidia-ml.so.1", "../libnvidia-ml.so.1"),
    ("libnvidia-ml.so", "../libnvidia-ml.so.1"),
];

/// `cuda-sim/driver/`, laid out (links written aside and renamed into place) when missing.
fn sim_driver_dir(sim: &Path) -> Result<PathBuf, String> {
    let dir = sim.join(SIM_DRIVER_SUBDIR);
    let linked = |link: &str, target: &str| {
        std::fs::read_link(dir.join(link)).ok().as_deref() == Some(Path::new(target))
    };
    if SIM_DRIVER_LINKS.iter().all(|(l, t)| linked(l, t)) {
        return Ok(dir);
    }
    let err = |what: &str, p: &Path, e: std::io::Error| {
        format!(
            "{what} {}: {e} (the simulated GPU's layout lacks its driver-only directory; \
             reinstall with scripts/install.sh, or run with --preload-runtime)",
            p.display()
        )
    };
    std::fs::create_dir_all(&dir).map_err(|e| err("cannot create", &dir, e))?;
    let tag = std::process::id();
    for (link, target) in SIM_DRIVER_LINKS {
        if linked(link, target) {
            continue;
        }
        let (p, tmp) = (dir.join(link), dir.join(format!(".{link}.{tag}.tmp")));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(target, &tmp).map_err(|e| err("cannot link", &tmp, e))?;
        std::fs::rename(&tmp, &p).map_err(|e| err("cannot rename to", &p, e))?;
    }
    Ok(dir)
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

/// `existing:lib1:lib2`, keeping what was there (entries already present are not repeated).
pub fn append_preload(existing: Option<OsString>, libs: &[PathBuf]) -> OsString {
    let mut parts: Vec<OsString> = Vec::new();
    if let Some(e) = existing {
        let s = e.to_string_lossy().into_owned();
        parts.extend(
            s.split([':', ' '])
                .filter(|x| !x.is_empty())
                .map(OsString::from),
        );
    }
    for l in libs {
        if !parts.iter().any(|p| Path::new(p) == l) {
            parts.push(l.as_os_str().to_owned());
        }
    }
    join_colon(&parts)
}

fn join_colon(parts: &[OsString]) -> OsString {
    let mut out = OsString::new();
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            out.push(":");
        }
        out.push(p);
    }
    out
}

/// `LD_LIBRARY_PATH` = `front`, what was there, then `back` (each named once).
fn set_library_path(cmd: &mut Command, front: &Path, back: Option<&Path>) {
    let mut parts = vec![front.as_os_str().to_owned()];
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        parts.extend(
            std::env::split_paths(&old)
                .filter(|p| p != front && Some(p.as_path()) != back && !p.as_os_str().is_empty())
                .map(PathBuf::into_os_string),
        );
    }
    parts.extend(back.map(|b| b.as_os_str().to_owned()));
    cmd.env("LD_LIBRARY_PATH", join_colon(&parts));
}

/// The sonames `--preload-runtime[=12|13]` preloads.
fn preloaded_runtimes(which: &str) -> &'static [&'static str] {
    match which {
        "12" => &["libcudart.so.12"],
        "13" => &["libcudart.so.13"],
        _ => &["libcudart.so.13", "libcudart.so.12"],
    }
}

// ---------------------------------------------------------------------------------------------
// Running the child and forwarding signals (in this launcher process only; the preload library
// installs no signal handlers).

const FORWARDED: [libc::c_int; 6] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

/// The child's pid while it runs; 0 before it is spawned, -1 from just before it is reaped
/// (a signal that lands later must not reach another process that gets the pid).
static CHILD: AtomicI32 = AtomicI32::new(0);
/// A pidfd of the child (-1: none, the kernel has no `pidfd_open` or refused it): signals go
/// through it, so that a signal handled on another thread, which read the pid before it was
/// cleared, reaches the child or nothing (the pidfd names that process, never a later one with
/// its pid). Kept open for the rest of the process: a handler may still hold the number.
static CHILD_FD: AtomicI32 = AtomicI32::new(-1);
/// Signals that arrived before the child's pid was known (bit = signal number), delivered as
/// soon as it is: a child can start and be signalled before `spawn` returns here.
static PENDING: AtomicU64 = AtomicU64::new(0);

/// Sends `sig` to the child: through its pidfd where there is one, else to `pid`.
/// Async-signal-safe (called from the handler).
fn signal_child(pid: i32, sig: libc::c_int) {
    let fd = CHILD_FD.load(Ordering::SeqCst);
    if fd >= 0 {
        // SAFETY: a raw system call with no memory arguments (siginfo NULL: as kill would).
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                fd,
                sig,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
    } else {
        // SAFETY: kill has no memory preconditions and is async-signal-safe.
        unsafe { libc::kill(pid, sig) };
    }
}

fn deliver_pending(pid: i32) {
    let bits = PENDING.swap(0, Ordering::SeqCst);
    for sig in 1..64 {
        if bits & (1u64 << sig) != 0 {
            signal_child(pid, sig);
        }
    }
}

/// A pidfd of `pid` (our unreaped child: the pid cannot have been reused), or -1.
fn pidfd_of(pid: i32) -> i32 {
    // SAFETY: a raw system call with no memory arguments.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    i32::try_from(fd).unwrap_or(-1)
}

/// Waits until child `pid` has ended, leaving it unreaped (its pid stays taken); false on an
/// error (then the caller reaps at once).
fn wait_unreaped(pid: i32) -> bool {
    loop {
        // SAFETY: zeroed siginfo_t is valid; a valid out-pointer.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: as above; WNOWAIT leaves the child to be reaped by `Child::wait`.
        let r = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if r == 0 {
            return true;
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return false;
        }
    }
}

/// `VRAMSHIM_RUN_FAULT=late-clear`: the child is reaped while its pid is still the signals'
/// target, and the launcher then waits 3 s with forwarding on (one line on stderr says when),
/// for the test that a signal landing there reaches no process that got the pid since.
fn late_clear() -> bool {
    vramshim_analyzer::switches::switch_on("VRAMSHIM_RUN_FAULT", "late-clear")
}

extern "C" fn forward(sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // A signal the terminal sent (Ctrl-C, Ctrl-\, hangup) went to the whole foreground process
    // group, the child included: forwarding it would deliver it twice.
    // SAFETY: with SA_SIGINFO the kernel passes a valid siginfo for the handler's duration.
    if !info.is_null() && unsafe { (*info).si_code } == libc::SI_KERNEL {
        return;
    }
    let pid = CHILD.load(Ordering::SeqCst);
    if pid > 0 {
        signal_child(pid, sig);
    } else if pid == 0 && (0..64).contains(&sig) {
        PENDING.fetch_or(1u64 << sig, Ordering::SeqCst);
        // The pid may have been published meanwhile (its publisher may already have looked).
        let pid = CHILD.load(Ordering::SeqCst);
        if pid > 0 {
            deliver_pending(pid);
        }
    }
}

/// Spawns `cmd`, forwards the signals in `FORWARDED` to it while it runs, and waits for it.
pub fn run_forwarding_signals(cmd: &mut Command) -> std::io::Result<(ExitStatus, u32)> {
    let mut old: Vec<(libc::c_int, libc::sigaction)> = Vec::new();
    for &sig in &FORWARDED {
        // SAFETY: zeroed sigaction structs are valid; the handler is an extern "C" function
        // that only touches atomics and calls async-signal-safe kill.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = forward as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            let mut prev: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, &sa, &mut prev) == 0 {
                old.push((sig, prev));
            }
        }
    }
    let late = late_clear();
    let result = cmd.spawn().and_then(|mut child| {
        let pid = child.id();
        CHILD_FD.store(pidfd_of(pid as i32), Ordering::SeqCst);
        CHILD.store(pid as i32, Ordering::SeqCst);
        deliver_pending(pid as i32);
        // The pid is the signals' target until the child has ended, and no longer once it is
        // reaped (another process may get it then): cleared in between, while the ended child
        // still holds it. A handler that read it before, on another thread, signals through
        // the pidfd (where the kernel has them).
        if !late {
            wait_unreaped(pid as i32);
            CHILD.store(-1, Ordering::SeqCst);
        }
        let status = child.wait();
        if late {
            eprintln!("vramshim: run: VRAMSHIM_RUN_FAULT=late-clear: child {pid} reaped");
            std::thread::sleep(std::time::Duration::from_secs(3));
        }
        CHILD.store(-1, Ordering::SeqCst);
        status.map(|s| (s, pid))
    });
    for (sig, prev) in old {
        // SAFETY: `prev` is the disposition sigaction returned for this signal.
        unsafe { libc::sigaction(sig, &prev, std::ptr::null_mut()) };
    }
    result
}

// ---------------------------------------------------------------------------------------------
// After the run: where the trace is and what it says.

/// What identifies a file's content as of a moment: inode, size and modification time.
type Stamp = (u64, u64, Option<SystemTime>);

/// The files a trace pattern matched before the run, with their stamps.
#[derive(Default)]
pub struct Before(Vec<(PathBuf, Stamp)>);

impl Before {
    pub fn take(pattern: &Path) -> Before {
        Before(
            candidates(pattern)
                .into_iter()
                .filter_map(|(p, m)| Some((p, stamp(&m)?)))
                .collect(),
        )
    }

    fn unchanged(&self, path: &Path, meta: &std::fs::Metadata) -> bool {
        let now = stamp(meta);
        self.0.iter().any(|(p, s)| p == path && Some(*s) == now)
    }
}

fn stamp(m: &std::fs::Metadata) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    m.is_file().then(|| (m.ino(), m.len(), m.modified().ok()))
}

/// The regular files (never a symbolic link, which the library does not follow either) the
/// pattern names: the path itself for a literal path, and the files in its directory that
/// match `%p`/`%h`/`%t` (for a literal path, a forked child's `<path>.<pid>`).
fn candidates(pattern: &Path) -> Vec<(PathBuf, std::fs::Metadata)> {
    let dir = pattern.parent().unwrap_or(Path::new("."));
    let Some(mut name) = pattern
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
    else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if !name.contains('%') {
        if let Ok(m) = std::fs::symlink_metadata(pattern)
            && m.is_file()
        {
            out.push((pattern.to_path_buf(), m));
        }
        name = format!("{name}.%p");
    }
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let fname = e.file_name().to_string_lossy().into_owned();
        if !matches_pattern(&name, &fname) {
            continue;
        }
        // DirEntry::metadata does not follow a symbolic link.
        if let Ok(m) = e.metadata()
            && m.is_file()
        {
            out.push((e.path(), m));
        }
    }
    out
}

/// The trace files a run wrote: the path itself, or for a pattern with `%p`/`%h`/`%t` every
/// file in its directory that matches it, written since `since` and new or changed since
/// `before` was taken.
pub fn find_traces(pattern: &Path, since: SystemTime, before: &Before) -> Vec<PathBuf> {
    let mut all = candidates(pattern).into_iter();
    // A literal path, when it is a candidate, comes first: the process's own file.
    let literal = !pattern
        .file_name()
        .is_some_and(|n| n.to_string_lossy().contains('%'));
    let mut first = Vec::new();
    let mut found: Vec<(SystemTime, PathBuf)> = Vec::new();
    let written = |p: &Path, m: &std::fs::Metadata| {
        let Ok(mtime) = m.modified() else {
            return None;
        };
        // A small slack: file systems round modification times.
        (mtime + std::time::Duration::from_secs(2) >= since && !before.unchanged(p, m))
            .then_some(mtime)
    };
    if literal && let Some((p, m)) = all.next() {
        if p == pattern {
            if written(&p, &m).is_some() {
                first.push(p);
            }
        } else if let Some(t) = written(&p, &m) {
            found.push((t, p));
        }
    }
    for (p, m) in all {
        if let Some(t) = written(&p, &m) {
            found.push((t, p));
        }
    }
    found.sort();
    first.extend(found.into_iter().map(|(_, p)| p));
    first
}

/// `%p`, `%h`, `%t` match any non-empty run of characters, `%%` a literal `%`.
fn matches_pattern(pattern: &str, name: &str) -> bool {
    let mut parts: Vec<String> = vec![String::new()];
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '%' {
            match chars.next() {
                Some('%') => parts.last_mut().unwrap().push('%'),
                Some(_) => parts.push(String::new()),
                None => parts.last_mut().unwrap().push('%'),
            }
        } else {
            parts.last_mut().unwrap().push(c);
        }
    }
    if parts.len() == 1 {
        return parts[0] == name;
    }
    let (first, rest) = parts.split_first().unwrap();
    let Some(mut tail) = name.strip_prefix(first.as_str()) else {
        return false;
    };
    let (last, middle) = rest.split_last().unwrap();
    for m in middle {
        // Each wildcard takes at least one character.
        let Some(pos) = tail.get(1..).and_then(|t| t.find(m.as_str())) else {
            return false;
        };
        tail = &tail[1 + pos + m.len()..];
    }
    tail.len() > last.len() && tail.ends_with(last.as_str())
}

fn report_traces(pattern: &Path, since: SystemTime, before: &Before) {
    for l in trace_report(pattern, since, before) {
        eprintln!("{l}");
    }
}

/// The lines `vramshim run` prints after a traced run. Each is made safe for the terminal: the
/// files matched in the pattern's directory may be named by anyone who can write there, and
/// the summary quotes strings the trace carries.
fn trace_report(pattern: &Path, since: SystemTime, before: &Before) -> Vec<String> {
    let show = |p: &Path| one_line(&p.display().to_string()).into_owned();
    let files = find_traces(pattern, since, before);
    if files.is_empty() {
        return vec![format!(
            "vramshim: no trace was written at {}: the program never loaded the CUDA driver (libcuda.so.1), the library was not preloaded into it (a static or setuid program), or it was killed before it ended, or the library refused the path (a symbolic link, a file that is not an earlier trace: its own line above says why); --log info says what the library did",
            show(pattern)
        )];
    }
    let mut out = Vec::new();
    for f in &files {
        let bytes = std::fs::metadata(f).map(|m| m.len()).unwrap_or(0);
        out.push(format!("vramshim: trace: {} ({bytes} bytes)", show(f)));
        match crate::cmd::demo::trace_summary_lines(f) {
            Ok(lines) => {
                for l in lines {
                    out.push(format!("vramshim:   {}", one_line(&l)));
                }
            }
            Err(e) => out.push(format!("vramshim:   (cannot summarize: {})", one_line(&e))),
        }
    }
    out.push(format!(
        "vramshim: more: vramshim summary {} ; vramshim report {} -o report.html",
        show(&files[0]),
        show(&files[0])
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_post_run_summary_escapes_planted_names() {
        // A file another user planted where the pattern matches, named to retitle the
        // terminal and clear the screen.
        let dir = vramshim_testkit::TempDir::new("run-names");
        let planted = dir.join("job-\u{1b}]0;owned\u{7}\u{1b}[2J-1.vramtrace");
        let o = vramshim_analyzer::synth::SynthOptions {
            events: 200,
            ..Default::default()
        };
        vramshim_analyzer::synth::write(std::fs::File::create(&planted).unwrap(), &o).unwrap();
        let since = SystemTime::now() - std::time::Duration::from_secs(60);
        let lines = trace_report(&dir.join("job-%p.vramtrace"), since, &Before::default());
        let text = lines.join("\n");
        assert!(
            lines.len() > 2,
            "the trace was found and summarized: {text}"
        );
        assert!(
            !text.contains('\u{1b}') && !text.contains('\u{7}'),
            "{text:?}"
        );
        assert!(text.contains("job-\\u{1b}]0;owned\\u{7}"), "{text}");
        // No trace at all: the pattern, as typed, is escaped too.
        let none = trace_report(
            Path::new("/nonexistent-\u{1b}[2J/%p.t"),
            since,
            &Before::default(),
        );
        assert!(
            !none[0].contains('\u{1b}') && none[0].contains("\\u{1b}[2J"),
            "{none:?}"
        );
    }

    #[test]
    fn pattern_matching() {
        assert!(matches_pattern("job-%p.vramtrace", "job-123.vramtrace"));
        assert!(!matches_pattern("job-%p.vramtrace", "job-.vramtrace"));
        assert!(!matches_pattern("job-%p.vramtrace", "other-1.vramtrace"));
        assert!(matches_pattern("%h-%p.t", "box-7.t"));
        assert!(matches_pattern("a%%b", "a%b"));
        assert!(matches_pattern("t.vramtrace.%p", "t.vramtrace.42"));
        assert!(!matches_pattern("t.vramtrace.%p", "t.vramtrace"));
    }

    /// A path the loader would split is refused with one line naming it; others pass.
    #[test]
    fn paths_the_loader_would_split_are_refused() {
        for bad in [
            "/tmp/my tools/libvramshim.so",
            "/opt/a:b/libvramshim.so",
            "/opt/a;b/cuda-sim",
            "/opt/a\tb/libvramshim.so",
            "/opt/a\nb/libvramshim.so",
        ] {
            let e = loader_safe(Path::new(bad), "the library").unwrap_err();
            assert!(e.starts_with("the library /"), "{e}");
            assert!(!e.contains('\n') && !e.contains('\t'), "{e}");
            assert!(e.contains("separator"), "{e}");
        }
        loader_safe(
            Path::new("/opt/vramshim-1.0/lib/libvramshim.so"),
            "the library",
        )
        .unwrap();
    }

    #[test]
    fn preload_appended_not_replaced() {
        let v = append_preload(
            Some("/x/a.so /x/b.so".into()),
            &[PathBuf::from("/y/libvramshim.so")],
        );
        assert_eq!(v, OsString::from("/x/a.so:/x/b.so:/y/libvramshim.so"));
        let v = append_preload(None, &[PathBuf::from("/y/libvramshim.so")]);
        assert_eq!(v, OsString::from("/y/libvramshim.so"));
        let v = append_preload(
            Some("/y/libvramshim.so".into()),
            &[PathBuf::from("/y/libvramshim.so")],
        );
        assert_eq!(v, OsString::from("/y/libvramshim.so"));
    }
}
