//! The smallest device over repeated passes: for each trace, under both free semantics, the
//! smallest device (whole 2 MiB pages, every size tried from peak live up) on which the default pool (`Stitch::tight`) completes
//! 1, 2 and 3 passes of the trace, the pool kept from pass to pass as `pool_slack`'s "passes
//! 2, 3" column runs them (`replay::repeat`: each pass `cudaFree`s what it left live, then the
//! next begins), as a ratio to peak live (the same for every pass count: nothing stays live
//! across a pass). Each figure with and without a process synchronization between passes, as
//! a training loop's step end has; then whether 3 passes complete on the whole-page device of
//! 1.03 x peak live.
//!
//! `cargo run --release -p vramshim-pool --example pool_passes -- [--shapes=request|pow2] [--guard] [DIR_OR_FILES...]`
//! (default: tests/workloads/traces; `--shapes`: handles sized per request,
//! `Stitch::with_shapes`; `--guard`: the shape guard, `Stitch::with_shape_guard`).

#[macro_use]
mod common;

use vramshim_pool::replay::{self, Event, Frees};
use vramshim_pool::stitch::{Shapes, Stitch};
use vramshim_pool::{AccountingDevice, MIB, Policy};

/// `repeat(events, passes)` with a process synchronization after each pass's end (the step
/// end of a training loop) when `sync`, its frees given the semantics `frees`.
fn passes_of(events: &[Event], passes: usize, sync: bool, frees: Frees) -> Vec<Event> {
    let one = replay::repeat(events, 1).len();
    let all = replay::repeat(events, passes);
    let mut out = Vec::with_capacity(all.len() + passes);
    for (i, chunk) in all.chunks(one).enumerate() {
        out.extend_from_slice(chunk);
        if sync && i + 1 < passes {
            out.push(Event::ProcessSync);
        }
    }
    frees.apply(&out)
}

/// The smallest whole-page device on which a pool built by `make` completes `events`: every
/// size from peak live up, in pages, as the pool's near-the-limit rules read the device's
/// room and a larger device need not complete where a smaller one does. Checked against
/// `replay::min_capacity_with`'s binary search, which assumes it does.
fn smallest(events: &[Event], live: u64, make: &dyn Fn() -> Box<dyn Policy>) -> u64 {
    let page = 2 * MIB;
    let mut cap = live.div_ceil(page) * page;
    loop {
        let mut dev = AccountingDevice::new(cap);
        let mut p = make();
        if replay::run_with(events, p.as_mut(), &mut dev).completed {
            break;
        }
        cap += page;
    }
    let searched = replay::min_capacity_with(events, make);
    if searched != cap {
        eprintln!(
            "pool_passes: the binary search says {} MiB, the scan from peak live {} MiB",
            searched / MIB,
            cap / MIB
        );
    }
    cap
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let shapes = match args.first().map(String::as_str) {
        Some("--shapes=request") => Shapes::Request,
        Some("--shapes=pow2") => Shapes::Pow2,
        Some(a) if a.starts_with("--shapes") => {
            eprintln!("pool_passes: `{a}`: expected --shapes=request or --shapes=pow2");
            std::process::exit(2);
        }
        _ => Shapes::Pages,
    };
    if shapes != Shapes::Pages {
        args.remove(0);
    }
    let guard = args.first().is_some_and(|a| a == "--guard");
    if guard {
        args.remove(0);
    }
    let files = common::trace_files(args);
    say!(
        "| trace | frees | sync between passes | peak live MiB | min device MiB, 1 / 2 / 3 passes | / peak live, 1 / 2 / 3 passes | 1.03 x device MiB | 3 passes complete there |"
    );
    say!("| --- | --- | --- | ---: | ---: | ---: | ---: | --- |");
    for f in files {
        let t = common::read_trace(&f);
        let name = format!(
            "{}/{}",
            f.parent()
                .and_then(|p| p.file_name())
                .unwrap_or_default()
                .to_string_lossy(),
            f.file_name().unwrap_or_default().to_string_lossy()
        );
        let live = replay::peak_live(&t.events);
        let small = (live as f64 * 1.03) as u64 / (2 * MIB) * (2 * MIB);
        for frees in Frees::BOTH {
            for sync in [false, true] {
                let make = || -> Box<dyn Policy> {
                    Box::new(Stitch::tight().with_shapes(shapes).with_shape_guard(guard))
                };
                let mins: Vec<u64> = (1..=3)
                    .map(|n| smallest(&passes_of(&t.events, n, sync, frees), live, &make))
                    .collect();
                let three = passes_of(&t.events, 3, sync, frees);
                let mut dev = AccountingDevice::new(small);
                let mut p = Stitch::tight().with_shapes(shapes);
                let r = replay::run_with(&three, &mut p, &mut dev);
                say!(
                    "| {name} | {} | {} | {:.1} | {} / {} / {} | {:.3} / {:.3} / {:.3} | {} | {} |",
                    frees.name(),
                    if sync { "yes" } else { "no" },
                    live as f64 / MIB as f64,
                    mins[0] / MIB,
                    mins[1] / MIB,
                    mins[2] / MIB,
                    mins[0] as f64 / live as f64,
                    mins[1] as f64 / live as f64,
                    mins[2] as f64 / live as f64,
                    small / MIB,
                    match &r.first_failure {
                        None => "yes".to_string(),
                        Some(f) => format!("no (event {} of {})", f.index, three.len()),
                    },
                );
            }
        }
    }
}
