//! The interposer's layers import only downward. Each module of `src/` belongs to the layer
//! named by the first component of its path; every `crate::` path in its code (a `use`
//! line, a grouped `use crate::{a, b}`, a path written inline, a `$crate::` path in a macro)
//! must name its own layer or one below it. Layers side by side (`cap`, `pool`, `tracer`,
//! `state`) import none of each other. Comments are not read: prose may name any layer.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The layers, bottom first; those in one entry stand side by side.
const LAYERS: &[&[&str]] = &[
    &["config"],
    &["sys"],
    &["cuda"],
    &["cap", "pool", "tracer", "state"],
    &["pipeline"],
    &["hooks"],
    &["lifecycle"],
];

/// The log's macros are invoked as `crate::warn!` & co. but live in `sys::log`.
const MACROS: &[(&str, &str)] = &[("warn", "sys"), ("info", "sys"), ("debug", "sys")];

fn rank(layer: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&layer))
}

/// The layer of a source file, from its path below `src/` (`None`: the crate root).
fn layer_of(rel: &Path) -> Option<String> {
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    let name = first.strip_suffix(".rs").unwrap_or(&first).to_string();
    (name != "lib").then_some(name)
}

/// The top-level modules named by the `crate::` paths of `code` (comments left out).
fn imported(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in code.lines() {
        let line = match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        };
        let mut rest = line;
        while let Some(i) = rest.find("crate::") {
            let before = rest[..i].chars().last();
            rest = &rest[i + "crate::".len()..];
            // `vramshim_crate::x` is not ours; `$crate::` is.
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                continue;
            }
            if let Some(group) = rest.strip_prefix('{') {
                let end = group.find('}').unwrap_or(group.len());
                for item in group[..end].split(',') {
                    let name: String = item
                        .trim()
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    if !name.is_empty() {
                        out.insert(name);
                    }
                }
                continue;
            }
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

/// Every upward or sideways import of `code`, a module of `layer`, as "layer -> target".
fn violations(layer: &str, code: &str) -> Vec<String> {
    let Some(own) = rank(layer) else {
        return vec![format!("{layer}: not a layer (add it to LAYERS)")];
    };
    let mut out = Vec::new();
    for name in imported(code) {
        let target = MACROS
            .iter()
            .find(|(m, _)| *m == name)
            .map_or(name.as_str(), |(_, l)| l);
        if target == "self" || target == "super" || target == layer {
            continue;
        }
        match rank(target) {
            Some(r) if r < own => {}
            Some(_) => out.push(format!("{layer} -> {target}")),
            None => out.push(format!("{layer} -> {target} (not a layer)")),
        }
    }
    out
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn every_module_imports_only_downward() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    files.sort();
    assert!(files.len() > 30, "the scan found too little: {files:?}");
    let mut found = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let Some(layer) = layer_of(rel) else {
            continue;
        };
        let code = std::fs::read_to_string(f).unwrap();
        for v in violations(&layer, &code) {
            found.push(format!("{}: {v}", rel.display()));
        }
    }
    assert!(
        found.is_empty(),
        "imports against the layer order ({LAYERS:?}):\n{}",
        found.join("\n")
    );
}

/// The checker itself sees each form of import it claims to read.
#[test]
fn the_checker_sees_every_form_of_upward_import() {
    assert_eq!(
        violations("cuda", "use crate::hooks::is_our_hook;"),
        ["cuda -> hooks"]
    );
    assert_eq!(
        violations("sys", "use crate::{config, pipeline};"),
        ["sys -> pipeline"]
    );
    assert_eq!(
        violations("cap", "    let x = crate::pool::stats(0);"),
        ["cap -> pool"]
    );
    assert_eq!(
        violations("config", "        crate::warn!(\"x\");"),
        ["config -> sys"]
    );
    assert_eq!(
        violations("sys", "        $crate::pipeline::x();"),
        ["sys -> pipeline"]
    );
    assert!(violations("hooks", "use crate::pipeline; use crate::cuda::real;").is_empty());
    assert!(violations("cuda", "// see crate::hooks for why").is_empty());
    assert!(violations("cuda", "use vramshim_crate::hooks;").is_empty());
}
