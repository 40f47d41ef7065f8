//! The `vramshim` command's test switches (`VRAMSHIM_FILES_FAULT`, `VRAMSHIM_RUN_FAULT`):
//! each value is a comma-separated list of names, read as the library reads its own
//! (`interposer/src/config/switches.rs`). A name no part of the command reads (a misspelling)
//! is said once per process, in one line on stderr naming the variable, the name, the accepted
//! names and the default taken (the library's line, `vramshim_trace::switches`), so that a
//! misspelt switch cannot turn a test that must fail into one that passes without a word; the
//! command goes on.

use std::sync::Once;

use vramshim_trace::switches::names;

/// Every test switch of the command and the names its readers accept.
const SWITCHES: [(&str, &[&str]); 2] = [
    // The output and work-file checks (`files::fault_unsafe`).
    ("VRAMSHIM_FILES_FAULT", &["unsafe"]),
    // `vramshim run`'s signal forwarding (`cmd::run`).
    ("VRAMSHIM_RUN_FAULT", &["late-clear"]),
];

/// Whether the switch `var` names `name` (a name it lists: a test must not ask for others).
pub fn switch_on(var: &str, name: &str) -> bool {
    static SAID: [Once; SWITCHES.len()] = [const { Once::new() }; SWITCHES.len()];
    let Some(i) = SWITCHES.iter().position(|(v, _)| *v == var) else {
        debug_assert!(false, "{var} is not a listed switch");
        return false;
    };
    let accepted = SWITCHES[i].1;
    debug_assert!(accepted.contains(&name), "{var}: {name} is not listed");
    let Some(value) = std::env::var_os(var) else {
        return false;
    };
    let value = value.to_string_lossy();
    SAID[i].call_once(|| {
        if let Some(line) = unknown_line(var, &value, accepted) {
            eprintln!("vramshim: {line}");
        }
    });
    names(&value).any(|n| n == name)
}

/// The line for the names in `value` (the switch `var`'s) that are not `accepted` (None when
/// there are none), in the library's wording ([`vramshim_trace::switches::unknown_line`]); the
/// names escaped for a terminal ([`crate::terminal::one_line`]).
fn unknown_line(var: &str, value: &str, accepted: &[&str]) -> Option<String> {
    vramshim_trace::switches::unknown_line(var, value, accepted, |s| {
        crate::terminal::one_line(s).into_owned()
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn unknown_names_are_said_known_ones_are_not() {
        let line = |v| super::unknown_line("VRAMSHIM_FILES_FAULT", v, &["unsafe"]);
        assert_eq!(line(" unsafe ,,"), None);
        assert_eq!(line(""), None);
        assert_eq!(
            line("unsaf\u{202e}e").unwrap(),
            "VRAMSHIM_FILES_FAULT: the name \"unsaf\\u{202e}e\" is read by no part of vramshim (a test-only switch: a comma-separated list); accepted: unsafe; ignoring it: no fault is switched on by it (the default)"
        );
        let two = line("unsafe,x\u{1b}[2J,y").unwrap();
        assert!(
            two.contains("the names \"x\\u{1b}[2J\", \"y\" are read by no part")
                && two.ends_with(
                    "the other names of VRAMSHIM_FILES_FAULT=\"unsafe,x\\u{1b}[2J,y\" apply"
                ),
            "{two}"
        );
    }
}
