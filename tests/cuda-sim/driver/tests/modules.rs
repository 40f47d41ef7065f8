//! The simulated driver's module/library/kernel API (globals backed by device memory of the
//! cubin symbol's size, attributes, occupancy, unload), its private export tables (context-local
//! storage with destructors, context and stream ids), libraries loaded without a current context
//! and the modelled kernel time, driven by a C
//! program (tests/c/modcheck.c) linked against the built libcuda.so.1.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

fn dirs() -> &'static (PathBuf, PathBuf) {
    static D: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    D.get_or_init(|| {
        let profile = vramshim_testkit::profile_dir();
        let built = profile.join("libvramsim_driver.so");
        assert!(
            built.exists(),
            "{} is missing: run `cargo build --release -p vramsim-driver` first",
            built.display()
        );
        let dir = vramshim_testkit::temp_dir("modcheck");
        for name in ["libcuda.so.1", "libcuda.so"] {
            std::os::unix::fs::symlink(&built, dir.join(name)).unwrap();
        }
        let exe = dir.join("modcheck");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/modcheck.c");
        let out = Command::new("gcc")
            .args(["-Wall", "-Werror", "-O1", "-o"])
            .arg(&exe)
            .arg(&src)
            .arg(format!("-L{}", dir.display()))
            .args(["-lcuda", "-ldl", "-pthread"])
            .output()
            .expect("gcc");
        assert!(
            out.status.success(),
            "gcc failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::write(dir.join("tiny.cubin"), tiny_cubin()).unwrap();
        (dir, exe)
    })
}

/// A minimal cubin (ELF64): `.data` holding `weights` (8 bytes: 1..=8), `.bss` holding
/// `counter` (4 bytes), and a function symbol `kern`.
fn tiny_cubin() -> Vec<u8> {
    let strtab: &[u8] = b"\0weights\0counter\0kern\0";
    let sym = |name: u32, info: u8, shndx: u16, size: u64| {
        let mut s = name.to_le_bytes().to_vec();
        s.extend([info, 0]);
        s.extend(shndx.to_le_bytes());
        s.extend(0u64.to_le_bytes());
        s.extend(size.to_le_bytes());
        s
    };
    let mut symtab = vec![0u8; 24];
    symtab.extend(sym(1, 0x11, 1, 8));
    symtab.extend(sym(9, 0x11, 2, 4));
    symtab.extend(sym(17, 0x12, 0, 0));
    let mut elf = vec![0u8; 64];
    elf[..4].copy_from_slice(b"\x7fELF");
    elf[4] = 2;
    let data_off = elf.len() as u64;
    elf.extend(1..=8u8);
    let symtab_off = elf.len() as u64;
    elf.extend(&symtab);
    let strtab_off = elf.len() as u64;
    elf.extend(strtab);
    let shoff = elf.len() as u64;
    let sh = |ty: u32, off: u64, size: u64, link: u32, entsize: u64| {
        let mut h = vec![0u8; 64];
        h[4..8].copy_from_slice(&ty.to_le_bytes());
        h[0x18..0x20].copy_from_slice(&off.to_le_bytes());
        h[0x20..0x28].copy_from_slice(&size.to_le_bytes());
        h[0x28..0x2c].copy_from_slice(&link.to_le_bytes());
        h[0x38..0x40].copy_from_slice(&entsize.to_le_bytes());
        h
    };
    elf.extend(sh(0, 0, 0, 0, 0));
    elf.extend(sh(1, data_off, 8, 0, 0));
    elf.extend(sh(8, 0, 4, 0, 0));
    elf.extend(sh(2, symtab_off, symtab.len() as u64, 4, 24));
    elf.extend(sh(3, strtab_off, strtab.len() as u64, 0, 0));
    elf[0x28..0x30].copy_from_slice(&shoff.to_le_bytes());
    elf[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
    elf[0x3c..0x3e].copy_from_slice(&5u16.to_le_bytes());
    elf
}

fn modcheck(args: &[&str], env: &[(&str, &str)]) -> Output {
    let (dir, exe) = dirs();
    let mut c = vramshim_testkit::sim_command(exe, "modcheck");
    c.env("LD_LIBRARY_PATH", dir)
        .env("VRAMSIM_CONTEXT_OVERHEAD", "0")
        .args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().expect("run modcheck");
    assert!(
        out.status.success(),
        "modcheck {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn module_globals_attributes_occupancy_and_unload() {
    let cubin = dirs().0.join("tiny.cubin");
    let out = modcheck(&["modules", cubin.to_str().unwrap()], &[]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("modules: ok"));
}

/// CUDA 12's libraries are context-independent: `cuLibraryLoadData` needs no current context
/// (its documented answers have no CUDA_ERROR_INVALID_CONTEXT), while a library's global and a
/// kernel's function are per context and answer 201 without one. NVIDIA's runtime relies on
/// it: it loads a kernel library lazily on whichever thread first launches one of its kernels,
/// before making its context current there, e.g. on PyTorch's autograd thread in a backward
/// pass; an answer of 201 there failed the step with "invalid device context".
#[test]
fn a_library_loads_without_a_current_context() {
    let cubin = dirs().0.join("tiny.cubin");
    let out = modcheck(&["contextless", cubin.to_str().unwrap()], &[]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("contextless: ok"));
}

#[test]
fn context_storage_destructors_and_context_and_stream_ids() {
    let out = modcheck(&["tables"], &[]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("tables: ok"));
}

/// Launches are empty operations in stream order; with VRAMSIM_KERNEL_NS each occupies its
/// stream that long, so a stream is still busy right after 20 launches of 20 ms and its
/// synchronization takes at least 400 ms. Only lower bounds are relied on.
#[test]
fn modelled_kernel_time_keeps_the_stream_busy() {
    let busy = |env: &[(&str, &str)]| {
        let t = std::time::Instant::now();
        let out = modcheck(&["kernel-time", "20"], env);
        let s = String::from_utf8_lossy(&out.stdout).into_owned();
        (s.contains("busy after launches: 1"), t.elapsed())
    };
    let (was_busy, took) = busy(&[("VRAMSIM_KERNEL_NS", "20000000")]);
    assert!(was_busy, "20 launches of 20 ms had not run when queued");
    assert!(took >= std::time::Duration::from_millis(400), "{took:?}");
}
