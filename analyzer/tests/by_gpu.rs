//! Two processes share one simulated 2 GiB GPU, each traced: one holds 600 MiB, the other fills the
//! card until it runs out. `vramshim summary` of both traces lines them up by the GPU's UUID
//! and the wall clock, and says that at the second one's out-of-memory the first held its
//! 600 MiB (neither trace alone can say so).

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

fn program(dir: &Path) -> PathBuf {
    compile_c(
        dir,
        "shared_gpu",
        r#"#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
/* shared_gpu hold MIB READY DONE: hold MIB MiB until DONE exists (READY says it holds them).
 * shared_gpu fill MIB: allocate MIB-MiB blocks until one is refused, then free them. */
int main(int argc, char **argv) {
    void *h = dlopen("libcudart.so.12", RTLD_NOW);
    if (!h) { fprintf(stderr, "no libcudart.so.12: %s\n", dlerror()); return 1; }
    int (*m)(void **, size_t) = (int (*)(void **, size_t))dlsym(h, "cudaMalloc");
    int (*f)(void *) = (int (*)(void *))dlsym(h, "cudaFree");
    size_t mib = (size_t)atol(argv[2]) << 20;
    if (strcmp(argv[1], "hold") == 0) {
        void *p = NULL;
        if (m(&p, mib) != 0) { fprintf(stderr, "hold refused\n"); return 2; }
        FILE *r = fopen(argv[3], "w");
        if (r) fclose(r);
        for (int i = 0; i < 6000 && access(argv[4], F_OK) != 0; i++) usleep(10000);
        f(p);
        return 0;
    }
    void *p[1024];
    int n = 0;
    while (n < 1024 && m(&p[n], mib) == 0) n++;
    printf("filled %d\n", n);
    while (n > 0) f(p[--n]);
    return 0;
}
"#,
    )
}

fn run_cmd(dir: &Path, machine: &str, trace: &str) -> Command {
    let mut c = Command::new(exe());
    c.current_dir(dir)
        .env_remove("VRAMSHIM_LIB")
        .env_remove("CUDA_VISIBLE_DEVICES")
        .env("VRAMSIM_NAME", machine)
        .args(["run", "--sim=2GiB", "--trace", trace, "--"]);
    c
}

#[test]
fn a_shared_gpus_out_of_memory_names_what_the_other_process_held() {
    let dir = scratch("by-gpu");
    let prog = program(&dir);
    let machine = format!("vramshim-by-gpu-{}", std::process::id());
    let (ready, done) = (dir.join("ready"), dir.join("done"));

    let mut holder = run_cmd(&dir, &machine, "a.vramtrace")
        .arg(&prog)
        .args(["hold", "600"])
        .arg(&ready)
        .arg(&done)
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !ready.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the holder never said it holds its memory"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let filler = run_cmd(&dir, &machine, "b.vramtrace")
        .arg(&prog)
        .args(["fill", "64"])
        .output()
        .unwrap();
    std::fs::write(&done, b"").unwrap();
    assert!(holder.wait().unwrap().success());
    let said = String::from_utf8_lossy(&filler.stdout);
    assert!(filler.status.success(), "{said}");
    let filled: u64 = said
        .trim()
        .strip_prefix("filled ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{said}"));
    // 2 GiB card, two CUDA contexts (cuda-sim charges 300 MiB each, as a real driver charges
    // its own) and 600 MiB held by the other process: at most 13 blocks of 64 MiB fit.
    assert!((1..=13).contains(&filled), "{filled}");

    let out = ok(&dir, &["summary", "--json", "a.vramtrace", "b.vramtrace"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let gpus = v["by_gpu"].as_array().expect("a by_gpu section");
    assert_eq!(gpus.len(), 1, "{gpus:#?}");
    let g = &gpus[0];
    assert!(g["uuid"].as_str().unwrap().starts_with("GPU-"), "{g:#}");
    let procs = g["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 2);
    assert_eq!(procs[0]["peak_in_use"], 600 * MIB);
    assert_eq!(procs[1]["peak_in_use"], filled * 64 * MIB);
    // Together: the holder's 600 MiB while the filler held all its blocks.
    let peak = &g["combined_peak"];
    assert_eq!(peak["bytes"], (600 + filled * 64) * MIB, "{peak:#}");
    assert_eq!(
        peak["held"],
        serde_json::json!([600 * MIB, filled * 64 * MIB])
    );
    // The filler's out-of-memory, with what each process held at that instant.
    let fails = g["failures"].as_array().unwrap();
    assert_eq!(fails.len(), 1, "{fails:#?}");
    let f = &fails[0];
    assert_eq!(f["process"], 1);
    assert_eq!(f["cause"], "device");
    assert_eq!(f["size"], 64 * MIB);
    assert_eq!(
        f["held"],
        serde_json::json!([600 * MIB, filled * 64 * MIB]),
        "{f:#}"
    );

    let text = ok(&dir, &["summary", "a.vramtrace", "b.vramtrace"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("== by GPU"), "{text}");
    assert!(
        text.contains("out of device memory asking 64.0 MiB")
            && text.contains("the others 600 MiB"),
        "{text}"
    );
    // The report draws them stacked on one chart, with the refusal marked.
    ok(
        &dir,
        &["report", "a.vramtrace", "b.vramtrace", "-o", "r.html"],
    );
    let html = std::fs::read_to_string(dir.join("r.html")).unwrap();
    assert!(
        html.contains("class=\"chart shared-gpu\""),
        "no shared-GPU chart"
    );
    assert_eq!(html.matches("<path class=\"process\"").count(), 2);
    assert_eq!(
        html.matches("class=\"mark oom\"").count(),
        2,
        "one mark in the shared chart, one in the filler's own"
    );
    // One trace alone has no one to line up with.
    let one = ok(&dir, &["summary", "--json", "b.vramtrace"]);
    let one: serde_json::Value = serde_json::from_slice(&one.stdout).unwrap();
    assert!(one.get("by_gpu").is_none());
}
