//! Prints a trace: header, then every event (`-q`: only counts per record type), then the
//! truncation report. A debugging aid; `vramshim summary` is the user-facing tool.
//!
//! ```text
//! cargo run --release -p vramshim-trace --example dump -- [-q] FILE.vramtrace
//! ```

use std::collections::BTreeMap;
use std::io::Write;

use vramshim_trace::*;

/// A failed write to stdout: a closed pipe (`dump ... | head`) ends the dump quietly.
fn stdout_failed(e: std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(0);
    }
    eprintln!("dump: writing the output: {e}");
    std::process::exit(1);
}

fn main() {
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    // `println!` panics when the reader has gone; every line goes through here instead.
    macro_rules! say {
        ($($t:tt)*) => {
            if let Err(e) = writeln!(out, $($t)*) {
                stdout_failed(e);
            }
        };
    }
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let quiet = args.iter().any(|a| a == "-q");
    args.retain(|a| a != "-q");
    let Some(path) = args.first() else {
        eprintln!("usage: dump [-q] FILE.vramtrace");
        std::process::exit(2);
    };
    let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let mut r = match TraceReader::open(path) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{path}: {e}");
            std::process::exit(1);
        }
    };
    say!("{:?}", r.header());
    let mut counts: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut ev = Event::Lost { t_ns: 0, count: 0 };
    let mut errors = 0;
    loop {
        match r.next_into(&mut ev) {
            Ok(true) => {
                let name = match &ev {
                    Event::Alloc(_) => "Alloc",
                    Event::Free(_) => "Free",
                    Event::CapRefusal { .. } => "CapRefusal",
                    Event::PoolTrim { .. } => "PoolTrim",
                    Event::Sync { .. } => "Sync",
                    Event::MemInfo { .. } => "MemInfo",
                    Event::ThreadStart { .. } => "ThreadStart",
                    Event::ThreadExit { .. } => "ThreadExit",
                    Event::Fork { .. } => "Fork",
                    Event::Module { .. } => "Module",
                    Event::Stack { .. } => "Stack",
                    Event::Counter { .. } => "Counter",
                    Event::PoolStats { .. } => "PoolStats",
                    Event::StreamDestroy { .. } => "StreamDestroy",
                    Event::Lost { .. } => "Lost",
                    Event::CallFailed { .. } => "CallFailed",
                    Event::Device(_) => "Device",
                    Event::Torch(_) => "Torch",
                    Event::PyCode { .. } => "PyCode",
                    Event::PyStack { .. } => "PyStack",
                };
                *counts.entry(name).or_default() += 1;
                if !quiet {
                    say!("{ev:?}");
                }
            }
            Ok(false) => break,
            Err(e) => {
                errors += 1;
                eprintln!("{path}: {e}");
                if !e.is_recoverable() {
                    break;
                }
            }
        }
    }
    let total: u64 = counts.values().sum();
    let ops = counts.get("Alloc").copied().unwrap_or(0) + counts.get("Free").copied().unwrap_or(0);
    say!("records: {counts:?}");
    say!(
        "file {size} bytes, {total} events ({:.2} bytes/event, {:.2} bytes per alloc/free), {} frames, end {:?}, {errors} errors",
        size as f64 / total.max(1) as f64,
        size as f64 / ops.max(1) as f64,
        r.frames_read(),
        r.end_time()
    );
    if let Some(t) = r.truncation() {
        say!("{t}");
    }
    if let Err(e) = out.flush() {
        stdout_failed(e);
    }
}
