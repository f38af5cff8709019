//! One thread reads every agent connection of the process.
//!
//! A daemon holds one connection per sandbox; a reader thread each would
//! cost ten thousand threads (and host pids) at ten thousand sandboxes.
//! Instead every connection's read half is registered here: one thread
//! waits on all of them with epoll (mio), reads whatever arrived without
//! blocking (`recv` with `MSG_DONTWAIT`: the socket itself stays blocking,
//! since writers share its open file and write whole frames), decodes and
//! routes the frames exactly as a dedicated reader would
//! ([`Shared::dispatch`] never waits for a consumer).
//!
//! The rare frame the reader must answer (a Pong, a Reset of a stream the
//! agent should not have opened) is written from a short-lived thread of
//! its own: a write may block on a full socket, and this thread must
//! never block.

use std::collections::HashMap;
use std::io::ErrorKind;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use brig_protocol::Decoder;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Registry, Token};

use crate::connection::Shared;
use crate::stream::Dead;

/// How much one `recv` asks for.
const READ_CHUNK: usize = 64 << 10;

/// A registered connection: its read half and what has been read of it.
struct Entry {
    sock: Arc<UnixStream>,
    decoder: Decoder,
    shared: Arc<Shared>,
}

pub(crate) struct Reactor {
    registry: Registry,
    entries: Mutex<HashMap<usize, Arc<Mutex<Entry>>>>,
    next: Mutex<usize>,
}

impl std::fmt::Debug for Reactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reactor").finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Reactor {
    /// The process's reactor, started on first use.
    pub(crate) fn get() -> Result<&'static Reactor, std::io::Error> {
        static REACTOR: OnceLock<Result<Reactor, String>> = OnceLock::new();
        REACTOR
            .get_or_init(|| Reactor::start().map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| std::io::Error::other(e.clone()))
    }

    fn start() -> Result<Reactor, std::io::Error> {
        let poll = Poll::new()?;
        let registry = poll.registry().try_clone()?;
        std::thread::Builder::new()
            .name("brig-agent-reactor".into())
            .spawn(move || run(poll))?;
        Ok(Reactor {
            registry,
            entries: Mutex::new(HashMap::new()),
            next: Mutex::new(0),
        })
    }

    /// Read `sock` from now on, routing its frames to `shared`. `decoder`
    /// may already hold bytes (what arrived with the handshake).
    pub(crate) fn register(
        &'static self,
        sock: Arc<UnixStream>,
        mut decoder: Decoder,
        shared: Arc<Shared>,
    ) -> Result<(), std::io::Error> {
        // Frames that came with the agent's Hello are routed first.
        if let Err(dead) = drain(&mut decoder, &shared) {
            shared.die(dead);
            return Ok(());
        }
        let token = {
            let mut next = lock(&self.next);
            *next += 1;
            *next
        };
        let fd = sock.as_raw_fd();
        let entry = Arc::new(Mutex::new(Entry {
            sock,
            decoder,
            shared,
        }));
        lock(&self.entries).insert(token, Arc::clone(&entry));
        // Registering a socket that is readable already reports it, so
        // nothing that arrived before this point is missed.
        if let Err(e) = self
            .registry
            .register(&mut SourceFd(&fd), Token(token), Interest::READABLE)
        {
            lock(&self.entries).remove(&token);
            return Err(e);
        }
        Ok(())
    }

    /// Read one connection until the socket is empty; forget it if it
    /// ended.
    fn ready(&self, token: usize, buf: &mut [u8]) {
        let Some(entry) = lock(&self.entries).get(&token).cloned() else {
            return;
        };
        let mut e = lock(&entry);
        let Entry {
            sock,
            decoder,
            shared,
        } = &mut *e;
        let dead = loop {
            match rustix::net::recv(&*sock, &mut *buf, rustix::net::RecvFlags::DONTWAIT) {
                Ok((0, _)) => break Some(Dead::Closed),
                Ok((n, _)) => {
                    decoder.push(&buf[..n]);
                    if let Err(dead) = drain(decoder, shared) {
                        break Some(dead);
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break None,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                // Any other error (ECONNRESET, a shut-down socket) means
                // the agent is gone as far as the streams are concerned.
                Err(_) => break Some(Dead::Closed),
            }
        };
        if let Some(dead) = dead {
            shared.die(dead);
            let _ = self.registry.deregister(&mut SourceFd(&sock.as_raw_fd()));
            drop(e);
            lock(&self.entries).remove(&token);
        }
    }
}

/// Route every whole frame in `decoder`.
fn drain(decoder: &mut Decoder, shared: &Arc<Shared>) -> Result<(), Dead> {
    loop {
        match decoder.next_frame() {
            Ok(Some(frame)) => shared.dispatch(frame)?,
            Ok(None) => return Ok(()),
            Err(e) => return Err(Dead::Protocol(format!("agent sent a bad frame: {e}"))),
        }
    }
}

fn run(mut poll: Poll) {
    let mut events = Events::with_capacity(1024);
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        if let Err(e) = poll.poll(&mut events, None) {
            if e.kind() == ErrorKind::Interrupted {
                continue;
            }
            // Nothing sensible is left to do: every connection would hang.
            panic!("the agent reactor's poll failed: {e}");
        }
        let Ok(reactor) = Reactor::get() else {
            return;
        };
        for ev in &events {
            reactor.ready(ev.token().0, &mut buf);
        }
    }
}
