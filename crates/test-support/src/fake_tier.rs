//! A [`Tier`] without isolation, for unit tests of the runtime (manager,
//! pool, expiry, pause/resume, reconcile) that need neither root nor a
//! kernel feature.
//!
//! Each "sandbox" is the real brig-agent running `--listen` as a plain
//! child process of the test, on a socket in a temporary directory, so
//! everything the runtime does over the agent protocol is real. What the
//! process tier does with cgroups is bookkept instead: pause stops the
//! agent (SIGSTOP), limits are recorded, usage is read from `/proc`. The
//! tier also records every call, so tests can assert on what the runtime
//! asked for. Launches can be made to fail ([`FakeTier::fail_launches`]).

use std::collections::HashMap;
use std::fs;
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use brig_core::{Ended, Instance, Isolation, Launch, Limits, SandboxId, Tier, TierError, Usage};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One call the runtime made, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    Launch(SandboxId),
    Adopt(SandboxId),
    Discard(SandboxId),
    Pause(SandboxId),
    Resume(SandboxId),
    SetLimits(SandboxId),
    Kill(SandboxId),
    Release(SandboxId),
}

#[derive(Debug)]
struct Running {
    child: Child,
    socket: PathBuf,
    /// Stopped (SIGSTOP) by a pause: outlives the instance handle, as a
    /// frozen cgroup does.
    paused: bool,
}

#[derive(Debug, Default)]
struct State {
    calls: Vec<Call>,
    /// What runs, by id: survives the instance handles (as a process
    /// tier's sandboxes survive the daemon), so `adopt` can find them.
    running: HashMap<SandboxId, Arc<Mutex<Option<Running>>>>,
    /// The agent of the next launch, if not the real one.
    next_agent: Option<PathBuf>,
}

/// See the module documentation.
#[derive(Debug, Clone)]
pub struct FakeTier {
    agent: PathBuf,
    dir: Arc<tempfile::TempDir>,
    state: Arc<Mutex<State>>,
    fail: Arc<AtomicUsize>,
    fail_pauses: Arc<AtomicUsize>,
}

impl FakeTier {
    /// A tier whose sandboxes run `agent` (the brig-agent binary).
    pub fn new(agent: &Path) -> FakeTier {
        FakeTier {
            agent: agent.to_path_buf(),
            dir: Arc::new(tempfile::tempdir().expect("a temporary directory")),
            state: Arc::default(),
            fail: Arc::default(),
            fail_pauses: Arc::default(),
        }
    }

    /// Make the next `n` pauses fail as a freezer that did not settle
    /// does ([`TierError::Busy`]), leaving the sandbox running.
    pub fn fail_pauses(&self, n: usize) {
        self.fail_pauses.store(n, Ordering::SeqCst);
    }

    /// Make the next `n` launches fail.
    pub fn fail_launches(&self, n: usize) {
        self.fail.store(n, Ordering::SeqCst);
    }

    /// Every call so far.
    pub fn calls(&self) -> Vec<Call> {
        lock(&self.state).calls.clone()
    }

    /// How many sandboxes run now.
    pub fn live(&self) -> usize {
        lock(&self.state)
            .running
            .values()
            .filter(|r| lock(r).is_some())
            .count()
    }

    fn record(&self, call: Call) {
        lock(&self.state).calls.push(call);
    }

    /// Start the next sandbox with `agent` instead of the real one (a
    /// hostile program standing in for a compromised agent).
    pub fn use_agent_once(&self, agent: &Path) {
        lock(&self.state).next_agent = Some(agent.to_path_buf());
    }

    /// Stop sandbox `id` (SIGSTOP) without it reading as paused: what a v1
    /// freezer left FREEZING looks like (a daemon that died mid-pause, a
    /// task caught mid-way): its agent does not answer, and `is_paused`
    /// says no.
    pub fn stop_unreported(&self, id: &SandboxId) {
        let slot = lock(&self.state).running.get(id).cloned();
        if let Some(r) = slot
            .as_ref()
            .and_then(|s| lock(s).as_ref().map(|r| r.child.id()))
        {
            if let Some(pid) = rustix::process::Pid::from_raw(r as i32) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::STOP);
            }
        }
    }

    fn instance(&self, id: &SandboxId, slot: Arc<Mutex<Option<Running>>>) -> FakeInstance {
        FakeInstance {
            id: id.clone(),
            tier: self.clone(),
            slot,
            limits: Mutex::new(None),
            released: AtomicBool::new(false),
            ended: Mutex::new(None),
        }
    }
}

impl Tier for FakeTier {
    fn isolation(&self) -> Isolation {
        Isolation::Process
    }

    fn launch(&self, launch: &Launch) -> Result<Box<dyn Instance>, TierError> {
        self.record(Call::Launch(launch.id.clone()));
        if self
            .fail
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(TierError::failed(
                &launch.id,
                "start the sandbox",
                "the fake tier was told to fail",
            ));
        }
        let socket = self.dir.path().join(format!("{}.sock", launch.id));
        let listener = UnixListener::bind(&socket)
            .map_err(|e| TierError::failed(&launch.id, "bind the agent socket", e))?;
        let agent = lock(&self.state)
            .next_agent
            .take()
            .unwrap_or_else(|| self.agent.clone());
        let child = Command::new(&agent)
            .arg("--listen")
            .stdin(Stdio::from(OwnedFd::from(listener)))
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| TierError::failed(&launch.id, "start the agent", e))?;
        let slot = Arc::new(Mutex::new(Some(Running {
            child,
            socket,
            paused: false,
        })));
        lock(&self.state)
            .running
            .insert(launch.id.clone(), Arc::clone(&slot));
        Ok(Box::new(self.instance(&launch.id, slot)))
    }

    fn adopt(&self, id: &SandboxId) -> Result<Option<Box<dyn Instance>>, TierError> {
        self.record(Call::Adopt(id.clone()));
        let slot = lock(&self.state).running.get(id).cloned();
        Ok(slot
            .filter(|s| lock(s).is_some())
            .map(|s| Box::new(self.instance(id, s)) as Box<dyn Instance>))
    }

    fn discard(&self, id: &SandboxId) -> Result<(), TierError> {
        self.record(Call::Discard(id.clone()));
        let slot = lock(&self.state).running.remove(id);
        if let Some(slot) = slot {
            end(&slot);
        }
        Ok(())
    }

    fn running(&self) -> Vec<SandboxId> {
        lock(&self.state)
            .running
            .iter()
            .filter(|(_, r)| lock(r).is_some())
            .map(|(id, _)| id.clone())
            .collect()
    }
}

/// Kill and reap the agent, if it still runs.
fn end(slot: &Mutex<Option<Running>>) -> Option<i32> {
    let mut running = lock(slot).take()?;
    let _ = running.child.kill();
    let status = running.child.wait().ok();
    let _ = fs::remove_file(&running.socket);
    status.map(|s| {
        use std::os::unix::process::ExitStatusExt;
        s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0))
    })
}

/// One fake sandbox.
#[derive(Debug)]
pub struct FakeInstance {
    id: SandboxId,
    tier: FakeTier,
    slot: Arc<Mutex<Option<Running>>>,
    limits: Mutex<Option<Limits>>,
    released: AtomicBool,
    ended: Mutex<Option<Ended>>,
}

impl FakeInstance {
    fn set_paused(&self, paused: bool) {
        if let Some(r) = lock(&self.slot).as_mut() {
            r.paused = paused;
        }
    }

    fn signal(&self, sig: rustix::process::Signal) {
        if let Some(r) = lock(&self.slot).as_ref() {
            if let Some(pid) = rustix::process::Pid::from_raw(r.child.id() as i32) {
                let _ = rustix::process::kill_process(pid, sig);
            }
        }
    }
}

impl Instance for FakeInstance {
    fn id(&self) -> &SandboxId {
        &self.id
    }

    fn pid(&self) -> Option<u32> {
        lock(&self.slot).as_ref().map(|r| r.child.id())
    }

    fn connect_agent(&self) -> Result<UnixStream, TierError> {
        let socket = lock(&self.slot)
            .as_ref()
            .map(|r| r.socket.clone())
            .ok_or_else(|| TierError::Gone {
                id: self.id.clone(),
            })?;
        UnixStream::connect(socket).map_err(|e| TierError::failed(&self.id, "connect", e))
    }

    fn pause(&self) -> Result<(), TierError> {
        self.tier.record(Call::Pause(self.id.clone()));
        let busy = self
            .tier
            .fail_pauses
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if busy {
            return Err(TierError::Busy {
                id: self.id.clone(),
                op: "pause the sandbox",
                reason: "the fake tier was told to fail".into(),
            });
        }
        self.signal(rustix::process::Signal::STOP);
        self.set_paused(true);
        Ok(())
    }

    fn resume(&self) -> Result<(), TierError> {
        self.tier.record(Call::Resume(self.id.clone()));
        self.signal(rustix::process::Signal::CONT);
        self.set_paused(false);
        Ok(())
    }

    fn is_paused(&self) -> Result<bool, TierError> {
        Ok(lock(&self.slot).as_ref().is_some_and(|r| r.paused))
    }

    fn end_all_but_agent(&self) -> Result<usize, TierError> {
        Ok(0)
    }

    fn usage(&self) -> Result<Usage, TierError> {
        let limit = lock(&self.limits)
            .as_ref()
            .map_or(Limits::default().memory.bytes(), |l| l.memory.bytes());
        Ok(Usage {
            cpu_ns: Some(0),
            memory_bytes: 0,
            memory_peak_bytes: None,
            memory_limit_bytes: limit,
            pids: 1,
            disk_used_bytes: None,
            disk_total_bytes: None,
            oom_kills: None,
        })
    }

    fn set_limits(&self, limits: &Limits) -> Result<(), TierError> {
        self.tier.record(Call::SetLimits(self.id.clone()));
        *lock(&self.limits) = Some(limits.clone());
        Ok(())
    }

    fn kill(&self) {
        self.tier.record(Call::Kill(self.id.clone()));
        self.signal(rustix::process::Signal::CONT);
        self.signal(rustix::process::Signal::KILL);
    }

    fn wait(&self) -> Result<Ended, TierError> {
        let mut ended = lock(&self.ended);
        if ended.is_none() {
            let code = end(&self.slot);
            lock(&self.tier.state).running.remove(&self.id);
            *ended = Some(Ended { code, oom: false });
        }
        Ok(ended.clone().unwrap_or_default())
    }

    fn release(&self) {
        self.tier.record(Call::Release(self.id.clone()));
        self.released.store(true, Ordering::SeqCst);
    }
}

impl Drop for FakeInstance {
    fn drop(&mut self) {
        if !self.released.load(Ordering::SeqCst) && lock(&self.ended).is_none() {
            self.kill();
            let _ = self.wait();
        }
    }
}
