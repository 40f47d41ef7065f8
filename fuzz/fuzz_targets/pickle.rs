//! Feeds arbitrary bytes to the pickle reader behind `import --from memory-viz`: it must never
//! panic, never overflow the stack, and never allocate past its limits (run with
//! `-rss_limit_mb=512`: the allocation budget is 64 MiB plus 64 bytes per input byte). A
//! pickle that reads is then taken as a memory snapshot (the shape checks and sizes).
#![no_main]

use libfuzzer_sys::fuzz_target;
use vramshim_analyzer::formats::pickle;

fuzz_target!(|data: &[u8]| {
    let _ = pickle::read(data);
    // The same bytes after a protocol header: the fuzzer reaches the opcodes at once.
    let mut framed = Vec::with_capacity(data.len() + 2);
    framed.extend_from_slice(&[0x80, 2]);
    framed.extend_from_slice(data);
    if let Ok(v) = pickle::read(&framed) {
        let _ = vramshim_analyzer::formats::memviz::events_of(std::path::Path::new("fuzz.pickle"), &v);
    }
});
