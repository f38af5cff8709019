//! `brig completion bash|zsh|fish|elvish|powershell`: a completion script
//! for the shell, on stdout (clap_complete, from the same definitions as
//! `--help`). For bash: `brig completion bash > /etc/bash_completion.d/brig`.

use clap::CommandFactory;

#[derive(Debug, clap::Args)]
pub struct CompletionArgs {
    /// The shell to complete for.
    shell: clap_complete::Shell,
}

pub fn run(args: CompletionArgs) -> anyhow::Result<i32> {
    let mut cmd = super::Cli::command();
    clap_complete::generate(args.shell, &mut cmd, "brig", &mut std::io::stdout());
    Ok(0)
}
