//! The tight pool's budget slack against its driver calls: for each budget (ratio, slack,
//! and whether the arena grows by runs of pages under one handle, `Stitch::with_runs`),
//! every trace under both free semantics, the peak reserved over peak live on an 80 GiB
//! device, the driver calls of passes 2 and 3 of a 3-pass loop, and the calls per 1000
//! allocations in the second half of one pass. Then, per trace, what one address range that
//! is never stitched needs: online, best fit by (length, address), freed ranges coalesced,
//! grown at its end only (PyTorch's expandable segments in one segment, no small pool), and the
//! offline greedy-by-size plan of the whole trace (`common::plan`), each its peak length in
//! whole pages over peak live. Best fit is one online placement, not a bound: the offline plan
//! needs less (bert 1.061 against 1.166), and `pool_plan` measures other online placements.
//!
//! `cargo run --release -p vramshim-pool --example pool_slack -- [BUDGET ...] -- [DIR_OR_FILES...]`
//! where a BUDGET is `RATIO:SLACK_MIB` followed by switches in any order, each at most once
//! (see [`FORM`]): `:runs` (`Stitch::with_runs`), `:kept` (`Stitch::with_kept`), `:grow`
//! (`Stitch::with_grow`), `:holds` (`Stitch::with_layer_holds`), `:guard`
//! (`Stitch::with_shape_guard`), `:nolayers` (without the
//! layer replay, `Stitch::with_layers(false)`) or `:layers` (with it, the default), and
//! `:request` or `:pow2` (handles sized per request, `Stitch::with_shapes`). Default
//! budgets: 0.05:2 0.075:2 0.10:0 0.05:16 0.05:32 0.05:2:runs.

#[macro_use]
mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use vramshim_pool::replay::Event;
use vramshim_pool::replay::{self, Frees};
use vramshim_pool::stitch::{Budget, Shapes, Stitch};
use vramshim_pool::{ALIGN, AccountingDevice, MIB, Policy};

/// Peak bytes (whole 2 MiB pages) of one best-fit range that only grows at its end.
fn arena_only(events: &[Event]) -> u64 {
    let g = 2 * MIB;
    // free ranges start -> end, and by (len, start) for best fit
    let mut free: BTreeMap<u64, u64> = BTreeMap::new();
    let mut by_len: BTreeSet<(u64, u64)> = BTreeSet::new();
    let mut end = 0u64;
    let mut peak = 0u64;
    let mut live: HashMap<u64, (u64, u64)> = HashMap::new();
    for e in events {
        match *e {
            Event::Alloc { id, size, .. } => {
                let sz = size.max(1).div_ceil(ALIGN) * ALIGN;
                let at = if let Some(&(len, s)) = by_len.range((sz, 0)..).next() {
                    by_len.remove(&(len, s));
                    free.remove(&s);
                    if len > sz {
                        free.insert(s + sz, s + len);
                        by_len.insert((len - sz, s + sz));
                    }
                    s
                } else if let Some((&s, &fe)) = free.iter().next_back()
                    && fe == end
                {
                    // the free tail grows
                    free.remove(&s);
                    by_len.remove(&(fe - s, s));
                    end = s + sz;
                    s
                } else {
                    end += sz;
                    end - sz
                };
                peak = peak.max(end);
                live.insert(id, (at, sz));
            }
            Event::Free { id, .. } => {
                let Some((mut s, sz)) = live.remove(&id) else {
                    continue;
                };
                let mut fe = s + sz;
                if let Some((&ps, &pe)) = free.range(..s).next_back()
                    && pe == s
                {
                    free.remove(&ps);
                    by_len.remove(&(pe - ps, ps));
                    s = ps;
                }
                if let Some(&ne) = free.get(&fe) {
                    free.remove(&fe);
                    by_len.remove(&(ne - fe, fe));
                    fe = ne;
                }
                free.insert(s, fe);
                by_len.insert((fe - s, s));
            }
            Event::ProcessSync | Event::StreamRetired { .. } => {}
        }
    }
    peak.div_ceil(g) * g
}

/// What a budget argument may be, for the usage and every message about one.
const FORM: &str = "RATIO:SLACK_MIB, then any of :runs :kept :grow :holds :guard, one of :layers / \
:nolayers and one of :request / :pow2, each at most once, in any order (e.g. 0.05:2, \
0.05:2:runs, 0.05:2:grow:nolayers, 0.05:2:pow2)";

/// One budget to replay under: `Stitch`'s budget ratio and slack (MiB), and its switches.
#[derive(Clone, Copy)]
struct Spec {
    ratio: f64,
    slack: u64,
    runs: bool,
    kept: bool,
    layers: bool,
    grow: bool,
    holds: bool,
    guard: bool,
    shapes: Shapes,
}

impl Spec {
    const fn new(ratio: f64, slack: u64) -> Spec {
        Spec {
            ratio,
            slack,
            runs: false,
            kept: false,
            layers: true,
            grow: false,
            holds: false,
            guard: false,
            shapes: Shapes::Pages,
        }
    }
}

/// A budget argument (see [`FORM`]), or what is wrong with it.
fn parse_budget(a: &str) -> Result<Spec, String> {
    let bad = |what: String| Err(format!("budget `{a}`: {what}; expected {FORM}"));
    let mut parts = a.split(':');
    let ratio = parts.next().unwrap_or_default();
    let Some(ratio) = ratio
        .parse::<f64>()
        .ok()
        .filter(|r| r.is_finite() && *r >= 0.0)
    else {
        return bad(format!("`{ratio}` is not a ratio (a number >= 0)"));
    };
    let Some(slack) = parts.next() else {
        return bad("no SLACK_MIB".into());
    };
    let Ok(slack) = slack.parse::<u64>() else {
        return bad(format!("`{slack}` is not a whole number of MiB"));
    };
    let mut spec = Spec::new(ratio, slack);
    let mut seen: Vec<&str> = Vec::new();
    for switch in parts {
        // `:layers` and `:nolayers` set one switch
        let which = match switch {
            "nolayers" => "layers",
            "request" | "pow2" => "shapes",
            _ => switch,
        };
        match switch {
            "runs" => spec.runs = true,
            "kept" => spec.kept = true,
            "grow" => spec.grow = true,
            "holds" => spec.holds = true,
            "guard" => spec.guard = true,
            "layers" => spec.layers = true,
            "nolayers" => spec.layers = false,
            "request" => spec.shapes = Shapes::Request,
            "pow2" => spec.shapes = Shapes::Pow2,
            _ => return bad(format!("unknown switch `:{switch}`")),
        }
        if seen.contains(&which) {
            return bad(if which == "layers" {
                format!("`:{switch}` sets the layer replay a second time (`:layers` / `:nolayers`)")
            } else if which == "shapes" {
                format!("`:{switch}` sets the handles a second time (`:request` / `:pow2`)")
            } else {
                format!("`:{switch}` given twice")
            });
        }
        seen.push(which);
    }
    Ok(spec)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let split = args.iter().position(|a| a == "--").unwrap_or(args.len());
    let mut budgets: Vec<Spec> = Vec::new();
    for a in &args[..split] {
        match parse_budget(a) {
            Ok(spec) => budgets.push(spec),
            Err(e) => {
                eprintln!("pool_slack: {e}");
                std::process::exit(2);
            }
        }
    }
    if budgets.is_empty() {
        budgets = vec![
            Spec::new(0.05, 2),
            Spec::new(0.075, 2),
            Spec::new(0.10, 0),
            Spec::new(0.05, 16),
            Spec::new(0.05, 32),
            Spec {
                runs: true,
                ..Spec::new(0.05, 2)
            },
        ];
    }
    let traces = common::traces(args.get(split + 1..).unwrap_or(&[]).to_vec());
    say!(
        "| trace | frees | budget | reserved/live | min device / peak live | driver calls | passes 2, 3 calls | calls /1000 allocs, 2nd half |"
    );
    say!("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |");
    let mut ranges = Vec::new();
    for (name, t, live) in traces {
        for frees in Frees::BOTH {
            let stream = frees.apply(&t.events);
            for &Spec {
                ratio,
                slack,
                runs,
                kept,
                layers,
                grow,
                holds,
                guard,
                shapes,
            } in &budgets
            {
                let make = move || -> Box<dyn Policy> {
                    Box::new(
                        Stitch::new()
                            .with_budget(Some(Budget {
                                ratio,
                                slack: slack * MIB,
                                ..Budget::default()
                            }))
                            .with_runs(runs)
                            .with_kept(kept)
                            .with_layers(layers)
                            .with_grow(grow)
                            .with_layer_holds(holds)
                            .with_shape_guard(guard)
                            .with_shapes(shapes),
                    )
                };
                let mut dev = AccountingDevice::new(80 << 30);
                let mut p = make();
                let r = replay::run_with(&stream, p.as_mut(), &mut dev);
                assert!(r.completed, "{name}: {:?}", r.first_failure);
                let passes = replay::calls_per_pass_with(&t.events, frees, &make, 3);
                let half = replay::second_half_calls_per_1000(&t.events, frees, &make);
                let min = replay::min_capacity_with(&stream, &make);
                say!(
                    "| {name} | {} | {:.1}% + {slack} MiB{}{}{}{}{}{}{} | {:.3} | {:.3} | {} | {}, {} | {:.1} |",
                    frees.name(),
                    ratio * 100.0,
                    if runs { ", runs" } else { "" },
                    if kept { ", kept" } else { "" },
                    if layers { "" } else { ", no layers" },
                    if grow { ", grow" } else { "" },
                    if holds { ", holds" } else { "" },
                    if guard { ", shape guard" } else { "" },
                    match shapes {
                        Shapes::Pages => "",
                        Shapes::Request => ", handles per request",
                        Shapes::Pow2 => ", power-of-two handles",
                    },
                    r.peak_device_used as f64 / live as f64,
                    min as f64 / live as f64,
                    r.driver_calls,
                    passes[1],
                    passes[2],
                    half
                );
            }
        }
        let plan = common::plan::offline(&common::plan::blocks(&t.events));
        ranges.push((
            name,
            arena_only(&t.events) as f64 / live as f64,
            (plan.div_ceil(common::plan::PAGE) * common::plan::PAGE) as f64 / live as f64,
        ));
    }
    say!();
    say!(
        "| trace | one range, online best fit grown at its end, peak / peak live | one range, offline greedy-by-size plan, peak / peak live |"
    );
    say!("| --- | ---: | ---: |");
    for (name, r, plan) in ranges {
        say!("| {name} | {r:.3} | {plan:.3} |");
    }
}
