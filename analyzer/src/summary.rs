use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {}

pub fn main(_args: Args) -> Result<ExitCode, String> {
    Err("summary: not implemented yet".into())
}
