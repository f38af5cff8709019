//! A daemon sandbox's port on a host loopback port (`brig create --publish
//! [HOSTPORT:]PORT`, the native API's `publish`): each connection to the
//! listener on `127.0.0.1:HOSTPORT` is relayed byte for byte to `PORT` on
//! the sandbox's loopback, through its agent ([`ports::tunnel`]), as the
//! port proxy reaches it — any tier with an agent can be published.
//!
//! - **Bound before the sandbox is made** ([`bind`]; specs are parsed by
//!   `brig_net::publish::parse`, as `brig run -p` does): a taken host port
//!   fails the create with a message naming it, and nothing is made.
//! - **No token**: the listener is on the host's loopback only, so what
//!   reaches it is already on the host, as with `docker run -p
//!   127.0.0.1:…`. Remote clients reach ports through the API instead
//!   (`/v1/sandboxes/{id}/ports/{port}/…`, `/tcp/{port}`, host names), with
//!   a key or the sandbox's traffic token.
//! - **Kept on the record** (`attrs.ports.published`, written with the
//!   record's first write), so a later daemon that re-adopts the sandbox
//!   binds the same host ports again ([`Publisher::readopt`]); one taken
//!   meanwhile is a warning and stays unpublished.
//! - **Gone with the sandbox**: the runtime's end event closes the
//!   listeners ([`on_end`]); connections in flight end with the sandbox's
//!   agent.

use std::collections::HashMap;
use std::io;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex, OnceLock};

use brig_core::SandboxId;
use brig_runtime::{SandboxManager, TenantId};
use serde::{Deserialize, Serialize};
use tokio::task::AbortHandle;

use crate::ports::{self, ProxyError};
use crate::{on_end, Ended};

/// The most ports one sandbox may publish.
pub const MAX_PER_SANDBOX: usize = 32;

/// One published port: the sandbox's `port` on `127.0.0.1:host_port`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Published {
    pub port: u16,
    pub host_port: u16,
}

/// A listener bound for a port that is not relayed yet.
#[derive(Debug)]
pub struct Bound {
    published: Published,
    listener: std::net::TcpListener,
}

impl Bound {
    pub fn published(&self) -> Published {
        self.published
    }
}

/// Why ports could not be published.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error(
        "host port {host_port} is already in use: publish on another one, or give the sandbox's \
         port alone for any free host port"
    )]
    Taken { host_port: u16 },
    #[error("cannot listen on 127.0.0.1:{host_port}: {source}")]
    Bind {
        host_port: u16,
        #[source]
        source: io::Error,
    },
    #[error("{reason}")]
    Invalid { reason: String },
}

/// Listen on `127.0.0.1:HOSTPORT` for each `(host_port, port)` (0: any free
/// port), all or none: nothing stays bound after an error.
pub fn bind(specs: &[(u16, u16)]) -> Result<Vec<Bound>, PublishError> {
    if specs.len() > MAX_PER_SANDBOX {
        return Err(PublishError::Invalid {
            reason: format!(
                "at most {MAX_PER_SANDBOX} ports can be published per sandbox ({} asked)",
                specs.len()
            ),
        });
    }
    let mut bound: Vec<Bound> = Vec::with_capacity(specs.len());
    for &(host_port, port) in specs {
        if host_port != 0 && bound.iter().any(|b| b.published.host_port == host_port) {
            return Err(PublishError::Invalid {
                reason: format!("host port {host_port} is asked for twice"),
            });
        }
        let listener =
            std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, host_port)).map_err(|source| {
                match source.kind() {
                    io::ErrorKind::AddrInUse => PublishError::Taken { host_port },
                    _ => PublishError::Bind { host_port, source },
                }
            })?;
        let actual = listener
            .local_addr()
            .map_err(|source| PublishError::Bind { host_port, source })?
            .port();
        bound.push(Bound {
            published: Published {
                port,
                host_port: actual,
            },
            listener,
        });
    }
    Ok(bound)
}

/// The daemon's published ports, by sandbox.
pub struct Publisher {
    manager: Arc<SandboxManager>,
    held: Mutex<HashMap<SandboxId, Vec<(Published, AbortHandle)>>>,
    /// Set once the end follower runs (it needs a tokio runtime, which
    /// the first [`Publisher::start`] is called in).
    following: OnceLock<()>,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher").finish_non_exhaustive()
    }
}

impl Publisher {
    pub fn new(manager: Arc<SandboxManager>) -> Arc<Publisher> {
        Arc::new(Publisher {
            manager,
            held: Mutex::default(),
            following: OnceLock::new(),
        })
    }

    /// Relay `bound`'s listeners to sandbox `id` (of `tenant`) until it
    /// ends. Call inside a tokio runtime.
    pub fn start(self: &Arc<Self>, tenant: &TenantId, id: &SandboxId, bound: Vec<Bound>) {
        self.following
            .get_or_init(|| on_end(&self.manager, self, Publisher::forget));
        let mut held = Vec::with_capacity(bound.len());
        for Bound {
            published,
            listener,
        } in bound
        {
            match self.relay(tenant, id, published.port, listener) {
                Ok(task) => held.push((published, task)),
                Err(e) => tracing::warn!(
                    "sandbox {id}: cannot publish port {} on 127.0.0.1:{}: {e}",
                    published.port,
                    published.host_port
                ),
            }
        }
        self.lock().insert(id.clone(), held);
        // It may have ended before the follower could see it.
        if !self.manager.is_live(id) {
            self.forget(Ended::One(id));
        }
    }

    /// What sandbox `id` publishes now.
    pub fn published(&self, id: &SandboxId) -> Vec<Published> {
        self.lock()
            .get(id)
            .map(|held| held.iter().map(|(p, _)| *p).collect())
            .unwrap_or_default()
    }

    /// Publish again what the live sandboxes' records say they published
    /// (a daemon that re-adopted them). Call inside a tokio runtime.
    pub fn readopt(self: &Arc<Self>) {
        let records = match self.manager.store().live_sandboxes() {
            Ok(records) => records,
            Err(e) => {
                tracing::warn!("cannot read the live sandboxes to publish their ports again: {e}");
                return;
            }
        };
        for record in records {
            let kept = record
                .attrs
                .get("ports")
                .and_then(|p| p.get("published"))
                .cloned()
                .and_then(|p| serde_json::from_value::<Vec<Published>>(p).ok())
                .unwrap_or_default();
            let mut bound = Vec::new();
            for p in kept {
                match bind(&[(p.host_port, p.port)]) {
                    Ok(mut b) => bound.append(&mut b),
                    Err(e) => tracing::warn!(
                        "sandbox {}: port {} is no longer published: {e}",
                        record.id,
                        p.port
                    ),
                }
            }
            if !bound.is_empty() {
                self.start(&record.tenant, &record.id, bound);
            }
        }
    }

    /// One listener's accept loop.
    fn relay(
        &self,
        tenant: &TenantId,
        id: &SandboxId,
        port: u16,
        listener: std::net::TcpListener,
    ) -> io::Result<AbortHandle> {
        listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let (manager, tenant, id) = (Arc::clone(&self.manager), tenant.clone(), id.clone());
        let task = tokio::spawn(async move {
            loop {
                let mut client = match listener.accept().await {
                    Ok((client, _)) => client,
                    Err(e) => {
                        // Out of descriptors, most likely: wait instead of
                        // spinning.
                        tracing::warn!("sandbox {id}: published port {port}: accept: {e}");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let _ = client.set_nodelay(true);
                let (manager, tenant, id) = (Arc::clone(&manager), tenant.clone(), id.clone());
                tokio::spawn(async move {
                    // A closed port or an ended sandbox closes the client's
                    // connection: what a refused connect looks like.
                    match ports::tunnel(&manager, &tenant, &id, port, &mut client).await {
                        Ok(()) | Err(ProxyError::PortClosed { .. }) => {}
                        Err(e) => tracing::debug!("published port: {e}"),
                    }
                });
            }
        });
        Ok(task.abort_handle())
    }

    fn forget(&self, ended: Ended<'_>) {
        let gone: Vec<_> = {
            let mut held = self.lock();
            match ended {
                Ended::One(id) => held.remove(id).into_iter().collect(),
                Ended::Missed(manager) => {
                    let ids: Vec<_> = held
                        .keys()
                        .filter(|id| !manager.is_live(id))
                        .cloned()
                        .collect();
                    ids.iter().filter_map(|id| held.remove(id)).collect()
                }
            }
        };
        for (_, task) in gone.into_iter().flatten() {
            task.abort();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SandboxId, Vec<(Published, AbortHandle)>>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_is_all_or_none_and_names_a_taken_port() {
        let taken = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let taken_port = taken.local_addr().unwrap().port();
        let err = bind(&[(0, 80), (taken_port, 81)]).unwrap_err();
        assert!(
            matches!(err, PublishError::Taken { host_port } if host_port == taken_port),
            "{err:?}"
        );
        assert!(err.to_string().contains(&taken_port.to_string()));
        let ok = bind(&[(0, 80), (0, 81)]).unwrap();
        assert_eq!(ok.len(), 2);
        assert_ne!(ok[0].published().host_port, ok[1].published().host_port);
        let free = ok[0].published().host_port;
        assert!(matches!(
            bind(&[(free, 1)]).unwrap_err(),
            PublishError::Taken { .. }
        ));
        drop(ok);
        // Released with the bound listeners.
        assert_eq!(bind(&[(free, 1)]).unwrap()[0].published().host_port, free);
        // At the limit and past it.
        assert_eq!(
            bind(&[(0, 1); MAX_PER_SANDBOX]).unwrap().len(),
            MAX_PER_SANDBOX
        );
        assert!(bind(&[(0, 1); MAX_PER_SANDBOX + 1]).is_err());
        let dup = bind(&[(free, 1), (free, 2)]).unwrap_err();
        assert!(dup.to_string().contains("twice"), "{dup}");
    }
}
