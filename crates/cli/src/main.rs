//! `brig`: one binary for the one-shot runner, the host check, the daemon
//! (`serve`) and its client (`create`, `exec`, `ls`, `kill`). `main` parses arguments with clap, hands the
//! subcommand to its module under `commands/`, and maps any error to a
//! message and an exit code in exactly one place ([`exit`]).

mod agent;
mod commands;
mod exit;
mod log;
mod tty;

use clap::Parser;

fn main() {
    let cli = commands::Cli::parse();
    let code = match commands::dispatch(cli) {
        Ok(code) => code,
        Err(err) => exit::report(&err),
    };
    std::process::exit(code);
}
