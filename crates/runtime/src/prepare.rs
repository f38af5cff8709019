//! Named templates built in the background, so that a client with a short
//! request timeout never waits minutes for a first build.
//!
//! `brig serve --e2b` prepares what E2B's clients ask for (`base`,
//! `code-interpreter-v1`) from the moment it starts
//! ([`SandboxManager::prepare`]): a template already built is ready at
//! once; one that is not is built on a thread of its own, its progress in
//! the daemon's log. A create that must not wait (E2B's:
//! [`CreateConfig::wait_for_template`] off) for a template that is not
//! built yet starts its build here if none runs, and fails at once with
//! [`ManagerError::Preparing`] (503 on E2B's API, which its clients retry)
//! saying for how long it has been building, rather than holding the
//! request past the client's timeout. A build that fails (no network for
//! mmdebstrap, a full disk) is remembered for [`RETRY_FAILED_AFTER`]:
//! creates meanwhile fail at once with [`ManagerError::PrepareFailed`],
//! naming the cause, instead of each starting a build that fails again.
//!
//! [`CreateConfig::wait_for_template`]: crate::CreateConfig::wait_for_template

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use brig_core::TemplateRef;

use crate::manager::{lock, ManagerError, SandboxManager};

/// How long a failed background build is reported before the next create
/// that needs the template tries again.
pub const RETRY_FAILED_AFTER: Duration = Duration::from_secs(60);

/// How long a failure that is the client's to fix (no such image) is
/// told before the next create tries again.
const CLIENT_FAULT_KEPT: Duration = Duration::from_secs(2);

/// How long a create that must not wait still waits for a pull it
/// started, before answering that the image is being prepared.
pub const PULL_WAIT: Duration = Duration::from_secs(20);

/// The daemon's background builds: those running (since when) and those
/// that failed lately (when, and why).
#[derive(Debug, Default)]
pub(crate) struct Preparing {
    running: HashMap<String, Instant>,
    failed: HashMap<String, Failed>,
}

/// Why a background build or pull failed, and whose fault it was.
#[derive(Debug)]
struct Failed {
    at: Instant,
    reason: String,
    /// Nothing by that name anywhere, or a registry that refused: the
    /// client's to fix (a 400, as a create that waits says it).
    client: bool,
}

impl Preparing {
    /// The failure to report for `name`, if its last build failed less
    /// than [`RETRY_FAILED_AFTER`] ago.
    fn failure(&self, name: &str) -> Option<ManagerError> {
        let failed = self.failed.get(name)?;
        let ago = failed.at.elapsed();
        // A client's mistake is told to the creates waiting for that
        // attempt; the next create asks the registries again (the image
        // may have been pushed meanwhile).
        let kept = if failed.client {
            CLIENT_FAULT_KEPT
        } else {
            RETRY_FAILED_AFTER
        };
        if ago >= kept {
            return None;
        }
        Some(if failed.client {
            ManagerError::BadRequest {
                reason: failed.reason.clone(),
            }
        } else {
            ManagerError::PrepareFailed {
                name: name.to_string(),
                reason: failed.reason.clone(),
                ago_secs: ago.as_secs(),
                retry_in_secs: (RETRY_FAILED_AFTER - ago).as_secs().max(1),
            }
        })
    }
}

impl SandboxManager {
    /// Build each of `names` that is not built yet, one after the other,
    /// on a thread of its own (which ends with the last build). Names that
    /// are not brig recipes, or that are built already, cost nothing.
    pub fn prepare(&self, names: &[String]) {
        let Some(home) = self.config().home.clone() else {
            return;
        };
        let wanted: Vec<String> = {
            let mut preparing = lock(&self.preparing);
            let wanted: Vec<String> = names
                .iter()
                .filter(|n| !preparing.running.contains_key(*n))
                .filter(|n| preparing.failure(n).is_none())
                .filter(|n| missing(&home, n, self.config().pull_images))
                .cloned()
                .collect();
            for n in &wanted {
                preparing.running.insert(n.clone(), Instant::now());
                preparing.failed.remove(n);
            }
            wanted
        };
        if wanted.is_empty() {
            return;
        }
        let preparing = Arc::clone(&self.preparing);
        let pull = self.config().pull_images;
        let spawned = thread::Builder::new().name("brig-prepare".into()).spawn({
            let wanted = wanted.clone();
            let preparing = Arc::clone(&preparing);
            move || build_all(&home, pull, &wanted, &preparing)
        });
        if let Err(e) = spawned {
            tracing::warn!("cannot start preparing templates: {e}");
            let mut preparing = lock(&preparing);
            for n in &wanted {
                preparing.running.remove(n);
            }
        }
    }

    /// For a create that must not wait: `Err(Preparing)` if `template` is
    /// a named template that is not built yet (its build started now if
    /// none runs).
    pub(crate) fn unless_preparing(&self, template: &TemplateRef) -> Result<(), ManagerError> {
        let (TemplateRef::Named(name) | TemplateRef::Image(name)) = template else {
            return Ok(());
        };
        let Some(home) = &self.config().home else {
            return Ok(());
        };
        if !missing(home, name, self.config().pull_images) {
            return Ok(());
        }
        self.prepare(std::slice::from_ref(name));
        // A pull is often quick (a slim image, a registry nearby): wait
        // for it a while, inside the clients' 60 s request timeout, before
        // asking them to come back. A recipe's first build takes minutes:
        // no wait.
        if brig_template::recipe(name).is_err() {
            let deadline = Instant::now() + PULL_WAIT;
            while Instant::now() < deadline && lock(&self.preparing).running.contains_key(name) {
                thread::sleep(Duration::from_millis(50));
            }
        }
        let preparing = lock(&self.preparing);
        if let Some(failed) = preparing.failure(name) {
            return Err(failed);
        }
        match preparing.running.get(name) {
            Some(since) => Err(ManagerError::Preparing {
                name: name.clone(),
                for_secs: since.elapsed().as_secs(),
            }),
            // Finished in between: the create goes on.
            None => Ok(()),
        }
    }

    /// For a create that must not wait on a warm start a front-end makes
    /// (`warm.rs`): `Ok` once `ready()` says it is kept; otherwise `make`
    /// runs on a thread of its own (unless it runs already, or failed
    /// less than [`RETRY_FAILED_AFTER`] ago), and the create waits for it
    /// up to `wait`, then fails with [`ManagerError::Warming`] (or
    /// [`ManagerError::WarmFailed`]) naming `name`.
    pub fn prepare_with(
        &self,
        name: &str,
        wait: Duration,
        ready: impl Fn() -> bool,
        make: impl FnOnce() -> Result<(), String> + Send + 'static,
    ) -> Result<(), ManagerError> {
        if ready() {
            return Ok(());
        }
        {
            let mut preparing = lock(&self.preparing);
            if !preparing.running.contains_key(name) {
                if let Some(failed) = preparing.failure(name) {
                    return Err(warm_error(failed));
                }
                preparing.running.insert(name.to_string(), Instant::now());
                preparing.failed.remove(name);
                let shared = Arc::clone(&self.preparing);
                let owned = name.to_string();
                let spawned = thread::Builder::new()
                    .name("brig-prepare".into())
                    .spawn(move || {
                        let started = Instant::now();
                        tracing::info!("{owned}: preparing it");
                        let made = make();
                        let mut preparing = lock(&shared);
                        preparing.running.remove(&owned);
                        match made {
                            Ok(()) => {
                                tracing::info!("{owned}: ready after {:.0?}", started.elapsed())
                            }
                            Err(reason) => {
                                tracing::warn!("{owned}: not prepared: {reason}");
                                let failed = Failed {
                                    at: Instant::now(),
                                    reason,
                                    client: false,
                                };
                                preparing.failed.insert(owned, failed);
                            }
                        }
                    });
                if let Err(e) = spawned {
                    preparing.running.remove(name);
                    return Err(ManagerError::WarmFailed {
                        name: name.to_string(),
                        reason: format!("cannot start a thread to prepare it: {e}"),
                        ago_secs: 0,
                        retry_in_secs: 1,
                    });
                }
            }
        }
        let deadline = Instant::now() + wait;
        while Instant::now() < deadline && lock(&self.preparing).running.contains_key(name) {
            thread::sleep(Duration::from_millis(100));
        }
        if ready() {
            return Ok(());
        }
        let preparing = lock(&self.preparing);
        if let Some(failed) = preparing.failure(name) {
            return Err(warm_error(failed));
        }
        let for_secs = preparing
            .running
            .get(name)
            .map_or(0, |since| since.elapsed().as_secs());
        Err(ManagerError::Warming {
            name: name.to_string(),
            for_secs,
        })
    }

    /// Templates being built in the background, and for how long (s).
    pub fn preparing(&self) -> Vec<(String, u64)> {
        let mut out: Vec<(String, u64)> = lock(&self.preparing)
            .running
            .iter()
            .map(|(n, at)| (n.clone(), at.elapsed().as_secs()))
            .collect();
        out.sort();
        out
    }
}

/// A failure [`Preparing::failure`] told of, as one of a warm start.
fn warm_error(e: ManagerError) -> ManagerError {
    match e {
        ManagerError::PrepareFailed {
            name,
            reason,
            ago_secs,
            retry_in_secs,
        } => ManagerError::WarmFailed {
            name,
            reason,
            ago_secs,
            retry_in_secs,
        },
        other => other,
    }
}

/// Whether `name` is a template this daemon could make but has not: a
/// recipe not built yet, or an image its store lacks (when it pulls).
/// A name that is neither is left to the create, which says so.
fn missing(home: &Path, name: &str, pull: bool) -> bool {
    if brig_template::recipe(name).is_ok() {
        return brig_template::ready(home, name).is_none();
    }
    pull && brig_image::ImageStore::open(home)
        .is_ok_and(|store| matches!(store.get(name), Ok(None)))
}

/// Build `names` in order, forgetting each once it is done, remembering
/// why if it failed.
fn build_all(home: &Path, pull: bool, names: &[String], preparing: &Mutex<Preparing>) {
    for name in names {
        let started = Instant::now();
        tracing::info!("template {name}: preparing it (a first build or pull takes a while)");
        let built = brig_template::resolve(
            home,
            TemplateRef::Named(name.clone()),
            brig_template::Progress::Lines,
            pull,
        )
        .map_err(|e| (crate::chain(&e), client_fault(&e)));
        let mut preparing = lock(preparing);
        preparing.running.remove(name);
        match built {
            Ok(_) => tracing::info!("template {name}: ready after {:.0?}", started.elapsed()),
            Err((reason, client)) => {
                tracing::warn!("template {name}: not prepared: {reason}");
                let at = Instant::now();
                preparing
                    .failed
                    .insert(name.clone(), Failed { at, reason, client });
            }
        }
    }
}

/// Whether a template failed for the client's reason (no such name, a
/// registry that refused or a malformed reference), as the create that
/// waits classifies it.
pub(crate) fn client_fault(e: &brig_template::TemplateError) -> bool {
    matches!(
        e,
        brig_template::TemplateError::NoSuchTemplate { .. }
            | brig_template::TemplateError::NotPulled { .. }
            | brig_template::TemplateError::Image(
                brig_image::ImageError::Registry { .. }
                    | brig_image::ImageError::BadReference { .. },
            )
    )
}
