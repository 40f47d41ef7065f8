//! `vramshim exporter --listen ADDR:PORT`: the node registry as Prometheus text at `/metrics`
//! (exposition format 0.0.4, which OpenMetrics scrapers read too). A tiny blocking HTTP/1.1
//! server on `std::net`: one request per connection, each connection on its own thread, each
//! bounded by one deadline for its request and one for its response and by a request-size
//! limit; at most [`MAX_CONNECTIONS`] at once, the oldest closed for a new one past that. So
//! clients that connect and send nothing (or read nothing) never make a scrape wait for them,
//! and memory and threads stay bounded. One scrape runs at a time; each reads the registry
//! once (one pass over its slots, one `/proc/<pid>/stat` read per registered process) and NVML
//! once per GPU. Metric names: docs/metrics.md.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use vramshim_region::registry::{FLAG_WAITING, Registered};

use super::{kube, node};

#[derive(clap::Args)]
pub struct Args {
    /// Address to serve `/metrics` on, e.g. `127.0.0.1:9400` or `0.0.0.0:9400`.
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: Option<String>,
    /// The node registry (default: VRAMSHIM_REGISTRY, else /dev/shm/vramshim-registry-<uid>).
    #[arg(long, value_name = "PATH")]
    pub registry: Option<PathBuf>,
    /// Print one scrape's text to stdout and exit (no server).
    #[arg(long)]
    pub once: bool,
    /// Leave NVML out (no per-GPU totals from the driver).
    #[arg(long)]
    pub no_nvml: bool,
    /// The kubelet's log root, whose `pods/` and `containers/` directories name the pods and
    /// containers of the processes' cgroups (pod, namespace, container_name labels).
    #[arg(long, value_name = "DIR", default_value = super::kube::DEFAULT_ROOT)]
    pub kube_logs: PathBuf,
}

const MAX_REQUEST: usize = 8192;
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections served at once. A client holds one at most [`IO_TIMEOUT`] for its request and
/// as long for its response; a new connection past this many closes the oldest, so clients
/// that only hold connections open cannot keep a scraper (whose request comes whole and is
/// answered in milliseconds) waiting, nor grow the exporter's threads or memory.
pub(crate) const MAX_CONNECTIONS: usize = 16;
/// The least time between two of the server's lines about a failed connection (the others are
/// counted and said with the next one): a client cannot flood the exporter's log.
const SAY_EVERY: Duration = Duration::from_secs(10);

pub fn main(args: Args) -> Result<ExitCode, String> {
    let reg = node::registry_path(args.registry.as_deref())?;
    let nvml = if args.no_nvml {
        None
    } else {
        nvml::Nvml::open()
    };
    if args.once {
        // The text still goes out (its `vramshim_registry_error 1` included, for a collector
        // that reads it), but a script must not take a node it could not read for an empty one.
        let (text, error) = scrape_checked(&reg, nvml.as_ref(), &args.kube_logs);
        print!("{text}");
        return match error {
            None => Ok(ExitCode::SUCCESS),
            Some(e) => Err(format!("exporter --once: {e}")),
        };
    }
    let Some(addr) = args.listen else {
        return Err("exporter: --listen ADDR:PORT is required (or --once to print one scrape); e.g. --listen 127.0.0.1:9400".into());
    };
    let listener = TcpListener::bind(addr.as_str()).map_err(|e| {
        format!("exporter: cannot listen on {addr:?}: {e}; accepted: ADDR:PORT, e.g. 127.0.0.1:9400 or [::1]:9400")
    })?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    eprintln!(
        "vramshim exporter: serving http://{local}/metrics from {}{}",
        reg.display(),
        if nvml.is_some() {
            ""
        } else {
            " (no NVML: per-GPU totals from the driver left out)"
        }
    );
    let server = Arc::new(Server {
        reg,
        nvml,
        kube: args.kube_logs,
        open: Mutex::new(VecDeque::new()),
        said: Mutex::new(Said::default()),
    });
    server.run(listener);
    Ok(ExitCode::SUCCESS)
}

/// What every connection's thread shares.
pub(crate) struct Server {
    reg: PathBuf,
    nvml: Option<nvml::Nvml>,
    kube: PathBuf,
    /// The connections being served, oldest first (a clone of each, to close it).
    open: Mutex<VecDeque<(u64, TcpStream)>>,
    said: Mutex<Said>,
}

/// The server's lines about failed connections, at most one per [`SAY_EVERY`].
#[derive(Default)]
struct Said {
    last: Option<Instant>,
    unsaid: u64,
}

impl Server {
    /// Accepts connections for ever, each served on its own thread.
    pub(crate) fn run(self: &Arc<Self>, listener: TcpListener) {
        for (id, conn) in (0u64..).zip(listener.incoming()) {
            match conn {
                Ok(s) => self.start(id, s),
                Err(e) => self.say(&format!("accept: {e}")),
            }
        }
    }

    fn start(self: &Arc<Self>, id: u64, s: TcpStream) {
        let clone = match s.try_clone() {
            Ok(c) => c,
            Err(e) => return self.say(&format!("a connection dropped: {e}")),
        };
        {
            let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
            while open.len() >= MAX_CONNECTIONS {
                if let Some((_, oldest)) = open.pop_front() {
                    // Its thread's read or write fails at once, and the thread ends.
                    let _ = oldest.shutdown(Shutdown::Both);
                }
            }
            open.push_back((id, clone));
        }
        let me = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("vramshim-http".into())
            .spawn(move || {
                if let Err(e) = serve(s, &me.reg, me.nvml.as_ref(), &me.kube) {
                    me.say(&e);
                }
                me.open
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .retain(|(i, _)| *i != id);
            });
        if let Err(e) = spawned {
            self.open
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .retain(|(i, _)| *i != id);
            self.say(&format!("a connection dropped: no thread for it: {e}"));
        }
    }

    fn say(&self, line: &str) {
        let mut said = self.said.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        if said.last.is_some_and(|t| now.duration_since(t) < SAY_EVERY) {
            said.unsaid += 1;
            return;
        }
        let more = match std::mem::take(&mut said.unsaid) {
            0 => String::new(),
            n => format!(
                " ({n} more such lines in the last {} s not shown)",
                SAY_EVERY.as_secs()
            ),
        };
        said.last = Some(now);
        eprintln!("vramshim exporter: {line}{more}");
    }
}

/// One connection: read one request (bounded), answer it, close.
fn serve(
    mut s: TcpStream,
    reg: &Path,
    nvml: Option<&nvml::Nvml>,
    kube: &std::path::Path,
) -> Result<(), String> {
    s.set_read_timeout(Some(IO_TIMEOUT))
        .map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(IO_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    // One deadline for the whole request, not per read: a client trickling a byte at a time
    // would otherwise hold its connection, and its thread, for hours.
    let deadline = std::time::Instant::now() + IO_TIMEOUT;
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(format!(
                "reading a request: timed out after {} s",
                IO_TIMEOUT.as_secs()
            ));
        }
        s.set_read_timeout(Some(left)).map_err(|e| e.to_string())?;
        if buf.len() >= MAX_REQUEST {
            return respond(
                &mut s,
                "431 Request Header Fields Too Large",
                "text/plain",
                "request too large\n",
            );
        }
        match s.read(&mut chunk) {
            // Closed before the blank line that ends a request (or closed by the server for a
            // newer connection): nothing to answer.
            Ok(0) => return Err("a connection closed before the end of its request".into()),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            // The read timeout (the deadline) reads as EAGAIN on Linux.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(format!(
                    "reading a request: timed out after {} s",
                    IO_TIMEOUT.as_secs()
                ));
            }
            Err(e) => return Err(format!("reading a request: {e}")),
        }
    }
    let line = buf.split(|&b| b == b'\n').next().unwrap_or(&[]);
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_ascii_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET", "/metrics") => {
            // One scrape at a time: concurrent requests each get a whole, fresh scrape, and
            // never read the registry and NVML side by side.
            static SCRAPING: Mutex<()> = Mutex::new(());
            let body = {
                let _one = SCRAPING.lock().unwrap_or_else(PoisonError::into_inner);
                scrape(reg, nvml, kube)
            };
            respond(
                &mut s,
                "200 OK",
                "text/plain; version=0.0.4; charset=utf-8",
                &body,
            )
        }
        ("GET", "/") => respond(
            &mut s,
            "200 OK",
            "text/html; charset=utf-8",
            "<html><body><a href=\"/metrics\">/metrics</a></body></html>\n",
        ),
        ("GET", _) => respond(
            &mut s,
            "404 Not Found",
            "text/plain",
            "only /metrics is served\n",
        ),
        _ => respond(
            &mut s,
            "405 Method Not Allowed",
            "text/plain",
            "only GET is served\n",
        ),
    }
}

/// Writes the response within one deadline for the whole of it: a client reading a byte at
/// a time would otherwise hold its connection for as long as it liked.
fn respond(s: &mut TcpStream, status: &str, ctype: &str, body: &str) -> Result<(), String> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let deadline = Instant::now() + IO_TIMEOUT;
    let timed_out = || {
        format!(
            "writing a response: timed out after {} s",
            IO_TIMEOUT.as_secs()
        )
    };
    for part in [head.as_bytes(), body.as_bytes()] {
        let mut rest = part;
        while !rest.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(timed_out());
            }
            s.set_write_timeout(Some(left)).map_err(|e| e.to_string())?;
            match s.write(rest) {
                Ok(0) => return Err("writing a response: the connection closed".into()),
                Ok(n) => rest = &rest[n..],
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(timed_out());
                }
                Err(e) => return Err(format!("writing a response: {e}")),
            }
        }
    }
    Ok(())
}

/// A label value with `\`, `"` and newlines escaped (the exposition format's rule), and the
/// characters a terminal escapes written as their escape first (`\u{1b}`, `\u{202e}`): a
/// name a process chose reaches `--once`'s terminal and every dashboard that shows the series,
/// where an escape sequence or a right-to-left override would act as it does on a terminal.
fn esc(v: &str) -> String {
    let v = vramshim_analyzer::render::for_terminal(v);
    let mut o = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => o.push_str("\\\\"),
            '"' => o.push_str("\\\""),
            '\n' => o.push_str("\\n"),
            c => o.push(c),
        }
    }
    o
}

fn process_labels(p: &Registered, names: &kube::Names) -> String {
    let c = &p.identity.container;
    let mut l = format!(
        "pid=\"{}\",uid=\"{}\",cmd=\"{}\"",
        p.pid,
        p.identity.uid,
        esc(&p.identity.cmd)
    );
    if !p.identity.group.is_empty() {
        let _ = write!(l, ",group=\"{}\"", esc(&p.identity.group));
    }
    if !c.id.is_empty() {
        let _ = write!(l, ",container=\"{}\"", esc(&c.id));
    }
    if let Some(name) = names.container(&c.id) {
        let _ = write!(l, ",container_name=\"{}\"", esc(name));
    }
    if !c.pod_uid.is_empty() {
        let _ = write!(l, ",pod_uid=\"{}\"", esc(&c.pod_uid));
    }
    if let Some(pod) = names.pod(&c.pod_uid) {
        let _ = write!(
            l,
            ",pod=\"{}\",namespace=\"{}\"",
            esc(&pod.name),
            esc(&pod.namespace)
        );
    }
    if c.runtime != vramshim_region::registry::Runtime::None {
        let _ = write!(l, ",runtime=\"{}\"", c.runtime.name());
    }
    l
}

struct Family {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    lines: String,
}

impl Family {
    fn new(name: &'static str, kind: &'static str, help: &'static str) -> Family {
        Family {
            name,
            kind,
            help,
            lines: String::new(),
        }
    }

    fn add(&mut self, labels: &str, v: u64) {
        let _ = writeln!(self.lines, "{}{{{labels}}} {v}", self.name);
    }

    fn write(&self, o: &mut String) {
        let _ = writeln!(o, "# HELP {} {}", self.name, self.help);
        let _ = writeln!(o, "# TYPE {} {}", self.name, self.kind);
        o.push_str(&self.lines);
    }
}

/// One scrape's text; a registry that cannot be read is said on stderr (the long-running
/// exporter goes on serving, with `vramshim_registry_error 1`).
pub(crate) fn scrape(
    reg: &std::path::Path,
    nvml: Option<&nvml::Nvml>,
    kube_root: &std::path::Path,
) -> String {
    let (text, error) = scrape_checked(reg, nvml, kube_root);
    if let Some(e) = error {
        eprintln!(
            "vramshim exporter: {}",
            vramshim_analyzer::render::one_line(&e)
        );
    }
    text
}

/// One scrape's text, and why the registry could not be read when it could not.
fn scrape_checked(
    reg: &std::path::Path,
    nvml: Option<&nvml::Nvml>,
    kube_root: &std::path::Path,
) -> (String, Option<String>) {
    let t0 = Instant::now();
    let (names, said) = kube::read(kube_root);
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !said.is_empty() && !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        for l in said {
            eprintln!("vramshim exporter: {l}");
        }
    }
    let (procs, failure) = match node::read(reg) {
        Ok(p) => (p, None),
        Err(e) => (Vec::new(), Some(e)),
    };
    let error = u8::from(failure.is_some());
    let mut used = Family::new(
        "vramshim_process_used_bytes",
        "gauge",
        "Device memory the process holds now (its live allocations, as vramshim counts them).",
    );
    let mut peak = Family::new(
        "vramshim_process_peak_bytes",
        "gauge",
        "The most device memory the process held at once so far.",
    );
    let mut cap = Family::new(
        "vramshim_process_cap_bytes",
        "gauge",
        "The cap that binds the process on the device: its own, or with VRAMSHIM_SHARED the smaller of the group's and the member's own; absent when uncapped.",
    );
    let mut group_cap = Family::new(
        "vramshim_process_group_cap_bytes",
        "gauge",
        "The cap of the process's VRAMSHIM_SHARED group on the device (its members' total); absent outside a group, when the group is uncapped, or when vramshim_process_group_cap_known is 0.",
    );
    let mut group_cap_known = Family::new(
        "vramshim_process_group_cap_known",
        "gauge",
        "For a VRAMSHIM_SHARED member: 1 where its libvramshim.so publishes its group's cap, 0 where the library predates it (the group's cap is then unknown, not absent).",
    );
    let mut pool = Family::new(
        "vramshim_process_pool_reserved_bytes",
        "gauge",
        "Device memory the process's pool reserves from the driver (VRAMSHIM_POOL).",
    );
    let mut refusals = Family::new(
        "vramshim_process_cap_refusals_total",
        "counter",
        "Allocations the cap refused in the process.",
    );
    let mut ooms = Family::new(
        "vramshim_process_ooms_total",
        "counter",
        "Allocations that failed in the process (the driver's out-of-memory and other failures).",
    );
    let mut waiting = Family::new(
        "vramshim_process_waiting_on_cap",
        "gauge",
        "1 while a request of the process waits for its shared cap (VRAMSHIM_ON_CAP=wait).",
    );
    // Per GPU: (ordinal seen by the first process, sum of use).
    let mut gpus: BTreeMap<String, u64> = BTreeMap::new();
    for p in &procs {
        let pl = process_labels(p, &names);
        refusals.add(&pl, p.refusals);
        ooms.add(&pl, p.ooms);
        waiting.add(&pl, u64::from(p.flags & FLAG_WAITING != 0));
        for d in &p.devices {
            let gpu = node::gpu_name(d);
            let dl = format!("{pl},device=\"{}\",uuid=\"{}\"", d.ordinal, esc(&gpu));
            used.add(&dl, d.used);
            peak.add(&dl, d.peak);
            if let Some(c) = d.cap {
                cap.add(&dl, c);
            }
            if let Some(c) = d.group_cap {
                group_cap.add(&dl, c);
            }
            if !p.identity.group.is_empty() {
                group_cap_known.add(&dl, u64::from(p.group_cap_known()));
            }
            pool.add(&dl, d.pool_reserved);
            *gpus.entry(gpu).or_default() += d.used + d.pool_reserved;
        }
    }
    let mut gpu_used = Family::new(
        "vramshim_gpu_used_bytes",
        "gauge",
        "Sum over the registered processes of their use and pool reserve on the GPU.",
    );
    let mut gpu_total = Family::new(
        "vramshim_gpu_memory_total_bytes",
        "gauge",
        "The GPU's memory as NVML reports it.",
    );
    let mut gpu_driver_used = Family::new(
        "vramshim_gpu_memory_used_bytes",
        "gauge",
        "The GPU's memory in use as NVML reports it (every process, vramshim or not, and the driver's own).",
    );
    let mut unaccounted = Family::new(
        "vramshim_gpu_unaccounted_bytes",
        "gauge",
        "Memory NVML reports in use that no registered vramshim process accounts for (other processes, contexts, the driver).",
    );
    let mut nvml_gpus = BTreeMap::new();
    if let Some(n) = nvml {
        for (uuid, total, used_now) in n.devices() {
            nvml_gpus.insert(uuid.to_ascii_lowercase(), (uuid, total, used_now));
        }
    }
    for (gpu, sum) in &gpus {
        gpu_used.add(&format!("uuid=\"{}\"", esc(gpu)), *sum);
    }
    for (uuid, total, used_now) in nvml_gpus.values() {
        let l = format!("uuid=\"{}\"", esc(uuid));
        gpu_total.add(&l, *total);
        gpu_driver_used.add(&l, *used_now);
        let ours = gpus
            .iter()
            .find(|(g, _)| g.eq_ignore_ascii_case(uuid))
            .map_or(0, |(_, s)| *s);
        unaccounted.add(&l, used_now.saturating_sub(ours));
    }
    let mut o = String::with_capacity(256 + procs.len() * 1024);
    for f in [
        &used,
        &peak,
        &cap,
        &group_cap,
        &group_cap_known,
        &pool,
        &refusals,
        &ooms,
        &waiting,
        &gpu_used,
        &gpu_total,
        &gpu_driver_used,
        &unaccounted,
    ] {
        f.write(&mut o);
    }
    let _ = writeln!(
        o,
        "# HELP vramshim_registered_processes Processes in the node registry now.\n# TYPE vramshim_registered_processes gauge\nvramshim_registered_processes {}",
        procs.len()
    );
    let _ = writeln!(
        o,
        "# HELP vramshim_registry_error 1 when the registry could not be read (the exporter's stderr says why).\n# TYPE vramshim_registry_error gauge\nvramshim_registry_error {error}"
    );
    let _ = writeln!(
        o,
        "# HELP vramshim_scrape_duration_seconds Time this scrape took to read the registry and NVML.\n# TYPE vramshim_scrape_duration_seconds gauge\nvramshim_scrape_duration_seconds {:.6}",
        t0.elapsed().as_secs_f64()
    );
    (o, failure)
}

/// NVML through `dlopen` (the exporter runs on nodes with and without a driver).
pub(crate) mod nvml {
    use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

    type Init = unsafe extern "C" fn() -> c_int;
    type Count = unsafe extern "C" fn(*mut c_uint) -> c_int;
    type Handle = unsafe extern "C" fn(c_uint, *mut *mut c_void) -> c_int;
    type Uuid = unsafe extern "C" fn(*mut c_void, *mut c_char, c_uint) -> c_int;
    type MemInfo = unsafe extern "C" fn(*mut c_void, *mut Memory) -> c_int;

    #[repr(C)]
    #[derive(Default)]
    pub struct Memory {
        total: u64,
        free: u64,
        used: u64,
    }

    pub struct Nvml {
        count: Count,
        handle: Handle,
        uuid: Uuid,
        mem: MemInfo,
    }

    fn sym(h: *mut c_void, name: &CStr) -> Option<usize> {
        // SAFETY: h is a live dlopen handle; name is NUL-terminated.
        let p = unsafe { libc::dlsym(h, name.as_ptr()) };
        (!p.is_null()).then_some(p as usize)
    }

    impl Nvml {
        /// `libnvidia-ml.so.1`, initialised; None where there is none or it fails.
        pub fn open() -> Option<Nvml> {
            // SAFETY: dlopen with a NUL-terminated name; the handle is never closed (NVML
            // stays loaded for the life of the exporter).
            let h = unsafe {
                libc::dlopen(
                    c"libnvidia-ml.so.1".as_ptr(),
                    libc::RTLD_NOW | libc::RTLD_LOCAL,
                )
            };
            if h.is_null() {
                return None;
            }
            let init = sym(h, c"nvmlInit_v2")?;
            // SAFETY: each address is NVML's function of that name, whose C signature the
            // type spells (nvml.h).
            let n = unsafe {
                Nvml {
                    count: std::mem::transmute::<usize, Count>(sym(h, c"nvmlDeviceGetCount_v2")?),
                    handle: std::mem::transmute::<usize, Handle>(sym(
                        h,
                        c"nvmlDeviceGetHandleByIndex_v2",
                    )?),
                    uuid: std::mem::transmute::<usize, Uuid>(sym(h, c"nvmlDeviceGetUUID")?),
                    mem: std::mem::transmute::<usize, MemInfo>(sym(h, c"nvmlDeviceGetMemoryInfo")?),
                }
            };
            // SAFETY: as above; nvmlInit_v2 takes no arguments.
            let rc = unsafe { std::mem::transmute::<usize, Init>(init)() };
            (rc == 0).then_some(n)
        }

        /// (UUID, total, used) of each GPU NVML sees.
        pub fn devices(&self) -> Vec<(String, u64, u64)> {
            let mut n: c_uint = 0;
            // SAFETY: n is a valid out-pointer.
            if unsafe { (self.count)(&mut n) } != 0 {
                return Vec::new();
            }
            let mut out = Vec::new();
            for i in 0..n.min(64) {
                let mut h = std::ptr::null_mut();
                let mut buf = [0 as c_char; 96];
                let mut m = Memory::default();
                // SAFETY: out-pointers valid for the calls; buf's length is passed.
                let ok = unsafe {
                    (self.handle)(i, &mut h) == 0
                        && (self.uuid)(h, buf.as_mut_ptr(), buf.len() as c_uint) == 0
                        && (self.mem)(h, &mut m) == 0
                };
                if ok {
                    buf[buf.len() - 1] = 0;
                    // SAFETY: buf is NUL-terminated (forced above).
                    let uuid = unsafe { CStr::from_ptr(buf.as_ptr()) }
                        .to_string_lossy()
                        .into_owned();
                    out.push((uuid, m.total, m.used));
                }
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A registry at `path` with this process registered in it (as `python`, in `group` and
    /// `container`): the registry, the process's key and its slot.
    fn register_me(
        path: &std::path::Path,
        group: &str,
        container: vramshim_region::registry::Container,
    ) -> (
        vramshim_region::registry::Registry,
        vramshim_region::ProcessKey,
        vramshim_region::registry::RegSlotIndex,
    ) {
        use vramshim_region::registry::{Identity, Registry};
        let reg = Registry::open_or_create(path).unwrap();
        let me = vramshim_region::ProcessKey::current().unwrap();
        let id = Identity {
            uid: 1000,
            start_ticks: vramshim_region::proc::stat(me.pid()).unwrap().0,
            cmd: "python".into(),
            group: group.into(),
            container,
        };
        let slot = reg.register(me, &id).unwrap();
        (reg, me, slot)
    }

    /// A group member whose own cap is stricter than the group's: its cap series is its own
    /// (the one that binds it), the group's cap has its own series beside it.
    #[test]
    fn a_members_binding_cap_and_its_groups_cap() {
        use vramshim_region::DeviceId;
        use vramshim_region::registry::DeviceRecord;
        let dir = vramshim_testkit::TempDir::new("exp-cap");
        let reg_path = dir.join("registry");
        let (reg, me, s) = register_me(&reg_path, "job", Default::default());
        let rec = DeviceRecord {
            ordinal: 0,
            uuid: Some(DeviceId([0x22; 16])),
            cap: Some(1 << 30),
            group_cap: Some(4 << 30),
            used: 1 << 20,
            ..DeviceRecord::default()
        };
        reg.publish_device(s, 0, &rec);
        let text = scrape(&reg_path, None, &dir.join("no-such-dir"));
        let value = |name: &str| {
            text.lines()
                .find(|l| l.starts_with(&format!("{name}{{")) && l.contains("group=\"job\""))
                .and_then(|l| l.rsplit(' ').next())
                .map(str::to_string)
                .unwrap_or_else(|| panic!("no {name}: {text}"))
        };
        assert_eq!(
            value("vramshim_process_cap_bytes"),
            (1u64 << 30).to_string()
        );
        assert_eq!(
            value("vramshim_process_group_cap_bytes"),
            (4u64 << 30).to_string()
        );
        assert_eq!(value("vramshim_process_group_cap_known"), "1");
        // The same member under a library that predates the group cap: no group cap series
        // (neither its own cap nor a previous owner's value), and it says it does not know.
        reg.set_flag(s, vramshim_region::registry::FLAG_GROUP_CAP, false);
        let text = scrape(&reg_path, None, &dir.join("no-such-dir"));
        assert!(
            !text.contains("vramshim_process_group_cap_bytes{"),
            "{text}"
        );
        assert!(
            text.lines()
                .any(|l| l.starts_with("vramshim_process_group_cap_known{") && l.ends_with(" 0")),
            "{text}"
        );
        reg.unregister(s, me);
    }

    /// A client that sends part of a request and stops is dropped at the deadline, and the
    /// server's line says it timed out (not the system's "Resource temporarily unavailable").
    #[test]
    fn a_stalled_request_is_said_to_time_out() {
        use std::io::Write;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        client.write_all(b"GET /met").unwrap();
        let (conn, _) = l.accept().unwrap();
        let dir = std::env::temp_dir();
        let e = serve(conn, &dir.join("no-registry"), None, &dir.join("no-logs")).unwrap_err();
        assert_eq!(e, "reading a request: timed out after 5 s");
    }

    /// A server on a free local port, serving an absent registry (an empty node) for ever.
    fn server() -> std::net::SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let dir = std::env::temp_dir();
        let server = Arc::new(Server {
            reg: dir.join("vramshim-no-registry-here"),
            nvml: None,
            kube: dir.join("vramshim-no-logs-here"),
            open: Mutex::new(VecDeque::new()),
            said: Mutex::new(Said::default()),
        });
        std::thread::spawn(move || server.run(l));
        addr
    }

    /// `/metrics`' answer (status line and body), read to the end.
    fn get_metrics(addr: std::net::SocketAddr) -> String {
        let mut c = TcpStream::connect(addr).unwrap();
        // only so that a broken server fails the test instead of hanging it
        c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut text = String::new();
        c.read_to_string(&mut text).unwrap();
        text
    }

    /// Whether the server closed `c` (a read ends at once) rather than left it open.
    fn closed(c: &mut TcpStream) -> bool {
        c.set_nonblocking(true).unwrap();
        let mut b = [0u8; 1];
        match c.read(&mut b) {
            Ok(_) => true,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
            Err(_) => true,
        }
    }

    /// Clients that connect and send nothing do not make a scrape wait for them: it is
    /// answered while they are all still connected (a server serving one connection at a time
    /// answers only after each of them timed out and was closed).
    #[test]
    fn silent_connections_do_not_delay_a_scrape() {
        let addr = server();
        let mut silent: Vec<TcpStream> =
            (0..3).map(|_| TcpStream::connect(addr).unwrap()).collect();
        let text = get_metrics(addr);
        assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
        assert!(text.contains("vramshim_registered_processes 0"), "{text}");
        for (i, c) in silent.iter_mut().enumerate() {
            assert!(
                !closed(c),
                "silent connection {i} was closed before the scrape"
            );
        }
    }

    /// Past [`MAX_CONNECTIONS`] open at once, each new connection closes the oldest: silent
    /// clients can neither hold every slot nor grow the server's threads.
    #[test]
    fn the_oldest_connection_makes_room_for_a_new_one() {
        let addr = server();
        let mut silent: Vec<TcpStream> = (0..MAX_CONNECTIONS + 1)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        // (the scrape's own connection is the one more past the limit)
        let text = get_metrics(addr);
        assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
        let states: Vec<bool> = silent.iter_mut().map(closed).collect();
        let mut wanted = vec![false; MAX_CONNECTIONS + 1];
        wanted[0] = true;
        wanted[1] = true;
        assert_eq!(states, wanted, "which silent connections were closed");
    }

    /// A client that reads its answer a little at a time is dropped at the response's
    /// deadline, however steadily it reads (a timeout per write would let it hold the
    /// connection for as long as the answer lasts).
    #[test]
    fn a_slowly_read_response_ends_at_its_deadline() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut conn, _) = l.accept().unwrap();
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop = Arc::clone(&done);
        let reader = std::thread::spawn(move || {
            // 4 KiB every 50 ms, for at most 4 x the deadline; then it hangs up
            let mut b = [0u8; 4096];
            let end = Instant::now() + 4 * IO_TIMEOUT;
            while Instant::now() < end && !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match client.read(&mut b) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        });
        let body = "x".repeat(64 << 20);
        let e = respond(&mut conn, "200 OK", "text/plain", &body).unwrap_err();
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(e, "writing a response: timed out after 5 s");
        reader.join().unwrap();
    }

    /// Failed connections are said at most once per [`SAY_EVERY`]: the others are counted
    /// (and the count said with the next line), so clients cannot flood the exporter's log.
    #[test]
    fn failed_connections_are_said_at_most_once_per_period() {
        let dir = std::env::temp_dir();
        let server = Server {
            reg: dir.join("vramshim-no-registry-here"),
            nvml: None,
            kube: dir.join("vramshim-no-logs-here"),
            open: Mutex::new(VecDeque::new()),
            said: Mutex::new(Said::default()),
        };
        for _ in 0..100 {
            server.say("reading a request: timed out after 5 s");
        }
        let said = server.said.lock().unwrap();
        assert!(said.last.is_some());
        assert_eq!(said.unsaid, 99);
    }

    #[test]
    fn escapes_label_values() {
        assert_eq!(esc("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    /// A name a process chose (here its group) with an escape sequence, a bell and a
    /// right-to-left override reaches the scrape's text as their escapes, never raw.
    #[test]
    fn a_chosen_names_control_characters_are_escaped_in_the_scrape() {
        let dir = vramshim_testkit::TempDir::new("exp-hostile");
        let reg_path = dir.join("registry");
        let _registered = register_me(&reg_path, "g\u{1b}]0;x\u{7}\u{202e}y", Default::default());
        let text = scrape(&reg_path, None, &dir.join("no-such-dir"));
        for c in ['\u{1b}', '\u{7}', '\u{202e}'] {
            assert!(!text.contains(c), "{c:?} raw in the scrape:\n{text}");
        }
        assert!(
            text.contains(r#"group="g\\u{1b}]0;x\\u{7}\\u{202e}y""#),
            "{text}"
        );
    }

    /// A process in a pod (its cgroup gave the pod UID and the container id) gets the pod's
    /// name and namespace and the container's name from the kubelet's directories (a fake
    /// tree here); without them, only the UID and the id.
    #[test]
    fn pod_namespace_and_container_names_from_the_kubelet() {
        use std::os::unix::fs::PermissionsExt;
        use vramshim_region::registry::{Container, Runtime};
        const UID: &str = "0b7d8f3c-5a1e-4c2b-9d6f-1e2a3b4c5d6e";
        const CID: &str = "4f1e2d3c4b5a69788796a5b4c3d2e1f0a1b2c3d4e5f60718293a4b5c6d7e8f90";
        let dir = vramshim_testkit::TempDir::new("exp-kube");
        let logs = dir.join("log");
        std::fs::create_dir_all(logs.join(format!("pods/ml_trainer-0_{UID}/pytorch"))).unwrap();
        std::fs::create_dir_all(logs.join("containers")).unwrap();
        for d in ["pods", "containers"] {
            std::fs::set_permissions(logs.join(d), std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        std::os::unix::fs::symlink(
            logs.join(format!("pods/ml_trainer-0_{UID}/pytorch/0.log")),
            logs.join(format!("containers/trainer-0_ml_pytorch-{CID}.log")),
        )
        .unwrap();
        let reg_path = dir.join("registry");
        let container = Container {
            runtime: Runtime::Containerd,
            id: CID.into(),
            pod_uid: UID.into(),
        };
        let _registered = register_me(&reg_path, "", container);
        let text = scrape(&reg_path, None, &logs);
        let line = text
            .lines()
            .find(|l| l.starts_with("vramshim_process_cap_refusals_total{"))
            .unwrap_or_else(|| panic!("{text}"));
        assert!(
            line.contains(&format!(
                "container=\"{CID}\",container_name=\"pytorch\",pod_uid=\"{UID}\",pod=\"trainer-0\",namespace=\"ml\""
            )),
            "{line}"
        );
        let text = scrape(&reg_path, None, &dir.join("no-such-dir"));
        assert!(
            !text.contains("namespace=") && text.contains(&format!("pod_uid=\"{UID}\"")),
            "{text}"
        );
    }
}
