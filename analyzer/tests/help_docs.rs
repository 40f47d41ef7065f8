//! `vramshim --help`, each command's `--help` and docs/configuration.md say the same: every
//! flag of a command is in its synopsis there and every flag of a synopsis is in the help, a
//! default the help shows is the synopsis's, `run`'s flags set the variables the table of the
//! library's variables pairs them with and show the table's defaults, and every variable of
//! the page's tables is named in some help and every variable a help names is on the page.

use std::collections::BTreeSet;
use std::process::Command;

mod common;

const VRAMSHIM: &str = env!("CARGO_BIN_EXE_vramshim");
const COMMANDS: &[&str] = &[
    "run", "demo", "summary", "report", "export", "import", "replay", "diff", "top", "exporter",
];

fn help(args: &[&str]) -> String {
    let o = Command::new(VRAMSHIM)
        .args(args)
        .arg("--help")
        .output()
        .unwrap();
    assert!(o.status.success(), "vramshim {args:?} --help failed");
    String::from_utf8(o.stdout).unwrap()
}

fn config_md() -> String {
    let p = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/configuration.md");
    std::fs::read_to_string(p).unwrap()
}

/// The long flags (`--name`) in `text`; a lone `--` is none.
fn flags(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("--") {
        let name: String = rest[i + 2..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
            .collect();
        if name.starts_with(|c: char| c.is_ascii_lowercase()) {
            out.insert(format!("--{name}"));
        }
        rest = &rest[i + 2 + name.len()..];
    }
    out
}

/// `VRAMSHIM_*` names in `text`.
fn variables(text: &str) -> BTreeSet<String> {
    text.match_indices("VRAMSHIM_")
        .map(|(i, _)| {
            text[i..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect::<String>()
        })
        .filter(|v| v.len() > "VRAMSHIM_".len())
        .collect()
}

/// The help's option lines: (long flag, the whole line). clap writes one line per option
/// when stdout is not a terminal.
fn options(help: &str) -> Vec<(String, String)> {
    help.lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with('-'))
        .filter_map(|l| {
            let flag = flags(
                l.split_whitespace()
                    .take(2)
                    .collect::<Vec<_>>()
                    .join(" ")
                    .as_str(),
            )
            .into_iter()
            .next()?;
            Some((flag, l.to_string()))
        })
        .filter(|(f, _)| f != "--help" && f != "--version")
        .collect()
}

/// The synopsis of `vramshim CMD` in the page's code blocks: its first line and the indented
/// lines that continue it.
fn synopsis(page: &str, cmd: &str) -> String {
    let mut in_code = false;
    let mut found = String::new();
    let mut taking = false;
    for line in page.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
            taking = false;
            continue;
        }
        if !in_code {
            continue;
        }
        if line.starts_with(&format!("vramshim {cmd} ")) {
            assert!(found.is_empty(), "two synopses of vramshim {cmd}");
            taking = true;
        } else if !line.starts_with(' ') {
            taking = false;
        }
        if taking {
            found.push_str(line);
            found.push('\n');
        }
    }
    assert!(
        !found.is_empty(),
        "docs/configuration.md has no synopsis of vramshim {cmd}"
    );
    found
}

#[test]
fn every_command_is_in_the_help_and_on_the_page() {
    let top = help(&[]);
    let page = config_md();
    for cmd in COMMANDS {
        assert!(
            top.lines()
                .any(|l| l.trim_start().starts_with(&format!("{cmd} "))),
            "{cmd} missing from vramshim --help:\n{top}"
        );
        synopsis(&page, cmd);
    }
}

#[test]
fn each_commands_flags_and_defaults_agree_with_the_page() {
    let page = config_md();
    let mut problems = Vec::new();
    for cmd in COMMANDS {
        let h = help(&[cmd]);
        let syn = synopsis(&page, cmd);
        let in_help: BTreeSet<String> = options(&h).into_iter().map(|(f, _)| f).collect();
        let on_page = flags(&syn);
        for f in in_help.difference(&on_page) {
            problems.push(format!(
                "vramshim {cmd} {f}: in --help, not in the page's synopsis"
            ));
        }
        for f in on_page.difference(&in_help) {
            problems.push(format!(
                "vramshim {cmd} {f}: in the page's synopsis, not in --help"
            ));
        }
        for (flag, line) in options(&h) {
            let Some(i) = line.find("[default: ") else {
                continue;
            };
            let default = line[i + "[default: ".len()..]
                .split(']')
                .next()
                .unwrap()
                .to_string();
            let want = format!("(default {default})");
            // the default follows the flag with no other flag between
            let ok = syn.find(&format!("{flag} ")).is_some_and(|at| {
                syn[at..]
                    .find(&want)
                    .is_some_and(|d| flags(&syn[at + flag.len()..at + d]).is_empty())
            });
            if !ok {
                problems.push(format!(
                    "vramshim {cmd} {flag}: --help says [default: {default}], the page's synopsis has no {want} after it"
                ));
            }
        }
    }
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

/// The rows of the library's variables table (`| VAR | FLAG | DEFAULT | ... |`).
fn library_rows(page: &str) -> Vec<(String, String, String)> {
    let start = page.find("## The library's variables").unwrap();
    let end = start + page[start..].find("\n### ").unwrap();
    page[start..end]
        .lines()
        .filter(|l| l.starts_with("| `VRAMSHIM_"))
        .map(|l| {
            let cells: Vec<&str> = l.split(" | ").collect();
            let var = cells[0]
                .trim_start_matches("| ")
                .trim_matches('`')
                .to_string();
            (var, cells[1].to_string(), cells[2].to_string())
        })
        .collect()
}

#[test]
fn run_flags_set_the_tables_variables_with_its_defaults() {
    let page = config_md();
    let opts = options(&help(&["run"]));
    let mut problems = Vec::new();
    let rows = library_rows(&page);
    assert!(rows.len() >= 15, "the table was not found: {rows:?}");
    for (var, flag_cell, default_cell) in rows {
        let Some(flag) = flags(&flag_cell).into_iter().next() else {
            continue;
        };
        let Some((_, line)) = opts.iter().find(|(f, _)| *f == flag) else {
            problems.push(format!("{var}: {flag} is not a flag of vramshim run"));
            continue;
        };
        if !line.contains(&format!("Sets {var}")) {
            problems.push(format!(
                "{var}: the help of {flag} does not say `Sets {var}`"
            ));
        }
        // a flag that takes a value shows the table's default ("`5%`" -> "5%"; "`0` (none)" -> "0")
        let takes_value = line
            .split_whitespace()
            .nth(1)
            .is_some_and(|w| w.starts_with('<'));
        let default = default_cell
            .split(" (")
            .next()
            .unwrap()
            .trim()
            .trim_matches('`');
        if takes_value && !(line.contains(default) && line.to_ascii_lowercase().contains("default"))
        {
            problems.push(format!(
                "{var}: the help of {flag} does not give the table's default {default:?}: {line}"
            ));
        }
    }
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

#[test]
fn every_variable_is_in_some_help_and_on_the_page() {
    let page = config_md();
    let mut all_help = help(&[]);
    for cmd in COMMANDS {
        all_help.push_str(&help(&[cmd]));
    }
    let in_help = variables(&all_help);
    // the library's and the analyzer's tables, and the launcher's own (VRAMSHIM_LIB)
    let mut tables = String::new();
    for (from, to) in [
        ("## The library's variables", "\n### "),
        ("## The analyzer's variables", "\n## "),
        ("## The launcher", "\n## "),
    ] {
        let s = page.find(from).unwrap();
        let e = s + from.len() + page[s + from.len()..].find(to).unwrap();
        tables.extend(
            page[s..e]
                .lines()
                .filter(|l| l.starts_with("| `VRAMSHIM_"))
                .map(|l| format!("{}\n", l.split(" | ").next().unwrap())),
        );
    }
    let in_tables = variables(&tables);
    assert!(
        in_tables.len() >= 20,
        "the tables were not found: {in_tables:?}"
    );
    let on_page = variables(&page);
    let mut problems = Vec::new();
    for v in in_tables.difference(&in_help) {
        problems.push(format!(
            "{v}: in docs/configuration.md's tables, in no --help"
        ));
    }
    for v in in_help.difference(&on_page) {
        problems.push(format!("{v}: in a --help, not in docs/configuration.md"));
    }
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

/// A numeric flag's bad value names the accepted forms (clap's own error said only "invalid
/// digit found in string"), and `--device` of a device the trace has nothing on names the
/// devices it has (replay replayed an empty stream and said "0 requests").
#[test]
fn bad_numbers_and_absent_devices_name_what_is_accepted() {
    let d = common::scratch("help-numbers");
    common::synth(&d, "t.vramtrace", &["--events", "400"]);
    for (args, accepted) in [
        (
            &["summary", "--top", "x", "t.vramtrace"][..],
            "a whole number",
        ),
        (
            &["diff", "--top", "ten", "t.vramtrace", "t.vramtrace"][..],
            "a whole number",
        ),
        (
            &[
                "export",
                "t.vramtrace",
                "-f",
                "rmm-csv",
                "-o",
                "-",
                "--device",
                "gpu0",
            ][..],
            "a CUDA device ordinal",
        ),
        (
            &["replay", "t.vramtrace", "--device", "x"][..],
            "a CUDA device ordinal",
        ),
        (
            &["run", "--stacks", "many", "--", "true"][..],
            "from 0 to 64",
        ),
        (&["top", "--once", "--interval", "soon"][..], "seconds"),
        (&["top", "--once", "--interval", "nan"][..], "seconds"),
        (
            &["replay", "t.vramtrace", "--device", "7"][..],
            "--device accepts the devices it has: 0",
        ),
        (
            &[
                "export",
                "t.vramtrace",
                "-f",
                "rmm-csv",
                "-o",
                "out",
                "--device",
                "7",
            ][..],
            "--device accepts the devices it has: 0",
        ),
        (
            &[
                "export",
                "t.vramtrace",
                "-f",
                "chrome-json",
                "-o",
                "out",
                "--device",
                "7",
            ][..],
            "--device accepts the devices it has: 0",
        ),
        (
            &[
                "export",
                "t.vramtrace",
                "-f",
                "perfetto",
                "-o",
                "out",
                "--device",
                "7",
            ][..],
            "--device accepts the devices it has: 0",
        ),
        (
            &[
                "export",
                "t.vramtrace",
                "-f",
                "memory-viz",
                "-o",
                "out",
                "--device",
                "0",
            ][..],
            "--device does not apply to memory-viz",
        ),
    ] {
        let o = common::run_in(&d, args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(accepted), "{args:?}: {err}");
        assert!(
            !err.contains("invalid digit") && !err.contains("invalid float"),
            "{args:?}: {err}"
        );
        assert!(!d.join("out").exists(), "{args:?}: an output was left");
    }
    // The device the trace has is exported as before.
    for format in ["rmm-csv", "chrome-json", "perfetto"] {
        let o = common::run_in(
            &d,
            &[
                "export",
                "t.vramtrace",
                "-f",
                format,
                "-o",
                "out",
                "--device",
                "0",
            ],
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{format}: {err}");
        assert!(
            std::fs::metadata(d.join("out")).unwrap().len() > 0,
            "{format}"
        );
        std::fs::remove_file(d.join("out")).unwrap();
    }
}

/// `export -o -` with a `--device` the trace has no event on writes nothing to standard output
/// (a file output is removed, standard output cannot be taken back): every format, one message
/// on standard error, exit 2. The check came after the writer's header once (rmm-csv's column
/// names, chrome-json's opening bracket, perfetto's process track were on standard output).
/// The device the trace has still goes to standard output.
#[test]
fn export_to_standard_output_refuses_an_absent_device_before_writing_a_byte() {
    let d = common::scratch("export-stdout-device");
    common::synth(&d, "t.vramtrace", &["--events", "400"]);
    for format in [
        "rmm-csv",
        "chrome-json",
        "perfetto",
        "memory-viz",
        "parquet",
    ] {
        let args = [
            "export",
            "t.vramtrace",
            "-f",
            format,
            "-o",
            "-",
            "--device",
            "7",
        ];
        let o = common::run_in(&d, &args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{format}: {err}");
        assert!(
            o.stdout.is_empty(),
            "{format}: {} bytes on standard output: {:?}",
            o.stdout.len(),
            String::from_utf8_lossy(&o.stdout[..o.stdout.len().min(80)])
        );
        assert_eq!(err.lines().count(), 1, "{format}: {err}");
        assert!(err.contains("--device"), "{format}: {err}");
    }
    for format in ["rmm-csv", "chrome-json", "perfetto"] {
        let args = [
            "export",
            "t.vramtrace",
            "-f",
            format,
            "-o",
            "-",
            "--device",
            "0",
        ];
        let o = common::run_in(&d, &args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{format}: {err}");
        assert!(!o.stdout.is_empty(), "{format}: {err}");
    }
}
