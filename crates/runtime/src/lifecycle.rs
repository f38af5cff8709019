//! Pause, resume and per-sandbox metrics: more [`SandboxManager`] methods,
//! through the sandbox's tier ([`brig_core::Instance`]: pause, resume,
//! end_all_but_agent, usage).
//!
//! **Pause** freezes every process of the sandbox (the agent with them, so
//! calls that need it fail with [`ManagerError::Paused`] until it is
//! resumed) and suspends its
//! time to live: the time it had left is kept here, and its record's
//! `expires_at` becomes now + [`ManagerConfig::max_timeout`], so a paused
//! sandbox that is never resumed is still ended by the sweeper eventually.
//! **Resume** thaws it and gives it back the time it had left (or the
//! timeout the request names). Both hold the sandbox's [`Lifecycle`] lock
//! throughout, so concurrent pauses and resumes are serialised.
//!
//! A pause keeps everything ([`PauseMode::Full`]: memory, processes, open
//! connections inside) or only the filesystem ([`PauseMode::Filesystem`]:
//! every process but the agent is killed first, so the sandbox holds no
//! memory but its files; its resume is a "reboot" with the same files). A
//! resume may also ask to reboot a fully paused sandbox. A sandbox can be
//! told to pause instead of ending when its time to live runs out
//! ([`SandboxManager::pause_on_timeout`]); the sweeper then pauses it, and
//! it ends only if it stays paused for [`ManagerConfig::max_timeout`].
//!
//! [`ManagerConfig::max_timeout`]: crate::ManagerConfig::max_timeout

use std::sync::Arc;
use std::time::{Duration, Instant};

use brig_core::{SandboxId, Usage};
use serde::{Deserialize, Serialize};

use crate::events::EventKind;
use crate::manager::{lock, Live, ManagerError, SandboxManager};
use crate::sandboxes::{SandboxError, SandboxState, Scope};
use crate::{SandboxRecord, TenantId, UnixMillis};

/// What a pause keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PauseMode {
    /// Memory and processes: a resume goes on where it stopped.
    #[default]
    Full,
    /// Only the files: every process but the agent is ended by the pause,
    /// and a resume starts from the files alone.
    Filesystem,
}

/// What the manager keeps per live sandbox for this module.
#[derive(Debug, Default)]
pub(crate) struct Lifecycle {
    /// `Some` while paused: the time to live it had when paused.
    paused: Option<Duration>,
    /// What the current (or last) pause kept.
    mode: PauseMode,
    /// `Some`: pause like this, rather than end, when the time to live
    /// runs out.
    on_timeout: Option<PauseMode>,
    /// The time to live a resume gives when the request names none, after
    /// a pause on timeout (which had no time left).
    timeout: Option<Duration>,
    /// The previous metrics sample (when, CPU ns), for `cpu_percent`.
    last_sample: Option<(Instant, u64)>,
    /// Its metrics series: a sample every [`ManagerConfig::metrics_interval`]
    /// while it runs (none while paused), the last [`SERIES_KEEP`].
    ///
    /// [`ManagerConfig::metrics_interval`]: crate::ManagerConfig::metrics_interval
    series: std::collections::VecDeque<SandboxMetrics>,
    /// The series' previous sample (when, CPU ns), for its `cpu_percent`.
    series_last: Option<(Instant, u64)>,
    /// Its memory in use as its guest's kernel last told it (tiers whose
    /// [`Instance::memory_in_guest`]), and whether a read is under way.
    ///
    /// [`Instance::memory_in_guest`]: brig_core::Instance::memory_in_guest
    guest_memory: Option<u64>,
    guest_reading: bool,
}

/// Samples a sandbox's series keeps: an hour at the default interval of
/// 5 s (E2B's), about 100 bytes each.
pub const SERIES_KEEP: usize = 720;

/// The part of a [`Lifecycle`] a restarted daemon needs, as the record
/// keeps it (`lifecycle_json`).
#[derive(Debug, Default, Serialize, Deserialize)]
struct Kept {
    paused_ms: Option<u64>,
    #[serde(default)]
    mode: PauseMode,
    on_timeout: Option<PauseMode>,
    timeout_ms: Option<u64>,
}

impl Lifecycle {
    /// Whether it is paused now.
    pub(crate) fn is_paused(&self) -> bool {
        self.paused.is_some()
    }

    /// What a daemon re-adopting `record`'s sandbox knows of it: what the
    /// record kept, and paused if the record says so (with the default
    /// time to live, if the pause itself was not kept).
    pub(crate) fn restored(record: &SandboxRecord) -> Lifecycle {
        let kept: Kept = record
            .lifecycle
            .clone()
            .and_then(|v| serde_json::from_value(v).ok())
            .unwrap_or_default();
        let paused = (record.state == SandboxState::Paused).then(|| {
            kept.paused_ms
                .map_or(crate::manager::DEFAULT_TIMEOUT, Duration::from_millis)
        });
        Lifecycle {
            paused,
            mode: kept.mode,
            on_timeout: kept.on_timeout,
            timeout: kept.timeout_ms.map(Duration::from_millis),
            last_sample: None,
            series: Default::default(),
            series_last: None,
            guest_memory: None,
            guest_reading: false,
        }
    }

    fn kept(&self) -> serde_json::Value {
        let kept = Kept {
            paused_ms: self.paused.map(|d| d.as_millis() as u64),
            mode: self.mode,
            on_timeout: self.on_timeout,
            timeout_ms: self.timeout.map(|d| d.as_millis() as u64),
        };
        serde_json::to_value(kept).unwrap_or(serde_json::Value::Null)
    }
}

impl SandboxManager {
    /// Write `lc` to the sandbox's record, for a daemon that re-adopts it.
    fn keep_lifecycle(&self, id: &SandboxId, lc: &Lifecycle) {
        if let Err(e) = self.store().set_lifecycle(id, &lc.kept()) {
            tracing::warn!("sandbox {id}: cannot keep its pause state: {e}");
        }
    }
}

impl Live {
    pub(crate) fn is_paused(&self) -> bool {
        lock(&self.lifecycle).paused.is_some()
    }

    /// Run `f` with the sandbox frozen: frozen now unless it is paused,
    /// thawed after unless it was; no pause, resume or timeout can change
    /// that meanwhile (its lifecycle is held). Returns `f`'s result and how
    /// long the sandbox was held frozen for it.
    pub(crate) fn frozen_for<T>(
        &self,
        id: &SandboxId,
        f: impl FnOnce() -> T,
    ) -> Result<(T, Duration), ManagerError> {
        let lc = lock(&self.lifecycle);
        let running = lc.paused.is_none();
        let started = Instant::now();
        if running {
            self.instance
                .pause()
                .map_err(tier_err(id, "freeze the sandbox"))?;
        }
        let out = f();
        let held = started.elapsed();
        if running {
            if let Err(e) = self.instance.resume() {
                tracing::error!("sandbox {id}: cannot thaw it after a snapshot: {e}");
            }
        }
        drop(lc);
        Ok((out, held))
    }

    /// How it is paused; `None` if it is not.
    pub(crate) fn pause_mode(&self) -> Option<PauseMode> {
        let lc = lock(&self.lifecycle);
        lc.paused.map(|_| lc.mode)
    }
}

/// What a resume did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resumed {
    /// Its processes are gone (a filesystem-only pause, or a resume that
    /// asked to reboot): whatever the sandbox runs must be started again.
    pub rebooted: bool,
}

/// One sample of a sandbox's resource use (the native API serves it at
/// `GET /v1/sandboxes/{id}/metrics`, E2B's at `GET /sandboxes/{id}/metrics`).
#[derive(Debug, Clone, Serialize)]
pub struct SandboxMetrics {
    /// CPU time used by all its processes since it started.
    pub cpu_usage_ns: u64,
    /// CPU use since the previous sample (or since the sandbox started), in
    /// percent of one core: 200 is two cores busy.
    pub cpu_percent: Option<f64>,
    /// Memory charged to it now, including the files in its tmpfs layers.
    pub memory_bytes: u64,
    pub memory_peak_bytes: Option<u64>,
    pub memory_limit_bytes: u64,
    /// Its writable root filesystem (the `disk` limit is its size).
    pub disk_used_bytes: Option<u64>,
    pub disk_total_bytes: Option<u64>,
    /// Tasks (processes and threads) alive, the agent included.
    pub pids: u64,
    /// Processes the kernel's OOM killer killed in it since it started.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oom_kills: Option<u64>,
    pub state: SandboxState,
    /// When the sample was taken, milliseconds since the epoch.
    pub timestamp: UnixMillis,
}

/// Live sandboxes by state, for `/metrics`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct LiveCounts {
    pub running: u64,
    pub paused: u64,
}

fn tier_err<'a>(
    id: &'a SandboxId,
    op: &'static str,
) -> impl FnOnce(brig_core::TierError) -> ManagerError + 'a {
    move |source| ManagerError::Tier {
        id: id.clone(),
        op,
        source,
    }
}

fn now_millis() -> UnixMillis {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as UnixMillis)
}

impl SandboxManager {
    /// A live sandbox of `tenant`'s; another tenant's is not found, and one
    /// that is not live answers with its state.
    pub(crate) fn owned_live(
        &self,
        tenant: &TenantId,
        id: &SandboxId,
    ) -> Result<Arc<Live>, ManagerError> {
        match self.live_sandbox(id) {
            Some(live) if &live.tenant == tenant => Ok(live),
            Some(_) => Err(SandboxError::NotFound { id: id.clone() }.into()),
            None => {
                let record = self.get(tenant, id)?;
                Err(ManagerError::NotRunning {
                    id: id.clone(),
                    state: record.state,
                })
            }
        }
    }

    /// Freeze a running sandbox and suspend its time to live.
    pub fn pause(&self, tenant: &TenantId, id: &SandboxId) -> Result<SandboxRecord, ManagerError> {
        self.pause_with(tenant, id, PauseMode::Full)
    }

    /// Pause a running sandbox, keeping what `mode` says.
    pub fn pause_with(
        &self,
        tenant: &TenantId,
        id: &SandboxId,
        mode: PauseMode,
    ) -> Result<SandboxRecord, ManagerError> {
        let live = self.owned_live(tenant, id)?;
        self.pause_live(tenant, id, &live, mode, None)
    }

    /// Pause `live` (a sandbox of `tenant`'s). `left`: the time to live to
    /// keep for its resume, instead of what its record has left.
    fn pause_live(
        &self,
        tenant: &TenantId,
        id: &SandboxId,
        live: &Live,
        mode: PauseMode,
        left: Option<Duration>,
    ) -> Result<SandboxRecord, ManagerError> {
        let mut lc = lock(&live.lifecycle);
        if lc.paused.is_some() {
            return Err(ManagerError::AlreadyPaused { id: id.clone() });
        }
        let record = self.get(tenant, id)?;
        if record.state != SandboxState::Running {
            return Err(ManagerError::NotRunning {
                id: id.clone(),
                state: record.state,
            });
        }
        let left = left.unwrap_or_else(|| {
            Duration::from_millis(record.expires_at.saturating_sub(now_millis()).max(1000) as u64)
        });
        live.instance
            .pause()
            .map_err(tier_err(id, "freeze the sandbox"))?;
        if mode == PauseMode::Filesystem {
            // Frozen, so nothing forks away meanwhile; then the agent alone
            // is frozen again.
            let ended = live
                .instance
                .end_all_but_agent()
                .map_err(tier_err(id, "end the sandbox's processes"));
            if let Err(e) = ended.and_then(|_| {
                live.instance
                    .pause()
                    .map_err(tier_err(id, "freeze the sandbox"))
            }) {
                let _ = live.instance.resume();
                return Err(e);
            }
        }
        let stored = {
            let store = self.store();
            store
                .transition(Scope::Tenant(tenant), id, SandboxState::Paused, None)
                .and_then(|_| {
                    store.extend_timeout(Scope::Tenant(tenant), id, self.config().max_timeout)
                })
        };
        match stored {
            Ok(record) => {
                lc.paused = Some(left);
                lc.mode = mode;
                self.keep_lifecycle(id, &lc);
                self.events().publish(id, tenant, EventKind::Paused);
                Ok(record)
            }
            Err(e) => {
                // Ended meanwhile (delete, expiry): leave it as it was.
                let _ = live.instance.resume();
                Err(e.into())
            }
        }
    }

    /// Thaw a paused sandbox. It runs for `timeout` from now (capped at the
    /// server's maximum), or by default for the time it had left when it
    /// was paused.
    pub fn resume(
        &self,
        tenant: &TenantId,
        id: &SandboxId,
        timeout: Option<Duration>,
    ) -> Result<SandboxRecord, ManagerError> {
        self.resume_with(tenant, id, timeout, false).map(|(r, _)| r)
    }

    /// [`Self::resume`], ending every process but the agent first if
    /// `reboot` (what a filesystem-only pause already did).
    pub fn resume_with(
        &self,
        tenant: &TenantId,
        id: &SandboxId,
        timeout: Option<Duration>,
        reboot: bool,
    ) -> Result<(SandboxRecord, Resumed), ManagerError> {
        let live = self.owned_live(tenant, id)?;
        let mut lc = lock(&live.lifecycle);
        let Some(left) = lc.paused else {
            let record = self.get(tenant, id)?;
            return Err(ManagerError::NotPaused {
                id: id.clone(),
                state: record.state,
            });
        };
        let timeout = match timeout {
            Some(t) => self.cap_timeout(t)?,
            None => left,
        };
        let rebooted = reboot || lc.mode == PauseMode::Filesystem;
        if reboot && lc.mode == PauseMode::Full {
            // Still frozen: killed before any of them runs again.
            live.instance
                .end_all_but_agent()
                .map_err(tier_err(id, "end the sandbox's processes"))?;
        }
        live.instance
            .resume()
            .map_err(tier_err(id, "thaw the sandbox"))?;
        lc.paused = None;
        self.keep_lifecycle(id, &lc);
        self.events().publish(id, tenant, EventKind::Resumed);
        let store = self.store();
        store.transition(Scope::Tenant(tenant), id, SandboxState::Running, None)?;
        let record = store.extend_timeout(Scope::Tenant(tenant), id, timeout)?;
        Ok((record, Resumed { rebooted }))
    }

    /// Pause the sandbox (keeping what `mode` says) instead of ending it
    /// when its time to live runs out; `None` ends it (the default). A
    /// resume without a timeout then gives it `timeout` again.
    pub fn pause_on_timeout(
        &self,
        tenant: &TenantId,
        id: &SandboxId,
        mode: Option<PauseMode>,
        timeout: Duration,
    ) -> Result<(), ManagerError> {
        let live = self.owned_live(tenant, id)?;
        let mut lc = lock(&live.lifecycle);
        lc.on_timeout = mode;
        lc.timeout = Some(timeout);
        self.keep_lifecycle(id, &lc);
        Ok(())
    }

    /// How the sandbox is paused; `None` if it is not (or has ended).
    pub fn pause_mode(&self, id: &SandboxId) -> Option<PauseMode> {
        self.live_sandbox(id)?.pause_mode()
    }

    /// The sweeper found `live`'s time to live over: pause it if it asked
    /// for that and is running. `false`: end it.
    pub(crate) fn paused_on_timeout(&self, id: &SandboxId, live: &Live) -> bool {
        let (mode, timeout) = {
            let lc = lock(&live.lifecycle);
            match lc.on_timeout {
                Some(mode) if lc.paused.is_none() => (mode, lc.timeout),
                _ => return false,
            }
        };
        match self.pause_live(&live.tenant, id, live, mode, timeout) {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!("sandbox {id}: pause on timeout failed, ending it: {e}");
                false
            }
        }
    }

    /// `extend` on a paused sandbox: the new time to live counts from its
    /// resume. `None` if the sandbox is not one of `tenant`'s paused ones.
    pub(crate) fn extend_paused(
        &self,
        tenant: &TenantId,
        id: &SandboxId,
        timeout: Duration,
    ) -> Result<Option<SandboxRecord>, ManagerError> {
        let Some(live) = self.live_sandbox(id).filter(|l| &l.tenant == tenant) else {
            return Ok(None);
        };
        let mut lc = lock(&live.lifecycle);
        match &mut lc.paused {
            Some(left) => {
                *left = timeout;
                self.keep_lifecycle(id, &lc);
                Ok(Some(self.get(tenant, id)?))
            }
            None => Ok(None),
        }
    }

    /// A sample of the sandbox's resource use (running or paused).
    /// What the tier reports of a sandbox's resource use now, without
    /// taking a CPU sample (unlike [`SandboxManager::metrics`], whose
    /// `cpu_percent` is measured from one call to the next).
    pub fn usage(&self, tenant: &TenantId, id: &SandboxId) -> Result<Usage, ManagerError> {
        let live = self.owned_live(tenant, id)?;
        live.instance
            .usage()
            .map(|u| with_guest_memory(&live, u))
            .map_err(tier_err(id, "read the sandbox's resource use"))
    }

    pub fn metrics(
        &self,
        tenant: &TenantId,
        id: &SandboxId,
    ) -> Result<SandboxMetrics, ManagerError> {
        let live = self.owned_live(tenant, id)?;
        let record = self.get(tenant, id)?;
        let stats = live
            .instance
            .usage()
            .map(|u| with_guest_memory(&live, u))
            .map_err(tier_err(id, "read the sandbox's resource use"))?;
        let now = Instant::now();
        let timestamp = now_millis();
        let cpu = stats.cpu_ns.unwrap_or(0);
        let mut lc = lock(&live.lifecycle);
        let since = since(lc.last_sample, now, cpu, timestamp, record.created_at);
        lc.last_sample = Some((now, cpu));
        let state = if lc.paused.is_some() {
            SandboxState::Paused
        } else {
            record.state
        };
        Ok(sample(&stats, since, state, timestamp))
    }

    /// Add a sample to the series of every running sandbox whose next one
    /// is due ([`ManagerConfig::metrics_interval`] after its last; the
    /// sweeper calls this on each of its ticks). Paused ones are skipped:
    /// nothing changes in a frozen sandbox, and E2B records nothing for
    /// them either.
    ///
    /// [`ManagerConfig::metrics_interval`]: crate::ManagerConfig::metrics_interval
    pub(crate) fn sample_series(&self) {
        let every = self.config().metrics_interval;
        let due = |l: &Live| {
            lock(&l.lifecycle)
                .series_last
                .is_none_or(|(at, _)| at.elapsed() + every / 10 >= every)
        };
        // Copied out first: no sandbox's lock is taken under the map's.
        let live: Vec<(SandboxId, Arc<Live>)> = lock(&self.live)
            .iter()
            .map(|(id, l)| (id.clone(), Arc::clone(l)))
            .collect();
        for (id, l) in live {
            if !l.is_paused() && due(&l) {
                self.sample_into_series(&id, &l);
            }
        }
    }

    /// Take one sample into `live`'s series; `None` if the tier could not
    /// say (a sandbox ending meanwhile).
    fn sample_into_series(&self, id: &SandboxId, live: &Arc<Live>) -> Option<()> {
        let stats = with_guest_memory(live, live.instance.usage().ok()?);
        let now = Instant::now();
        let timestamp = now_millis();
        let cpu = stats.cpu_ns.unwrap_or(0);
        let prev = lock(&live.lifecycle).series_last;
        // The first sample is over the time since the sandbox started.
        let created = match prev {
            Some(_) => 0,
            None => self.store().get_sandbox(Scope::Daemon, id).ok()?.created_at,
        };
        let since = since(prev, now, cpu, timestamp, created);
        let mut lc = lock(&live.lifecycle);
        if lc.series_last != prev {
            // Another sample went in meanwhile (the sweeper's and a
            // request's, at once): one is the series' sample.
            return Some(());
        }
        lc.series_last = Some((now, cpu));
        if lc.series.len() == SERIES_KEEP {
            lc.series.pop_front();
        }
        lc.series
            .push_back(sample(&stats, since, SandboxState::Running, timestamp));
        Some(())
    }

    /// The samples of the sandbox's metrics series taken from `from` to
    /// `to` (milliseconds since the epoch, both included), oldest first.
    /// A running sandbox with no sample yet (created since the last tick)
    /// gets its first one now, so a live sandbox's series is never empty.
    pub fn metrics_series(
        &self,
        tenant: &TenantId,
        id: &SandboxId,
        from: UnixMillis,
        to: UnixMillis,
    ) -> Result<Vec<SandboxMetrics>, ManagerError> {
        let live = self.owned_live(tenant, id)?;
        let empty = lock(&live.lifecycle).series.is_empty();
        if empty && !live.is_paused() {
            self.sample_into_series(id, &live);
        }
        let lc = lock(&live.lifecycle);
        Ok(lc
            .series
            .iter()
            .filter(|s| (from..=to).contains(&s.timestamp))
            .cloned()
            .collect())
    }

    /// How many of this daemon's sandboxes are running and paused.
    pub fn live_counts(&self) -> LiveCounts {
        let live: Vec<Arc<Live>> = lock(&self.live).values().cloned().collect();
        let mut counts = LiveCounts::default();
        for l in live {
            if l.is_paused() {
                counts.paused += 1;
            } else {
                counts.running += 1;
            }
        }
        counts
    }
}

/// `usage` with the guest's own figure for its memory in use, where only
/// its kernel can tell ([`brig_core::Instance::memory_in_guest`]): the
/// last one read. A read (`/proc/meminfo` through the agent) runs on a
/// thread of its own, started here when none is under way and the
/// sandbox is not paused, so a guest slow to answer holds up neither the
/// sweeper nor the request; until the first one is in, the tier's figure
/// stands.
fn with_guest_memory(live: &Arc<Live>, mut usage: Usage) -> Usage {
    if !live.instance.memory_in_guest() {
        return usage;
    }
    let start = {
        let mut lc = lock(&live.lifecycle);
        if let Some(used) = lc.guest_memory {
            usage.memory_bytes = used.min(usage.memory_limit_bytes);
        }
        let start = !lc.guest_reading && lc.paused.is_none();
        lc.guest_reading |= start;
        start
    };
    if start {
        let reader = Arc::clone(live);
        let spawned = std::thread::Builder::new()
            .name("brig-guest-mem".into())
            .spawn(move || {
                let used = guest_memory_used(&reader.conn);
                let mut lc = lock(&reader.lifecycle);
                lc.guest_reading = false;
                if used.is_some() {
                    lc.guest_memory = used;
                }
            });
        if spawned.is_err() {
            lock(&live.lifecycle).guest_reading = false;
        }
    }
    usage
}

/// What the guest's kernel says of its memory: `MemTotal` less
/// `MemAvailable` (what `free` counts as used: page cache it can drop is
/// not).
fn guest_memory_used(conn: &brig_agent_client::Connection) -> Option<u64> {
    use std::io::Read;
    let mut text = String::new();
    conn.read_file("/proc/meminfo")
        .ok()?
        .take(64 << 10)
        .read_to_string(&mut text)
        .ok()?;
    meminfo_used(&text)
}

fn meminfo_used(meminfo: &str) -> Option<u64> {
    let field = |name: &str| {
        meminfo.lines().find_map(|l| {
            l.strip_prefix(name)?
                .strip_prefix(':')?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse::<u64>()
                .ok()
                .map(|kib| kib << 10)
        })
    };
    Some(field("MemTotal")?.saturating_sub(field("MemAvailable")?))
}
/// The wall time and CPU time between the previous sample `prev` (when, CPU
/// ns) and now; with none, since the sandbox's creation (`created`, ms).
fn since(
    prev: Option<(Instant, u64)>,
    now: Instant,
    cpu: u64,
    timestamp: UnixMillis,
    created: UnixMillis,
) -> (Duration, u64) {
    match prev {
        Some((at, before)) => (now.duration_since(at), cpu.saturating_sub(before)),
        None => {
            let wall = timestamp.saturating_sub(created).max(0) as u64;
            (Duration::from_millis(wall), cpu)
        }
    }
}

/// One sample from the tier's reading and the interval it covers:
/// `cpu_percent` is the CPU time over the wall time (100 = one core).
fn sample(
    stats: &Usage,
    (wall, used): (Duration, u64),
    state: SandboxState,
    timestamp: UnixMillis,
) -> SandboxMetrics {
    let cpu_percent = (!wall.is_zero() && stats.cpu_ns.is_some()).then(|| {
        let pct = used as f64 / wall.as_nanos() as f64 * 100.0;
        (pct * 100.0).round() / 100.0
    });
    SandboxMetrics {
        cpu_usage_ns: stats.cpu_ns.unwrap_or(0),
        cpu_percent,
        memory_bytes: stats.memory_bytes,
        memory_peak_bytes: stats.memory_peak_bytes,
        memory_limit_bytes: stats.memory_limit_bytes,
        disk_used_bytes: stats.disk_used_bytes,
        disk_total_bytes: stats.disk_total_bytes,
        pids: stats.pids,
        oom_kills: stats.oom_kills,
        state,
        timestamp,
    }
}

#[cfg(test)]
mod tests {
    use super::meminfo_used;

    #[test]
    fn guest_memory_in_use_is_total_less_available() {
        let meminfo = "MemTotal:         490820 kB\nMemFree:          300000 kB\n\
                       MemAvailable:     400820 kB\nBuffers:            1000 kB\n";
        assert_eq!(meminfo_used(meminfo), Some(90000 << 10));
        // A kernel too old to say what is available: not known.
        assert_eq!(meminfo_used("MemTotal: 490820 kB\nMemFree: 1 kB\n"), None);
        assert_eq!(meminfo_used(""), None);
    }
}
