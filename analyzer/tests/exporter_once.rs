//! `vramshim exporter` when the node registry cannot be read: `--once` (for scripts and
//! textfile collectors) fails with one message; the server goes on serving the error metric.

mod common;
use common::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};

/// A file at the registry path that no vramshim would use: open to others, not a registry.
fn unreadable_registry(d: &std::path::Path) -> std::path::PathBuf {
    let p = d.join("registry");
    std::fs::write(&p, b"not a registry").unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    p
}

/// `vramshim exporter --once` on `registry` (no NVML, no kubelet logs).
fn once(d: &std::path::Path, registry: &std::path::Path) -> std::process::Output {
    Command::new(exe())
        .args(["exporter", "--once", "--no-nvml", "--registry"])
        .arg(registry)
        .arg("--kube-logs")
        .arg(d.join("no-logs"))
        .output()
        .unwrap()
}

#[test]
fn once_fails_with_one_message_when_the_registry_cannot_be_read() {
    let d = scratch("exporter-once");
    let reg = unreadable_registry(&d);
    for bad in [reg.clone(), d.to_path_buf()] {
        let out = once(&d, &bad);
        let err = String::from_utf8_lossy(&out.stderr);
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(2), "{}: {err}", bad.display());
        assert_eq!(err.lines().count(), 1, "one message: {err}");
        assert!(
            err.starts_with("vramshim: exporter --once: ")
                && err.contains(&bad.display().to_string()),
            "names the registry and why: {err}"
        );
        assert!(text.contains("vramshim_registry_error 1"), "{text}");
    }
    // An absent registry is a node with nothing registered yet: not an error.
    let out = once(&d, &d.join("absent"));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("vramshim_registry_error 0"));
}

struct Kill(std::process::Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn get_metrics(addr: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text
}

#[test]
fn the_server_keeps_serving_the_error_metric() {
    let d = scratch("exporter-serve-error");
    let reg = unreadable_registry(&d);
    let mut child = Command::new(exe())
        .args([
            "exporter",
            "--listen",
            "127.0.0.1:0",
            "--no-nvml",
            "--registry",
        ])
        .arg(&reg)
        .arg("--kube-logs")
        .arg(d.join("no-logs"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let child = Kill(child);
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    for _ in 0..2 {
        let text = get_metrics(&addr);
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        assert!(text.contains("vramshim_registry_error 1"), "{text}");
        line.clear();
        err.read_line(&mut line).unwrap();
        assert!(line.contains(&reg.display().to_string()), "{line}");
    }
    drop(child);
}
