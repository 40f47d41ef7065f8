//! A crate's modules import only downward: the check behind the layering tests of the
//! interposer, analyzer and trace crates.
//!
//! Each source file below `src/` belongs to the module named by the first component of its
//! path (`src/analysis/report.rs` is `analysis`). Every `crate::` path in its code (a `use`
//! line, a grouped `use crate::{a, b::{c, d}}` over several lines, a path written inline, a
//! `$crate::` path in a macro) must name its own module or one in a lower layer. Modules in one layer stand side by side
//! and import none of each other. Comments are not read: prose may name any module. The
//! crate root (`lib.rs`) is the top and is not checked.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The code of `text` without its `//` comments (doc comments included).
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        out.push_str(line.find("//").map_or(line, |i| &line[..i]));
        out.push('\n');
    }
    out
}

fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The top-level module names that the `crate::` paths of `code` start with.
pub fn imported(code: &str) -> BTreeSet<String> {
    let code = strip_comments(code);
    let mut out = BTreeSet::new();
    let mut rest = code.as_str();
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().last();
        rest = &rest[i + "crate::".len()..];
        // `other_crate::x` is not ours; `$crate::x` is.
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let after = rest.trim_start();
        let Some(group) = after.strip_prefix('{') else {
            let name = ident(rest);
            if !name.is_empty() {
                out.insert(name.to_string());
            }
            continue;
        };
        // A group: the first name of every item at its outer level.
        let mut depth = 1;
        let mut expect_item = true;
        let mut g = group;
        while depth > 0 && !g.is_empty() {
            let c = g.chars().next().unwrap();
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 1 => expect_item = true,
                c if expect_item && depth == 1 && (c.is_ascii_alphabetic() || c == '_') => {
                    let name = ident(g);
                    out.insert(name.to_string());
                    expect_item = false;
                    g = &g[name.len()..];
                    continue;
                }
                _ => {}
            }
            g = &g[c.len_utf8()..];
        }
        rest = g;
    }
    out
}

/// Every import of `code` (a file of module `module`) against the order `layers` (bottom
/// first; the modules of one entry stand side by side), as `"module -> target"`. `aliases`
/// names the module that a name reached through the crate root belongs to (a
/// `#[macro_export]` macro invoked as `crate::warn!` lives in, say, `sys`).
pub fn violations(
    layers: &[&[&str]],
    aliases: &[(&str, &str)],
    module: &str,
    code: &str,
) -> Vec<String> {
    let rank = |m: &str| layers.iter().position(|l| l.contains(&m));
    let Some(own) = rank(module) else {
        return vec![format!("{module}: in no layer (add it to the layer list)")];
    };
    let mut out = Vec::new();
    for name in imported(code) {
        let name = aliases
            .iter()
            .find(|(a, _)| *a == name)
            .map_or(name.as_str(), |(_, m)| m)
            .to_string();
        if name == module || name == "self" || name == "super" {
            continue;
        }
        match rank(&name) {
            Some(r) if r < own => {}
            Some(_) => out.push(format!("{module} -> {name}")),
            // A name the crate root re-exports: reaching through the top is upward too.
            None => out.push(format!("{module} -> {name} (through the crate root)")),
        }
    }
    out
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Checks every file below `src` but the crate root and the paths in `skip` (relative to
/// `src`: files or folders of another crate, such as a binary's). Returns the violations as
/// `"file: module -> target"` and the number of files read.
pub fn check(src: &Path, layers: &[&[&str]], skip: &[&str]) -> (Vec<String>, usize) {
    check_with_aliases(src, layers, &[], skip)
}

/// [`check`], with names reached through the crate root assigned to modules (see
/// [`violations`]).
pub fn check_with_aliases(
    src: &Path,
    layers: &[&[&str]],
    aliases: &[(&str, &str)],
    skip: &[&str],
) -> (Vec<String>, usize) {
    let mut files = Vec::new();
    sources(src, &mut files);
    let mut found = Vec::new();
    let mut read = 0;
    for f in &files {
        let rel = f.strip_prefix(src).unwrap();
        if rel == Path::new("lib.rs") || skip.iter().any(|s| rel.starts_with(s)) {
            continue;
        }
        let first = rel.components().next().unwrap().as_os_str();
        let first = first.to_str().unwrap();
        let module = first.strip_suffix(".rs").unwrap_or(first);
        let code = std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        read += 1;
        for v in violations(layers, aliases, module, &code) {
            found.push(format!("{}: {v}", rel.display()));
        }
    }
    (found, read)
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: &[&[&str]] = &[&["low"], &["mid", "side"], &["top"]];

    #[test]
    fn every_form_of_import_is_seen() {
        assert_eq!(
            violations(L, &[], "low", "use crate::mid::X;"),
            ["low -> mid"]
        );
        assert_eq!(
            violations(L, &[], "mid", "use crate::{low, side};"),
            ["mid -> side"]
        );
        assert_eq!(
            violations(
                L,
                &[],
                "mid",
                "use crate::{\n    low::{a, b},\n    top::c,\n};"
            ),
            ["mid -> top"]
        );
        assert_eq!(
            violations(L, &[], "mid", "  let x = crate::top::f(1);"),
            ["mid -> top"]
        );
        assert_eq!(
            violations(L, &[], "low", "use crate::Thing;"),
            ["low -> Thing (through the crate root)"]
        );
        assert_eq!(
            violations(L, &[("warn", "mid")], "low", "    crate::warn!(\"x\");"),
            ["low -> mid"]
        );
        assert_eq!(
            violations(L, &[], "low", "        $crate::top::f();"),
            ["low -> top"]
        );
        assert_eq!(
            violations(L, &[], "gone", ""),
            ["gone: in no layer (add it to the layer list)"]
        );
    }

    #[test]
    fn downward_imports_comments_and_other_crates_pass() {
        let code = "use crate::low::{a, b};\nuse super::x;\nuse self::y;\n\
                    /// See [`crate::top::f`].\nlet a = other_crate::top::g(); // crate::top\n\
                    use crate::mid::z;";
        assert!(violations(L, &[], "top", code).is_empty());
        assert!(violations(L, &[], "mid", "use crate::mid::q; use crate::low::r;").is_empty());
        assert!(violations(L, &[], "mid", code).is_empty());
        assert!(violations(L, &[("warn", "low")], "mid", "crate::warn!(\"x\");").is_empty());
    }
}
