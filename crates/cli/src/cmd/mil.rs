//! `anelm mil print FILE` and `anelm mil check FILE`: for people debugging MIL programs.

use std::path::PathBuf;

use anyhow::{Context, Result};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: MilCommand,
}

#[derive(clap::Subcommand)]
pub enum MilCommand {
    /// Parse MIL text and print it in canonical form.
    Print { file: PathBuf },
    /// Parse MIL text and lint it against known ANE limits (findings are warnings; exit 1 only
    /// when the file does not parse).
    Check { file: PathBuf },
}

pub fn run(a: Args) -> Result<()> {
    let (MilCommand::Print { file } | MilCommand::Check { file }) = &a.command;
    let src =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    match a.command {
        MilCommand::Print { .. } => {
            let text = anelm_mil::print_text(&src).with_context(|| file.display().to_string())?;
            print!("{text}");
        }
        MilCommand::Check { .. } => {
            let findings =
                anelm_mil::check_text(&src).with_context(|| file.display().to_string())?;
            for f in &findings {
                println!("{f}");
            }
            println!(
                "{}: parses; {} lint finding(s)",
                file.display(),
                findings.len()
            );
        }
    }
    Ok(())
}
