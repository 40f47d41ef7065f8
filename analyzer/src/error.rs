//! One error type for every bad input: it names the file, where in it, and what is wrong.

use std::fmt;
use std::path::Path;

/// Where in a file a problem was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// Byte offset (binary formats).
    Offset(u64),
    /// 1-based line number (text formats).
    Line(u64),
    /// 1-based record number (a decoded event).
    Record(u64),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InputError {
    pub path: String,
    pub at: Option<Location>,
    pub msg: String,
}

impl InputError {
    pub fn new(path: &Path, at: Option<Location>, msg: impl Into<String>) -> Self {
        InputError {
            // Shown on a terminal: a name another user chose carries no control characters.
            path: crate::terminal::one_line(&path.display().to_string()).into_owned(),
            at,
            msg: msg.into(),
        }
    }
    pub fn io(path: &Path, e: &std::io::Error) -> Self {
        let msg = match e.kind() {
            std::io::ErrorKind::NotFound => "no such file".to_string(),
            std::io::ErrorKind::PermissionDenied => "permission denied".to_string(),
            _ => e.to_string(),
        };
        InputError::new(path, None, msg)
    }
    pub fn at_line(path: &Path, line: u64, msg: impl Into<String>) -> Self {
        InputError::new(path, Some(Location::Line(line)), msg)
    }
    pub fn at_offset(path: &Path, off: u64, msg: impl Into<String>) -> Self {
        InputError::new(path, Some(Location::Offset(off)), msg)
    }
}

impl fmt::Display for InputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.path)?;
        match &self.at {
            Some(Location::Offset(o)) => write!(f, ": offset {o}")?,
            Some(Location::Line(l)) => write!(f, ": line {l}")?,
            Some(Location::Record(r)) => write!(f, ": record {r}")?,
            None => {}
        }
        write!(f, ": {}", self.msg)
    }
}

impl std::error::Error for InputError {}

impl From<InputError> for String {
    fn from(e: InputError) -> String {
        e.to_string()
    }
}

/// An error while writing an output file.
pub fn write_error(path: &Path, e: &std::io::Error) -> String {
    format!(
        "{}: cannot write: {e}",
        crate::terminal::one_line(&path.display().to_string())
    )
}
