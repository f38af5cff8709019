//! Pre-made sandboxes: agents already running in their namespaces, root
//! filesystem and cgroups, their handshake done, waiting to be claimed.
//!
//! Creating a sandbox from scratch costs 2–20 ms (namespaces, a dozen
//! mounts, a memory cgroup, which the kernel makes slower the more
//! siblings it has, and the agent's start). A claim from the pool costs
//! what is left: the record in SQLite, the limits the request asks for
//! written to the cgroup, a supervisor thread. The filler threads
//! ([`crate::manager`]) make a new one in the background after every
//! claim.
//!
//! What a pooled sandbox can serve is decided when it is made, and is its
//! pool's key: its template and whether setuid binaries work in it
//! (`SandboxSpec::allow_setuid`, what E2B sandboxes need for `sudo`: it
//! decides no_new_privs, the bounding set and the overlay's mount flags,
//! all fixed at spawn). Its disk (the size of its tmpfs) cannot change
//! either, and on cgroup v1 a CPU limit needs a cgroup it does not have. A
//! request for anything else is made from scratch ([`Pool::take`] answers
//! `None`). Memory and pids limits are written on claim; create-time
//! environment variables are given to each process the sandbox starts, not
//! to the agent (see `SandboxManager::exec`), so a pooled sandbox and a new
//! one behave alike.
//!
//! A pool of a named template (`base`) fills only once the template is
//! built: at once if it is when the daemon starts, else after the first
//! create that uses it has built it ([`Pool::resolve`]). Nothing is built
//! for the pool alone, so an unbuilt template neither delays the start nor
//! fills the log.
//!
//! Pooled sandboxes have no record: nothing outside the daemon knows them.
//! They die with the daemon like every other sandbox (`PR_SET_PDEATHSIG`),
//! and reconcile removes their cgroups on the next start.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use brig_agent_client::Connection;
use brig_core::Instance;
use brig_core::{Limits, TemplateRef};

/// What `--pool` keys on after the template: sandboxes in which setuid
/// binaries work.
pub const SETUID_SUFFIX: &str = "+setuid";

/// How many pre-made sandboxes to keep for one template, with or without
/// setuid binaries working in them.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolTarget {
    pub template: TemplateRef,
    /// Made with `allow_setuid` (serves only creates that ask for it, such
    /// as the E2B layer's).
    pub setuid: bool,
    pub size: usize,
}

impl PoolTarget {
    /// `TEMPLATE=N` or `TEMPLATE+setuid=N` (`host=8`, `base+setuid=2`,
    /// `dir:/srv/rootfs=2`), as `brig serve --pool` takes it. A named
    /// template must be one brig knows how to build.
    pub fn parse(s: &str) -> Result<PoolTarget, String> {
        let (template, size) = s.rsplit_once('=').ok_or_else(|| {
            format!("--pool {s:?}: expected TEMPLATE=N or TEMPLATE+setuid=N, for example host=8")
        })?;
        let (template, setuid) = match template.strip_suffix(SETUID_SUFFIX) {
            Some(t) => (t, true),
            None => (template, false),
        };
        if template.contains('+') && !template.starts_with("dir:") {
            return Err(format!(
                "--pool {s:?}: {template:?} is not a template; the one option after a template \
                 is +setuid, once, as in base+setuid=2"
            ));
        }
        let template = match TemplateRef::parse(template)
            .map_err(|e| format!("--pool {s:?}: bad template: {e}"))?
        {
            // A name no recipe has: an image of the store by that name,
            // pooled once it is there (pulled or imported).
            TemplateRef::Named(name) if brig_template::recipe(&name).is_err() => {
                TemplateRef::Image(name)
            }
            other => other,
        };
        let size = size
            .parse::<usize>()
            .ok()
            .filter(|n| *n <= MAX_POOL)
            .ok_or_else(|| {
                format!("--pool {s:?}: N must be a whole number from 0 to {MAX_POOL}")
            })?;
        Ok(PoolTarget {
            template,
            setuid,
            size,
        })
    }

    /// `base+setuid`: the pool's name in `/v1/info`, `/metrics` and logs,
    /// as `--pool` spells it.
    pub fn name(&self) -> String {
        let suffix = if self.setuid { SETUID_SUFFIX } else { "" };
        format!("{}{suffix}", self.template)
    }
}

/// A bound on one template's pool: each idle sandbox holds about 0.6 MiB.
pub const MAX_POOL: usize = 1024;

/// Pre-made `base` sandboxes with setuid binaries working, what every E2B
/// create of the default template asks for: kept by `brig serve --e2b`
/// unless a `--pool base...` flag says otherwise.
pub const DEFAULT_E2B_POOL: usize = 2;

/// The pool `brig serve --e2b` keeps by default: `base+setuid=2`.
pub fn e2b_default() -> PoolTarget {
    PoolTarget {
        template: TemplateRef::Named("base".into()),
        setuid: true,
        size: DEFAULT_E2B_POOL,
    }
}

/// The pools to keep: `defaults`, except those of a template that a flag
/// names (`--pool base=0` turns off the default `base+setuid` pool too),
/// then the flags, a later one for the same template and setuid replacing
/// an earlier one.
pub fn merge(defaults: Vec<PoolTarget>, flags: Vec<PoolTarget>) -> Vec<PoolTarget> {
    let mut pools: Vec<PoolTarget> = defaults
        .into_iter()
        .filter(|d| !flags.iter().any(|f| f.template == d.template))
        .collect();
    for flag in flags {
        pools.retain(|t| (&t.template, t.setuid) != (&flag.template, flag.setuid));
        pools.push(flag);
    }
    pools
}

/// A sandbox whose agent has answered its handshake and that nobody owns
/// yet.
pub(crate) struct Warm {
    pub instance: Box<dyn Instance>,
    pub conn: Connection,
    /// Its link to the gateway, under policy `none` until claimed.
    pub net: Option<std::sync::Arc<crate::manager::NetLink>>,
}

/// One pool: a target, what its template resolves to, its sandboxes.
struct Slot {
    target: PoolTarget,
    /// The template sandboxes are made from (and that a create's resolved
    /// template is compared with): the target's own, or for a named one
    /// its built rootfs once known (`None` until then: nothing is made).
    made_from: Option<TemplateRef>,
    idle: VecDeque<Warm>,
    /// Sandboxes being made for it by a filler (see `reserve`).
    making: usize,
}

/// What a filler is making: see [`Pool::reserve`].
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Reserved {
    slot: usize,
    pub template: TemplateRef,
    pub setuid: bool,
}

/// The idle sandboxes, per (template, setuid).
pub(crate) struct Pool {
    slots: Mutex<Vec<Slot>>,
    /// Signalled on every claim and every newly built template: the filler
    /// has work.
    claimed: Condvar,
    /// Creates served from the pool since the start.
    served: AtomicU64,
    /// The limits every pooled sandbox is made with (the defaults, the
    /// daemon's default CPU quota included).
    made: Limits,
}

impl Pool {
    /// Pools for `targets` (a later target for the same template and
    /// setuid replaces an earlier one; size 0 is none). Named templates
    /// already built under `home` fill at once; the others wait for
    /// [`Pool::resolve`].
    pub fn new(targets: Vec<PoolTarget>, home: Option<&Path>, made: Limits) -> Pool {
        let mut slots: Vec<Slot> = Vec::new();
        for target in targets {
            slots.retain(|s| {
                (&s.target.template, s.target.setuid) != (&target.template, target.setuid)
            });
            if target.size == 0 {
                continue;
            }
            let made_from = match &target.template {
                TemplateRef::Host => Some(TemplateRef::Host),
                // Creates name the canonical path (`allowed_template`).
                TemplateRef::Dir(p) => Some(TemplateRef::Dir(
                    p.canonicalize().unwrap_or_else(|_| p.clone()),
                )),
                TemplateRef::Named(name) => home.and_then(|home| built(home, name)),
                // An image's layers once it is in the store (never pulled
                // here: the first create that names it pulls it).
                TemplateRef::Image(name) => home.and_then(|home| stored(home, name)),
                TemplateRef::Layers { .. } => None,
            };
            slots.push(Slot {
                target,
                made_from,
                idle: VecDeque::new(),
                making: 0,
            });
        }
        Pool {
            slots: Mutex::new(slots),
            claimed: Condvar::new(),
            served: AtomicU64::new(0),
            made,
        }
    }

    /// The limits every pooled sandbox is made with.
    pub fn limits(&self) -> Limits {
        self.made.clone()
    }

    /// The named template `name` is built at `made_from` (a create just
    /// resolved it): its pools start filling. Sandboxes made from another
    /// rootfs (it was rebuilt elsewhere) are returned, for the caller to
    /// drop outside the lock.
    pub fn resolve(&self, name: &str, made_from: &TemplateRef) -> Vec<Warm> {
        let mut old = Vec::new();
        let mut slots = self.lock();
        let mut changed = false;
        for slot in slots.iter_mut() {
            if !matches!(&slot.target.template, TemplateRef::Named(n) | TemplateRef::Image(n) if n == name)
                || slot.made_from.as_ref() == Some(made_from)
            {
                continue;
            }
            slot.made_from = Some(made_from.clone());
            old.extend(slot.idle.drain(..));
            changed = true;
        }
        drop(slots);
        if changed {
            self.claimed.notify_all();
        }
        old
    }

    /// Whether a request for `template` (resolved: a named template is its
    /// rootfs) with `limits` and `setuid` can be served from the pool at
    /// all (see the module docs).
    pub fn serves(&self, template: &TemplateRef, setuid: bool, limits: &Limits) -> bool {
        // Memory and pids change on a live sandbox; its disk and CPU quota
        // are what it was made with.
        limits.disk == self.made.disk
            && limits.cpus == self.made.cpus
            && self.lock().iter().any(|s| s.serves(template, setuid))
    }

    /// An idle sandbox for `template` and `setuid`, if there is one whose
    /// agent is still there. Wakes the filler either way.
    pub fn take(&self, template: &TemplateRef, setuid: bool) -> Option<Warm> {
        let mut slots = self.lock();
        let slot = slots.iter_mut().find(|s| s.serves(template, setuid))?;
        let mut found = None;
        while let Some(warm) = slot.idle.pop_front() {
            if !warm.conn.is_closed() {
                found = Some(warm);
                break;
            }
            // Its agent died while idle: dropping it reaps and cleans it.
        }
        drop(slots);
        self.claimed.notify_one();
        if found.is_some() {
            self.served.fetch_add(1, Ordering::Relaxed);
        }
        found
    }

    /// The first pool with fewer sandboxes (idle, or being made by a
    /// filler) than its target, counting one more for the one returned:
    /// the caller makes it, then calls [`Pool::put`] or
    /// [`Pool::unreserve`]. Pools of named templates not built yet are
    /// skipped.
    pub fn reserve(&self) -> Option<Reserved> {
        let mut slots = self.lock();
        let (i, slot) = slots
            .iter_mut()
            .enumerate()
            .find(|(_, s)| s.made_from.is_some() && s.idle.len() + s.making < s.target.size)?;
        slot.making += 1;
        Some(Reserved {
            slot: i,
            template: slot.made_from.clone()?,
            setuid: slot.target.setuid,
        })
    }

    /// Add a sandbox made for `r` and end the reservation. One made from a
    /// rootfs its pool no longer uses is given back, for the caller to
    /// drop outside the lock.
    pub fn put(&self, r: &Reserved, warm: Warm) -> Option<Warm> {
        let mut slots = self.lock();
        let slot = &mut slots[r.slot];
        slot.making = slot.making.saturating_sub(1);
        if slot.made_from.as_ref() != Some(&r.template) {
            return Some(warm);
        }
        slot.idle.push_back(warm);
        None
    }

    /// The end of a [`Pool::reserve`] that made nothing.
    pub fn unreserve(&self, r: &Reserved) {
        let mut slots = self.lock();
        let slot = &mut slots[r.slot];
        slot.making = slot.making.saturating_sub(1);
    }

    /// Block until a claim or `timeout`.
    pub fn wait(&self, timeout: Duration) {
        let slots = self.lock();
        let _ = self.claimed.wait_timeout(slots, timeout);
    }

    /// Wake the filler (at shutdown, so it sees the flag).
    pub fn wake(&self) {
        self.claimed.notify_all();
    }

    /// Every idle sandbox, for shutdown (dropping one kills and reaps it).
    pub fn drain(&self) -> Vec<Warm> {
        self.lock()
            .iter_mut()
            .flat_map(|s| s.idle.drain(..))
            .collect()
    }

    /// Idle sandboxes per pool, for `/metrics` and `/v1/info`: (its name,
    /// `base+setuid`; idle now; target).
    pub fn sizes(&self) -> Vec<(String, usize, usize)> {
        self.lock()
            .iter()
            .map(|s| (s.target.name(), s.idle.len(), s.target.size))
            .collect()
    }

    /// Creates served from the pool since the start.
    pub fn served(&self) -> u64 {
        self.served.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Slot>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Slot {
    fn serves(&self, template: &TemplateRef, setuid: bool) -> bool {
        self.target.setuid == setuid && self.made_from.as_ref() == Some(template)
    }
}

/// The named template's rootfs under `home` if it is built from its
/// current recipe (reading its stamp; nothing is built): the build's own
/// directory, as `brig_template::ensure` gives it to creates.
fn built(home: &Path, name: &str) -> Option<TemplateRef> {
    brig_template::ready(home, name).map(TemplateRef::Dir)
}

/// Image `name`'s layers if the store has it (nothing is pulled).
fn stored(home: &Path, name: &str) -> Option<TemplateRef> {
    let template = TemplateRef::Image(name.to_string());
    brig_template::resolve(home, template, brig_template::Progress::Quiet, false)
        .ok()
        .map(|r| r.template)
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
                setuid: false,
                size: 8
            }
        );
        let dir = PoolTarget::parse("dir:/srv/a=b=2").unwrap();
        assert_eq!(dir.template, TemplateRef::Dir("/srv/a=b".into()));
        assert_eq!(dir.size, 2);
        let base = PoolTarget::parse("base+setuid=2").unwrap();
        assert_eq!(base.template, TemplateRef::Named("base".into()));
        assert!(base.setuid);
        assert_eq!(base.name(), "base+setuid");
        assert!(PoolTarget::parse("host+setuid=1").unwrap().setuid);
        assert!(!PoolTarget::parse("base=0").unwrap().setuid);
        for (bad, says) in [
            ("host", "TEMPLATE=N"),
            ("host=", "whole number"),
            ("host=-1", "whole number"),
            ("host=x", "whole number"),
            ("host=100000", "whole number"),
            ("dir:=1", "bad template"),
            ("base+sudo=2", "+setuid, once"),
            ("base+setuid+setuid=2", "+setuid, once"),
            ("+setuid=2", "bad template"),
            ("No Such=2", "bad template"),
        ] {
            let e = PoolTarget::parse(bad).unwrap_err();
            assert!(e.contains("--pool") && e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn flags_replace_the_defaults_of_the_template_they_name() {
        let p = |s: &str| PoolTarget::parse(s).unwrap();
        let names = |v: Vec<PoolTarget>| {
            v.iter()
                .map(|t| format!("{}={}", t.name(), t.size))
                .collect::<Vec<_>>()
        };
        let defaults = || vec![p("host=4"), e2b_default()];
        assert_eq!(
            names(merge(defaults(), vec![])),
            ["host=4", "base+setuid=2"]
        );
        assert_eq!(
            names(merge(defaults(), vec![p("base=0")])),
            ["host=4", "base=0"],
            "base=0 turns the default off"
        );
        assert_eq!(
            names(merge(defaults(), vec![p("base+setuid=4"), p("base=1")])),
            ["host=4", "base+setuid=4", "base=1"]
        );
        assert_eq!(
            names(merge(defaults(), vec![p("host=1"), p("host=2")])),
            ["base+setuid=2", "host=2"],
            "a later flag wins"
        );
    }

    #[test]
    fn only_requests_a_pooled_sandbox_can_serve_are_served() {
        let pool = Pool::new(
            vec![PoolTarget {
                template: TemplateRef::Host,
                setuid: false,
                size: 2,
            }],
            None,
            Limits::default(),
        );
        let mut limits = Limits::default();
        assert!(pool.serves(&TemplateRef::Host, false, &limits));
        assert!(!pool.serves(&TemplateRef::Host, true, &limits), "setuid");
        assert!(!pool.serves(&TemplateRef::Dir("/x".into()), false, &limits));
        limits.cpus = Some(1.0);
        assert!(!pool.serves(&TemplateRef::Host, false, &limits));
        let limits = Limits {
            disk: brig_core::ByteSize::mib(64),
            ..Limits::default()
        };
        assert!(!pool.serves(&TemplateRef::Host, false, &limits));
        let r = pool.reserve().unwrap();
        assert_eq!((&r.template, r.setuid), (&TemplateRef::Host, false));
        assert!(pool.reserve().is_some());
        assert_eq!(pool.reserve(), None, "two being made fill a pool of two");
        pool.unreserve(&r);
        assert!(pool.reserve().is_some());
        assert!(pool.take(&TemplateRef::Host, false).is_none());
    }

    #[test]
    fn pools_are_keyed_by_template_and_setuid_and_named_ones_wait_for_their_build() {
        let targets = [
            "host=1",
            "base+setuid=1",
            "base=0",
            "host+setuid=3",
            "host+setuid=1",
        ]
        .map(|t| PoolTarget::parse(t).unwrap());
        let pool = Pool::new(targets.to_vec(), None, Limits::default());
        // base=0 is no pool; a later host+setuid replaced the earlier one.
        assert_eq!(
            pool.sizes(),
            vec![
                ("host".to_string(), 0, 1),
                ("base+setuid".to_string(), 0, 1),
                ("host+setuid".to_string(), 0, 1)
            ]
        );
        let limits = Limits::default();
        assert!(pool.serves(&TemplateRef::Host, true, &limits));
        let rootfs = TemplateRef::Dir("/srv/templates/base/rootfs".into());
        assert!(!pool.serves(&rootfs, true, &limits), "not built yet");
        // Nothing is made for the unbuilt template.
        let a = pool.reserve().unwrap();
        let b = pool.reserve().unwrap();
        assert_eq!((&a.template, a.setuid), (&TemplateRef::Host, false));
        assert_eq!((&b.template, b.setuid), (&TemplateRef::Host, true));
        assert_eq!(pool.reserve(), None);
        // A create built it: its pool fills from the rootfs.
        assert!(pool.resolve("base", &rootfs).is_empty());
        assert!(pool.serves(&rootfs, true, &limits));
        assert!(!pool.serves(&rootfs, false, &limits));
        let c = pool.reserve().unwrap();
        assert_eq!((&c.template, c.setuid), (&rootfs, true));
        assert_eq!(pool.reserve(), None);
    }
}
