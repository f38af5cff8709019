//! [`ErrorKind`]: what a front-end needs to know about a runtime error to
//! answer it in its own wire format.
//!
//! Every runtime error ([`ManagerError`], [`SandboxError`], [`StoreError`],
//! [`KeyError`], [`AuthError`]) has a `kind()`. A front-end maps kinds to
//! its statuses and codes (the native API to `404 not_found`, E2B's control
//! plane to `{"code": 404}`, envd to Connect codes) and shows the error's
//! message, [`chain`]ed with its sources. Runtime messages say what failed
//! and what to change in runtime terms; they never name a route of one
//! front-end: hints such as "resume it with POST /v1/…" are added by the
//! front-end that owns the route.
//!
//! [`ManagerError`]: crate::ManagerError
//! [`SandboxError`]: crate::SandboxError
//! [`StoreError`]: crate::StoreError
//! [`KeyError`]: crate::KeyError
//! [`AuthError`]: crate::AuthError

/// What kind of failure a runtime error is, as a client should see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The sandbox (or key, or file inside the sandbox) does not exist, or
    /// is another tenant's.
    NotFound,
    /// The request itself is wrong: a bad spec, timeout, cursor or
    /// template name.
    BadRequest,
    /// The request conflicts with the current state: already paused, not
    /// paused, the tenant's last key, a file that exists.
    Conflict,
    /// The sandbox has ended (or ended under the request): it cannot be
    /// used again.
    NotRunning,
    /// The sandbox is paused: nothing inside it answers until it is
    /// resumed.
    Paused,
    /// The request is understood but not allowed (a `dir:` template outside
    /// the template roots, a file the sandbox's user cannot touch).
    Forbidden,
    /// The presented API key is missing, unknown or revoked.
    Unauthorized,
    /// This host cannot do it (no cgroup controller for it).
    Unsupported,
    /// No room left: a volume is full (its size is its quota).
    NoSpace,
    /// Not now: the daemon is shutting down, a template cannot be built.
    Unavailable,
    /// A bug or a failure of the host: logged, reported with its chain.
    Internal,
}

/// `err: its source: its source's source`, each message once: an error
/// that shows its source in its own message (`sandbox {id}: {source}`) does
/// not get it repeated.
pub fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut next = err.source();
    while let Some(e) = next {
        let message = e.to_string();
        if !out.ends_with(&message) {
            out.push_str(": ");
            out.push_str(&message);
        }
        next = e.source();
    }
    out
}
