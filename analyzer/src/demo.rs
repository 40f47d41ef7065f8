use std::path::Path;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {}

pub fn main(_args: Args) -> Result<ExitCode, String> {
    Err("demo: not implemented yet".into())
}

/// Three lines describing a trace (the analyzer's summary once it lands).
pub fn trace_summary_lines(_path: &Path) -> Result<Vec<String>, String> {
    Err("the trace reader is not built yet".into())
}
