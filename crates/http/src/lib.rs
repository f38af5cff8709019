//! brig-http: what every HTTP front-end of the runtime shares.
//!
//! A front-end (the native API, brig-api; E2B's planes, brig-e2b) turns
//! requests into calls on the [`SandboxManager`] and answers in its own
//! wire format. What they have in common is here, and none of it decides
//! what an error looks like on the wire: each piece returns a typed error
//! the front-end maps.
//!
//! - [`Auth`]: the tenant a request acts for, from `Authorization: Bearer
//!   <key>` (an axum extractor over any state that is an [`AuthState`]),
//!   or from a key found elsewhere ([`Auth::with_key`]). Refusals are
//!   [`AuthRejection`]s, turned into the front-end's own error by
//!   [`AuthState::Rejection`].
//! - [`blocking`]: run a blocking manager call (SQLite, the agent, the
//!   spawner) off the async workers; [`BlockingError`] if the task failed.
//! - [`ports`]: HTTP, WebSocket and raw TCP to a port inside a sandbox,
//!   through its agent ([`ports::proxy`], [`ports::tcp_upgrade`], failing
//!   with a [`ports::ProxyError`]); [`publish`]: a sandbox's port on a
//!   host loopback port (`brig create --publish`).
//! - [`on_end`]: follow the runtime's events to forget per-sandbox state
//!   when a sandbox ends.
//! - [`listen`]: the daemon's listening socket, with a backlog for bursts.
//! - [`multipart`]: a bound on what a multipart upload's boundaries and
//!   part headers may make the daemon hold.
#![forbid(unsafe_code)]

pub mod multipart;
pub mod ports;
pub mod publish;
pub mod tls;

use std::sync::{Arc, Weak};

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use axum::response::IntoResponse;
use brig_core::SandboxId;
use brig_runtime::{AuthError, EventKind, Principal, SandboxManager, TenantId};
use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinError;

/// The most connections that may wait to be accepted. The kernel caps
/// it at `net.core.somaxconn` (4096 on current kernels); what tokio's
/// `TcpListener::bind` asks for, 1024, overflows when clients open a few
/// thousand connections at once (2,000 streaming execs): the kernel then
/// drops their handshakes, and each client waits out TCP's retransmit
/// back-off (a minute or more) before the daemon ever sees it.
const BACKLOG: u32 = 65_535;

/// A listening TCP socket on `addr` (port 0 picks one) for an HTTP
/// front-end, with a backlog as deep as the kernel allows.
pub fn listen(addr: std::net::SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    // As std and tokio do: a restarted daemon binds again at once, though
    // connections of the old one linger in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

/// A front-end's router state, as [`Auth`] needs it.
pub trait AuthState: Send + Sync {
    /// How the front-end answers a refused key (its 401, its 500).
    type Rejection: IntoResponse + From<AuthRejection>;

    fn manager(&self) -> &Arc<SandboxManager>;
}

/// A secret for a URL or a header: 32 random alphanumerics from the OS
/// (E2B's envd and traffic tokens, the native traffic token).
pub fn random_token() -> String {
    use rand::distributions::{Alphanumeric, DistString};
    Alphanumeric.sample_string(&mut rand::rngs::OsRng, 32)
}

/// Compare secrets without leaking where they differ through timing.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The tenant a request acts for.
#[derive(Debug, Clone)]
pub struct Auth(pub TenantId);

/// Who a request comes from: its key, with the key's tenant and role (for
/// the routes that manage keys and tenants).
#[derive(Debug, Clone)]
pub struct Caller(pub Principal);

impl<S: AuthState> FromRequestParts<S> for Caller {
    type Rejection = S::Rejection;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Caller, S::Rejection> {
        let key = bearer(parts).ok_or(AuthRejection::Missing)?;
        Ok(Caller(Auth::principal(state.manager(), key).await?))
    }
}

/// The key in `Authorization: Bearer <key>`.
fn bearer(parts: &Parts) -> Option<String> {
    parts
        .headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|k| k.trim().to_string())
}

/// Why a request has no tenant.
#[derive(Debug, thiserror::Error)]
pub enum AuthRejection {
    /// No `Authorization: Bearer <key>` header.
    #[error("no api key")]
    Missing,
    /// The key was refused ([`AuthError::is_rejection`]), or could not be
    /// checked (the store failed).
    #[error(transparent)]
    Key(#[from] AuthError),
    /// The check's blocking task failed.
    #[error("the api key check failed")]
    Task(#[source] JoinError),
}

impl<S: AuthState> FromRequestParts<S> for Auth {
    type Rejection = S::Rejection;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Auth, S::Rejection> {
        let key = bearer(parts).ok_or(AuthRejection::Missing)?;
        Ok(Auth::with_key(state.manager(), key).await?)
    }
}

impl Auth {
    /// Check a key however it arrived (the native PTY route also takes one
    /// from `Sec-WebSocket-Protocol`, E2B's control plane from
    /// `X-API-KEY`). A refused key is logged here, once.
    pub async fn with_key(
        manager: &Arc<SandboxManager>,
        key: String,
    ) -> Result<Auth, AuthRejection> {
        Ok(Auth(Self::principal(manager, key).await?.tenant))
    }

    /// The whole [`Principal`] a key authenticates as.
    pub async fn principal(
        manager: &Arc<SandboxManager>,
        key: String,
    ) -> Result<Principal, AuthRejection> {
        let manager = Arc::clone(manager);
        let checked = tokio::task::spawn_blocking(move || manager.authenticate(&key))
            .await
            .map_err(AuthRejection::Task)?;
        match checked {
            Ok(principal) => Ok(principal),
            Err(e) => {
                if e.is_rejection() {
                    tracing::info!("refused an api key: {e}");
                }
                Err(e.into())
            }
        }
    }
}

/// Why a [`blocking`] call failed.
#[derive(Debug, thiserror::Error)]
pub enum BlockingError<E> {
    /// The call itself failed.
    #[error(transparent)]
    Call(E),
    /// The blocking task panicked or was cancelled.
    #[error(transparent)]
    Task(JoinError),
}

/// Run a blocking manager call (SQLite, the agent, the spawner) off the
/// async workers.
pub async fn blocking<T: Send + 'static, E: Send + 'static>(
    f: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, BlockingError<E>> {
    match tokio::task::spawn_blocking(f).await {
        Ok(result) => result.map_err(BlockingError::Call),
        Err(e) => Err(BlockingError::Task(e)),
    }
}

/// What a follower of sandbox ends ([`on_end`]) is told.
#[derive(Debug)]
pub enum Ended<'a> {
    /// This sandbox ended: forget it.
    One(&'a SandboxId),
    /// Some ends were missed (the follower fell behind the runtime's
    /// events): forget every sandbox the manager no longer runs.
    Missed(&'a SandboxManager),
}

/// Tell `forget` about every sandbox that ends from now on, on a task of the
/// current tokio runtime (none outside one), for as long as `holder` (what
/// keeps per-sandbox state) and the manager live. Subscribes before it
/// returns: no end after this call is missed.
pub fn on_end<T: Send + Sync + 'static>(
    manager: &Arc<SandboxManager>,
    holder: &Arc<T>,
    forget: impl Fn(&T, Ended<'_>) + Send + 'static,
) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let mut events = manager.subscribe();
    let (holder, manager): (Weak<T>, Weak<SandboxManager>) =
        (Arc::downgrade(holder), Arc::downgrade(manager));
    rt.spawn(async move {
        loop {
            let event = events.recv().await;
            let Some(holder) = holder.upgrade() else {
                return;
            };
            match event {
                Ok(e) if matches!(e.kind, EventKind::Ended { .. }) => {
                    forget(&holder, Ended::One(&e.id))
                }
                Ok(_) => {}
                Err(RecvError::Lagged(_)) => match manager.upgrade() {
                    Some(m) => forget(&holder, Ended::Missed(&m)),
                    None => return,
                },
                // The manager and its supervisors are gone.
                Err(RecvError::Closed) => return,
            }
        }
    });
}
