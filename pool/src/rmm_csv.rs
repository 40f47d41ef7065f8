//! RMM's `logging_resource_adaptor` CSV: `Thread,Time,Action,Pointer,Size,Stream`.
//!
//! Columns are found by header name. Action is `allocate`, `free` or `allocate failure`;
//! Pointer is hex (`0x...`, or `(nil)`); Size decimal bytes as requested; Stream an unsigned
//! integer printed in hex by RMM (`0` = legacy default stream). Each allocation gets an id;
//! a free refers to the live allocation at its pointer (frees of unknown pointers, e.g.
//! blocks allocated before recording started, are counted and skipped); `allocate failure`
//! rows are counted and skipped.
//!
//! A row is replayed the way the log-replay workload (`tests/workloads/replay`, `vramshim
//! replay --live`, `vramshim demo`) issues it and `vramshim replay` reads an imported log: an
//! `allocate` is a request on the row's stream, a `free` is `cudaFree` ([`FreeMode::Sync`]:
//! the block is reusable after a synchronization covers it). RMM's own `deallocate(ptr, size,
//! stream)` is stream-ordered, but a log replayed through the CUDA API becomes
//! `cudaMalloc`/`cudaFree`, and the what-if must answer for what really runs: the same events
//! through the same policy code, so `pool::replay`, `vramshim replay` and the interposer's
//! pool on the same log agree.

use crate::FreeMode;
use crate::fxhash::FxMap;
use crate::replay::Event;
use std::collections::HashSet;

/// A parsed log.
#[derive(Clone, Debug, Default)]
pub struct ParsedTrace {
    pub events: Vec<Event>,
    pub allocs: u64,
    pub frees: u64,
    /// Frees of pointers with no live allocation in the log.
    pub skipped_frees: u64,
    /// `allocate failure` rows.
    pub failed_allocs: u64,
    /// Distinct values of the Thread column.
    pub threads: usize,
}

/// A problem in the input: 1-based line number and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    pub line: usize,
    pub msg: String,
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.line, self.msg)
    }
}

impl std::error::Error for ParseError {}

fn parse_hex(s: &str) -> Option<u64> {
    let s = s.trim();
    if s == "(nil)" || s.is_empty() {
        return Some(0);
    }
    let h = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    u64::from_str_radix(h, 16).ok()
}

/// Parse a whole log.
pub fn parse(text: &str) -> Result<ParsedTrace, ParseError> {
    let mut lines = text.lines().enumerate();
    let header = loop {
        match lines.next() {
            None => {
                return Err(ParseError {
                    line: 1,
                    msg: "empty input: expected the header Thread,Time,Action,Pointer,Size,Stream"
                        .into(),
                });
            }
            Some((_, l)) if l.trim().is_empty() => continue,
            Some((i, l)) => break (i, l),
        }
    };
    let cols: Vec<&str> = header.1.split(',').map(|c| c.trim()).collect();
    let find = |name: &str| -> Result<usize, ParseError> {
        cols.iter()
            .position(|c| c.eq_ignore_ascii_case(name))
            .ok_or_else(|| ParseError {
                line: header.0 + 1,
                msg: format!(
                    "header has no {name} column (expected Thread,Time,Action,Pointer,Size,Stream)"
                ),
            })
    };
    let c_thread = find("Thread")?;
    let c_action = find("Action")?;
    let c_ptr = find("Pointer")?;
    let c_size = find("Size")?;
    let c_stream = find("Stream")?;
    let ncols = cols.len();

    let mut out = ParsedTrace::default();
    let mut live: FxMap<u64, u64> = FxMap::default();
    let mut threads = HashSet::new();
    let mut next_id = 0u64;
    for (i, line) in lines {
        let lineno = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(',').collect();
        if f.len() < ncols {
            return Err(ParseError {
                line: lineno,
                msg: format!("expected {ncols} fields, found {}", f.len()),
            });
        }
        let bad = |what: &str, v: &str| ParseError {
            line: lineno,
            msg: format!("bad {what} {v:?}"),
        };
        threads.insert(f[c_thread].trim().to_string());
        let ptr = parse_hex(f[c_ptr]).ok_or_else(|| bad("pointer", f[c_ptr]))?;
        let size: u64 = f[c_size]
            .trim()
            .parse()
            .map_err(|_| bad("size", f[c_size]))?;
        let stream = parse_hex(f[c_stream]).ok_or_else(|| bad("stream", f[c_stream]))?;
        match f[c_action].trim() {
            "allocate" => {
                let id = next_id;
                next_id += 1;
                live.insert(ptr, id);
                out.allocs += 1;
                out.events.push(Event::Alloc { id, size, stream });
            }
            "free" => match live.remove(&ptr) {
                Some(id) => {
                    out.frees += 1;
                    out.events.push(Event::Free {
                        id,
                        mode: FreeMode::Sync,
                    });
                }
                None => out.skipped_frees += 1,
            },
            "allocate failure" => out.failed_allocs += 1,
            a => {
                return Err(ParseError {
                    line: lineno,
                    msg: format!(
                        "unknown action {a:?} (expected allocate, free or allocate failure)"
                    ),
                });
            }
        }
    }
    out.threads = threads.len();
    Ok(out)
}

/// The largest file [`parse_file`] reads (it holds the text in memory; a device such as
/// `/dev/zero` would never end).
pub const MAX_FILE: u64 = 4 << 30;

/// Read and parse a file; errors name the file.
pub fn parse_file(path: impl AsRef<std::path::Path>) -> Result<ParsedTrace, ParseError> {
    use std::io::Read;
    let p = path.as_ref();
    let io = |e: std::io::Error| ParseError {
        line: 0,
        msg: format!("{}: {e}", p.display()),
    };
    let mut text = String::new();
    std::fs::File::open(p)
        .map_err(io)?
        .take(MAX_FILE + 1)
        .read_to_string(&mut text)
        .map_err(io)?;
    if text.len() as u64 > MAX_FILE {
        return Err(ParseError {
            line: 0,
            msg: format!(
                "{}: larger than {} GiB, the largest log read whole",
                p.display(),
                MAX_FILE >> 30
            ),
        });
    }
    parse(&text).map_err(|e| ParseError {
        line: e.line,
        msg: format!("{}: {}", p.display(), e.msg),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_rmm_rows() {
        let t = "Thread,Time,Action,Pointer,Size,Stream\n\
                 1,00:00:00.000000,allocate,0x1000,1024,0\n\
                 1,00:00:00.000001,allocate failure,(nil),99,0\n\
                 1,00:00:00.000002,free,0x1000,1024,0\n\
                 2,00:00:00.000003,free,0x9999,8,0\n\
                 2,00:00:00.000004,allocate,0x1000,7,7f00\n";
        let p = parse(t).unwrap();
        assert_eq!(p.allocs, 2);
        assert_eq!(p.frees, 1);
        assert_eq!(p.skipped_frees, 1);
        assert_eq!(p.failed_allocs, 1);
        assert_eq!(p.threads, 2);
        assert_eq!(
            p.events,
            vec![
                Event::Alloc {
                    id: 0,
                    size: 1024,
                    stream: 0
                },
                Event::Free {
                    id: 0,
                    mode: FreeMode::Sync
                },
                Event::Alloc {
                    id: 1,
                    size: 7,
                    stream: 0x7f00
                },
            ]
        );
    }

    #[test]
    fn errors_name_the_line() {
        let e =
            parse("Thread,Time,Action,Pointer,Size,Stream\n1,0,allocate,0x10,abc,0\n").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.to_string().contains("size"));
        assert!(parse("a,b\n").is_err());
        assert!(parse("").is_err());
    }
}
