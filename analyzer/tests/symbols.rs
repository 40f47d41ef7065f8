//! Call sites named from the modules' ELF files: a C program built with -g and frame pointers,
//! traced with stacks on the simulated GPU, shows its allocating functions with file:line; a
//! rebuilt (changed) or deleted binary falls back to module+offset.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

fn compile(dir: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let out = dir.join(name);
    let st = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-g", "-O1", "-fno-omit-frame-pointer", "-o"])
        .arg(&out)
        .arg(data("alloc_sites.c"))
        .args(extra)
        .arg("-ldl")
        .status()
        .expect("run cc");
    assert!(st.success(), "cc failed");
    out
}

/// Runs `prog` under vramshim on the simulated GPU with stacks; the trace's path.
fn traced(dir: &Path, prog: &Path) -> PathBuf {
    let trace = dir.join(format!(
        "{}.vramtrace",
        prog.file_name().unwrap().to_string_lossy()
    ));
    let o = Command::new(exe())
        .env_remove("VRAMSHIM_LIB")
        .env(
            "VRAMSIM_NAME",
            format!("vramshim-sym-{}", std::process::id()),
        )
        .env("VRAMSHIM_NO_PROGRESS", "1")
        .current_dir(dir)
        .args(["run", "--sim", "--stacks", "16", "--trace"])
        .arg(&trace)
        .arg("--")
        .arg(prog)
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    trace
}

/// The labels of the top call sites (device 0).
fn sites(dir: &Path, trace: &Path, env: &[(&str, &str)]) -> Vec<(String, u64)> {
    let mut cmd = Command::new(exe());
    cmd.current_dir(dir)
        .env("VRAMSHIM_NO_PROGRESS", "1")
        .args(["summary", "--json"])
        .arg(trace);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let o = cmd.output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let dev = v["traces"][0]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["device"] == 0)
        .expect("device 0")
        .clone();
    dev["top_sites"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["site"].as_str().unwrap().to_string(),
                s["bytes"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn line_of(needle: &str) -> usize {
    let src = std::fs::read_to_string(data("alloc_sites.c")).unwrap();
    1 + src
        .lines()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("{needle} not in alloc_sites.c"))
}

#[test]
fn call_sites_are_named_from_the_binary_and_fall_back_when_it_changed_or_is_gone() {
    built_library();
    let dir = scratch("symbols");
    let prog = compile(&dir, "alloc_sites", &[]);
    let trace = traced(&dir, &prog);

    // The function that called cudaMalloc, at the line of the call.
    let s = sites(&dir, &trace, &[]);
    let call = line_of("if (cuda_malloc(&p, n) != 0) return NULL;");
    let weights = format!("alloc_weights (alloc_sites.c:{call})");
    let second_call = call
        + 1
        + std::fs::read_to_string(data("alloc_sites.c"))
            .unwrap()
            .lines()
            .skip(call)
            .position(|l| l.contains("cuda_malloc(&p, n)"))
            .unwrap();
    let acts = format!("alloc_activations (alloc_sites.c:{second_call})");
    assert!(
        s.contains(&(weights.clone(), 8 << 20)),
        "{weights} in {s:?}"
    );
    assert!(s.contains(&(acts.clone(), 4 << 20)), "{acts} in {s:?}");

    // Switched off: module+offset, as before symbolization.
    let off = sites(&dir, &trace, &[("VRAMSHIM_SYMBOLIZE", "0")]);
    assert!(
        off.iter().all(|(l, _)| l.starts_with("alloc_sites+0x")),
        "{off:?}"
    );

    // Modified after the trace began (same bytes, new time): not trusted.
    let touch = |p: &Path, when: &str| {
        let st = Command::new("touch")
            .args(["-d", when])
            .arg(p)
            .status()
            .unwrap();
        assert!(st.success());
    };
    touch(&prog, "now");
    assert_eq!(
        sites(&dir, &trace, &[]),
        off,
        "a binary modified since the trace"
    );
    touch(&prog, "2000-01-01");
    assert_eq!(
        sites(&dir, &trace, &[]),
        s,
        "the same binary, dated before the trace again"
    );

    // Rebuilt with more code but dated before the trace: its segments differ, not trusted.
    let newer = compile(&dir, "alloc_sites.rebuilt", &["-DREBUILT=1"]);
    touch(&newer, "2000-01-01");
    std::fs::rename(&newer, &prog).unwrap();
    assert_eq!(sites(&dir, &trace, &[]), off, "a rebuilt binary");

    // Gone: the same fallback.
    std::fs::remove_file(&prog).unwrap();
    assert_eq!(sites(&dir, &trace, &[]), off);
    let _ = std::fs::remove_dir_all(&dir);
}
