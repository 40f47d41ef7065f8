//! JSON the `vramshim` command writes (`summary --json`, `replay --json`, `diff --json`,
//! `top --json`, the chrome-json export): serde_json's, with every character the terminal
//! output escapes ([`crate::terminal::escaped`]) written as its `\uXXXX` escape. JSON itself
//! only requires the C0 controls escaped, so a name a trace carries (a Python file, a module
//! path, a command line) could hold a right-to-left override or an isolate that reorders
//! whatever shows the JSON (a terminal, an editor, a log viewer), so that one name passes
//! for another; escaped, the text reads as it is, and any JSON reader gets the same string
//! back.

use std::io;

use serde::Serialize;
use serde_json::ser::{CompactFormatter, Formatter, PrettyFormatter};

/// `value` as indented JSON (as `serde_json::to_string_pretty`), escaped as above.
pub fn to_string_pretty<T: Serialize + ?Sized>(value: &T) -> Result<String, String> {
    write(value, Escaping(PrettyFormatter::new()))
}

/// `value` as one line of JSON (as `serde_json::to_string`), escaped as above.
pub fn to_string<T: Serialize + ?Sized>(value: &T) -> Result<String, String> {
    write(value, Escaping(CompactFormatter))
}

fn write<T: Serialize + ?Sized, F: Formatter>(value: &T, f: F) -> Result<String, String> {
    let mut out = Vec::with_capacity(128);
    let mut ser = serde_json::Serializer::with_formatter(&mut out, f);
    value.serialize(&mut ser).map_err(|e| e.to_string())?;
    // serde_json writes UTF-8 only (strings are `str`, escapes ASCII).
    String::from_utf8(out).map_err(|e| e.to_string())
}

/// A formatter that writes strings' [`crate::terminal::escaped`] characters as escapes and
/// leaves everything else to `F`.
struct Escaping<F>(F);

impl<F: Formatter> Formatter for Escaping<F> {
    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        let mut rest = fragment;
        while let Some((i, c)) = rest
            .char_indices()
            .find(|&(_, c)| crate::terminal::escaped(c))
        {
            w.write_all(&rest.as_bytes()[..i])?;
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                write!(w, "\\u{u:04x}")?;
            }
            rest = &rest[i + c.len_utf8()..];
        }
        w.write_all(rest.as_bytes())
    }

    // Everything else as `F` writes it (the trait's own defaults are the compact form).
    fn write_null<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.write_null(w)
    }
    fn begin_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.begin_array(w)
    }
    fn end_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_array(w)
    }
    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.0.begin_array_value(w, first)
    }
    fn end_array_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_array_value(w)
    }
    fn begin_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.begin_object(w)
    }
    fn end_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_object(w)
    }
    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.0.begin_object_key(w, first)
    }
    fn end_object_key<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_object_key(w)
    }
    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.begin_object_value(w)
    }
    fn end_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_object_value(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reordering_characters_are_escaped_and_read_back() {
        let name = "train\u{202e}yp.evil\u{2066}x\u{2069}\u{200f}\u{61c}\u{2028}\u{85}\u{7f}é训";
        let v = serde_json::json!({ name: [name, 1] });
        for text in [to_string(&v).unwrap(), to_string_pretty(&v).unwrap()] {
            // (the pretty layout's own line breaks aside)
            let raw = |c: char| crate::terminal::escaped(c) && c != '\n';
            assert!(!text.chars().any(raw), "{text}");
            assert!(
                text.contains(
                    "train\\u202eyp.evil\\u2066x\\u2069\\u200f\\u061c\\u2028\\u0085\\u007fé训"
                ),
                "{text}"
            );
            let back: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_eq!(back, v);
        }
        // nothing else differs from serde_json, layout included
        let plain = serde_json::json!({"a\"\\\n": [null, true, 1.5, "x\u{1b}"]});
        assert_eq!(
            to_string(&plain).unwrap(),
            serde_json::to_string(&plain).unwrap()
        );
        assert_eq!(
            to_string_pretty(&plain).unwrap(),
            serde_json::to_string_pretty(&plain).unwrap()
        );
    }
}
