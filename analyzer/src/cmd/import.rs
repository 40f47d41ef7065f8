//! `vramshim import FILE --from rmm-csv|memory-viz -o TRACE`.

use std::path::PathBuf;
use std::process::ExitCode;

use vramshim_analyzer::convert::{self as export, ImportFormat};

#[derive(clap::Args)]
pub struct Args {
    /// An RMM logging CSV or a PyTorch memory snapshot pickle.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// What FILE is (guessed from its first bytes when left out).
    #[arg(long, value_enum)]
    pub from: Option<ImportFormat>,
    /// The .vramtrace to write.
    #[arg(short, long)]
    pub output: PathBuf,
}

pub fn main(a: Args) -> Result<ExitCode, String> {
    let n = export::import(&a.file, a.from, &a.output)?;
    let show = |p: &std::path::Path| {
        vramshim_analyzer::render::one_line(&p.display().to_string()).into_owned()
    };
    eprintln!(
        "imported {n} events from {} into {}",
        show(&a.file),
        show(&a.output)
    );
    Ok(ExitCode::SUCCESS)
}
