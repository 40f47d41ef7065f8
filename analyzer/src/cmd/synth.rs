//! `vramshim synth -o FILE`: a deterministic synthetic trace (benchmarks and tests).

use std::io::BufWriter;
use std::path::PathBuf;
use std::process::ExitCode;

use vramshim_analyzer::error::write_error;
use vramshim_analyzer::synth::{self, SynthOptions};

#[derive(clap::Args)]
pub struct Args {
    /// Where to write the .vramtrace.
    #[arg(short, long)]
    pub output: PathBuf,
    /// About how many events.
    #[arg(long, default_value_t = 10_000)]
    pub events: u64,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[arg(long, default_value_t = 1)]
    pub devices: i32,
    /// Per-step working set scale (1.0 = default).
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    /// Plain cudaMalloc/cudaFree, no pool counters.
    #[arg(long)]
    pub unpooled: bool,
    /// No cap refusal at the end.
    #[arg(long)]
    pub no_refusal: bool,
    /// Steps replay one of this many step shapes (activation sizes drawn once, as real
    /// training repeats them); 0 = every size drawn afresh (the original generator).
    #[arg(long, default_value_t = 0)]
    pub step_shapes: u32,
    /// Model the real streams as the interposer records them (one thread, short lifetimes,
    /// reused addresses, noisy ns timings; docs/benchmarks.md): the benchmark's trace.
    #[arg(long)]
    pub faithful: bool,
}

pub fn main(a: Args) -> Result<ExitCode, String> {
    let o = SynthOptions {
        events: a.events,
        seed: a.seed,
        devices: a.devices.clamp(1, 16),
        pooled: !a.unpooled,
        refusal: !a.no_refusal,
        scale: a.scale,
        step_shapes: a.step_shapes,
        faithful: a.faithful,
    };
    let f = vramshim_analyzer::files::create_output(&a.output)?;
    let n = synth::write(BufWriter::with_capacity(1 << 20, f), &o)
        .map_err(|e| write_error(&a.output, &e))?;
    eprintln!("wrote {} events to {}", n, a.output.display());
    Ok(ExitCode::SUCCESS)
}
