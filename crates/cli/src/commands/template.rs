//! `brig template build|ls`: the named templates (`base`,
//! `code-interpreter-v1`), built with mmdebstrap into
//! `$BRIG_HOME/templates/<name>/rootfs` (crate brig-template).
//!
//! Building is also what `brig run --template NAME` and the daemon do on
//! first use; `build` does it ahead of time (or again, with `--force`).

use std::time::Instant;

use serde_json::json;

use super::client::home_dir;

#[derive(Debug, clap::Args)]
pub struct TemplateArgs {
    #[command(subcommand)]
    command: TemplateCommand,
}

#[derive(Debug, clap::Subcommand)]
enum TemplateCommand {
    /// Build a template if it is missing or its recipe changed; print its rootfs.
    Build {
        /// `base` or `code-interpreter-v1`.
        name: String,
        /// Rebuild even if it is up to date.
        #[arg(long)]
        force: bool,
    },
    /// List the named templates and whether each is built.
    Ls {
        /// One JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(args: TemplateArgs) -> anyhow::Result<i32> {
    let home = home_dir();
    match args.command {
        TemplateCommand::Build { name, force } => {
            let start = Instant::now();
            let rootfs = brig_template::build(&home, &name, force, brig_template::Progress::Auto)?;
            eprintln!(
                "brig: template {name} ready in {:.1} s",
                start.elapsed().as_secs_f64()
            );
            println!("{}", rootfs.display());
        }
        TemplateCommand::Ls { json } => {
            let list = brig_template::list(&home);
            if json {
                let items: Vec<_> = list
                    .iter()
                    .map(|t| {
                        json!({
                            "name": t.recipe.name,
                            "description": t.recipe.description,
                            "state": t.state.as_str(),
                            "rootfs": t.rootfs,
                            "size_bytes": t.size,
                            "packages": t.recipe.package_list(),
                        })
                    })
                    .collect();
                println!("{}", serde_json::Value::Array(items));
            } else {
                println!("{:<22} {:<8} {:>9}  DESCRIPTION", "NAME", "STATE", "SIZE");
                for t in &list {
                    let size = t
                        .size
                        .map(|b| format!("{} MiB", b / (1024 * 1024)))
                        .unwrap_or_else(|| "-".into());
                    println!(
                        "{:<22} {:<8} {:>9}  {}",
                        t.recipe.name,
                        t.state.as_str(),
                        size,
                        t.recipe.description
                    );
                }
            }
        }
    }
    Ok(0)
}
