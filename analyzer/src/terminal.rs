//! Text shown on a terminal that comes from elsewhere: a trace's strings, file names another
//! user chose, names processes gave themselves.

use std::borrow::Cow;

/// Text for a terminal: every control character but the line breaks and tabs of the text's
/// own layout written as its escape (`\u{1b}`), so that no string a trace carries (a command
/// line, a host name, a Python file or function name) can move the cursor, retitle the
/// window, or hide or rewrite lines already printed.
pub fn for_terminal(text: &str) -> Cow<'_, str> {
    escape_controls(text, |c| c == '\n' || c == '\t')
}

/// A string from a trace on one line of text: its line breaks escaped as well (a command
/// line's `python -c` program shows as `\n`, and cannot forge lines of the summary).
pub fn one_line(text: &str) -> Cow<'_, str> {
    escape_controls(text, |_| false)
}

fn escape_controls(text: &str, keep: impl Fn(char) -> bool) -> Cow<'_, str> {
    if !text.chars().any(|c| c.is_control() && !keep(c)) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if c.is_control() && !keep(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_for_the_terminal() {
        assert_eq!(for_terminal("plain\n\ttext"), "plain\n\ttext");
        assert_eq!(
            for_terminal("a\u{1b}]0;t\u{7}b\u{9b}2J\r\n"),
            "a\\u{1b}]0;t\\u{7}b\\u{9b}2J\\r\n"
        );
        assert_eq!(one_line("-c\nimport os\tx"), "-c\\nimport os\\tx");
    }
}
