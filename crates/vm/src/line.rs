//! The host's end of a guest's agent line: QEMU's chardev socket, behind
//! which is the guest's virtio-serial port (`brig_protocol::serial` for
//! the packets on it and why).
//!
//! [`connect`] makes one agent connection: it dials QEMU's socket (QEMU
//! serves one client at a time), says `Hello` with a fresh nonce, and
//! drops everything until the guest's `Ready` with that nonce. It returns
//! one end of a socketpair; two threads of the daemon pump between the
//! other end and the line, packing and unpacking. The runtime sees a unix
//! stream to the agent, as in every tier. The threads end when either side
//! hangs up; a daemon that dies takes them with it, and the guest learns
//! it from the port (or from the next host's `Hello`).

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use brig_protocol::serial::{self, Packet, Unstuffer, MAX_PACKET};

#[derive(Debug, thiserror::Error)]
pub enum LineError {
    #[error("cannot reach the guest's agent line at {path}")]
    Dial {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("the agent line failed")]
    Io(#[from] io::Error),
    #[error("the guest's agent did not answer within {0:?}")]
    Timeout(Duration),
    #[error("the guest hung up its agent line before answering")]
    Closed,
}

/// An agent connection: the stream for the runtime, and the line under
/// it (shut it down to end the connection from this side).
#[derive(Debug)]
pub struct Connected {
    pub stream: UnixStream,
    pub line: UnixStream,
}

/// Connect to the agent through QEMU's socket at `socket`, waiting up to
/// `timeout` for the guest to answer (a guest still booting answers when
/// its agent is up).
pub fn connect(socket: &Path, timeout: Duration) -> Result<Connected, LineError> {
    let line = dial(socket)?;
    let nonce: u64 = rand::random();
    let (unstuffer, after) =
        exchange(&line, &Packet::Hello(nonce), &Packet::Ready(nonce), timeout)?;
    let (ours, theirs) = UnixStream::pair()?;
    let (line_in, ours_out) = (line.try_clone()?, ours.try_clone()?);
    thread::Builder::new()
        .name("vm-line-in".into())
        .spawn(move || from_guest(line_in, ours_out, unstuffer, after))?;
    let line_out = line.try_clone()?;
    thread::Builder::new()
        .name("vm-line-out".into())
        .spawn(move || to_guest(ours, line_out))?;
    Ok(Connected {
        stream: theirs,
        line,
    })
}

/// Give a guest restored from a memory snapshot its own identity
/// (`brig_protocol::serial`'s `Renew`: the host's clock, 32 random bytes,
/// `hostname`) on a line of its own, and wait up to `timeout` for it to
/// say it is done.
pub fn renew(socket: &Path, hostname: &str, timeout: Duration) -> Result<(), LineError> {
    let line = dial(socket)?;
    let nonce: u64 = rand::random();
    let time_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let renewal = serial::Renewal {
        nonce,
        time_ns,
        entropy: rand::random(),
        hostname: hostname.to_owned(),
    };
    exchange(
        &line,
        &Packet::Renew(renewal),
        &Packet::Renewed(nonce),
        timeout,
    )?;
    let _ = line.shutdown(Shutdown::Both);
    Ok(())
}

/// Give a restored guest its new network address (`brig_protocol::serial`'s
/// `Readdress`) on a line of its own, and wait up to `timeout` for it to
/// say it is done.
pub fn readdress(
    socket: &Path,
    addr: std::net::Ipv4Addr,
    gateway: std::net::Ipv4Addr,
    timeout: Duration,
) -> Result<(), LineError> {
    let line = dial(socket)?;
    let nonce: u64 = rand::random();
    exchange(
        &line,
        &Packet::Readdress(serial::Address {
            nonce,
            addr,
            gateway,
        }),
        &Packet::Renewed(nonce),
        timeout,
    )?;
    let _ = line.shutdown(Shutdown::Both);
    Ok(())
}

fn dial(socket: &Path) -> Result<UnixStream, LineError> {
    UnixStream::connect(socket).map_err(|source| LineError::Dial {
        path: socket.display().to_string(),
        source,
    })
}

/// Send `ask`, then drop everything until `answer`: earlier bytes are
/// output meant for a predecessor, or the tail of one's packets. Returns
/// the reader's state and the packets that came after the answer.
fn exchange(
    line: &UnixStream,
    ask: &Packet,
    answer: &Packet,
    timeout: Duration,
) -> Result<(Unstuffer, Vec<Packet>), LineError> {
    let mut out = Vec::new();
    ask.encode_into(&mut out);
    (&*line).write_all(&out)?;
    let deadline = Instant::now() + timeout;
    let mut unstuffer = Unstuffer::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut after: Vec<Packet> = Vec::new();
    let mut answered = false;
    while !answered {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(LineError::Timeout(timeout));
        }
        line.set_read_timeout(Some(left))?;
        let n = match (&*line).read(&mut buf) {
            Ok(0) => return Err(LineError::Closed),
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(LineError::Timeout(timeout))
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        };
        unstuffer.feed(&buf[..n], |p| {
            if answered {
                after.push(p);
            } else if &p == answer {
                answered = true;
            }
        });
    }
    line.set_read_timeout(None)?;
    Ok((unstuffer, after))
}

/// The guest's packets to the runtime's stream, until either ends.
fn from_guest(
    line: UnixStream,
    mut ours: UnixStream,
    mut unstuffer: Unstuffer,
    early: Vec<Packet>,
) {
    let mut open = true;
    let deliver = |p: Packet, ours: &mut UnixStream| match p {
        Packet::Data(d) => ours.write_all(&d).is_ok(),
        Packet::Close => false,
        _ => true,
    };
    for p in early {
        open = open && deliver(p, &mut ours);
    }
    let mut buf = vec![0u8; 64 * 1024];
    while open {
        let n = match (&line).read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        unstuffer.feed(&buf[..n], |p| {
            if open {
                open = deliver(p, &mut ours);
            }
        });
    }
    let _ = ours.shutdown(Shutdown::Both);
    let _ = line.shutdown(Shutdown::Both);
}

/// The runtime's bytes to the guest, packed; a `Close` when it hangs up.
fn to_guest(mut ours: UnixStream, line: UnixStream) {
    let mut buf = vec![0u8; MAX_PACKET];
    let mut out = Vec::with_capacity(MAX_PACKET * 2 + 8);
    loop {
        let n = match ours.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        out.clear();
        serial::encode_data(&buf[..n], &mut out);
        if (&line).write_all(&out).is_err() {
            break;
        }
    }
    out.clear();
    Packet::Close.encode_into(&mut out);
    let _ = (&line).write_all(&out);
    let _ = line.shutdown(Shutdown::Both);
    let _ = ours.shutdown(Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    /// A guest's end played by a thread: it sends stale output first,
    /// answers the Hello, echoes Data upper-cased.
    #[test]
    fn a_connection_skips_what_came_before_ready_and_pumps_both_ways() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("agent.sock");
        let listener = UnixListener::bind(&sock).unwrap();
        let guest = thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            let mut out = Vec::new();
            Packet::Data(b"stale output".to_vec()).encode_into(&mut out);
            (&s).write_all(&out).unwrap();
            let mut u = Unstuffer::new();
            let mut buf = [0u8; 4096];
            let mut closed = false;
            while !closed {
                let n = (&s).read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                let mut replies = Vec::new();
                u.feed(&buf[..n], |p| match p {
                    Packet::Hello(nonce) => {
                        Packet::Ready(nonce).encode_into(&mut replies);
                        Packet::Data(b"first".to_vec()).encode_into(&mut replies);
                    }
                    Packet::Data(d) => {
                        Packet::Data(d.to_ascii_uppercase()).encode_into(&mut replies)
                    }
                    Packet::Close => closed = true,
                    _ => {}
                });
                (&s).write_all(&replies).unwrap();
            }
            closed
        });
        let mut c = connect(&sock, Duration::from_secs(10)).unwrap();
        c.stream.write_all(&[b'a', serial::END, b'b']).unwrap();
        let mut got = vec![0u8; 8];
        c.stream.read_exact(&mut got).unwrap();
        assert_eq!(
            &got,
            &[b'f', b'i', b'r', b's', b't', b'A', serial::END, b'B']
        );
        drop(c.stream);
        assert!(guest.join().unwrap(), "the guest heard Close");
    }

    /// A renewal goes out whole on a line of its own, and returns on the
    /// guest's `Renewed` with its nonce (a stale one is not enough).
    #[test]
    fn a_renewal_waits_for_the_guest_to_say_it_is_done() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("agent.sock");
        let listener = UnixListener::bind(&sock).unwrap();
        let guest = thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            let mut u = Unstuffer::new();
            let mut buf = [0u8; 4096];
            let mut got = None;
            while got.is_none() {
                let n = (&s).read(&mut buf).unwrap();
                u.feed(&buf[..n], |p| {
                    if let Packet::Renew(r) = p {
                        got = Some(r);
                    }
                });
            }
            let r = got.unwrap();
            let mut out = Vec::new();
            Packet::Renewed(r.nonce.wrapping_add(1)).encode_into(&mut out);
            Packet::Renewed(r.nonce).encode_into(&mut out);
            (&s).write_all(&out).unwrap();
            r
        });
        let before = std::time::SystemTime::now();
        renew(&sock, "sbx-1", Duration::from_secs(10)).unwrap();
        let r = guest.join().unwrap();
        assert_eq!(r.hostname, "sbx-1");
        let sent = std::time::UNIX_EPOCH + Duration::from_nanos(r.time_ns);
        assert!(sent >= before - Duration::from_secs(1), "the host's clock");
        assert_ne!(r.entropy, [0u8; 32]);
    }

    #[test]
    fn a_guest_that_never_answers_times_out() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("agent.sock");
        let _listener = UnixListener::bind(&sock).unwrap();
        let e = connect(&sock, Duration::from_millis(200)).unwrap_err();
        assert!(matches!(e, LineError::Timeout(_)), "{e}");
    }
}
