//! `brig exec ID [-i] [-t] [--user U] [--background] -- CMD...`: run a
//! command in a sandbox on the daemon and exit with its status (128+N for
//! signal N, 127 for a command that does not exist).
//!
//! Three ways, picked from the flags:
//!
//! - plain: `POST /exec`, its NDJSON output copied to stdout and stderr;
//!   stdin is not read.
//! - `-i` and/or `-t`: a session on `GET /pty` (a WebSocket). With `-t` the
//!   command runs on a terminal in the sandbox sized like ours, and with
//!   `-i` too our terminal goes raw, so ^C and the like reach the remote
//!   terminal as bytes; window changes (SIGWINCH) are forwarded as resizes.
//!   With `-i` alone the command runs on pipes and our stdin is streamed to
//!   it, its end sent as `eof`. SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to
//!   brig are forwarded to the command instead of ending brig.
//! - `--background`: `POST /processes`; prints the pid and returns.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;

use anyhow::Context;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use serde_json::{json, Value};
use tungstenite::stream::MaybeTlsStream;
use tungstenite::Message;

use super::client::{check_sandbox_ref, env_pairs, Client, RemoteError, WebSocket};
use crate::exit;
use crate::tty::{self, RawTerminal, SignalFd};

#[derive(Debug, clap::Args)]
#[command(trailing_var_arg = true)]
pub struct ExecArgs {
    /// The sandbox: its id, its name, or a unique start of its id.
    id: String,
    /// Set an environment variable (repeatable); `-e KEY` passes KEY's
    /// value here through.
    #[arg(long = "env", short = 'e', value_name = "KEY[=VALUE]")]
    env: Vec<String>,
    /// Read environment variables from a file of KEY=VALUE lines.
    #[arg(long = "env-file", value_name = "FILE")]
    env_file: Vec<std::path::PathBuf>,
    /// Working directory inside the sandbox.
    #[arg(long, short = 'w', value_name = "DIR")]
    workdir: Option<String>,
    /// Run as this user of the sandbox's /etc/passwd (sets uid, gid and
    /// HOME).
    #[arg(long, short = 'u', value_name = "USER")]
    user: Option<String>,
    /// Send stdin to the command (until its end).
    #[arg(long, short = 'i')]
    interactive: bool,
    /// Run the command on a terminal in the sandbox (with -i: our terminal
    /// goes raw and keys such as ^C reach it).
    #[arg(long, short = 't')]
    tty: bool,
    /// Kill the command (and what it started) if it runs longer, e.g. 30s,
    /// 5m; brig then exits with 124.
    #[arg(long, value_name = "DURATION", conflicts_with = "background")]
    timeout: Option<String>,
    /// Start the command in the background, print its pid and return.
    #[arg(long, short = 'd', conflicts_with_all = ["interactive", "tty"])]
    background: bool,
    /// The command and its arguments (after `--`).
    #[arg(value_name = "CMD", required = true)]
    command: Vec<String>,
}

/// How the command is run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `POST /exec`, output only.
    Stream,
    /// A WebSocket session: on a terminal or not, stdin sent or not.
    Session { tty: bool, stdin: bool },
    /// `POST /processes`.
    Background,
}

/// What the flags ask for, checked.
#[derive(Debug)]
struct ExecConfig {
    id: String,
    /// `{argv, env, cwd, user}`, the part every endpoint takes.
    body: Value,
    mode: Mode,
}

impl ExecArgs {
    fn into_config(self) -> anyhow::Result<ExecConfig> {
        // An id, a name or a prefix, resolved once the daemon is reachable.
        check_sandbox_ref(&self.id)?;
        let mode = match (self.background, self.interactive, self.tty) {
            (true, _, _) => Mode::Background,
            (false, false, false) => Mode::Stream,
            (false, stdin, tty) => Mode::Session { tty, stdin },
        };
        let mut env = env_pairs(&self.env, &self.env_file)?;
        if self.tty {
            // The remote terminal speaks what ours does (as `brig run -t`).
            env.entry("TERM").or_insert_with(|| {
                std::env::var("TERM")
                    .unwrap_or_else(|_| "xterm".into())
                    .into()
            });
        }
        let mut body = json!({
            "argv": self.command,
            "env": env,
        });
        if let Some(dir) = self.workdir {
            body["cwd"] = dir.into();
        }
        if let Some(user) = self.user {
            body["user"] = user.into();
        }
        if let Some(t) = self.timeout {
            brig_core::parse_duration(&t).context("--timeout")?;
            body["timeout"] = t.into();
        }
        Ok(ExecConfig {
            id: self.id,
            body,
            mode,
        })
    }
}

pub fn run(args: ExecArgs) -> anyhow::Result<i32> {
    let mut config = args.into_config()?;
    if config.mode
        == (Mode::Session {
            tty: true,
            stdin: true,
        })
    {
        tty::require_terminal_input()?;
    }
    let client = Client::from_env()?;
    config.id = client.resolve(&config.id)?;
    let done = match config.mode {
        Mode::Stream => stream(&client, &config),
        Mode::Background => background(&client, &config),
        Mode::Session { tty, stdin } => session(&client, &config, tty, stdin),
    };
    match done {
        // As `brig run`: a command that does not exist is 127.
        Err(e)
            if e.downcast_ref::<RemoteError>()
                .is_some_and(|r| r.code == "command_not_found") =>
        {
            eprintln!("brig: {e:#}");
            Ok(exit::NOT_FOUND)
        }
        other => other,
    }
}

/// The exit code for an `exited` event or frame.
/// A stream's `error` event: if the sandbox ended under the command, say
/// why and exit as the command's end would have (124 its timeout, 137
/// killed: out of memory, deleted, the daemon's shutdown); else an error.
fn stream_failed(event: &Value, otherwise: &str) -> anyhow::Result<i32> {
    let message = event["message"].as_str().unwrap_or(otherwise);
    let code = match event["sandbox_end"]["cause"].as_str() {
        Some("timeout") => exit::TIMED_OUT,
        Some("out_of_memory" | "deleted" | "shutdown") => exit::KILLED,
        _ => anyhow::bail!("{message}"),
    };
    eprintln!("brig: {message}");
    Ok(code)
}

fn exit_code(event: &Value) -> i32 {
    if event["oom_killed"] == true {
        eprintln!(
            "brig: {}",
            event["message"]
                .as_str()
                .unwrap_or("killed by the kernel's OOM killer")
        );
        return exit::OOM;
    }
    if event["timed_out"] == true {
        let ms = event["timeout_ms"].as_u64().unwrap_or(0);
        eprintln!(
            "brig: timed out after {}; the command was killed",
            exit::humantime(std::time::Duration::from_millis(ms))
        );
        return exit::TIMED_OUT;
    }
    match (event["code"].as_i64(), event["signal"].as_i64()) {
        (Some(code), _) => code as i32,
        (None, Some(sig)) => 128 + sig as i32,
        (None, None) => exit::START_FAILED,
    }
}

fn stream(client: &Client, config: &ExecConfig) -> anyhow::Result<i32> {
    let resp = client.send(
        client.request("POST", &format!("/v1/sandboxes/{}/exec", config.id)),
        Some(&config.body),
    )?;
    let (mut out, mut err) = (std::io::stdout().lock(), std::io::stderr().lock());
    for line in BufReader::new(resp.into_reader()).lines() {
        let line = line.context("the daemon's output stream broke")?;
        let event: Value = serde_json::from_str(&line)
            .with_context(|| format!("the daemon sent a line that is not JSON: {line:?}"))?;
        let data = || BASE64.decode(event["data"].as_str().unwrap_or_default());
        match event["type"].as_str() {
            Some("stdout") => {
                out.write_all(&data().context("bad stdout data")?)?;
                out.flush()?;
            }
            Some("stderr") => {
                err.write_all(&data().context("bad stderr data")?)?;
                err.flush()?;
            }
            Some("exited") => return Ok(exit_code(&event)),
            Some("error") => return stream_failed(&event, "the process stream failed"),
            _ => {}
        }
    }
    anyhow::bail!("the daemon ended the output stream before the command exited")
}

fn background(client: &Client, config: &ExecConfig) -> anyhow::Result<i32> {
    let answer = client.json(
        "POST",
        &format!("/v1/sandboxes/{}/processes", config.id),
        Some(&config.body),
    )?;
    let pid = answer["pid"]
        .as_i64()
        .with_context(|| format!("the daemon answered without a pid: {answer}"))?;
    println!("{pid}");
    Ok(0)
}

/// The signals brig forwards to the command during a session (and
/// SIGWINCH, which becomes a resize).
const FORWARDED: [libc::c_int; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// A WebSocket session (see `crates/api/src/pty.rs` for the
/// protocol): start, then one poll loop over the socket, stdin and a
/// signalfd until the command's `exited` frame.
fn session(client: &Client, config: &ExecConfig, tty: bool, stdin: bool) -> anyhow::Result<i32> {
    let mut ws = client.websocket(&format!("/v1/sandboxes/{}/pty", config.id))?;
    let mut start = config.body.clone();
    start["pty"] = tty.into();
    if tty {
        let (rows, cols) = tty::window_size().unwrap_or((24, 80));
        start["rows"] = rows.into();
        start["cols"] = cols.into();
    }
    ws.send(Message::text(start.to_string()))
        .context("cannot start the session")?;
    let first = read_text(&mut ws)?;
    match first["type"].as_str() {
        Some("started") => {}
        Some("error") => {
            return Err(RemoteError {
                status: 0,
                code: first["code"].as_str().unwrap_or_default().to_string(),
                message: first["message"].as_str().unwrap_or_default().to_string(),
            }
            .into())
        }
        _ => anyhow::bail!("the daemon answered the start with {first}"),
    }

    let mut watched = FORWARDED.to_vec();
    watched.push(libc::SIGWINCH);
    let signals = SignalFd::new(&watched)?;
    // Raw only when our keys go to the remote terminal: then it, not ours,
    // turns ^C into SIGINT and echoes what we type.
    let _raw = (tty && stdin).then(|| RawTerminal::enter(0)).flatten();
    let socket = match ws.get_ref() {
        MaybeTlsStream::Plain(s) => s,
        _ => anyhow::bail!("only plain http:// daemons are supported"),
    };
    socket
        .set_nonblocking(true)
        .context("configure the daemon's socket")?;
    let socket_fd = socket.as_raw_fd();
    let mut session = Session {
        ws,
        tty,
        stdin_open: stdin,
        unflushed: false,
        exited: None,
    };
    loop {
        let mut fds = vec![
            pollfd(
                socket_fd,
                libc::POLLIN | if session.unflushed { libc::POLLOUT } else { 0 },
            ),
            pollfd(signals.fd(), libc::POLLIN),
        ];
        // Input waits while the socket has not taken the last of it.
        if session.stdin_open && !session.unflushed {
            fds.push(pollfd(0, libc::POLLIN));
        }
        // SAFETY: a valid array of pollfds for its length.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e).context("poll");
        }
        if let Some(sig) = signals.read_ready(fds[1].revents) {
            session.signal(sig)?;
        }
        if fds.get(2).is_some_and(|p| p.revents != 0) {
            session.forward_stdin()?;
        }
        if fds[0].revents & libc::POLLOUT != 0 {
            session.flush()?;
        }
        if fds[0].revents != 0 {
            if let Some(code) = session.read_socket()? {
                return Ok(code);
            }
        }
    }
}

fn pollfd(fd: libc::c_int, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd,
        events,
        revents: 0,
    }
}

/// A blocking read of the next text frame (before the loop starts).
fn read_text(ws: &mut WebSocket) -> anyhow::Result<Value> {
    loop {
        match ws.read().context("the daemon's session broke")? {
            Message::Text(t) => {
                return serde_json::from_str(t.as_str())
                    .with_context(|| format!("the daemon sent a frame that is not JSON: {t:?}"))
            }
            Message::Close(_) => anyhow::bail!("the daemon closed the session before it started"),
            _ => {}
        }
    }
}

/// A running session's state.
struct Session {
    ws: WebSocket,
    tty: bool,
    stdin_open: bool,
    /// The socket has not taken everything written to it yet.
    unflushed: bool,
    /// The command's exit code, once its `exited` frame came.
    exited: Option<i32>,
}

fn would_block(e: &tungstenite::Error) -> bool {
    matches!(e, tungstenite::Error::Io(io) if io.kind() == std::io::ErrorKind::WouldBlock)
}

impl Session {
    /// Queue a frame; what the socket cannot take now goes on POLLOUT.
    fn send(&mut self, msg: Message) -> anyhow::Result<()> {
        match self.ws.send(msg) {
            Ok(()) => self.unflushed = false,
            Err(e) if would_block(&e) => self.unflushed = true,
            Err(e) => return Err(e).context("the daemon's session broke"),
        }
        Ok(())
    }

    fn flush(&mut self) -> anyhow::Result<()> {
        match self.ws.flush() {
            Ok(()) => self.unflushed = false,
            Err(e) if would_block(&e) => self.unflushed = true,
            Err(e) => return Err(e).context("the daemon's session broke"),
        }
        Ok(())
    }

    fn signal(&mut self, sig: libc::c_int) -> anyhow::Result<()> {
        if sig == libc::SIGWINCH {
            match (self.tty, tty::window_size()) {
                (true, Some((rows, cols))) => self.send(Message::text(
                    json!({ "type": "resize", "rows": rows, "cols": cols }).to_string(),
                )),
                _ => Ok(()),
            }
        } else {
            self.send(Message::text(
                json!({ "type": "signal", "signal": sig }).to_string(),
            ))
        }
    }

    /// One read of stdin (poll said it is ready) to the command; its end
    /// becomes `eof`.
    fn forward_stdin(&mut self) -> anyhow::Result<()> {
        let mut buf = vec![0u8; 16 * 1024];
        // SAFETY: reading into a live buffer of its length.
        let n = unsafe { libc::read(0, buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if matches!(
                e.kind(),
                std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock
            ) {
                return Ok(());
            }
            return Err(e).context("read stdin");
        }
        if n == 0 {
            self.stdin_open = false;
            return self.send(Message::text(r#"{"type":"eof"}"#));
        }
        buf.truncate(n as usize);
        self.send(Message::binary(buf))
    }

    /// Everything the socket has now; the exit code once the session is
    /// over.
    fn read_socket(&mut self) -> anyhow::Result<Option<i32>> {
        loop {
            let msg =
                match self.ws.read() {
                    Ok(msg) => msg,
                    Err(e) if would_block(&e) => return Ok(None),
                    Err(
                        tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed,
                    ) if self.exited.is_some() => return Ok(self.exited),
                    Err(e) => return Err(e).context("the daemon's session broke"),
                };
            match msg {
                Message::Binary(b) => self.output(&b)?,
                Message::Text(t) => {
                    let event: Value = serde_json::from_str(t.as_str()).with_context(|| {
                        format!("the daemon sent a frame that is not JSON: {t:?}")
                    })?;
                    match event["type"].as_str() {
                        Some("exited") => self.exited = Some(exit_code(&event)),
                        Some("error") => {
                            return stream_failed(&event, "the session failed").map(Some)
                        }
                        _ => {}
                    }
                }
                Message::Close(_) => {
                    // Our answer to the close, best effort: the command
                    // is over either way.
                    let _ = self.ws.flush();
                    return match self.exited {
                        Some(code) => Ok(Some(code)),
                        None => {
                            anyhow::bail!("the daemon ended the session before the command exited")
                        }
                    };
                }
                _ => {}
            }
        }
    }

    /// Output to our stdout (or stderr, for a tagged stderr frame).
    fn output(&mut self, frame: &[u8]) -> anyhow::Result<()> {
        let (to_stderr, bytes) = match (self.tty, frame.split_first()) {
            (true, _) => (false, frame),
            (false, Some((&2, rest))) => (true, rest),
            (false, Some((_, rest))) => (false, rest),
            (false, None) => return Ok(()),
        };
        let written = if to_stderr {
            let mut err = std::io::stderr().lock();
            err.write_all(bytes).and_then(|()| err.flush())
        } else {
            let mut out = std::io::stdout().lock();
            out.write_all(bytes).and_then(|()| out.flush())
        };
        written.context("write the command's output")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn config(args: &[&str]) -> anyhow::Result<ExecConfig> {
        let cli = crate::commands::Cli::try_parse_from(["brig", "exec"].iter().chain(args))?;
        match cli.command {
            crate::commands::Command::Exec(a) => a.into_config(),
            _ => unreachable!(),
        }
    }

    #[test]
    fn an_unknown_flag_before_the_command_is_a_usage_error() {
        let e = config(&["0123456789ab", "--network", "host", "--", "true"]).unwrap_err();
        let e = e.downcast::<clap::Error>().expect("a usage error");
        assert_eq!(e.kind(), clap::error::ErrorKind::UnknownArgument);
        assert!(e.to_string().contains("--network"), "{e}");
        // After the command starts, dashes belong to it.
        let c = config(&["0123456789ab", "ls", "-l", "--all"]).unwrap();
        assert_eq!(c.body["argv"], serde_json::json!(["ls", "-l", "--all"]));
    }

    #[test]
    fn flags_pick_the_endpoint() {
        let c = config(&["0123456789ab", "--", "ls", "-l"]).unwrap();
        assert_eq!(c.mode, Mode::Stream);
        assert_eq!(c.body["argv"], json!(["ls", "-l"]));
        let c = config(&["-i", "0123456789ab", "--", "cat"]).unwrap();
        assert_eq!(
            c.mode,
            Mode::Session {
                tty: false,
                stdin: true
            }
        );
        let c = config(&[
            "-it",
            "--user",
            "nobody",
            "-w",
            "/tmp",
            "0123456789ab",
            "--",
            "sh",
        ])
        .unwrap();
        assert_eq!(
            c.mode,
            Mode::Session {
                tty: true,
                stdin: true
            }
        );
        assert_eq!(c.body["user"], "nobody");
        assert_eq!(c.body["cwd"], "/tmp");
        let c = config(&[
            "--background",
            "-e",
            "A=1",
            "0123456789ab",
            "--",
            "sleep",
            "9",
        ])
        .unwrap();
        assert_eq!(c.mode, Mode::Background);
        assert_eq!(c.body["env"], json!({"A": "1"}));
        assert!(config(&["-d", "-t", "0123456789ab", "--", "sh"]).is_err());
        // `-e KEY` passes KEY's value here through, and nothing if unset.
        let c = config(&["-e", "BRIG_SURELY_UNSET_7", "0123456789ab", "--", "sh"]).unwrap();
        assert_eq!(c.body["env"], json!({}));
        assert!(config(&["../x", "--", "sh"]).is_err());
    }
}
