//! `vramshim replay TRACE`: would this job have fit, how much would it reserve, how many
//! driver calls: deterministic, through the pool crate's policies on an accounting device.

use std::fmt::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use vramshim_analyzer::units::{bytes, duration_ns, parse_size};
use vramshim_analyzer::whatif;
use vramshim_pool::PolicyKind;

#[derive(clap::Args)]
pub struct Args {
    /// A .vramtrace or an RMM logging CSV (or a memory_viz pickle).
    #[arg(value_name = "TRACE")]
    pub trace: PathBuf,
    /// stitch, caching, direct, or all (side by side).
    #[arg(long, default_value = "all")]
    pub pool: String,
    /// vramshim's cap (e.g. 8G).
    #[arg(long, value_parser = parse_size)]
    pub cap: Option<u64>,
    /// Device size (default: from the trace, else 80G).
    #[arg(long, value_parser = parse_size)]
    pub device_memory: Option<u64>,
    /// Which device's stream (default: the busiest).
    #[arg(long, value_parser = crate::cmd::numbers::device)]
    pub device: Option<i32>,
    /// Also find the smallest device each policy needs.
    #[arg(long)]
    pub min_capacity: bool,
    /// Print the documented JSON object (docs/analyzer.md).
    #[arg(long)]
    pub json: bool,
    /// Replay through real CUDA calls (real GPU, or --sim).
    #[arg(long)]
    pub live: bool,
    /// With --live: on the simulated GPU.
    #[arg(long)]
    pub sim: bool,
    #[command(flatten)]
    pub torch: crate::cmd::replay_torch::TorchArgs,
}

pub fn main(a: Args) -> Result<ExitCode, String> {
    if let Some(r) = crate::cmd::replay_torch::dispatch(
        &a.trace,
        a.live,
        a.sim,
        a.cap,
        &a.pool,
        a.device_memory,
        &a.torch,
    ) {
        return r;
    }
    if a.live || a.sim {
        if a.min_capacity {
            return Err("--min-capacity is a what-if question: drop --live".into());
        }
        return crate::cmd::replay_live::main(crate::cmd::replay_live::LiveArgs {
            trace: &a.trace,
            pool: &a.pool,
            cap: a.cap,
            device_memory: a.device_memory,
            device: a.device,
            sim: a.sim,
            json: a.json,
        });
    }
    let policies: Vec<PolicyKind> = if a.pool == "all" {
        PolicyKind::ALL.to_vec()
    } else {
        vec![
            a.pool
                .parse::<PolicyKind>()
                .map_err(|e| format!("--pool: {e} (or all)"))?,
        ]
    };
    let r = whatif::replay(
        &a.trace,
        &policies,
        a.device,
        a.device_memory,
        a.cap,
        a.min_capacity,
    )?;
    if a.json {
        println!("{}", vramshim_analyzer::json::to_string_pretty(&r)?);
        return Ok(damage_status(&r.damage));
    }
    let mut o = String::new();
    let _ = writeln!(
        o,
        "replay of {} (device {}): {} requests, {} frees, peak live {}",
        r.file,
        r.device,
        r.requests,
        r.frees,
        bytes(r.peak_live)
    );
    let _ = writeln!(
        o,
        "device {} ({}){}",
        bytes(r.device_memory),
        r.device_memory_source,
        r.cap
            .map(|c| format!(", cap {}", bytes(c)))
            .unwrap_or_default()
    );
    let _ = writeln!(o);
    let mut head = format!(
        "{:<10} {:>10} {:>13} {:>13} {:>7} {:>12} {:>8}",
        "policy", "result", "peak reserved", "peak used", "frag", "driver calls", "syncs"
    );
    if a.min_capacity {
        head.push_str(&format!(" {:>13}", "min device"));
    }
    let _ = writeln!(o, "{head}");
    for p in &r.policies {
        let mut line = format!(
            "{:<10} {:>10} {:>13} {:>13} {:>6.1}% {:>12} {:>8}",
            p.policy,
            if p.completed { "completes" } else { "FAILS" },
            bytes(p.peak_reserved),
            bytes(p.peak_device_used),
            p.fragmentation * 100.0,
            p.driver_calls,
            p.syncs
        );
        if let Some(m) = p.min_capacity {
            line.push_str(&format!(
                " {:>13}",
                if m == u64::MAX {
                    "never".into()
                } else {
                    bytes(m)
                }
            ));
        }
        let _ = writeln!(o, "{line}");
    }
    for p in r.policies.iter().filter(|p| !p.completed) {
        if let Some(f) = &p.first_failure {
            let on = if f.stream == vramshim_pool::ANY_STREAM {
                "any stream (not stream-ordered)".to_string()
            } else {
                format!("stream {:#x}", f.stream)
            };
            let _ = writeln!(
                o,
                "{}: first failure at event {} (+{}): {} on {on}: {}",
                p.policy,
                f.event_index,
                duration_ns(f.offset_ns),
                bytes(f.size),
                f.why
            );
        }
    }
    let _ = writeln!(o, "\nsame free semantics for every policy:");
    for c in &r.same_frees {
        let _ = writeln!(
            o,
            "{:<15} {:<10} {:>10} {:>13} {:>13} {:>12} {:>8}",
            c.frees,
            c.policy,
            if c.completed { "completes" } else { "FAILS" },
            bytes(c.peak_reserved),
            bytes(c.peak_device_used),
            c.driver_calls,
            c.syncs
        );
    }
    print!("{}", vramshim_analyzer::render::for_terminal(&o));
    Ok(damage_status(&r.damage))
}

/// Exit status 3 when part of the input could not be read (each problem named on stderr):
/// the replay used everything else, but it is not the whole run.
fn damage_status(damage: &[String]) -> ExitCode {
    for d in damage {
        eprintln!("vramshim: {}", vramshim_analyzer::render::one_line(d));
    }
    if damage.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(3)
    }
}
