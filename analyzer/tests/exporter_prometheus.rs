//! `vramshim exporter` scraped by a real Prometheus server (Debian's `prometheus` package)
//! while capped processes (tests/workloads/cap/cap_probe.c under libvramshim.so) run on one
//! simulated GPU: a PromQL query through Prometheus's HTTP API returns each process's bytes in
//! use and the group's cap; a process that exits and one that is SIGKILLed disappear.
//!
//! Without `prometheus` on PATH the test skips with one line; `VRAMSHIM_REQUIRE_VIEWERS=1`
//! (set by .ci/run, which installs the package) makes that a failure.
//! Needs the workspace built (interposer, analyzer, cuda-sim).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use vramshim_testkit::{Link, compile_c, interposer_lib, sim_command, temp_dir, unique_name};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// A bound on every wait (not a timing assertion: only a hang fails it).
const PATIENCE: Duration = Duration::from_secs(120);

fn prometheus() -> Option<PathBuf> {
    for d in std::env::var("PATH").unwrap_or_default().split(':') {
        let p = Path::new(d).join("prometheus");
        if p.is_file() {
            return Some(p);
        }
    }
    let required = std::env::var("VRAMSHIM_REQUIRE_VIEWERS").is_ok_and(|v| v == "1");
    assert!(
        !required,
        "VRAMSHIM_REQUIRE_VIEWERS=1 but no prometheus on PATH (apt-get install prometheus)"
    );
    eprintln!("skipped: no prometheus on PATH (apt-get install prometheus)");
    None
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A plain HTTP GET on 127.0.0.1 (status, body).
fn get(port: u16, target: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(20))).ok()?;
    write!(
        s,
        "GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).ok()?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    // Prometheus answers small bodies whole, larger ones chunked.
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    Some((status, body))
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

fn enc(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'-' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// An instant PromQL query: (labels, value) of each series.
fn query(port: u16, q: &str) -> Vec<(Value, f64)> {
    let Some((200, body)) = get(port, &format!("/api/v1/query?query={}", enc(q))) else {
        return Vec::new();
    };
    let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    v["data"]["result"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|r| {
                    let val = r["value"][1]
                        .as_str()
                        .unwrap_or("nan")
                        .parse()
                        .unwrap_or(f64::NAN);
                    (r["metric"].clone(), val)
                })
                .collect()
        })
        .unwrap_or_default()
}

fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let t0 = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(t0.elapsed() < PATIENCE, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// `cap_probe hold SIZE SECONDS` under the library in group `group`, once it holds its memory.
fn holder(sim: &str, env: &[(&str, String)], size: u64, secs: u32) -> Child {
    let probe = compile_c(
        "cap_probe",
        &["tests/workloads/cap/cap_probe.c"],
        Link::SharedRuntime,
    );
    let mut c = sim_command(probe, "exporter");
    c.env("VRAMSIM_NAME", sim)
        // Contexts cost nothing here, so that the cap counts exactly what each holder holds.
        .env("VRAMSIM_CONTEXT_OVERHEAD", "0")
        .env("LD_PRELOAD", interposer_lib())
        .args(["hold", &size.to_string(), &secs.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (k, v) in env {
        c.env(k, v);
    }
    let mut child = c.spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("hold rc=0"), "holder: {line:?}");
    child
}

fn pids_in(series: &[(Value, f64)]) -> Vec<(u32, f64)> {
    let mut v: Vec<(u32, f64)> = series
        .iter()
        .map(|(m, x)| (m["pid"].as_str().unwrap_or("0").parse().unwrap_or(0), *x))
        .collect();
    v.sort_by_key(|p| p.0);
    v
}

#[test]
fn prometheus_scrapes_the_exporter_and_dead_processes_disappear() {
    let Some(prom) = prometheus() else {
        return;
    };
    interposer_lib();
    let dir = temp_dir("exporter-prometheus");
    let registry = dir.join("registry");
    let sim = unique_name("exporter");
    let group = unique_name("expgrp");
    let env = vec![
        ("VRAMSHIM_REGISTRY", registry.display().to_string()),
        ("VRAMSHIM_SHARED", group.clone()),
        ("VRAMSHIM_CAP", "1GiB".to_string()),
    ];

    // The exporter, on the same simulated GPU (its NVML) and registry.
    let mut ex = sim_command(env!("CARGO_BIN_EXE_vramshim"), "exporter");
    ex.env("VRAMSIM_NAME", &sim)
        .args(["exporter", "--listen", "127.0.0.1:0", "--registry"])
        .arg(&registry)
        .stderr(Stdio::piped());
    let mut exporter = Killed(ex.spawn().unwrap());
    let mut first = String::new();
    BufReader::new(exporter.0.stderr.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let addr = first
        .split("http://")
        .nth(1)
        .and_then(|r| r.split("/metrics").next())
        .unwrap_or_else(|| panic!("exporter said {first:?}"))
        .to_string();
    let ex_port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();

    // Prometheus, scraping it every second.
    let prom_port = free_port();
    let cfg = dir.join("prometheus.yml");
    std::fs::write(
        &cfg,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: vramshim\n    static_configs:\n      - targets: ['{addr}']\n"
        ),
    )
    .unwrap();
    let _prom = Killed(
        Command::new(prom)
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for("Prometheus to be ready", || {
        matches!(get(prom_port, "/-/ready"), Some((200, _))).then_some(())
    });

    let a = Killed(holder(&sim, &env, 300 * MIB, 600));
    let b = holder(&sim, &env, 200 * MIB, 600);
    let mut b = Killed(b);
    let (a_pid, b_pid) = (a.0.id(), b.0.id());
    // A third that exits by itself (after 6 s): registered while it runs.
    let mut c = holder(&sim, &env, 100 * MIB, 6);
    let c_pid = c.id();
    let (code, once) = {
        let o = Command::new(env!("CARGO_BIN_EXE_vramshim"))
            .args(["exporter", "--once", "--no-nvml", "--registry"])
            .arg(&registry)
            .output()
            .unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
        )
    };
    assert_eq!(code, Some(0));
    assert!(
        once.contains(&format!("pid=\"{c_pid}\"")),
        "a running process is registered:\n{once}"
    );

    // Each process's bytes in use, through PromQL.
    let used_q = format!("vramshim_process_used_bytes{{group=\"{group}\"}}");
    let seen = wait_for("both holders' use in Prometheus", || {
        let v = pids_in(&query(prom_port, &used_q));
        let has = |pid: u32, bytes: u64| v.iter().any(|&(p, x)| p == pid && x == bytes as f64);
        (has(a_pid, 300 * MIB) && has(b_pid, 200 * MIB)).then_some(v)
    });
    eprintln!("in use per process: {seen:?}");
    let caps = query(
        prom_port,
        &format!("max by (group) (vramshim_process_cap_bytes{{group=\"{group}\"}})"),
    );
    assert_eq!(caps.len(), 1, "{caps:?}");
    assert_eq!(caps[0].1, GIB as f64, "the group's cap");
    // Labels operators filter on.
    let one = query(
        prom_port,
        &format!("vramshim_process_used_bytes{{pid=\"{a_pid}\"}}"),
    );
    let m = &one[0].0;
    assert_eq!(m["cmd"], "cap_probe");
    assert_eq!(m["device"], "0");
    assert!(m["uuid"].as_str().unwrap().starts_with("GPU-"), "{m}");
    assert!(m["uid"].as_str().is_some(), "{m}");
    // Per GPU: the sum, and (NVML of the simulated GPU) what no registered process accounts for.
    let gpu = wait_for("the GPU's NVML numbers", || {
        let v = query(prom_port, "vramshim_gpu_unaccounted_bytes");
        (!v.is_empty()).then_some(v)
    });
    assert_eq!(gpu[0].0["uuid"], m["uuid"], "NVML's UUID is the registry's");

    // The process that exited, and the one SIGKILLed, disappear.
    assert!(c.wait().unwrap().success());
    b.0.kill().unwrap(); // SIGKILL: no exit handler runs
    b.0.wait().unwrap();
    let left = wait_for("the dead processes to disappear", || {
        let v = pids_in(&query(prom_port, &used_q));
        (v.len() == 1).then_some(v)
    });
    assert_eq!(left, vec![(a_pid, (300 * MIB) as f64)]);
    let n = query(prom_port, "vramshim_registered_processes");
    assert_eq!(n[0].1, 1.0);
    // The HTTP server's answers to what it does not serve.
    assert_eq!(get(ex_port, "/nope").map(|r| r.0), Some(404));
    drop(a);
    let _ = std::fs::remove_file(vramsim_devstate::DeviceState::path(&sim));
    let _ = std::fs::remove_dir_all(&dir);
}
