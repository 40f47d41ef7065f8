//! Feeds arbitrary bytes to the RMM logging CSV reader behind `import --from rmm-csv` and
//! `replay`: it must never panic and never buffer more than a line (64 KiB) whatever the input
//! (run with `-rss_limit_mb=512`). Two shapes per input: the bytes as a whole file, and the
//! bytes as rows after a valid header (so the fuzzer reaches the row parser at once).
#![no_main]

use std::cell::Cell;
use std::path::Path;
use std::rc::Rc;

use libfuzzer_sys::fuzz_target;
use vramshim_analyzer::formats::rmm_csv;

fn drain(bytes: &[u8]) {
    let count = Rc::new(Cell::new(0));
    let Ok((_, mut src)) = rmm_csv::open_reader(Path::new("fuzz.csv"), bytes, count) else {
        return;
    };
    use vramshim_analyzer::input::EventSource;
    while let Some(ev) = src.next_event() {
        if ev.is_err() {
            break;
        }
    }
    let _ = src.warnings();
}

fuzz_target!(|data: &[u8]| {
    drain(data);
    let mut rows = Vec::with_capacity(data.len() + 64);
    rows.extend_from_slice(rmm_csv::HEADER.as_bytes());
    rows.push(b'\n');
    rows.extend_from_slice(data);
    drain(&rows);
});
