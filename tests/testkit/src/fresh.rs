//! Whether a binary the tests run but do not build (`libvramshim.so`, `vramshim`, the
//! simulated GPU's libraries) was built from the sources now in the tree.
//!
//! Why: `cargo test -p vramshim-interposer --lib` (or any package's tests) builds that
//! package's test binaries and what they link, never the preload library nor another
//! package's command, which a live test starts as separate files from the target directory.
//! After a source change such a test runs the previous build's code, and its failures (or
//! passes) are of that code. So before the first use in a process the binary is checked
//! against the sources cargo recorded for it: its dep-info (`<profile>/<stem>.d`, which cargo
//! writes with every build of it: every source file of the package and of the workspace
//! packages it depends on, as compiled, so a `#[cfg(test)]` module is not among them and
//! editing one does not make the binary stale). The binary is stale if one of those files is
//! newer than it or gone, or if none lies in this checkout (it was built from another
//! worktree sharing the target directory); the test then fails with one message naming the
//! binary, the file and the `cargo build` command that fixes it.
//!
//! Checked, not built here: a `cargo build` run from inside a test would wait for the
//! target directory's lock, which the `cargo test` that started the test holds while it
//! builds other test binaries (and, when it does not hold it, two test processes would build
//! the same files at once).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::SystemTime;

/// The source files a dep-info file lists for its first target (`TARGET: SRC SRC ...`, a
/// space inside a name escaped as `\ `, lines continued with `\`).
pub(crate) fn dep_info_sources(text: &str) -> Vec<PathBuf> {
    let joined = text.replace("\\\n", " ");
    let Some(first) = joined.lines().map(str::trim).find(|l| !l.is_empty()) else {
        return Vec::new();
    };
    // the target is the text up to the first unescaped ": "
    let mut rest = None;
    let mut esc = false;
    for (i, c) in first.char_indices() {
        if esc {
            esc = false;
        } else if c == '\\' {
            esc = true;
        } else if c == ':' && (i + 1 == first.len() || first[i + 1..].starts_with([' ', '\t'])) {
            rest = Some(&first[i + 1..]);
            break;
        }
    }
    let Some(rest) = rest else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = rest.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars
                .peek()
                .is_some_and(|n| *n == ' ' || *n == '\\' || *n == '#') =>
            {
                cur.push(chars.next().unwrap());
            }
            ' ' | '\t' => {
                if !cur.is_empty() {
                    out.push(PathBuf::from(std::mem::take(&mut cur)));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(PathBuf::from(cur));
    }
    out
}

/// `Ok` if `artifact` was built from the sources its dep-info `dep_info` lists and none of them
/// changed since, at least one of them lying under `root`; else why not (one sentence, naming
/// `artifact` and the offending file, ending in `fix`, the command that rebuilds it).
pub(crate) fn check(
    artifact: &Path,
    dep_info: &Path,
    root: &Path,
    fix: &str,
) -> Result<(), String> {
    let built = match std::fs::metadata(artifact).and_then(|m| m.modified()) {
        Ok(t) => t,
        Err(_) => return Err(format!("{} is not built: {fix}", artifact.display())),
    };
    let Ok(text) = std::fs::read_to_string(dep_info) else {
        return Err(format!(
            "{} has no dep-info {} (cargo writes it with every build), so it cannot be told \
             fresh: {fix}",
            artifact.display(),
            dep_info.display()
        ));
    };
    let sources = dep_info_sources(&text);
    if !sources.iter().any(|s| s.starts_with(root)) {
        return Err(format!(
            "{} was built from another checkout ({}), not {}: {fix}",
            artifact.display(),
            sources
                .first()
                .map_or_else(|| "no source listed".into(), |s| s.display().to_string()),
            root.display()
        ));
    }
    let mut newest: Option<(SystemTime, &Path)> = None;
    for s in &sources {
        let Ok(t) = std::fs::metadata(s).and_then(|m| m.modified()) else {
            return Err(format!(
                "{} is stale: it was built from {}, which is gone: {fix}",
                artifact.display(),
                s.display()
            ));
        };
        if newest.is_none_or(|(n, _)| t > n) {
            newest = Some((t, s));
        }
    }
    match newest {
        Some((t, s)) if t > built => Err(format!(
            "{} is stale: {} changed after it was built (`cargo test` does not rebuild it): {fix}",
            artifact.display(),
            s.display()
        )),
        _ => Ok(()),
    }
}

/// The packages of the interposer's binaries (both: a change to a package they share makes
/// both stale).
const VRAMSHIM_PACKAGES: &str = "-p vramshim-interposer -p vramshim-analyzer";

/// The packages of the simulated GPU's libraries (every one the layout copies).
pub(crate) const SIM_PACKAGES: &str = "-p vramsim-driver -p vramsim-nvml -p vramsim-runtime12 \
     -p vramsim-runtime13 -p vramsim-runtime-static";

/// The command that builds `packages` (binaries the tests run but do not build) into the
/// running tests' target directory and profile.
pub(crate) fn build_command(packages: &str) -> String {
    let profile = crate::profile_dir();
    let target = profile.parent().map(Path::to_path_buf).unwrap_or_default();
    let mut cmd = String::new();
    if target != crate::repo_root().join("target") {
        cmd.push_str(&format!("CARGO_TARGET_DIR={} ", target.display()));
    }
    cmd.push_str("cargo build");
    match profile.file_name().and_then(|n| n.to_str()) {
        Some("debug") => {}
        Some("release") | None => cmd.push_str(" --release"),
        Some(p) => cmd.push_str(&format!(" --profile {p}")),
    }
    cmd.push(' ');
    cmd.push_str(packages);
    cmd
}

/// The dep-info file cargo writes beside `artifact` (`libx.so`, `libx.a`, `x`): `<stem>.d`.
pub(crate) fn dep_info_of(artifact: &Path) -> PathBuf {
    let stem = artifact
        .file_stem()
        .map_or_else(Default::default, |s| s.to_string_lossy().into_owned());
    artifact.with_file_name(format!("{stem}.d"))
}

/// `<profile>/<file>` (its dep-info `<profile>/<stem>.d`), checked fresh once per process; a
/// stale or missing one fails the calling test with the reason.
#[track_caller]
pub(crate) fn fresh(
    cell: &'static OnceLock<Result<PathBuf, String>>,
    file: &str,
    stem: &str,
) -> PathBuf {
    let r = cell.get_or_init(|| {
        let profile = crate::profile_dir();
        let artifact = profile.join(file);
        let dep_info = profile.join(format!("{stem}.d"));
        let fix = build_command(VRAMSHIM_PACKAGES);
        check(&artifact, &dep_info, &crate::repo_root(), &fix).map(|()| artifact)
    });
    match r {
        Ok(p) => p.clone(),
        Err(why) => panic!("{why}"),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::fs::File;
    use std::time::Duration;

    /// Dates `path` `secs` seconds after a fixed instant.
    pub(crate) fn at(path: &Path, secs: u64) {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs);
        File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_modified(t)
            .unwrap();
    }

    /// A dep-info file lists its sources after the target, spaces in names escaped; later
    /// lines (each source as an empty rule) add nothing.
    #[test]
    fn dep_info_lists_the_first_targets_sources() {
        let d = "/t/release/libx.rlib: /r/a.rs /r/b\\ c.rs \\\n /r/d.rs\n\n/r/a.rs:\n";
        assert_eq!(
            dep_info_sources(d),
            [
                PathBuf::from("/r/a.rs"),
                PathBuf::from("/r/b c.rs"),
                PathBuf::from("/r/d.rs")
            ]
        );
        assert!(dep_info_sources("").is_empty());
        assert!(dep_info_sources("no rule here").is_empty());
    }

    /// Fresh when every listed source is older than the binary; stale (naming the file and
    /// the command) when one is newer, gone, or none lies in the checkout; unbuilt, and with
    /// no dep-info, said so.
    #[test]
    fn a_binary_is_stale_when_a_source_it_was_built_from_is_newer_or_gone() {
        let tmp = crate::TempDir::new("fresh");
        let root = tmp.join("repo");
        std::fs::create_dir_all(root.join("src")).unwrap();
        let (a, b) = (root.join("src/a.rs"), root.join("src/b.rs"));
        let bin = tmp.join("libx.so");
        let dep = tmp.join("libx.d");
        for f in [&a, &b, &bin] {
            std::fs::write(f, "x").unwrap();
        }
        std::fs::write(
            &dep,
            format!(
                "{}: {} {}\n",
                tmp.join("libx.rlib").display(),
                a.display(),
                b.display()
            ),
        )
        .unwrap();
        at(&a, 10);
        at(&b, 20);
        at(&bin, 30);
        let fix = "cargo build --release -p x";
        assert_eq!(check(&bin, &dep, &root, fix), Ok(()));
        // a source touched after the build
        at(&b, 40);
        let e = check(&bin, &dep, &root, fix).unwrap_err();
        assert!(
            e.contains("libx.so is stale") && e.contains("src/b.rs") && e.ends_with(fix),
            "{e}"
        );
        // rebuilt
        at(&bin, 50);
        assert_eq!(check(&bin, &dep, &root, fix), Ok(()));
        // built from another checkout
        let other = tmp.join("other");
        let e = check(&bin, &dep, &other, fix).unwrap_err();
        assert!(e.contains("another checkout") && e.ends_with(fix), "{e}");
        // a source gone
        std::fs::remove_file(&a).unwrap();
        let e = check(&bin, &dep, &root, fix).unwrap_err();
        assert!(e.contains("src/a.rs, which is gone"), "{e}");
        // no dep-info, no binary
        let e = check(&bin, &tmp.join("none.d"), &root, fix).unwrap_err();
        assert!(e.contains("no dep-info") && e.ends_with(fix), "{e}");
        let e = check(&tmp.join("none.so"), &dep, &root, fix).unwrap_err();
        assert!(
            e.contains("none.so is not built") && e.ends_with(fix),
            "{e}"
        );
    }
}
