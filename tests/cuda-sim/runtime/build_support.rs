// Shared by the build scripts of the artifact crates (runtime12, runtime13, runtime-static),
// which `include!` this file: reads src/exports.rs and writes the `.symver` directives and the
// version script that give every exported function the `libcudart.so.N` version node.

use std::path::{Path, PathBuf};

/// Names of the C functions defined by `exports.rs` (its text passed in), for the artifact
/// crates' build scripts: `(name, cfg)` where cfg is `Some("cudart13")` / `Some("not(cudart13)")`
/// when the export only exists in one flavour.
fn export_names(exports_rs: &str) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    let mut pending_cfg: Option<String> = None;
    for line in exports_rs.lines() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("#[cfg(") {
            pending_cfg = rest.strip_suffix(")]").map(str::to_string);
            continue;
        }
        let name_after = |prefix: &str| -> Option<String> {
            let i = t.find(prefix)?;
            let rest = &t[i + prefix.len()..];
            let end = rest.find('(')?;
            let name = rest[..end].trim();
            (!name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
                .then(|| name.to_string())
        };
        let found = if t.starts_with("fn ") {
            name_after("fn ")
        } else if t.contains("extern \"C\" fn ") {
            name_after("extern \"C\" fn ")
        } else {
            None
        };
        if let Some(n) = found {
            out.push((n, pending_cfg.take()));
        } else if !t.starts_with("#[") && !t.starts_with("///") && !t.is_empty() {
            pending_cfg = None;
        }
    }
    out
}

/// Emits what an artifact crate needs. `node`: `Some("libcudart.so.12")` for a shared
/// object (soname + version node), `None` for the static library. `cudart13`: the flavour.
#[allow(dead_code)]
fn build_artifact(node: Option<&str>, cudart13: bool) {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let exports = manifest.join("../runtime/src/exports.rs");
    println!("cargo:rerun-if-changed={}", exports.display());
    println!("cargo:rerun-if-changed=../runtime/build_support.rs");
    println!("cargo::rustc-check-cfg=cfg(cudart13)");
    if cudart13 {
        println!("cargo:rustc-cfg=cudart13");
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let text = std::fs::read_to_string(&exports).expect("read exports.rs");
    let names: Vec<String> = export_names(&text)
        .into_iter()
        .filter(|(_, cfg)| match cfg.as_deref() {
            None => true,
            Some("cudart13") => cudart13,
            Some("not(cudart13)") => !cudart13,
            Some(other) => panic!("exports.rs: unsupported cfg {other}"),
        })
        .map(|(n, _)| n)
        .collect();
    let mut asm = String::new();
    if let Some(node) = node {
        asm.push_str("core::arch::global_asm!(\n");
        for n in &names {
            asm.push_str(&format!("    \".symver {n}, {n}@@{node}\",\n"));
        }
        asm.push_str(");\n");
        let map = out.join("cudart.map");
        std::fs::write(&map, format!("{node} {{\n  global:\n    cuda*;\n    __cuda*;\n    vramsim*;\n  local:\n    *;\n}};\n"))
            .expect("write version script");
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{node}");
        println!(
            "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
            map.display()
        );
    }
    write_if_changed(&out.join("symver.rs"), &asm);
}

fn write_if_changed(p: &Path, s: &str) {
    if std::fs::read_to_string(p).ok().as_deref() != Some(s) {
        std::fs::write(p, s).expect("write generated file");
    }
}
