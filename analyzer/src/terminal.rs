//! Text shown on a terminal that comes from elsewhere: a trace's strings, file names another
//! user chose, names processes gave themselves.

use std::borrow::Cow;

/// Text for a terminal: every character [`escaped`] but the line breaks and tabs of the
/// text's own layout written as its escape (`\u{1b}`), so that no string a trace carries (a
/// command line, a host name, a Python file or function name) can move the cursor, retitle
/// the window, or hide or rewrite lines already printed.
pub fn for_terminal(text: &str) -> Cow<'_, str> {
    escape(text, |c| c == '\n' || c == '\t')
}

/// A string from elsewhere on one line of text (a trace's strings, a file name, a name a
/// process chose): every character [`escaped`], line breaks and tabs too (a command line's
/// `python -c` program shows as `\n`, and cannot forge lines of the summary).
pub fn one_line(text: &str) -> Cow<'_, str> {
    escape(text, |_| false)
}

/// Whether `c` is written as its escape (`\u{1b}`, `\n`, `\u{202e}`) rather than as itself:
/// a control character (C0 with the line breaks, tabs and carriage returns, DEL, C1 with the
/// 8-bit CSI), or a character that is not a control but that a terminal may act on all the
/// same: the bidirectional marks, embeddings, overrides and isolates (a right-to-left
/// override shows the rest of a line reversed, so a name can pass for another) and the line
/// and paragraph separators.
pub fn escaped(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{200e}'
                | '\u{200f}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
                | '\u{2028}'
                | '\u{2029}'
        )
}

fn escape(text: &str, keep: impl Fn(char) -> bool) -> Cow<'_, str> {
    if !text.chars().any(|c| escaped(c) && !keep(c)) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if escaped(c) && !keep(c) {
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
        assert!(matches!(for_terminal("plain\n\ttext"), Cow::Borrowed(_)));
        // ESC (an OSC retitle), BEL, the 8-bit CSI, a carriage return
        assert_eq!(
            for_terminal("a\u{1b}]0;t\u{7}b\u{9b}2J\r\n"),
            "a\\u{1b}]0;t\\u{7}b\\u{9b}2J\\r\n"
        );
        assert_eq!(one_line("-c\nimport os\tx"), "-c\\nimport os\\tx");
        // a process's own name: an OSC retitle, a line break, a CSI clear, DEL, NUL
        assert_eq!(
            one_line("a\x1b]0;t\x07\n g\x1b[2J\x7f\0"),
            "a\\u{1b}]0;t\\u{7}\\n g\\u{1b}[2J\\u{7f}\\u{0}"
        );
        // printable text, whatever its script, is left alone
        assert!(matches!(
            one_line("gpt2 Ärger 训练 'q\"\\"),
            Cow::Borrowed(_)
        ));
    }

    /// Characters a terminal may act on that are not controls: a right-to-left override makes
    /// `evil\u{202e}txt.exe` read as `evilexe.txt`; an isolate or a mark reorders a line the
    /// same way; a line separator may break one.
    #[test]
    fn reordering_and_line_separating_characters_are_escaped() {
        assert_eq!(one_line("evil\u{202e}txt.exe"), "evil\\u{202e}txt.exe");
        assert_eq!(
            for_terminal("a\u{2066}b\u{2069}c\u{200f}\u{061c}\u{202a}\n"),
            "a\\u{2066}b\\u{2069}c\\u{200f}\\u{61c}\\u{202a}\n"
        );
        assert_eq!(
            one_line("x\u{2028}FORGED\u{2029}y"),
            "x\\u{2028}FORGED\\u{2029}y"
        );
        for c in [
            '\u{200e}', '\u{202b}', '\u{202c}', '\u{202d}', '\u{2067}', '\u{2068}',
        ] {
            assert!(escaped(c), "{c:?}");
        }
        // neighbours that are plain text: a zero-width joiner (emoji), the hyphen before the
        // marks, the dash after the isolates
        for c in ['\u{200d}', '\u{2010}', '\u{2027}', '\u{206a}'] {
            assert!(!escaped(c), "{c:?}");
        }
    }
}
