//! The scripts that install the tests' packages (`scripts/setup-*`) install wheels only: every
//! `pip install` in them carries `--only-binary :all:`, so that CI never builds a package from
//! source (a compiler run nobody reviewed, and minutes of a shared machine) when a pinned
//! version has no wheel for its platform: the install fails instead, naming the package.

use vramshim_testkit::repo_root;

/// Each `-m pip install` command of a shell script (comments that mention `pip install` are
/// not commands): from `-m pip install` to the end of the command (backslash continuations
/// followed; a command inside an array `(...)` ends at its `)`).
fn pip_installs(script: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(i) = script[from..].find("-m pip install") {
        let start = from + i;
        let line_start = script[..start].rfind('\n').map_or(0, |n| n + 1);
        let prefix = &script[line_start..start];
        // Inside an array `(...)` opened before the command, the command ends at its `)`.
        let in_array = prefix.matches('(').count() > prefix.matches(')').count();
        let mut depth = 0i64;
        let mut end = script.len();
        let mut prev = ' ';
        for (k, c) in script[start..].char_indices() {
            match c {
                '(' => depth += 1,
                ')' if depth == 0 && in_array => {
                    end = start + k;
                    break;
                }
                ')' => depth -= 1,
                '\n' if prev != '\\' && depth <= 0 && !in_array => {
                    end = start + k;
                    break;
                }
                _ => {}
            }
            prev = c;
        }
        found.push(script[start..end].to_string());
        from = end;
    }
    found
}

#[test]
fn setup_scripts_install_wheels_only() {
    let dir = repo_root().join("scripts");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if !name.starts_with("setup-") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for cmd in pip_installs(&text) {
            assert!(
                cmd.contains("--only-binary :all:"),
                "scripts/{name}: a pip install without --only-binary :all: (a package without a \
                 wheel would be built from source): {cmd}"
            );
            checked += 1;
        }
    }
    assert!(
        checked >= 7,
        "found the setup scripts' pip installs (rmm, jax, cupy, duckdb, transformers, torch, \
         nvidia-wheels): {checked}"
    );
}

#[test]
fn a_pip_install_is_read_to_the_end_of_its_command() {
    let s = "# a `pip install --target` tree\na=(python -m pip install -q\n    --only-binary :all:)\n\
             python -m pip install --no-deps \\\n    --target x pkg >&2\n\
             echo done\n";
    assert_eq!(
        pip_installs(s),
        [
            "-m pip install -q\n    --only-binary :all:",
            "-m pip install --no-deps \\\n    --target x pkg >&2",
        ]
    );
}
