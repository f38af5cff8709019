//! `brig man [--dir DIR]`: the manual, from the same definitions as
//! `--help` (clap_mangen), so it cannot drift from the CLI. Without `--dir`,
//! brig(1) on stdout; with it, brig.1 and one page per subcommand
//! (brig-exec.1, brig-keys-create.1, ...) written into DIR, e.g.
//! `sudo brig man --dir /usr/local/share/man/man1`.

use std::path::PathBuf;

use anyhow::Context;
use clap::CommandFactory;

#[derive(Debug, clap::Args)]
pub struct ManArgs {
    /// Write brig.1 and a page per subcommand into this directory.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

pub fn run(args: ManArgs) -> anyhow::Result<i32> {
    let cmd = super::Cli::command();
    match args.dir {
        None => clap_mangen::Man::new(cmd)
            .render(&mut std::io::stdout())
            .context("writing the manual")?,
        Some(dir) => {
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            clap_mangen::generate_to(cmd, &dir)
                .with_context(|| format!("cannot write the manual into {}", dir.display()))?;
            eprintln!("brig: manual pages written to {}", dir.display());
        }
    }
    Ok(0)
}
