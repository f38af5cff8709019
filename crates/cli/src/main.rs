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
    // A client command whose output is cut short (`brig ls | head`) ends
    // quietly, as other tools do, instead of panicking on EPIPE. The
    // long-lived ones keep Rust's default (SIGPIPE ignored, EPIPE handled).
    if !matches!(
        cli.command,
        commands::Command::Serve(_) | commands::Command::Mcp(_) | commands::Command::Run(_)
    ) {
        // SAFETY: restoring a signal's default disposition, before any
        // thread is started.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let code = match commands::dispatch(cli) {
        Ok(code) => code,
        Err(err) => exit::report(&err),
    };
    std::process::exit(code);
}
