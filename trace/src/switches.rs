//! The one line said about a test switch's unknown names, shared by the library
//! (`VRAMSHIM_*_FAULT`, `VRAMSHIM_POOL_DEBUG`: its `config::switches`) and the `vramshim`
//! command (`VRAMSHIM_FILES_FAULT`, `VRAMSHIM_RUN_FAULT`), which share no crate of their own:
//! a switch's value is a comma-separated list of names, and a name no reader takes (a
//! misspelling) is said in this one wording wherever it is read, so that a misspelt switch
//! cannot turn a test that must fail into one that passes without a word.

/// The names of a switch's `value`: split at commas, blanks trimmed, empty ones skipped.
pub fn names(value: &str) -> impl Iterator<Item = &str> + Clone {
    value.split(',').map(str::trim).filter(|n| !n.is_empty())
}

/// The line for the names in `value` (the switch `var`'s) that are not `accepted` (None when
/// there are none): the variable, the unknown names, the accepted ones, what is done instead
/// (nothing: the default) and the whole value when it holds other names. The names and the
/// value come from the environment: each is written through `escape` (the caller's escaping
/// for where the line goes).
pub fn unknown_line(
    var: &str,
    value: &str,
    accepted: &[&str],
    escape: impl Fn(&str) -> String,
) -> Option<String> {
    let unknown: Vec<String> = names(value)
        .filter(|n| !accepted.contains(n))
        .map(|n| format!("\"{}\"", escape(n)))
        .collect();
    if unknown.is_empty() {
        return None;
    }
    let (what, verb, them) = if unknown.len() == 1 {
        ("name", "is", "it")
    } else {
        ("names", "are", "them")
    };
    let rest = if names(value).count() > unknown.len() {
        format!(
            "; the other names of {var}=\"{}\" apply",
            escape(value.trim())
        )
    } else {
        String::new()
    };
    Some(format!(
        "{var}: the {what} {} {verb} read by no part of vramshim (a test-only switch: a comma-separated list); accepted: {}; ignoring {them}: no fault is switched on by {them} (the default){rest}",
        unknown.join(", "),
        accepted.join(", "),
    ))
}

#[cfg(test)]
mod tests {
    use super::unknown_line;

    #[test]
    fn unknown_names_are_said_once_each_through_the_callers_escaping() {
        let esc = |s: &str| s.replace('\u{1b}', "<ESC>");
        assert_eq!(unknown_line("V", " a ,, b", &["a", "b"], esc), None);
        assert_eq!(unknown_line("V", "", &["a"], esc), None);
        assert_eq!(
            unknown_line("V", "c", &["a", "b"], esc).unwrap(),
            "V: the name \"c\" is read by no part of vramshim (a test-only switch: a comma-separated list); accepted: a, b; ignoring it: no fault is switched on by it (the default)"
        );
        assert_eq!(
            unknown_line("V", "a, x\u{1b},y ", &["a"], esc).unwrap(),
            "V: the names \"x<ESC>\", \"y\" are read by no part of vramshim (a test-only switch: a comma-separated list); accepted: a; ignoring them: no fault is switched on by them (the default); the other names of V=\"a, x<ESC>,y\" apply"
        );
    }
}
