//! The default (`Auto`) layout's choices, which set the writer thread's cost per frame: small
//! frames stored (no zstd call), rows under 1 KiB or without MemOps, columns for large frames
//! of MemOps, the mid-size layout followed from the last comparison. Every file written here
//! must read back to exactly its events.

mod common;

use common::*;
use vramshim_trace::*;

/// (magic, compressed_len, raw_len) of every frame.
fn frames(b: &[u8]) -> Vec<([u8; 4], usize, usize)> {
    let hl = u32::from_le_bytes(b[18..22].try_into().unwrap()) as usize;
    let mut p = 22 + hl;
    let mut out = Vec::new();
    while p + 32 <= b.len() {
        let m: [u8; 4] = b[p..p + 4].try_into().unwrap();
        let c = u32::from_le_bytes(b[p + 4..p + 8].try_into().unwrap()) as usize;
        let r = u32::from_le_bytes(b[p + 8..p + 12].try_into().unwrap()) as usize;
        out.push((m, c, r));
        p += 32 + c;
    }
    assert_eq!(p, b.len(), "frames do not end at the end of the file");
    out
}

fn sync(t: u64) -> Event {
    Event::Sync {
        t_ns: t,
        tid: 7,
        device: 0,
        kind: SyncKind::ProcessDevice,
        stream: 0,
        latency_ns: (t % 977_000) as u32,
    }
}

/// An alloc/free pair with noisy timings, as a training loop makes them.
fn pair(i: u64) -> [Event; 2] {
    let t = 1_000_000_000 + i * 40_000 + (i * 7919) % 13_000;
    let mut a = op(
        t,
        7,
        Api::CudaMalloc,
        0x7f00_0000_0000 + (i % 32) * 0x20_0000,
        4096 << (i % 8),
    );
    a.latency_ns = 2_000 + ((i * 104_729) % 30_000) as u32;
    let mut f = a.clone();
    f.api = Api::CudaFree;
    f.t_ns = t + 9_000 + (i * 31) % 500;
    f.latency_ns = 1_000 + ((i * 15_485_863) % 9_000) as u32;
    [Event::Alloc(a), Event::Free(f)]
}

/// Writes `batches` (one frame each) with the default layout; checks the events read back.
fn write(batches: &[Vec<Event>]) -> Vec<u8> {
    let mut w = TraceWriter::new(Vec::new(), &Header::default()).unwrap();
    for b in batches {
        for e in b {
            w.write(e).unwrap();
        }
        w.flush_frame().unwrap();
    }
    let bytes = w.finish().unwrap();
    let (_, got, errors, trunc) = read_all(&bytes).unwrap();
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(trunc, None);
    let want: Vec<Event> = batches.iter().flatten().cloned().collect();
    assert_eq!(got, want);
    bytes
}

#[test]
fn a_tick_with_a_few_events_is_stored_not_compressed() {
    let batches: Vec<Vec<Event>> = (0..4)
        .map(|k| (0..5).map(|i| sync(1_000_000 * k + 10_000 * i)).collect())
        .collect();
    let b = write(&batches);
    for (m, c, r) in frames(&b) {
        assert_eq!(&m, b"VRFR");
        assert!(r < 256, "{r}");
        // A stored zstd frame: magic, descriptor, size, block header, the bytes, checksum.
        assert_eq!(c, 4 + 2 + 3 + r + 4, "raw {r}, compressed {c}");
    }
}

#[test]
fn frames_without_memops_or_under_1k_are_rows() {
    // 400 Sync records (~6 KiB): compressed, but as rows (no timing column to split off).
    let syncs: Vec<Event> = (0..400).map(|i| sync(1_000_000 + 70_001 * i)).collect();
    // 30 pairs (~700 bytes): rows.
    let few: Vec<Event> = (0..30).flat_map(pair).collect();
    let b = write(&[syncs, few]);
    let f = frames(&b);
    assert_eq!(&f[0].0, b"VRFR");
    assert!(f[0].2 > 4096 && f[0].1 < f[0].2, "{:?}", f[0]);
    assert_eq!(&f[1].0, b"VRFR");
    assert!(f[1].2 > 256 && f[1].2 < 1024, "{:?}", f[1]);
    // Compressed at the small frames' level, still with its content checksum: the zstd
    // frame header's descriptor has Content_Checksum (bit 2) set.
    let hl = u32::from_le_bytes(b[18..22].try_into().unwrap()) as usize;
    let second = 22 + hl + 32 + f[0].1;
    assert_eq!(&b[second + 32..second + 36], &[0x28, 0xb5, 0x2f, 0xfd]);
    assert_ne!(b[second + 36] & 0x04, 0, "no content checksum");
}

#[test]
fn large_memop_frames_are_columnar() {
    let many: Vec<Event> = (0..3000).flat_map(pair).collect();
    let f = frames(&write(&[many]));
    assert_eq!(&f[0].0, b"VRFC");
    assert!(f[0].2 >= 16 << 10);
}

/// Mid-size frames (1-16 KiB): the first is compressed both ways; the next seven follow its
/// outcome; the ninth is compared again. Whatever each picks, every frame reads back.
#[test]
fn mid_size_frames_follow_the_last_comparison() {
    let batches: Vec<Vec<Event>> = (0..20)
        .map(|k| (0..200).flat_map(|i| pair(k * 1000 + i)).collect())
        .collect();
    let b = write(&batches);
    let f = frames(&b);
    assert!(
        f[..20].iter().all(|x| x.2 >= 1024 && x.2 < 16 << 10),
        "{f:?}"
    );
    // Same kind of events in every frame: the layout the first comparison chose holds.
    assert!(f[..20].iter().all(|x| x.0 == f[0].0), "{f:?}");
    // And it is the smaller of the two: columns, for this many noisy timings.
    assert_eq!(&f[0].0, b"VRFC");
}
