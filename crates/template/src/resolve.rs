//! From what a person named as a template to what the jail mounts: one
//! place for `brig run` and the daemon.
//!
//! - `host` and `dir:PATH` are used as they are.
//! - A recipe's name (`base`, `code-interpreter-v1`) is its build, built
//!   first if missing or stale ([`ensure`]).
//! - Any other name, or an image reference (`python:3.12-slim`,
//!   `127.0.0.1:5000/team/tool@sha256:…`), is an image of brig's image
//!   store (crate brig-image) by that name, pulled first if the store has
//!   none ([`brig_image::pull`]): its layers, top first, as
//!   [`TemplateRef::Layers`], with the image's config (env, working
//!   directory, user, entrypoint and cmd) for the caller to apply.
//!
//! What this process resolves it keeps leased until it exits (as template
//! builds are, [`ensure`]): a `brig template prune`, here or in another
//! process, never removes layers a sandbox of this process may run on.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use brig_core::TemplateRef;
use brig_image::pull::{PullEvent, PullOptions};
use brig_image::{ImageConfig, ImageError, ImageRecord, ImageStore, LayerLease};

use crate::{ensure, recipe, Progress, TemplateError};

/// A template resolved for the jail.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// `Host`, `Dir` or `Layers`.
    pub template: TemplateRef,
    /// The image's config, for a template that is an image.
    pub image: Option<ImageConfig>,
}

/// Resolve `template` (see the module docs). Pulls and builds report on
/// stderr as `progress` says; `pull`: whether an image the store lacks is
/// pulled (else an error naming `brig template pull`).
pub fn resolve(
    home: &Path,
    template: TemplateRef,
    progress: Progress,
    pull_missing: bool,
) -> Result<Resolved, TemplateError> {
    let name = match template {
        TemplateRef::Named(name) if recipe(&name).is_ok() => {
            return Ok(Resolved {
                template: TemplateRef::Dir(ensure(home, &name, progress)?),
                image: None,
            })
        }
        TemplateRef::Named(name) | TemplateRef::Image(name) => name,
        other => {
            return Ok(Resolved {
                template: other,
                image: None,
            })
        }
    };
    let store = Arc::new(ImageStore::open(home)?);
    let image = match store.get(&name)? {
        Some(image) => image,
        None if !pull_missing => {
            return Err(TemplateError::NotPulled {
                name,
                known: crate::known_names(),
            })
        }
        None => pull(&store, &name, None, &PullOptions::default(), progress).map_err(|e| {
            match e {
                // A name that is neither a recipe nor anything a registry
                // has: say both.
                TemplateError::Image(ImageError::Registry { reason, .. })
                    if TemplateRef::valid_name(&name) =>
                {
                    TemplateError::NoSuchTemplate {
                        name: name.clone(),
                        known: crate::known_names(),
                        pulled: reason,
                    }
                }
                e => e,
            }
        })?,
    };
    // A snapshot's layers are held by each sandbox on it (the daemon's),
    // so that deleting the snapshot frees them when the last one ends.
    let lowers = if name.starts_with(brig_image::SNAPSHOT_PREFIX) {
        store.lowers(&image)
    } else {
        leased(&store, &image)?
    };
    Ok(Resolved {
        template: TemplateRef::Layers {
            image: name,
            lowers,
        },
        image: Some(image.config),
    })
}

/// Pull `reference` into the store of `home` as `name` (default: the
/// reference as given), reporting as `progress` says.
pub fn pull(
    store: &Arc<ImageStore>,
    reference: &str,
    name: Option<&str>,
    opts: &PullOptions,
    progress: Progress,
) -> Result<ImageRecord, TemplateError> {
    let display = Display::new(reference, progress);
    let on_event = Arc::new(move |e: PullEvent| display.event(e));
    Ok(brig_image::pull::pull(
        store, reference, name, opts, on_event,
    )?)
}

/// `image`'s layers, leased for the rest of this process's life.
fn leased(store: &ImageStore, image: &ImageRecord) -> Result<Vec<PathBuf>, TemplateError> {
    static HELD: std::sync::Mutex<Vec<(String, LayerLease)>> = std::sync::Mutex::new(Vec::new());
    let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
    if !held.iter().any(|(d, _)| d == &image.digest) {
        held.push((image.digest.clone(), store.lease(image)?));
    }
    Ok(store.lowers(image))
}

/// One bar per layer, by the layer's digest.
type LayerBars = std::sync::Mutex<Vec<(String, indicatif::ProgressBar)>>;

/// How a pull's progress is shown: a bar per layer on a terminal, a line
/// per layer otherwise, or nothing.
struct Display {
    reference: String,
    bars: Option<(indicatif::MultiProgress, LayerBars)>,
    lines: bool,
    total: std::sync::atomic::AtomicUsize,
    done: std::sync::atomic::AtomicUsize,
}

impl Display {
    fn new(reference: &str, progress: Progress) -> Display {
        let terminal = progress == Progress::Auto && std::io::stderr().is_terminal();
        Display {
            reference: reference.to_string(),
            bars: terminal.then(|| (indicatif::MultiProgress::new(), std::sync::Mutex::default())),
            lines: progress != Progress::Quiet && !terminal,
            total: 0.into(),
            done: 0.into(),
        }
    }

    fn event(&self, e: PullEvent) {
        use std::sync::atomic::Ordering::Relaxed;
        let short = |d: &str| {
            d.trim_start_matches("sha256:")
                .chars()
                .take(12)
                .collect::<String>()
        };
        match e {
            PullEvent::Resolved { digest, layers } => {
                self.total.store(layers.len(), Relaxed);
                if let Some((multi, bars)) = &self.bars {
                    let style = indicatif::ProgressStyle::with_template(
                        "{prefix} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}",
                    )
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                    .progress_chars("=> ");
                    let mut bars = bars.lock().unwrap_or_else(|e| e.into_inner());
                    for (d, size) in layers {
                        let bar = multi.add(indicatif::ProgressBar::new(size));
                        bar.set_style(style.clone());
                        bar.set_prefix(short(&d));
                        bars.push((d, bar));
                    }
                } else if self.lines {
                    eprintln!(
                        "brig: pulling {} ({}, {} layers)",
                        self.reference,
                        short(&digest),
                        layers.len()
                    );
                }
            }
            PullEvent::Progress { digest, bytes } => {
                if let Some(bar) = self.bar(&digest) {
                    bar.inc(bytes);
                }
            }
            PullEvent::Cached { digest } | PullEvent::Done { digest } => {
                let n = self.done.fetch_add(1, Relaxed) + 1;
                if let Some(bar) = self.bar(&digest) {
                    bar.finish();
                } else if self.lines {
                    eprintln!(
                        "brig: pulling {}: layer {} ready ({n}/{})",
                        self.reference,
                        short(&digest),
                        self.total.load(Relaxed)
                    );
                }
            }
            PullEvent::Retrying { digest, reason } => {
                if self.lines || self.bars.is_some() {
                    eprintln!(
                        "brig: pulling {}: layer {} failed ({reason}); trying again",
                        self.reference,
                        short(&digest)
                    );
                }
            }
        }
    }

    fn bar(&self, digest: &str) -> Option<indicatif::ProgressBar> {
        let (_, bars) = self.bars.as_ref()?;
        let bars = bars.lock().unwrap_or_else(|e| e.into_inner());
        bars.iter()
            .find(|(d, _)| d == digest)
            .map(|(_, b)| b.clone())
    }
}
