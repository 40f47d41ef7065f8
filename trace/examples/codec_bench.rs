//! Codec benchmark: encode, compress, write and decode the real allocation streams
//! (`tests/workloads/traces/*.rmm.csv`, RMM CSV) in-process.
//!
//! ```text
//! cargo run --release -p vramshim-trace --example codec_bench [-- CSV...]
//! ```
//!
//! Prints, per trace: events, bytes/event on disk (zstd level 1 and 3), encode ns/event on
//! the calling thread (RecordEncoder::push, what the tracer's hot path pays), writer
//! throughput (encode + zstd + write to memory), and decode throughput (next_into) on the
//! trace repeated to >= 1M events. Rates are per CPU-second of the measuring thread. Timestamps are the CSV's (microsecond resolution), latency
//! is 0: a replay through the interposer (scripts/bench) gives the on-disk numbers with real
//! nanosecond timestamps and latencies.

use std::path::{Path, PathBuf};

use vramshim_trace::*;

fn parse_time(s: &str) -> u64 {
    // HH:MM:SS.micro
    let mut parts = s.split(':');
    let h: u64 = parts.next().and_then(|v| v.parse().ok()).unwrap_or(0);
    let m: u64 = parts.next().and_then(|v| v.parse().ok()).unwrap_or(0);
    let sec = parts.next().unwrap_or("0");
    let (s, us) = sec.split_once('.').unwrap_or((sec, "0"));
    let s: u64 = s.parse().unwrap_or(0);
    let us: u64 = format!("{us:0<6}")[..6].parse().unwrap_or(0);
    ((h * 60 + m) * 60 + s) * 1_000_000_000 + us * 1000
}

fn load(path: &Path) -> Vec<Event> {
    let text = std::fs::read_to_string(path).expect("read csv");
    let mut out = Vec::new();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        if f.len() < 6 {
            continue;
        }
        let tid: u32 = f[0].parse().unwrap_or(0);
        let t = 1_000_000_000 + parse_time(f[1]);
        let addr = u64::from_str_radix(f[3].trim_start_matches("0x"), 16).unwrap_or(0);
        let size: u64 = f[4].parse().unwrap_or(0);
        let stream: u64 = f[5].parse().unwrap_or(0);
        let (api, alloc) = match f[2] {
            "allocate" => (Api::CudaMalloc, true),
            "free" => (Api::CudaFree, false),
            _ => continue,
        };
        let m = MemOp {
            t_ns: t,
            tid,
            api,
            kind: AllocKind::Runtime,
            flags: 0,
            device: 0,
            stream,
            addr,
            size,
            result: 0,
            latency_ns: 0,
            stack: 0,
        };
        out.push(if alloc {
            Event::Alloc(m)
        } else {
            Event::Free(m)
        });
    }
    out
}

/// CPU time of the calling thread in ns (`/proc/thread-self/schedstat`, first field): the
/// machine is shared, so per-event costs are measured in CPU time, not wall time.
fn cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

fn encode(events: &[Event], level: i32) -> Vec<u8> {
    let mut w = TraceWriter::with_level(Vec::new(), &Header::default(), level).unwrap();
    for e in events {
        w.write(e).unwrap();
    }
    w.finish().unwrap()
}

fn main() {
    let args: Vec<PathBuf> = std::env::args().skip(1).map(PathBuf::from).collect();
    let files = if args.is_empty() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/workloads/traces");
        ["vit_train", "t5_train", "bert_serve"]
            .iter()
            .map(|n| dir.join(format!("{n}.rmm.csv")))
            .collect()
    } else {
        args
    };
    println!(
        "| trace | events | B/event zstd-1 | B/event zstd-3 | raw B/event | encode ns/event | write Mev/s | decode Mev/s |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for f in files {
        let events = load(&f);
        let n = events.len();
        let b1 = encode(&events, 1);
        let b3 = encode(&events, 3);
        // Raw record bytes (no compression) and per-event encode cost.
        let reps = (2_000_000 / n.max(1)).max(1);
        let mut enc = RecordEncoder::with_capacity(64 << 10);
        let mut raw_total = 0usize;
        let t0 = cpu_ns();
        for _ in 0..reps {
            enc.begin(1);
            for e in &events {
                enc.push(e);
                if enc.len() >= 64 << 10 {
                    raw_total += enc.len();
                    enc.begin(1);
                }
            }
            raw_total += enc.len();
        }
        let enc_ns = (cpu_ns() - t0) as f64 / (reps * n) as f64;
        let raw_per = raw_total as f64 / (reps * n) as f64;
        // Writer throughput (encode + zstd level 1 + write to memory).
        let t0 = cpu_ns();
        let mut w = TraceWriter::with_level(Vec::new(), &Header::default(), 1).unwrap();
        for _ in 0..reps {
            for e in &events {
                w.write(e).unwrap();
            }
        }
        let big = w.finish().unwrap();
        let write_rate = (reps * n) as f64 / ((cpu_ns() - t0) as f64 / 1e9) / 1e6;
        // Decode throughput on the big file, allocation-free path.
        let mut best = f64::MAX;
        for _ in 0..3 {
            let t0 = cpu_ns();
            let mut r = TraceReader::from_reader(&big[..]).unwrap();
            let mut ev = Event::Lost { t_ns: 0, count: 0 };
            let mut k = 0usize;
            let mut sum = 0u64;
            while r.next_into(&mut ev).unwrap() {
                if let Event::Alloc(m) = &ev {
                    sum = sum.wrapping_add(m.size);
                }
                k += 1;
            }
            assert_eq!(k, reps * n);
            std::hint::black_box(sum);
            best = best.min((cpu_ns() - t0) as f64 / 1e9);
        }
        let dec_rate = (reps * n) as f64 / best / 1e6;
        println!(
            "| {} | {} | {:.2} | {:.2} | {:.1} | {:.1} | {:.1} | {:.1} |",
            f.file_name().unwrap().to_string_lossy(),
            n,
            b1.len() as f64 / n as f64,
            b3.len() as f64 / n as f64,
            raw_per,
            enc_ns,
            write_rate,
            dec_rate
        );
    }
}
