//! Child processes: spawning with pipes or a PTY, and the per-process
//! output queue that sits between the child's pipes and the client's
//! stream.
//!
//! The queue is where back-pressure happens. A foreground process's queue
//! holds at most [`FOREGROUND_QUEUE`] bytes; while it is full the agent
//! stops reading the child's pipes, the pipe fills, and the child blocks in
//! write(2). The queue drains only as fast as the stream's send window
//! allows, so a child writing gigabytes costs the agent a bounded amount of
//! memory. A background process must never block on a client that may
//! never come, so while none is attached its queue is a ring of
//! [`BACKGROUND_QUEUE`] bytes that drops the oldest output; `ATTACH`
//! replays what is left. Once a client is attached, it paces the process
//! as it would a foreground one (up to [`BACKGROUND_QUEUE`] queued), so an
//! attached client loses nothing.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use brig_protocol::message::{ExecRequest, CHANNEL_STDERR, CHANNEL_STDOUT, MAX_META};

use crate::logs::Logs;
use crate::sys::{self, WaitStatus};
use crate::users;

/// Queue bound of a foreground process before the agent stops reading it.
pub const FOREGROUND_QUEUE: usize = 64 << 10;
/// Output kept for a background process (the last 1 MiB).
pub const BACKGROUND_QUEUE: usize = 1 << 20;
/// Bytes read from a child pipe at a time.
const READ_CHUNK: usize = 64 << 10;

/// Which output descriptor of a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pipe {
    Stdout,
    Stderr,
}

#[derive(Debug)]
pub struct Proc {
    pub pid: i32,
    pub argv: Vec<String>,
    /// The host's note about it (`ExecRequest::meta`).
    pub meta: Option<String>,
    pub background: bool,
    /// The stream the process's output goes to, if a client is attached.
    pub attached: Option<u32>,
    pub status: Option<WaitStatus>,
    /// When `status` came.
    pub exited_at: Option<Instant>,
    /// With a PTY, `stdout` is the master and is also where stdin goes.
    pub pty: bool,
    pub stdout: Option<File>,
    pub stderr: Option<File>,
    pub stdin: Option<File>,
    /// stdin bytes received but not yet written to the child. Bounded by
    /// the stream's receive window.
    pub stdin_buf: VecDeque<u8>,
    /// The client closed stdin; close the child's once `stdin_buf` drains.
    pub stdin_eof: bool,
    /// The terminal size a client last asked for, and when to make sure
    /// it holds ([`Proc::resize`]).
    resized: Option<(Instant, u16, u16)>,
    queue: VecDeque<(u8, Vec<u8>)>,
    queued: usize,
    pub dropped: u64,
}

/// Why a process could not be started.
#[derive(Debug)]
pub enum SpawnError {
    Invalid(String),
    Io(String, io::Error),
}

impl Proc {
    pub fn spawn(req: &ExecRequest) -> Result<Proc, SpawnError> {
        let Some(program) = req.argv.first() else {
            return Err(SpawnError::Invalid("argv is empty".into()));
        };
        if req.meta.as_ref().is_some_and(|m| m.len() > MAX_META) {
            return Err(SpawnError::Invalid(format!(
                "meta is longer than {MAX_META} bytes"
            )));
        }
        // A missing working directory would fail the spawn with ENOENT,
        // which reads as "command not found": say what is missing.
        if let Some(cwd) = &req.cwd {
            match std::fs::metadata(cwd) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => {
                    return Err(SpawnError::Invalid(format!(
                        "the working directory {cwd} is not a directory"
                    )))
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    return Err(SpawnError::Invalid(format!(
                        "the working directory {cwd} does not exist in the sandbox: create it \
                         first (mkdir -p) or choose another"
                    )))
                }
                // Anything else (a permission the user lacks) is for the
                // spawn itself to report.
                Err(_) => {}
            }
        }
        let mut cmd = Command::new(program);
        cmd.args(&req.argv[1..]);
        let identity = Identity::resolve(req)?;
        // The environment, as envd builds it: the agent's own (PATH and the
        // template's variables), then the user's HOME, USER and LOGNAME,
        // then the request's variables, which win.
        if let Some(account) = &identity.account {
            cmd.env("HOME", &account.home)
                .env("USER", &account.name)
                .env("LOGNAME", &account.name);
        }
        if std::env::var_os("PATH").is_none() {
            cmd.env("PATH", DEFAULT_PATH);
        }
        cmd.envs(&req.env);
        if let Some(cwd) = &req.cwd {
            cmd.current_dir(cwd);
        }
        if let Some((uid, gid, groups)) = identity.credentials() {
            // SAFETY: the hook runs in the forked child before exec and only
            // makes async-signal-safe syscalls (setgroups, setgid, setuid)
            // on data built before the fork; it allocates nothing. std's own
            // `Command::uid` cannot be used: it drops every supplementary
            // group, and a `pre_exec` hook runs only after it.
            unsafe {
                cmd.pre_exec(move || sys::switch_user(uid, gid, &groups));
            }
        }
        let what = || format!("cannot start {program}");
        let mut proc = Proc {
            pid: 0,
            argv: req.argv.clone(),
            meta: req.meta.clone(),
            background: req.background,
            attached: None,
            status: None,
            pty: req.pty.is_some(),
            stdout: None,
            stderr: None,
            stdin: None,
            stdin_buf: VecDeque::new(),
            stdin_eof: false,
            resized: None,
            queue: VecDeque::new(),
            queued: 0,
            dropped: 0,
            exited_at: None,
        };
        if let Some(size) = req.pty {
            let (master, slave) =
                sys::openpty(size.rows, size.cols).map_err(|e| SpawnError::Io(what(), e))?;
            let dup = |fd: &OwnedFd| fd.try_clone().map_err(|e| SpawnError::Io(what(), e));
            cmd.stdin(Stdio::from(dup(&slave)?))
                .stdout(Stdio::from(dup(&slave)?))
                .stderr(Stdio::from(slave));
            // SAFETY: the hook runs in the forked child before exec and only
            // makes async-signal-safe syscalls (setsid, ioctl) on fd 0, which
            // std has already pointed at the PTY slave. A new session with
            // the slave as controlling terminal is what makes the child a
            // proper terminal job: ^C, SIGWINCH and `tty` work.
            unsafe {
                cmd.pre_exec(|| {
                    if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                        return Err(io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
            let child = cmd.spawn().map_err(|e| SpawnError::Io(what(), e))?;
            // `cmd` still holds copies of the slave; drop it so that reading
            // the master reports EIO once the child's side is closed.
            drop(cmd);
            let master = File::from(master);
            sys::set_nonblocking(&master).map_err(|e| SpawnError::Io(what(), e))?;
            proc.stdin = Some(master.try_clone().map_err(|e| SpawnError::Io(what(), e))?);
            proc.stdout = Some(master);
            proc.pid = child.id() as i32;
        } else {
            // Each child leads its own process group so that cancelling it
            // also kills whatever it started.
            cmd.stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .process_group(0);
            let mut child = cmd.spawn().map_err(|e| SpawnError::Io(what(), e))?;
            let to_file = |fd: OwnedFd| -> Result<File, SpawnError> {
                let f = File::from(fd);
                sys::set_nonblocking(&f).map_err(|e| SpawnError::Io(what(), e))?;
                Ok(f)
            };
            proc.stdin = child
                .stdin
                .take()
                .map(OwnedFd::from)
                .map(to_file)
                .transpose()?;
            proc.stdout = child
                .stdout
                .take()
                .map(OwnedFd::from)
                .map(to_file)
                .transpose()?;
            proc.stderr = child
                .stderr
                .take()
                .map(OwnedFd::from)
                .map(to_file)
                .transpose()?;
            proc.pid = child.id() as i32;
        }
        // The `Child` is dropped without waiting: the agent reaps with
        // waitpid(-1) when its SIGCHLD signalfd fires.
        Ok(proc)
    }

    fn cap(&self) -> usize {
        if self.background {
            BACKGROUND_QUEUE
        } else {
            FOREGROUND_QUEUE
        }
    }

    /// Output with nobody to take it: a background process no client is
    /// attached to. Only that output is kept in a ring that drops the
    /// oldest; everything else waits for its client.
    fn unattended(&self) -> bool {
        self.background && self.attached.is_none()
    }

    /// Whether the agent should read this process's output now. A
    /// background process with a client attached is paced by that client
    /// like a foreground one (it blocks in write(2) once its queue is
    /// full), so the client sees every byte; with none it never blocks.
    pub fn wants_output(&self) -> bool {
        self.unattended() || self.queued < self.cap()
    }

    /// Read what is available from one pipe into the queue. Returns false
    /// once the pipe has ended (and closes it).
    pub fn read_pipe(&mut self, which: Pipe, log: &mut Logs) -> bool {
        let (slot, channel) = match which {
            Pipe::Stdout => (&mut self.stdout, CHANNEL_STDOUT),
            Pipe::Stderr => (&mut self.stderr, CHANNEL_STDERR),
        };
        let Some(file) = slot else { return false };
        let mut buf = vec![0; READ_CHUNK];
        match file.read(&mut buf) {
            Ok(0) => {
                *slot = None;
                false
            }
            Ok(n) => {
                buf.truncate(n);
                // What a background process prints is the sandbox's log; a
                // PTY's output is a terminal session, not a log.
                if self.background && !self.pty {
                    log.append(self.pid, channel, &buf);
                }
                self.queued += n;
                self.queue.push_back((channel, buf));
                while self.unattended() && self.queued > BACKGROUND_QUEUE {
                    if let Some((_, old)) = self.queue.pop_front() {
                        self.queued -= old.len();
                        self.dropped += old.len() as u64;
                    }
                }
                true
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => true,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => true,
            // EIO is how a PTY master reports that the slave side is gone.
            Err(_) => {
                *slot = None;
                false
            }
        }
    }

    /// Once the process has exited: where a PTY master never reports that
    /// the slave side closed (gVisor's: [`sys::pty_reports_hangup`]), its
    /// output ends with the process, so what is buffered now is read and
    /// the master let go. (Linux's says so itself, after whatever the
    /// process left running has written too.)
    pub fn end_pty_without_hangup(&mut self, log: &mut Logs) {
        if !self.pty || self.status.is_none() || sys::pty_reports_hangup() {
            return;
        }
        while self.stdout.is_some() {
            let before = self.queued as u64 + self.dropped;
            if !self.read_pipe(Pipe::Stdout, log) {
                break;
            }
            if self.queued as u64 + self.dropped == before {
                // Nothing more to read: it would block.
                self.stdout = None;
            }
        }
    }

    /// How long after its exit a process's output may still come: from
    /// what it started in the background and did not wait for (`echo a &`),
    /// which still holds the pipes (or the terminal). After that, what
    /// still holds them is an orphan that would keep the command from
    /// ending forever; like E2B's envd, the command ends with its process.
    pub const OUTPUT_GRACE: Duration = Duration::from_millis(100);

    /// When [`Proc::end_orphaned_output`] should look at this process
    /// next: exited, its output still open and being read (a consumer
    /// that holds the output back gets its say first).
    pub fn output_deadline(&self) -> Option<Instant> {
        let open = self.stdout.is_some() || self.stderr.is_some();
        (open && self.wants_output())
            .then_some(self.exited_at)
            .flatten()
            .map(|t| t + Self::OUTPUT_GRACE)
    }

    /// How long after a resize the size is checked again.
    pub const RESIZE_RECHECK: Duration = Duration::from_millis(100);

    /// Set the PTY's size, and look again [`Proc::RESIZE_RECHECK`] later.
    /// A program that reads the size and writes it back (readline does,
    /// each time it draws a prompt: `TIOCGWINSZ` then `TIOCSWINSZ` with
    /// what it read) undoes a resize that lands between its two calls.
    /// On Linux that window is two syscalls wide; under gVisor's ptrace
    /// platform, on a loaded host, a resize sent as a shell returns to its
    /// prompt was lost about once in a hundred. The client's size is the
    /// one it sees and must stay the terminal's.
    pub fn resize(&mut self, rows: u16, cols: u16) -> io::Result<()> {
        let Some(master) = self.stdout.as_ref().filter(|_| self.pty) else {
            return Err(io::Error::from_raw_os_error(libc::ENOTTY));
        };
        sys::set_winsize(master, rows, cols)?;
        self.resized = Some((Instant::now() + Self::RESIZE_RECHECK, rows, cols));
        Ok(())
    }

    /// Once the recheck is due: set the size the client asked for again if
    /// something put back an older one meanwhile.
    pub fn recheck_size(&mut self, now: Instant) {
        let Some((due, rows, cols)) = self.resized else {
            return;
        };
        if due > now {
            return;
        }
        self.resized = None;
        let Some(master) = self.stdout.as_ref().filter(|_| self.pty) else {
            return;
        };
        if sys::winsize(master).is_ok_and(|size| size != (rows, cols)) {
            let _ = sys::set_winsize(master, rows, cols);
        }
    }

    /// When the poll loop must wake for this process: its output grace
    /// ends or a resize is to be checked.
    pub fn next_deadline(&self) -> Option<Instant> {
        let recheck = self.resized.map(|(due, _, _)| due);
        match (self.output_deadline(), recheck) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Past the grace after its exit: read what is in the pipes now (all
    /// the process itself wrote is there) and close them.
    pub fn end_orphaned_output(&mut self, now: Instant, log: &mut Logs) {
        if self.output_deadline().is_none_or(|d| d > now) {
            return;
        }
        for which in [Pipe::Stdout, Pipe::Stderr] {
            loop {
                let before = self.queued as u64 + self.dropped;
                if !self.read_pipe(which, log) || !self.wants_output() {
                    break;
                }
                if self.queued as u64 + self.dropped == before {
                    // Empty: what comes later is an orphan's.
                    match which {
                        Pipe::Stdout => self.stdout = None,
                        Pipe::Stderr => self.stderr = None,
                    }
                    break;
                }
            }
        }
    }

    /// The next output chunk, at most `max` bytes of it.
    pub fn take_output(&mut self, max: usize) -> Option<(u8, Vec<u8>)> {
        let (channel, front) = self.queue.front_mut()?;
        let channel = *channel;
        let chunk = if front.len() <= max {
            self.queue.pop_front().map(|(_, b)| b).unwrap_or_default()
        } else {
            let rest = front.split_off(max);
            std::mem::replace(front, rest)
        };
        self.queued -= chunk.len();
        Some((channel, chunk))
    }

    /// Exited, all output read from the pipes and handed on.
    pub fn is_finished(&self) -> bool {
        self.status.is_some()
            && self.stdout.is_none()
            && self.stderr.is_none()
            && self.queue.is_empty()
    }

    /// Write buffered stdin to the child. Returns how many bytes left the
    /// buffer (written, or discarded because the child closed its stdin).
    pub fn write_stdin(&mut self) -> usize {
        let mut done = 0;
        while !self.stdin_buf.is_empty() {
            let Some(file) = &mut self.stdin else {
                done += self.stdin_buf.len();
                self.stdin_buf.clear();
                break;
            };
            let (front, _) = self.stdin_buf.as_slices();
            match file.write(front) {
                Ok(n) => {
                    self.stdin_buf.drain(..n);
                    done += n;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // EPIPE: the child closed its stdin; nobody will read the rest.
                Err(_) => self.stdin = None,
            }
        }
        if self.stdin_buf.is_empty() && self.stdin_eof {
            self.close_stdin();
        }
        done
    }

    fn close_stdin(&mut self) {
        if self.pty {
            // A PTY has no half-close: send the terminal's EOF character,
            // which ends a read at the start of a line.
            if let Some(f) = &mut self.stdin {
                let _ = f.write(&[0x04]);
            }
            self.stdin_eof = false;
            return;
        }
        self.stdin = None;
    }

    pub fn stdin_fd(&self) -> Option<i32> {
        self.stdin.as_ref().map(|f| f.as_raw_fd())
    }
}

/// PATH for a process when the agent itself has none.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Who a process runs as: the request's user name or uid/gid, with the
/// account from the sandbox's /etc/passwd when there is one.
#[derive(Debug)]
struct Identity {
    uid: Option<u32>,
    gid: Option<u32>,
    account: Option<users::Account>,
}

impl Identity {
    /// A name must exist in /etc/passwd; a bare uid need not (it then gets
    /// no HOME/USER/LOGNAME and no supplementary groups). An explicit
    /// uid or gid wins over the name's.
    fn resolve(req: &ExecRequest) -> Result<Identity, SpawnError> {
        let account = match (&req.user, req.uid) {
            (Some(name), _) => Some(users::by_name(name).ok_or_else(|| {
                SpawnError::Invalid(format!("no user named {name:?} in /etc/passwd"))
            })?),
            (None, Some(uid)) => users::by_uid(uid),
            (None, None) => None,
        };
        // A uid that names another account than `user` keeps the name's
        // environment but not its groups (see `credentials`).
        Ok(Identity {
            uid: req.uid.or(account.as_ref().map(|a| a.uid)),
            gid: req.gid.or(account.as_ref().map(|a| a.gid)),
            account,
        })
    }

    /// (uid, gid, supplementary groups) to switch to, if anything is to
    /// change. Without a uid the process keeps the agent's; a gid alone
    /// changes only the group.
    fn credentials(&self) -> Option<(u32, u32, Vec<libc::gid_t>)> {
        if self.uid.is_none() && self.gid.is_none() {
            return None;
        }
        let (my_uid, my_gid) = sys::current_ids();
        let uid = self.uid.unwrap_or(my_uid);
        let gid = self.gid.unwrap_or(my_gid);
        let groups = match &self.account {
            // The account's groups only when it really is the user started.
            Some(a) if a.uid == uid => users::groups_of(&a.name, gid),
            _ => vec![gid],
        };
        Some((uid, gid, groups))
    }
}
