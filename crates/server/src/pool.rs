//! Pre-made sandboxes: agents already running in their namespaces, root
//! filesystem and cgroups, their handshake done, waiting to be claimed.
//!
//! Creating a sandbox from scratch costs 2–20 ms (namespaces, a dozen
//! mounts, a memory cgroup, which the kernel makes slower the more
//! siblings it has, and the agent's start). A claim from the pool costs
//! what is left: the record in SQLite, the limits the request asks for
//! written to the cgroup, a supervisor thread. The filler thread
//! ([`crate::manager`]) makes a new one in the background after every
//! claim.
//!
//! What a pooled sandbox can serve is decided when it is made: its
//! template and its disk (the size of its tmpfs) cannot change, and on
//! cgroup v1 a CPU limit needs a cgroup it does not have. A request for
//! anything else is made from scratch ([`Pool::take`] answers `None`).
//! Memory and pids limits are written on claim; create-time environment
//! variables are given to each process the sandbox starts, not to the
//! agent (see `SandboxManager::exec`).
//!
//! Pooled sandboxes have no record: nothing outside the daemon knows them.
//! They die with the daemon like every other sandbox (`PR_SET_PDEATHSIG`),
//! and reconcile removes their cgroups on the next start.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use brig_agent_client::Connection;
use brig_core::{Limits, TemplateRef};
use brig_jail::Sandbox;

/// How many pre-made sandboxes to keep for one template.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolTarget {
    pub template: TemplateRef,
    pub size: usize,
}

impl PoolTarget {
    /// `TEMPLATE=N` (`host=8`, `dir:/srv/rootfs=2`), as `brig serve --pool`
    /// takes it.
    pub fn parse(s: &str) -> Result<PoolTarget, String> {
        let (template, size) = s
            .rsplit_once('=')
            .ok_or_else(|| format!("--pool {s:?}: expected TEMPLATE=N, for example host=8"))?;
        let template =
            TemplateRef::parse(template).map_err(|e| format!("--pool {s:?}: bad template: {e}"))?;
        let size = size
            .parse::<usize>()
            .ok()
            .filter(|n| *n <= MAX_POOL)
            .ok_or_else(|| {
                format!("--pool {s:?}: N must be a whole number from 0 to {MAX_POOL}")
            })?;
        Ok(PoolTarget { template, size })
    }
}

/// A bound on one template's pool: each idle sandbox holds about 0.6 MiB.
pub const MAX_POOL: usize = 1024;

/// A sandbox whose agent has answered its handshake and that nobody owns
/// yet.
pub(crate) struct Warm {
    pub sandbox: Sandbox,
    pub conn: Connection,
}

/// The idle sandboxes, per template.
pub(crate) struct Pool {
    targets: Vec<PoolTarget>,
    idle: Mutex<HashMap<String, VecDeque<Warm>>>,
    /// Signalled on every claim: the filler has work.
    claimed: Condvar,
    /// Creates served from the pool since the start.
    served: AtomicU64,
    /// Sandboxes being made for the pool, per template (see `reserve`).
    making: Mutex<HashMap<String, usize>>,
}

impl Pool {
    pub fn new(targets: Vec<PoolTarget>) -> Pool {
        Pool {
            targets: targets.into_iter().filter(|t| t.size > 0).collect(),
            idle: Mutex::new(HashMap::new()),
            claimed: Condvar::new(),
            served: AtomicU64::new(0),
            making: Mutex::new(HashMap::new()),
        }
    }

    /// The limits every pooled sandbox is made with.
    pub fn limits() -> Limits {
        Limits::default()
    }

    /// Whether a request for `template` with `limits` can be served from
    /// the pool at all (see the module docs).
    pub fn serves(&self, template: &TemplateRef, limits: &Limits) -> bool {
        limits.disk == Pool::limits().disk
            && limits.cpus.is_none()
            && self.targets.iter().any(|t| &t.template == template)
    }

    /// An idle sandbox for `template`, if there is one whose agent is
    /// still there. Wakes the filler either way.
    pub fn take(&self, template: &TemplateRef) -> Option<Warm> {
        let mut idle = self.lock();
        let queue = idle.get_mut(&template.to_string())?;
        let mut found = None;
        while let Some(warm) = queue.pop_front() {
            if !warm.conn.is_closed() {
                found = Some(warm);
                break;
            }
            // Its agent died while idle: dropping it reaps and cleans it.
        }
        drop(idle);
        self.claimed.notify_one();
        if found.is_some() {
            self.served.fetch_add(1, Ordering::Relaxed);
        }
        found
    }

    /// Add a freshly made sandbox.
    pub fn put(&self, template: &TemplateRef, warm: Warm) {
        self.lock()
            .entry(template.to_string())
            .or_default()
            .push_back(warm);
    }

    /// The first template with fewer sandboxes (idle, or being made by a
    /// filler) than its target, counting one more for the template returned: the caller
    /// makes it, then calls [`Pool::unreserve`] (and `put` on success).
    pub fn reserve(&self) -> Option<TemplateRef> {
        let idle = self.lock();
        let mut making = self.making.lock().unwrap_or_else(|e| e.into_inner());
        let t = self.targets.iter().find(|t| {
            let name = t.template.to_string();
            let have = idle.get(&name).map_or(0, VecDeque::len);
            have + making.get(&name).copied().unwrap_or(0) < t.size
        })?;
        *making.entry(t.template.to_string()).or_default() += 1;
        Some(t.template.clone())
    }

    /// The end of a [`Pool::reserve`].
    pub fn unreserve(&self, template: &TemplateRef) {
        let mut making = self.making.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = making.get_mut(&template.to_string()) {
            *n = n.saturating_sub(1);
        }
    }

    /// Block until a claim or `timeout`.
    pub fn wait(&self, timeout: Duration) {
        let idle = self.lock();
        let _ = self.claimed.wait_timeout(idle, timeout);
    }

    /// Wake the filler (at shutdown, so it sees the flag).
    pub fn wake(&self) {
        self.claimed.notify_all();
    }

    /// Every idle sandbox, for shutdown (dropping one kills and reaps it).
    pub fn drain(&self) -> Vec<Warm> {
        self.lock()
            .drain()
            .flat_map(|(_, q)| q.into_iter())
            .collect()
    }

    /// Idle sandboxes per template, for `/metrics` and `/v1/info`.
    pub fn sizes(&self) -> Vec<(String, usize, usize)> {
        let idle = self.lock();
        self.targets
            .iter()
            .map(|t| {
                let name = t.template.to_string();
                let n = idle.get(&name).map_or(0, VecDeque::len);
                (name, n, t.size)
            })
            .collect()
    }

    /// Creates served from the pool since the start.
    pub fn served(&self) -> u64 {
        self.served.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, VecDeque<Warm>>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_targets_parse_with_clear_errors() {
        assert_eq!(
            PoolTarget::parse("host=8").unwrap(),
            PoolTarget {
                template: TemplateRef::Host,
                size: 8
            }
        );
        let dir = PoolTarget::parse("dir:/srv/a=b=2").unwrap();
        assert_eq!(dir.template, TemplateRef::Dir("/srv/a=b".into()));
        assert_eq!(dir.size, 2);
        for bad in [
            "host",
            "host=",
            "host=-1",
            "host=x",
            "host=100000",
            "dir:=1",
        ] {
            let e = PoolTarget::parse(bad).unwrap_err();
            assert!(e.contains("--pool"), "{bad}: {e}");
        }
    }

    #[test]
    fn only_requests_a_pooled_sandbox_can_serve_are_served() {
        let pool = Pool::new(vec![PoolTarget {
            template: TemplateRef::Host,
            size: 2,
        }]);
        let mut limits = Limits::default();
        assert!(pool.serves(&TemplateRef::Host, &limits));
        assert!(!pool.serves(&TemplateRef::Dir("/x".into()), &limits));
        limits.cpus = Some(1.0);
        assert!(!pool.serves(&TemplateRef::Host, &limits));
        let limits = Limits {
            disk: brig_core::ByteSize::mib(64),
            ..Limits::default()
        };
        assert!(!pool.serves(&TemplateRef::Host, &limits));
        assert_eq!(pool.reserve(), Some(TemplateRef::Host));
        assert_eq!(pool.reserve(), Some(TemplateRef::Host));
        assert_eq!(pool.reserve(), None, "two being made fill a pool of two");
        pool.unreserve(&TemplateRef::Host);
        assert_eq!(pool.reserve(), Some(TemplateRef::Host));
        assert!(pool.take(&TemplateRef::Host).is_none());
    }
}
