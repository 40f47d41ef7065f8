//! What the pool's examples share: the traces named on the command line (read, or the
//! process ends with the reason; with their names and peaks of live bytes) and the checking device with a stitch pool they replay on.
//! A folder with `mod.rs`, so that Cargo does not take it for an example of its own.

#![allow(dead_code)] // each example uses part of it

pub mod plan;

use std::io::Write;
use std::path::{Path, PathBuf};

use vramshim_pool::AccountingDevice;
use vramshim_pool::rmm_csv::{self, ParsedTrace};
use vramshim_pool::stitch::Stitch;

/// `println!` for the examples' output, which is often read by another program that may stop
/// reading early (`pool_slack ... | head`): `println!` panics when the reader has gone away.
macro_rules! say {
    () => {
        $crate::common::say(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::common::say(format_args!($($arg)*))
    };
}

/// One line to stdout. When the reader has gone away the example ends at once with status 0
/// (the reader has what it wanted); any other write error ends it with the error (status 1).
pub fn say(line: std::fmt::Arguments) {
    if let Err(e) = writeln!(std::io::stdout().lock(), "{line}") {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("stdout: {e}");
        std::process::exit(1);
    }
}

/// The RMM CSV traces `args` name: a file as given, a directory's `.csv` files in name order;
/// no arguments: the repository's `tests/workloads/traces`. A directory that cannot be read
/// ends the process (status 1) with the reason.
pub fn trace_files(args: Vec<String>) -> Vec<PathBuf> {
    let roots = if args.is_empty() {
        vec![concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/workloads/traces").to_string()]
    } else {
        args
    };
    let mut files = Vec::new();
    for r in roots {
        let p = Path::new(&r);
        if p.is_dir() {
            let mut v: Vec<_> = match std::fs::read_dir(p) {
                Ok(d) => d
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.to_string_lossy().ends_with(".csv"))
                    .collect(),
                Err(e) => {
                    eprintln!("{}: {e}", p.display());
                    std::process::exit(1);
                }
            };
            v.sort();
            files.extend(v);
        } else {
            files.push(p.to_path_buf());
        }
    }
    files
}

/// The trace at `path`; one that cannot be read or parsed ends the process (status 1) with
/// the reason.
pub fn read_trace(path: &Path) -> ParsedTrace {
    rmm_csv::parse_file(path).unwrap_or_else(|e| {
        eprintln!("{}: {e}", path.display());
        std::process::exit(1);
    })
}

/// The traces `args` name ([`trace_files`], found now), each read when reached
/// ([`read_trace`]): its file name, the trace, and its peak of live bytes.
pub fn traces(args: Vec<String>) -> impl Iterator<Item = (String, ParsedTrace, u64)> {
    trace_files(args).into_iter().map(|f| {
        let t = read_trace(&f);
        let name = f
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        let live = vramshim_pool::replay::peak_live(&t.events);
        (name, t, live)
    })
}

/// The stitch pool, tight (`Stitch::tight`) or not.
pub fn stitch(tight: bool) -> Stitch {
    if tight {
        Stitch::tight()
    } else {
        Stitch::new()
    }
}

/// A checking accounting device of `cap` bytes (it records overlaps and early reuse) and a
/// new stitch pool to replay on it.
pub fn checking_stitch(cap: u64, tight: bool) -> (AccountingDevice, Stitch) {
    let mut dev = AccountingDevice::new(cap);
    dev.set_checking(true);
    (dev, stitch(tight))
}
