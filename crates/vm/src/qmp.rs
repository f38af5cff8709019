//! QEMU's control socket (QMP, `docs/interop/qmp-spec`): one JSON object
//! per line. A client reads the greeting, sends `qmp_capabilities`, then
//! commands; each answers `{"return": …}` or `{"error": {"class", "desc"}}`,
//! with asynchronous `{"event": …}` objects in between, which are skipped.
//!
//! QEMU serves one QMP client at a time: brig connects for each operation
//! and hangs up after, so a daemon that died mid-operation blocks nobody.

use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

/// How long one QMP exchange may take (QEMU answers in milliseconds; a
/// stuck one must not hang the daemon).
const TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    #[error("cannot talk to QEMU's control socket")]
    Io(#[from] io::Error),
    #[error("QEMU's control socket sent something that is not QMP: {0}")]
    Protocol(String),
    #[error("QEMU refused {command}: {class}: {desc}")]
    Refused {
        command: String,
        class: String,
        desc: String,
    },
}

/// A QMP session, capabilities negotiated.
#[derive(Debug)]
pub struct Qmp {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Qmp {
    pub fn connect(socket: &Path) -> Result<Qmp, QmpError> {
        let stream = UnixStream::connect(socket)?;
        stream.set_read_timeout(Some(TIMEOUT))?;
        stream.set_write_timeout(Some(TIMEOUT))?;
        let mut qmp = Qmp {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
        };
        let greeting = qmp.read()?;
        if greeting.get("QMP").is_none() {
            return Err(QmpError::Protocol(format!("no greeting: {greeting}")));
        }
        qmp.execute("qmp_capabilities", None)?;
        Ok(qmp)
    }

    fn read(&mut self) -> Result<Value, QmpError> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(QmpError::Io(io::ErrorKind::UnexpectedEof.into()));
        }
        serde_json::from_str(&line).map_err(|e| QmpError::Protocol(format!("{e}: {line}")))
    }

    /// Run `command` (with `arguments`), and return what it returned.
    pub fn execute(&mut self, command: &str, arguments: Option<Value>) -> Result<Value, QmpError> {
        let line = request(command, arguments)?;
        self.writer.write_all(&line)?;
        self.answer(command)
    }

    /// Hand QEMU the descriptor `fd` as `name` (`getfd`, the descriptor
    /// riding with the command as SCM_RIGHTS), for a later `fd:NAME`.
    pub fn pass_fd(&mut self, name: &str, fd: BorrowedFd<'_>) -> Result<(), QmpError> {
        let line = request("getfd", Some(json!({ "fdname": name })))?;
        send_with_fd(&self.writer, &line, fd)?;
        self.answer("getfd").map(drop)
    }

    fn answer(&mut self, command: &str) -> Result<Value, QmpError> {
        loop {
            let mut answer = self.read()?;
            if answer.get("event").is_some() {
                continue;
            }
            if let Some(r) = answer.get_mut("return") {
                return Ok(r.take());
            }
            if let Some(e) = answer.get("error") {
                let field = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
                return Err(QmpError::Refused {
                    command: command.to_owned(),
                    class: field("class"),
                    desc: field("desc"),
                });
            }
            return Err(QmpError::Protocol(format!("unexpected answer: {answer}")));
        }
    }

    /// Wait up to `timeout` for the migration this QEMU sends or receives
    /// (`query-migrate`) to complete; its `failed` state is an error with
    /// QEMU's reason.
    pub fn wait_for_migration(&mut self, timeout: Duration) -> Result<(), QmpError> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let r = self.execute("query-migrate", None)?;
            match r.get("status").and_then(Value::as_str) {
                Some("completed") => return Ok(()),
                Some("failed" | "cancelled") => {
                    return Err(QmpError::Refused {
                        command: "migrate".into(),
                        class: "MigrationFailed".into(),
                        desc: r
                            .get("error-desc")
                            .and_then(Value::as_str)
                            .unwrap_or("no reason given")
                            .to_owned(),
                    })
                }
                _ if std::time::Instant::now() > deadline => {
                    return Err(QmpError::Io(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("the migration did not complete within {timeout:?}: {r}"),
                    )))
                }
                _ => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    }

    /// `query-status`'s `status`: "running", "paused", "shutdown"…
    pub fn status(&mut self) -> Result<String, QmpError> {
        let r = self.execute("query-status", None)?;
        r.get("status")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| QmpError::Protocol(format!("query-status without a status: {r}")))
    }
}

fn request(command: &str, arguments: Option<Value>) -> Result<Vec<u8>, QmpError> {
    let mut request = json!({ "execute": command });
    if let Some(a) = arguments {
        request["arguments"] = a;
    }
    let mut line = serde_json::to_vec(&request).map_err(|e| QmpError::Protocol(e.to_string()))?;
    line.push(b'\n');
    Ok(line)
}

/// Write `bytes` to `stream` with `fd` attached (SCM_RIGHTS).
fn send_with_fd(stream: &UnixStream, bytes: &[u8], fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: CMSG_SPACE of a constant size.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    let mut control = vec![0u8; space];
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // SAFETY: a zeroed msghdr is valid; every pointer set below refers to
    // buffers that outlive the sendmsg call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: the control buffer holds one header of CMSG_SPACE(int)
    // bytes; CMSG_FIRSTHDR and CMSG_DATA point inside it.
    let sent = unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), fd.as_raw_fd());
        libc::sendmsg(stream.as_raw_fd(), &msg, libc::MSG_NOSIGNAL)
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    // The descriptor went with the first byte; the rest follows plainly.
    let sent = sent as usize;
    if sent < bytes.len() {
        (&*stream).write_all(&bytes[sent..])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::FromRawFd;
    use std::os::unix::net::UnixListener;

    /// A scripted QEMU: the greeting, then for each request the lines
    /// given, recording what it was sent.
    fn fake(
        answers: Vec<Vec<&'static str>>,
    ) -> (tempfile::TempDir, std::thread::JoinHandle<String>) {
        let dir = tempfile::tempdir().unwrap();
        let listener = UnixListener::bind(dir.path().join("qmp.sock")).unwrap();
        let t = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            s.write_all(b"{\"QMP\": {\"version\": {}, \"capabilities\": []}}\n")
                .unwrap();
            let mut got = String::new();
            let mut r = BufReader::new(s.try_clone().unwrap());
            for lines in answers {
                let mut line = String::new();
                r.read_line(&mut line).unwrap();
                got.push_str(&line);
                for l in lines {
                    s.write_all(l.as_bytes()).unwrap();
                    s.write_all(b"\n").unwrap();
                }
            }
            let mut rest = String::new();
            let _ = r.read_to_string(&mut rest);
            got
        });
        (dir, t)
    }

    #[test]
    fn commands_skip_events_and_return_their_value() {
        let (dir, t) = fake(vec![
            vec!["{\"return\": {}}"],
            vec![
                "{\"event\": \"STOP\", \"timestamp\": {}}",
                "{\"return\": {\"status\": \"paused\", \"running\": false}}",
            ],
        ]);
        let mut q = Qmp::connect(&dir.path().join("qmp.sock")).unwrap();
        assert_eq!(q.status().unwrap(), "paused");
        drop(q);
        let sent = t.join().unwrap();
        let lines: Vec<Value> = sent
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines[0], json!({"execute": "qmp_capabilities"}));
        assert_eq!(lines[1], json!({"execute": "query-status"}));
    }

    /// `getfd` carries the descriptor; a migration is waited for through
    /// `query-migrate` until completed, and its failure says QEMU's reason.
    #[test]
    fn a_descriptor_rides_with_getfd_and_migrations_are_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let listener = UnixListener::bind(dir.path().join("qmp.sock")).unwrap();
        let peer = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            // Answer qmp_capabilities only after reading it: answered
            // early, the client's getfd could arrive in the same read and
            // its descriptor be dropped with a plain read().
            (&s).write_all(b"{\"QMP\": {}}\n").unwrap();
            let mut caps = [0u8; 64];
            let _ = (&s).read(&mut caps).unwrap();
            (&s).write_all(b"{\"return\": {}}\n").unwrap();
            // The getfd line, with its descriptor.
            let mut buf = [0u8; 256];
            let mut iov = libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: buf.len(),
            };
            let mut control = [0u8; 64];
            // SAFETY: a zeroed msghdr pointing at buffers that outlive
            // the call.
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = control.len() as _;
            // SAFETY: recvmsg into the buffers above; the header is read
            // only if the kernel wrote one.
            let fd = unsafe {
                let n = libc::recvmsg(s.as_raw_fd(), &mut msg, 0);
                assert!(n > 0);
                let c = libc::CMSG_FIRSTHDR(&msg);
                assert!(!c.is_null(), "no descriptor came");
                std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<RawFd>())
            };
            // SAFETY: the descriptor the kernel just gave this process.
            let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
            let mut text = String::new();
            f.read_to_string(&mut text).unwrap();
            (&s).write_all(b"{\"return\": {}}\n").unwrap();
            for answer in [
                "{\"return\": {\"status\": \"active\"}}\n",
                "{\"return\": {\"status\": \"completed\"}}\n",
                "{\"return\": {\"status\": \"failed\", \"error-desc\": \"disk full\"}}\n",
            ] {
                let _ = (&s).read(&mut buf).unwrap();
                (&s).write_all(answer.as_bytes()).unwrap();
            }
            text
        });
        let file = dir.path().join("memory");
        std::fs::write(&file, "the descriptor's file").unwrap();
        let f = std::fs::File::open(&file).unwrap();
        let mut q = Qmp::connect(&dir.path().join("qmp.sock")).unwrap();
        q.pass_fd("brig-save", std::os::fd::AsFd::as_fd(&f))
            .unwrap();
        q.wait_for_migration(Duration::from_secs(10)).unwrap();
        let e = q.wait_for_migration(Duration::from_secs(10)).unwrap_err();
        assert!(e.to_string().contains("disk full"), "{e}");
        let text = peer.join().unwrap();
        assert_eq!(text, "the descriptor's file");
    }

    #[test]
    fn an_error_answer_is_refused_with_its_class_and_description() {
        let (dir, _t) = fake(vec![
            vec!["{\"return\": {}}"],
            vec!["{\"error\": {\"class\": \"GenericError\", \"desc\": \"no such thing\"}}"],
        ]);
        let mut q = Qmp::connect(&dir.path().join("qmp.sock")).unwrap();
        let e = q.execute("frobnicate", Some(json!({"x": 1}))).unwrap_err();
        assert_eq!(
            e.to_string(),
            "QEMU refused frobnicate: GenericError: no such thing"
        );
    }
}
