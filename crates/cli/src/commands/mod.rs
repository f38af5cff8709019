//! One module per subcommand. Each parses its clap struct into a validated
//! config before doing any work, then returns the process exit code.

use clap::{Parser, Subcommand};

pub mod doctor;
pub mod run;

/// brig runs untrusted code in fast, strongly isolated sandboxes.
#[derive(Debug, Parser)]
#[command(name = "brig", version, about, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a command in a fresh sandbox and remove the sandbox when it exits.
    Run(Box<run::RunArgs>),
    /// Report which kernel features and isolation tiers this host offers.
    Doctor(doctor::DoctorArgs),
}

pub fn dispatch(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Run(args) => run::run(*args),
        Command::Doctor(args) => doctor::run(args),
    }
}
