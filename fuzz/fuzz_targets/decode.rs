//! Feeds arbitrary bytes to the decoder: it must never panic, never loop, and never allocate
//! beyond its caps (run with `-rss_limit_mb=512`). Two shapes per input: the bytes as a whole
//! file, and the bytes as the records of one well-formed frame after a valid header (so the
//! fuzzer reaches the record decoder without having to forge zstd).
#![no_main]

use libfuzzer_sys::fuzz_target;
use vramshim_trace::{Event, Header, RecordStats, TraceReader, TraceWriter};

fn drain(bytes: &[u8]) {
    let Ok(mut r) = TraceReader::from_reader(bytes) else {
        return;
    };
    let mut ev = Event::Lost { t_ns: 0, count: 0 };
    for _ in 0..10_000_000 {
        match r.next_into(&mut ev) {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) if e.is_recoverable() => {}
            Err(_) => break,
        }
    }
    let _ = r.truncation().map(|t| t.to_string());
}

fuzz_target!(|data: &[u8]| {
    drain(data);
    if data.len() <= 1 << 20 {
        let mut w = TraceWriter::new(Vec::new(), &Header::default()).unwrap();
        let stats = RecordStats {
            records: 0,
            t_min: u64::MAX,
            t_max: 0,
        };
        if w.write_records(data, stats).is_ok()
            && let Ok(file) = w.finish()
        {
            drain(&file);
        }
    }
});
