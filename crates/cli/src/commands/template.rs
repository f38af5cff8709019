//! `brig template build|pull|import|ls|inspect|rm|prune`: what sandboxes
//! start from, in `$BRIG_HOME`. The named templates (`base`,
//! `code-interpreter-v1`) are built with mmdebstrap into
//! `$BRIG_HOME/templates/<name>/` (crate brig-template); images are pulled
//! from registries or imported from archives into the layer store
//! `$BRIG_HOME/images/` (crate brig-image).
//!
//! Building or pulling is also what `brig run --template NAME` and the
//! daemon do on first use; `build` and `pull` do it ahead of time.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use brig_image::ImageStore;
use serde_json::json;

use super::client::home_dir;

#[derive(Debug, clap::Args)]
pub struct TemplateArgs {
    #[command(subcommand)]
    command: TemplateCommand,
}

#[derive(Debug, clap::Subcommand)]
enum TemplateCommand {
    /// Build a named template (`base`, `code-interpreter-v1`) if it is
    /// missing or its recipe changed, or, with a Dockerfile, an image
    /// (each RUN in a sandbox, each step cached).
    Build {
        /// `base` or `code-interpreter-v1`, or the name of the image to build.
        name: String,
        /// Rebuild a named template even if it is up to date.
        #[arg(long)]
        force: bool,
        /// The Dockerfile [default: CONTEXT/Dockerfile].
        #[arg(long, short = 'f', value_name = "FILE")]
        file: Option<std::path::PathBuf>,
        /// `NAME=VALUE` for the Dockerfile's ARG (repeatable).
        #[arg(long = "build-arg", value_name = "NAME=VALUE")]
        build_arg: Vec<String>,
        /// The directory COPY reads from [default: the current one].
        context: Option<std::path::PathBuf>,
    },
    /// Pull an image from a registry into the image store (`python:3.12`
    /// is docker.io/library/python:3.12).
    Pull {
        /// `[REGISTRY/]PATH[:TAG][@DIGEST]`.
        reference: String,
        /// The name to keep it by [default: the reference as given].
        #[arg(long)]
        name: Option<String>,
        /// Plain HTTP (and unchecked TLS) for this registry; loopback
        /// registries get it anyway.
        #[arg(long)]
        insecure: bool,
        /// OS/ARCH[/VARIANT] of a multi-platform image [default: this
        /// host's, linux/amd64].
        #[arg(long)]
        platform: Option<String>,
        /// Registry user [default: ~/.docker/config.json's entry, else
        /// anonymous].
        #[arg(long, requires = "password_stdin")]
        username: Option<String>,
        /// Read the registry password from stdin.
        #[arg(long, requires = "username")]
        password_stdin: bool,
    },
    /// Import an image from an OCI layout directory, an oci-archive or a
    /// docker-archive (`docker save`, `podman save`, `skopeo copy`).
    Import {
        path: std::path::PathBuf,
        /// The name to keep it by.
        #[arg(long)]
        name: String,
    },
    /// List the named templates and the images.
    Ls {
        /// One JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show an image: its source, digest, layers and config.
    Inspect {
        name: String,
        /// JSON instead of lines.
        #[arg(long)]
        json: bool,
    },
    /// Forget an image (its layers go with the next prune). Refused while
    /// a live sandbox of the home's daemon runs on it.
    Rm { name: String },
    /// Remove layers and blobs no image uses (nor any running sandbox), and
    /// old builds of the named templates.
    Prune,
}

pub fn run(args: TemplateArgs) -> anyhow::Result<i32> {
    let home = home_dir();
    match args.command {
        TemplateCommand::Build {
            name,
            file,
            build_arg,
            context,
            ..
        } if file.is_some() || context.is_some() || brig_template::recipe(&name).is_err() => {
            let context = context.unwrap_or_else(|| std::path::PathBuf::from("."));
            let file = file.unwrap_or_else(|| context.join("Dockerfile"));
            let start = Instant::now();
            let image = super::build::build(&home, &name, &file, &context, &build_arg)?;
            eprintln!(
                "brig: built {} ({} layers) in {:.1} s",
                image.name,
                image.layers.len(),
                start.elapsed().as_secs_f64()
            );
            println!("{}", image.name);
        }
        TemplateCommand::Build { name, force, .. } => {
            let start = Instant::now();
            let rootfs = brig_template::build(&home, &name, force, brig_template::Progress::Auto)?;
            eprintln!(
                "brig: template {name} ready in {:.1} s",
                start.elapsed().as_secs_f64()
            );
            println!("{}", rootfs.display());
        }
        TemplateCommand::Pull {
            reference,
            name,
            insecure,
            platform,
            username,
            password_stdin,
        } => {
            let credentials = match (username, password_stdin) {
                (Some(user), true) => {
                    let mut pass = String::new();
                    std::io::stdin()
                        .read_line(&mut pass)
                        .context("read the password from stdin")?;
                    Some((user, pass.trim_end_matches(['\r', '\n']).to_string()))
                }
                _ => None,
            };
            let opts = brig_image::pull::PullOptions {
                insecure,
                platform,
                credentials,
            };
            let start = Instant::now();
            let store = Arc::new(ImageStore::open(&home)?);
            let image = brig_template::pull(
                &store,
                &reference,
                name.as_deref(),
                &opts,
                brig_template::Progress::Auto,
            )?;
            eprintln!(
                "brig: pulled {} ({}, {} layers, {}) in {:.1} s",
                image.name,
                image.digest,
                image.layers.len(),
                mib(image.size),
                start.elapsed().as_secs_f64()
            );
            println!("{}", image.name);
        }
        TemplateCommand::Import { path, name } => {
            let store = ImageStore::open(&home)?;
            let image = brig_image::import(&store, &path, &name)?;
            eprintln!(
                "brig: imported {} ({}, {} layers)",
                image.name,
                image.digest,
                image.layers.len()
            );
            println!("{}", image.name);
        }
        TemplateCommand::Inspect { name, json } => {
            let store = ImageStore::open(&home)?;
            let Some(image) = store.get(&name)? else {
                anyhow::bail!("no image named {name:?} (`brig template ls` lists them)");
            };
            let lowers = store.lowers(&image);
            if json {
                let mut v = serde_json::to_value(&image)?;
                v["lowers"] = json!(lowers);
                println!("{v}");
            } else {
                println!("Name:       {}", image.name);
                println!("Source:     {}", image.source);
                println!("Digest:     {}", image.digest);
                println!("Size:       {}", mib(image.size));
                println!("Layers:     {}", image.layers.len());
                if let Some(base) = &image.base {
                    println!(
                        "Base:       {} (a build the layers stand on)",
                        base.display()
                    );
                }
                let c = &image.config;
                println!("Entrypoint: {}", shown(&c.entrypoint));
                println!("Cmd:        {}", shown(&c.cmd));
                println!("Workdir:    {}", c.working_dir.as_deref().unwrap_or("-"));
                println!("User:       {}", c.user.as_deref().unwrap_or("-"));
                for e in &c.env {
                    println!("Env:        {e}");
                }
            }
        }
        TemplateCommand::Rm { name } => {
            if let Some(id) = name.strip_prefix(brig_image::SNAPSHOT_PREFIX) {
                anyhow::bail!(
                    "{name} is a sandbox's snapshot: remove it with brig snapshot rm {id}"
                );
            }
            let store = ImageStore::open(&home)?;
            if store.get(&name)?.is_none() {
                anyhow::bail!("no image named {name:?} (`brig template ls` lists them)");
            }
            let users = live_users(&home, &name);
            if !users.is_empty() {
                anyhow::bail!(
                    "image {name} is in use by running sandbox(es) {}: end them first (brig kill ID)",
                    users.join(", ")
                );
            }
            store.remove(&name)?;
            eprintln!("brig: removed image {name} (`brig template prune` reclaims its layers)");
        }
        TemplateCommand::Prune => {
            let store = ImageStore::open(&home)?;
            let pruned = store.prune()?;
            let builds = brig_template::prune(&home);
            eprintln!(
                "brig: removed {} layers and {} blobs ({}), {} old template builds; {} layers in use kept",
                pruned.layers,
                pruned.blobs,
                mib(pruned.bytes),
                builds,
                pruned.in_use
            );
        }
        TemplateCommand::Ls { json } => {
            // Snapshots are their tenants' own: `brig snapshot ls`.
            let images: Vec<_> = ImageStore::open(&home)
                .and_then(|s| s.list())
                .unwrap_or_default()
                .into_iter()
                .filter(|i| !i.name.starts_with(brig_image::SNAPSHOT_PREFIX))
                .collect();
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
                            "kind": "recipe",
                        })
                    })
                    .chain(images.iter().map(|i| {
                        json!({
                            "name": i.name,
                            "kind": "image",
                            "state": "ready",
                            "source": i.source,
                            "digest": i.digest,
                            "size_bytes": i.size,
                            "layers": i.layers.len(),
                            "created_at": i.created_at,
                        })
                    }))
                    .collect();
                println!("{}", serde_json::Value::Array(items));
            } else {
                // As wide as the longest name (image references are long).
                let w = list
                    .iter()
                    .map(|t| t.recipe.name.len())
                    .chain(images.iter().map(|i| i.name.len()))
                    .max()
                    .unwrap_or(4)
                    .max(22);
                println!("{:<w$} {:<8} {:>10}  DESCRIPTION", "NAME", "STATE", "SIZE");
                for t in &list {
                    let size = t
                        .size
                        .map(|b| format!("{} MiB", b / (1024 * 1024)))
                        .unwrap_or_else(|| "-".into());
                    println!(
                        "{:<w$} {:<8} {:>10}  {}",
                        t.recipe.name,
                        t.state.as_str(),
                        size,
                        t.recipe.description
                    );
                }
                for i in &images {
                    println!(
                        "{:<w$} {:<8} {:>10}  image {} ({} layers)",
                        i.name,
                        "ready",
                        mib(i.size),
                        i.source,
                        i.layers.len()
                    );
                }
            }
        }
    }
    Ok(0)
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

fn shown(argv: &[String]) -> String {
    if argv.is_empty() {
        "-".into()
    } else {
        serde_json::to_string(argv).unwrap_or_default()
    }
}

/// The live sandboxes of the home's daemon that run on image `name` (their
/// records name the template they were created from).
fn live_users(home: &Path, name: &str) -> Vec<String> {
    if !home.join(brig_runtime::DB_FILE).exists() {
        return Vec::new();
    }
    let Ok(store) = brig_runtime::Store::open_in(home) else {
        return Vec::new();
    };
    store
        .live_on_template(name)
        .unwrap_or_default()
        .iter()
        .map(ToString::to_string)
        .collect()
}
