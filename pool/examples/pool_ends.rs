//! The stitch pool's arena placing by two ends (`Stitch::set_ends_class`: a long-lived block
//! at the bottom of the lowest window that fits, a short-lived one at the top of the highest),
//! told each block's class from the trace's own lifetimes (an oracle: lived at least T ticks,
//! one tick per allocation or free), against the same pool told nothing, side by side in one
//! run: per trace, free semantics, budget ratio (slack 2 MiB) and T, the driver calls of one
//! pass, those per 1000 allocations of its second half, and peak reserved over peak live on
//! an 80 GiB device. What a pool predicting lifetimes could gain with this placement inside
//! the stitch pool (`pool_plan` measures it in one never-stitched range).
//!
//! `cargo run --release -p vramshim-pool --example pool_ends -- [--ends=T[,T...]] [--ratios=R[,R...]] [DIR_OR_FILES...]`
//! (defaults: T 12 and 19; ratios 0.05, 0.10, 0.17, 0.25; tests/workloads/traces).

#[macro_use]
mod common;
#[path = "../tests/common/ends.rs"]
mod ends;

use vramshim_pool::replay::{self, Frees};
use vramshim_pool::stitch::{Budget, Faults, Stitch};

/// The comma-separated values after `prefix` in `a`, or what is wrong with them.
fn list<T: std::str::FromStr>(a: &str, prefix: &str) -> Result<Vec<T>, String> {
    a[prefix.len()..]
        .split(',')
        .map(|v| {
            v.parse::<T>()
                .map_err(|_| format!("`{v}` in `{a}` is not a number"))
        })
        .collect()
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let (mut ts, mut ratios) = (vec![12usize, 19], vec![0.05f64, 0.10, 0.17, 0.25]);
    while let Some(a) = args.first().cloned() {
        let r = if a.starts_with("--ends=") {
            list(&a, "--ends=").map(|v| ts = v)
        } else if a.starts_with("--ratios=") {
            list::<f64>(&a, "--ratios=").and_then(|v| {
                if v.iter().all(|r| r.is_finite() && *r >= 0.0) {
                    ratios = v;
                    Ok(())
                } else {
                    Err(format!("`{a}`: a ratio is a number >= 0"))
                }
            })
        } else {
            break;
        };
        if let Err(e) = r {
            eprintln!("pool_ends: {e}; expected --ends=T[,T...] and --ratios=R[,R...]");
            std::process::exit(2);
        }
        args.remove(0);
    }
    say!(
        "| trace | frees | budget | T | calls: told nothing / two ends | 2nd half per 1000: told nothing / two ends | reserved / peak live: told nothing / two ends |"
    );
    say!("| --- | --- | --- | ---: | ---: | ---: | ---: |");
    for (name, t, _) in common::traces(args) {
        for frees in Frees::BOTH {
            let stream = frees.apply(&t.events);
            let live = replay::peak_live(&stream) as f64;
            for &ratio in &ratios {
                let pool = || {
                    Stitch::new().with_budget(Some(Budget {
                        ratio,
                        ..Budget::default()
                    }))
                };
                let base = ends::pass(&stream, None, pool(), Faults::default(), 80 << 30);
                for &t in &ts {
                    let c = ends::classes(&stream, t);
                    let e = ends::pass(&stream, Some(&c), pool(), Faults::default(), 80 << 30);
                    for p in [&base, &e] {
                        assert!(p.violations.is_empty(), "{name}: {:?}", &p.violations[..1]);
                        assert!(p.leaks.is_empty(), "{name}: {:?}", &p.leaks[..1]);
                    }
                    let n = (base.allocs - base.allocs / 2).max(1) as f64;
                    say!(
                        "| {name} | {} | {:.0}% + 2 MiB | {t} | {} / {} | {:.1} / {:.1} | {:.3} / {:.3} |",
                        frees.name(),
                        ratio * 100.0,
                        base.calls,
                        e.calls,
                        base.second_half as f64 * 1000.0 / n,
                        e.second_half as f64 * 1000.0 / n,
                        base.peak_reserved as f64 / live,
                        e.peak_reserved as f64 / live,
                    );
                }
            }
        }
    }
}
