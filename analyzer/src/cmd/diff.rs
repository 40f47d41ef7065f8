//! `vramshim diff A B`: what changed between two runs.

use std::fmt::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use vramshim_analyzer::analysis::{self, Options, diff};
use vramshim_analyzer::input;
use vramshim_analyzer::render::{for_terminal, one_line};
use vramshim_analyzer::units::{bytes, bytes_delta};

#[derive(clap::Args)]
pub struct Args {
    /// The earlier run.
    pub a: PathBuf,
    /// The later run.
    pub b: PathBuf,
    /// Print the documented JSON object (docs/analyzer.md).
    #[arg(long)]
    pub json: bool,
    /// Call sites listed.
    #[arg(long, default_value_t = 15, value_parser = crate::cmd::numbers::count)]
    pub top: usize,
}

fn is_bytes(what: &str) -> bool {
    matches!(
        what,
        "peak_in_use" | "peak_reserved" | "bytes_allocated" | "live_at_exit"
    )
}

pub fn main(args: Args) -> Result<ExitCode, String> {
    let opts = Options {
        top: 500,
        ..Options::default()
    };
    let a = analysis::analyze(input::open(&args.a)?, &opts)?;
    let b = analysis::analyze(input::open(&args.b)?, &opts)?;
    let d = diff::diff(&a, &b, args.top);
    if args.json {
        println!("{}", vramshim_analyzer::json::to_string_pretty(&d)?);
        let torn = a.torn || b.torn;
        return Ok(crate::cmd::input_status(&[a, b], torn));
    }
    let mut o = String::new();
    let _ = writeln!(o, "A: {}\nB: {}", one_line(&d.a), one_line(&d.b));
    let pct = |r: Option<f64>| {
        r.map(|r| format!("{:+.1}%", r * 100.0))
            .unwrap_or_else(|| "new".into())
    };
    for dev in &d.devices {
        let _ = writeln!(o, "\n-- device {}", dev.device);
        for c in &dev.metrics {
            if c.a == 0 && c.b == 0 {
                continue;
            }
            let (va, vb, dl) = if is_bytes(&c.what) {
                (bytes(c.a as u64), bytes(c.b as u64), bytes_delta(c.delta))
            } else {
                (c.a.to_string(), c.b.to_string(), format!("{:+}", c.delta))
            };
            let _ = writeln!(
                o,
                "  {:<16} {:>12} -> {:>12}  {:>12} {}",
                c.what.replace('_', " "),
                va,
                vb,
                dl,
                if c.delta != 0 {
                    pct(c.relative)
                } else {
                    String::new()
                }
            );
        }
        let changed: Vec<_> = dev.calls.iter().filter(|c| c.delta != 0).collect();
        if !changed.is_empty() {
            let _ = writeln!(o, "  calls:");
            for c in changed {
                let _ = writeln!(
                    o,
                    "    {:<40} {:>10} -> {:>10} ({:+})",
                    c.what, c.a, c.b, c.delta
                );
            }
        }
        if dev.sizes.iter().any(|c| c.delta != 0) {
            let _ = writeln!(o, "  size mix (allocations per size class):");
            for c in &dev.sizes {
                let (lo, hi) = c.what.split_once("..").unwrap_or(("0", "0"));
                let label = format!(
                    "{}..{}",
                    bytes(lo.parse().unwrap_or(0)),
                    bytes(hi.parse().unwrap_or(0))
                );
                let _ = writeln!(
                    o,
                    "    {:<24} {:>10} -> {:>10} ({:+})",
                    label, c.a, c.b, c.delta
                );
            }
        }
        if !dev.sites.is_empty() {
            let _ = writeln!(o, "  call sites (bytes allocated), largest changes:");
            for c in &dev.sites {
                let _ = writeln!(
                    o,
                    "    {:>12}  {} -> {}  {}",
                    bytes_delta(c.delta),
                    bytes(c.a as u64),
                    bytes(c.b as u64),
                    one_line(&c.what)
                );
            }
        }
    }
    print!("{}", for_terminal(&o));
    let torn = a.torn || b.torn;
    Ok(crate::cmd::input_status(&[a, b], torn))
}
