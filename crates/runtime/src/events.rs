//! Lifecycle events: what happened to a sandbox, told to whoever listens,
//! so that nothing has to poll the manager to learn it.
//!
//! The [`SandboxManager`](crate::SandboxManager) publishes an [`Event`] on
//! each change of a live sandbox: [`EventKind::Created`] once it is
//! running and supervised, [`EventKind::Paused`] and
//! [`EventKind::Resumed`], and [`EventKind::Ended`] once its supervisor has
//! torn it down and recorded the end (by then it is no longer live:
//! [`SandboxManager::is_live`](crate::SandboxManager::is_live) says false).
//! [`SandboxManager::subscribe`](crate::SandboxManager::subscribe) gives a
//! receiver of every event from then on.
//!
//! The bus is a `tokio::sync::broadcast` channel: publishing never blocks
//! (the supervisors publish from plain threads), receivers may be async or
//! blocking, and a receiver that falls more than [`CAPACITY`] events behind
//! is told how many it missed (`RecvError::Lagged`) instead of holding the
//! publishers up; it should then look at what it keeps track of afresh.

use brig_core::SandboxId;
use tokio::sync::broadcast;

use crate::sandboxes::SandboxState;
use crate::tenants::TenantId;

/// Events a receiver may fall behind by before it misses some.
pub const CAPACITY: usize = 1024;

/// Something that happened to one sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub id: SandboxId,
    pub tenant: TenantId,
    pub kind: EventKind,
}

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// It runs, its agent answered, its record is written.
    Created,
    /// It was frozen (a pause, or a pause on timeout).
    Paused,
    /// It was thawed.
    Resumed,
    /// It is torn down and its end recorded: `stopped` (brig ended it:
    /// delete, expiry, shutdown) or `dead` (it ended by itself), with the
    /// init's exit code when the teardown learned it.
    Ended {
        state: SandboxState,
        code: Option<i32>,
    },
}

/// The sending side, shared by the manager and its supervisors.
#[derive(Debug, Clone)]
pub(crate) struct Events {
    tx: broadcast::Sender<Event>,
}

impl Events {
    pub(crate) fn new() -> Events {
        Events {
            tx: broadcast::channel(CAPACITY).0,
        }
    }

    pub(crate) fn publish(&self, id: &SandboxId, tenant: &TenantId, kind: EventKind) {
        // No receiver is not an error: nobody wanted to know.
        let _ = self.tx.send(Event {
            id: id.clone(),
            tenant: tenant.clone(),
            kind,
        });
    }

    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.tx.subscribe()
    }
}
