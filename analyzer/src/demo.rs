use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {}

pub fn main(_args: Args) -> Result<ExitCode, String> {
    Err("demo: not implemented yet".into())
}
