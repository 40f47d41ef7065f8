//! The stitch pool's own replay (no CUDA, no PyTorch) of the shipped traces as PyTorch hands
//! them to it: stream-ordered (`backend:cudaMallocAsync`: cudaMallocAsync / cudaFreeAsync on
//! the legacy stream), uncached (`PYTORCH_NO_CUDA_MEMORY_CACHING=1`: cudaMalloc / cudaFree,
//! a freed block pending until a synchronization), and uncached with a synchronization after
//! every free (what CUDA's own cudaFree does). Prints the smallest device (whole 2 MiB pages)
//! each needs over peak live, and the pool's synchronizations per 1000 allocations on it.
//! `cargo run --release -p vramshim-pytorch-tests --example free_modes [TRACE...]`
//! (docs/pytorch.md, "vramshim's pool under PyTorch").

use vramshim_pool::replay::{self, Event};
use vramshim_pool::{ANY_STREAM, FreeMode, PolicyKind};

/// The stream as PyTorch's `backend:cudaMallocAsync` hands it over: each free is a
/// `cudaFreeAsync` on the stream its block was allocated on.
fn stream_ordered(events: &[Event]) -> Vec<Event> {
    let mut streams = std::collections::HashMap::new();
    events
        .iter()
        .map(|e| match *e {
            Event::Alloc { id, stream, .. } => {
                streams.insert(id, stream);
                *e
            }
            Event::Free { id, .. } => Event::Free {
                id,
                mode: FreeMode::Async {
                    stream: streams.get(&id).copied().unwrap_or(0),
                },
            },
            Event::ProcessSync | Event::StreamRetired { .. } => *e,
        })
        .collect()
}

/// The stream as PyTorch uncached hands it over: requests on no stream, `cudaFree`s, and
/// with `sync_each` a process synchronization after every free.
fn uncached(events: &[Event], sync_each: bool) -> Vec<Event> {
    let mut out = Vec::with_capacity(events.len() * 2);
    for e in events {
        match *e {
            Event::Alloc { id, size, .. } => out.push(Event::Alloc {
                id,
                size,
                stream: ANY_STREAM,
            }),
            Event::Free { id, .. } => {
                out.push(Event::Free {
                    id,
                    mode: FreeMode::Sync,
                });
                if sync_each {
                    out.push(Event::ProcessSync);
                }
            }
            e @ (Event::ProcessSync | Event::StreamRetired { .. }) => out.push(e),
        }
    }
    out
}

fn main() {
    let mut traces: Vec<String> = std::env::args().skip(1).collect();
    if traces.is_empty() {
        let dir = vramshim_testkit::repo_root().join("tests/workloads/traces");
        traces = ["bert_serve", "vit_train", "t5_train"]
            .iter()
            .map(|t| dir.join(format!("{t}.rmm.csv")).display().to_string())
            .collect();
    }
    println!(
        "| trace | frees | smallest device MiB | / peak live | pool syncs / 1000 allocs there |"
    );
    println!("| --- | --- | ---: | ---: | ---: |");
    for t in &traces {
        let parsed = vramshim_pool::rmm_csv::parse_file(t).unwrap_or_else(|e| panic!("{t}: {e}"));
        let live = replay::peak_live(&parsed.events) as f64;
        let name = t.rsplit('/').next().unwrap_or(t);
        for (label, events) in [
            (
                "stream-ordered (cudaFreeAsync)",
                stream_ordered(&parsed.events),
            ),
            ("uncached (cudaFree)", uncached(&parsed.events, false)),
            ("cudaFree + sync each", uncached(&parsed.events, true)),
        ] {
            let min = replay::min_capacity(&events, PolicyKind::Stitch);
            let r = replay::run(&events, PolicyKind::Stitch, min, None);
            println!(
                "| {name} | {label} | {} | {:.3} | {:.1} |",
                min >> 20,
                min as f64 / live,
                r.stats.syncs as f64 * 1000.0 / parsed.allocs.max(1) as f64
            );
        }
    }
}
