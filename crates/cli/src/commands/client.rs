//! What the daemon's client subcommands share: where the daemon is
//! (`BRIG_URL`), which key to present (`BRIG_API_KEY`, else the key the
//! local daemon wrote to `$BRIG_HOME/local.key`), and turning an error
//! answer (`{"code","message"}`) into an error carrying its message.

use std::net::TcpStream;
use std::path::PathBuf;

use anyhow::Context;

/// Where a local daemon writes the first key, for the local CLI.
pub const LOCAL_KEY_FILE: &str = "local.key";
pub const DEFAULT_URL: &str = "http://127.0.0.1:7777";
pub const DEFAULT_HOME: &str = "/var/lib/brig";

/// Where the daemon's home and address came from: `--home`/`--url`,
/// which clap also fills from `BRIG_HOME`/`BRIG_URL`.
static LOCATION: std::sync::OnceLock<(Option<PathBuf>, Option<String>)> =
    std::sync::OnceLock::new();

/// Record the global `--home` and `--url` (once, before any subcommand
/// runs).
pub fn set_location(home: Option<PathBuf>, url: Option<String>) {
    let _ = LOCATION.set((home, url.filter(|u| !u.is_empty())));
}

/// `--home` (or `$BRIG_HOME`), else /var/lib/brig.
pub fn home_dir() -> PathBuf {
    LOCATION
        .get()
        .and_then(|(home, _)| home.clone())
        .unwrap_or_else(|| PathBuf::from(DEFAULT_HOME))
}

/// `--url` (or `$BRIG_URL`).
fn url_given() -> Option<String> {
    LOCATION.get().and_then(|(_, url)| url.clone())
}

/// A connection to the daemon: base URL and key.
#[derive(Debug)]
pub struct Client {
    base: String,
    /// Where `base` came from, for "cannot reach" messages.
    found: Found,
    key: String,
    agent: ureq::Agent,
}

/// How the CLI found the daemon's address.
#[derive(Debug, Clone)]
enum Found {
    /// `--url` or `BRIG_URL`.
    Env,
    /// The running daemon of `$BRIG_HOME` said so in its `daemon` file.
    HomeFile(PathBuf),
    /// Nothing said: the default address.
    Default,
}

/// The key the CLI presents: `$BRIG_API_KEY`, else the local daemon's
/// `$BRIG_HOME/local.key`.
pub fn api_key() -> anyhow::Result<String> {
    if let Some(k) = std::env::var("BRIG_API_KEY").ok().filter(|k| !k.is_empty()) {
        return Ok(k);
    }
    let path = home_dir().join(LOCAL_KEY_FILE);
    Ok(std::fs::read_to_string(&path)
        .with_context(|| {
            format!(
                "no api key: set BRIG_API_KEY, or run where the local daemon's key {} is \
                 readable (--home or BRIG_HOME selects the daemon's home)",
                path.display()
            )
        })?
        .trim()
        .to_string())
}

/// Where the local daemon of `home` listens, if one runs: `brig serve`
/// holds a lock on `$BRIG_HOME/daemon` and writes its address there (see
/// serve.rs); a file nobody holds is a daemon that is gone.
fn local_daemon(home: &std::path::Path) -> Option<String> {
    use std::io::Read;
    let mut file = std::fs::File::open(home.join(super::serve::DAEMON_FILE)).ok()?;
    super::serve::lock_holder(&file)?;
    let mut text = String::new();
    file.read_to_string(&mut text).ok()?;
    let addr = text.lines().nth(1)?.trim();
    (!addr.is_empty()).then(|| format!("http://{addr}"))
}

/// An error answer from the daemon, shown with a CLI remedy instead of
/// the API's (which names HTTP routes).
#[derive(Debug, thiserror::Error)]
#[error("{}", self.for_people())]
pub struct RemoteError {
    pub status: u16,
    pub code: String,
    pub message: String,
}

impl RemoteError {
    /// The daemon's message without the API's route hints, then what to
    /// run, then the error's code.
    fn for_people(&self) -> String {
        let message = without_routes(&self.message);
        let remedy = match self.code.as_str() {
            "unauthorized" => Some(
                "missing or invalid api key: set BRIG_API_KEY to a key of this daemon \
                 (`brig keys create` makes one), or unset it to use $BRIG_HOME/local.key"
                    .to_string(),
            ),
            "paused" => Some(format!(
                "resume it with `brig resume {}`",
                sandbox_named(&message).unwrap_or("ID")
            )),
            "conflict" if message.contains("already paused") => Some(format!(
                "resume it with `brig resume {}`",
                sandbox_named(&message).unwrap_or("ID")
            )),
            "not_found" if message.starts_with("sandbox ") => {
                Some("`brig ls -a` lists the sandboxes you can see".to_string())
            }
            _ => None,
        };
        match remedy {
            Some(r) if self.code == "unauthorized" => format!("{r} ({})", self.code),
            Some(r) => format!("{message}; {r} ({})", self.code),
            None => format!("{message} ({})", self.code),
        }
    }
}

/// A message with the API's hints cut out: " (POST /v1/…)", "; resume it
/// with POST /v1/…", "; see api/openapi.yaml".
fn without_routes(message: &str) -> String {
    let api_hint = |s: &str| s.contains("/v1/") || s.contains("openapi");
    message
        .split("; ")
        .filter(|clause| !api_hint(clause))
        .map(|clause| {
            let mut c = clause.to_string();
            while let Some(open) = c.find(" (").filter(|&at| {
                c[at..]
                    .find(')')
                    .is_some_and(|end| api_hint(&c[at..at + end]))
            }) {
                let close = open + c[open..].find(')').unwrap_or(c.len() - open - 1) + 1;
                c.replace_range(open..close, "");
            }
            c
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The id in "sandbox ID …".
fn sandbox_named(message: &str) -> Option<&str> {
    message
        .strip_prefix("sandbox ")?
        .split(|c: char| !c.is_ascii_alphanumeric())
        .next()
        .filter(|id| !id.is_empty())
}

/// The daemon's URL if one is named (`--url`, `BRIG_URL`) or runs for the
/// home; `None` when no daemon is to be found (`brig mcp` then starts an
/// embedded runtime).
pub fn daemon_url() -> Option<String> {
    url_given().or_else(|| local_daemon(&home_dir()))
}

impl Client {
    /// From the environment, or a clear error saying what to set.
    pub fn from_env() -> anyhow::Result<Client> {
        let home = home_dir();
        let (base, found) = match url_given() {
            Some(url) => (url, Found::Env),
            None => match local_daemon(&home) {
                Some(url) => (url, Found::HomeFile(home.join("daemon"))),
                None => (DEFAULT_URL.to_string(), Found::Default),
            },
        };
        let key = api_key()?;
        Ok(Client {
            base: base.trim_end_matches('/').to_string(),
            found,
            key,
            agent: ureq::AgentBuilder::new().build(),
        })
    }

    /// Every sandbox of this tenant the daemon has a record of, live and
    /// ended, page by page.
    pub fn sandboxes(&self) -> anyhow::Result<Vec<serde_json::Value>> {
        let mut all = Vec::new();
        let mut path = "/v1/sandboxes?limit=1000".to_string();
        loop {
            let page = self.json("GET", &path, None)?;
            if let Some(items) = page["items"].as_array() {
                all.extend(items.iter().cloned());
            }
            match page["next"].as_str() {
                Some(next) => path = format!("/v1/sandboxes?limit=1000&cursor={next}"),
                None => return Ok(all),
            }
        }
    }

    /// A sandbox id from what a person typed: the id itself, a sandbox's
    /// name, or a unique prefix of one of this tenant's sandbox ids (as
    /// docker takes them, in that order).
    pub fn resolve(&self, given: &str) -> anyhow::Result<String> {
        if brig_core::SandboxId::parse(given).is_some() {
            return Ok(given.to_string());
        }
        check_sandbox_ref(given)?;
        let all = self.sandboxes()?;
        if let Some(named) = all.iter().find(|s| s["name"].as_str() == Some(given)) {
            return Ok(named["id"].as_str().unwrap_or_default().to_string());
        }
        let hex = given.len() <= 12 && given.bytes().all(|b| b.is_ascii_hexdigit());
        let prefix = given.to_ascii_lowercase();
        let found: Vec<String> = all
            .iter()
            .filter_map(|s| s["id"].as_str())
            .filter(|id| hex && id.starts_with(&prefix))
            .map(str::to_string)
            .collect();
        match found.as_slice() {
            [one] => Ok(one.clone()),
            [] if hex => anyhow::bail!(
                "no sandbox is named {given:?} and no sandbox id starts with it (`brig ls -a` \
                 lists them)"
            ),
            [] => anyhow::bail!(
                "no sandbox is named {given:?} (`brig ls -a` lists them; an id is 12 hex digits \
                 or a unique start of them)"
            ),
            many => anyhow::bail!(
                "{given:?} is the start of {} sandbox ids ({}): type more of it",
                many.len(),
                many.join(", ")
            ),
        }
    }

    pub fn request(&self, method: &str, path: &str) -> ureq::Request {
        self.agent
            .request(method, &format!("{}{path}", self.base))
            .set("Authorization", &format!("Bearer {}", self.key))
    }

    /// Send and turn a non-2xx answer or a transport failure into an error.
    pub fn send(
        &self,
        req: ureq::Request,
        body: Option<&serde_json::Value>,
    ) -> anyhow::Result<ureq::Response> {
        let result = match body {
            Some(b) => req.send_json(b),
            None => req.call(),
        };
        self.answer(result)
    }

    /// Send `body` as it is read (chunked, never held whole), with the
    /// same error handling as [`Client::send`].
    pub fn send_reader(
        &self,
        req: ureq::Request,
        body: impl std::io::Read,
    ) -> anyhow::Result<ureq::Response> {
        self.answer(req.send(body))
    }

    /// A 2xx answer, or the daemon's error (or the transport's) as an error.
    fn answer(
        &self,
        result: Result<ureq::Response, ureq::Error>,
    ) -> anyhow::Result<ureq::Response> {
        match result {
            Ok(resp) => Ok(resp),
            Err(ureq::Error::Status(status, resp)) => {
                let body: serde_json::Value = resp.into_json().unwrap_or_default();
                let text = |k: &str| {
                    body.get(k)
                        .and_then(|v| v.as_str())
                        .unwrap_or("")
                        .to_string()
                };
                Err(RemoteError {
                    status,
                    code: text("code"),
                    message: text("message"),
                }
                .into())
            }
            Err(e) => Err(self.unreachable(e)),
        }
    }

    /// "Cannot reach the daemon": which address, where it came from, and
    /// how to start one or point at another.
    fn unreachable(&self, e: impl std::error::Error + Send + Sync + 'static) -> anyhow::Error {
        let whence = match &self.found {
            Found::Env => "--url or BRIG_URL".to_string(),
            Found::HomeFile(p) => p.display().to_string(),
            Found::Default => "the default; --url or BRIG_URL sets another".to_string(),
        };
        anyhow::Error::new(e).context(format!(
            "cannot reach the brig daemon at {} ({whence}): start it with `sudo brig serve` (it \
             listens on {DEFAULT_URL} unless told otherwise), or point --url or BRIG_URL at the \
             daemon you run",
            self.base
        ))
    }

    pub fn json(
        &self,
        method: &str,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> anyhow::Result<serde_json::Value> {
        let resp = self.send(self.request(method, path), body)?;
        resp.into_json()
            .context("the daemon's answer is not the JSON expected")
    }
}

/// The daemon's WebSocket endpoints (`GET /v1/sandboxes/{id}/pty`).
pub type WebSocket = tungstenite::WebSocket<tungstenite::stream::MaybeTlsStream<TcpStream>>;

impl Client {
    /// Open a WebSocket to `path` on the daemon, with the key in the
    /// `Authorization` header. An error answer to the upgrade (401, 404,
    /// 409) becomes a [`RemoteError`], like any other.
    pub fn websocket(&self, path: &str) -> anyhow::Result<WebSocket> {
        use tungstenite::client::IntoClientRequest;
        let url = match self.base.split_once("://") {
            Some(("http", rest)) => format!("ws://{rest}{path}"),
            Some(("https", rest)) => format!("wss://{rest}{path}"),
            _ => anyhow::bail!(
                "BRIG_URL {} is not an http:// URL, e.g. http://127.0.0.1:7777",
                self.base
            ),
        };
        let mut req = url
            .as_str()
            .into_client_request()
            .with_context(|| format!("invalid daemon URL {url}"))?;
        req.headers_mut().insert(
            "authorization",
            format!("Bearer {}", self.key)
                .parse()
                .context("the api key is not a valid header value")?,
        );
        match tungstenite::connect(req) {
            Ok((ws, _)) => Ok(ws),
            Err(tungstenite::Error::Http(resp)) => {
                let body: serde_json::Value = resp
                    .body()
                    .as_deref()
                    .and_then(|b| serde_json::from_slice(b).ok())
                    .unwrap_or_default();
                let text = |k: &str| body[k].as_str().unwrap_or("").to_string();
                Err(RemoteError {
                    status: resp.status().as_u16(),
                    code: text("code"),
                    message: text("message"),
                }
                .into())
            }
            Err(e) => Err(self.unreachable(e)),
        }
    }
}

impl Client {
    /// A raw TCP connection to `path` on the daemon (`GET` with
    /// `Connection: Upgrade`, `Upgrade: tcp`, the key in `Authorization`):
    /// the socket once the daemon answered `101`; an error answer becomes a
    /// [`RemoteError`], like any other.
    pub fn tcp(&self, path: &str) -> anyhow::Result<TcpStream> {
        use std::io::{BufRead, BufReader, Read, Write};
        let authority = match self.base.split_once("://") {
            Some(("http", rest)) => rest.split('/').next().unwrap_or(rest).to_string(),
            _ => anyhow::bail!(
                "--url/BRIG_URL {} is not an http:// URL (e.g. http://127.0.0.1:7777): raw TCP \
                 through the daemon needs plain HTTP",
                self.base
            ),
        };
        let mut stream = TcpStream::connect(&authority).map_err(|e| self.unreachable(e))?;
        stream.set_nodelay(true)?;
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: {authority}\r\nAuthorization: Bearer {}\r\n\
             Connection: Upgrade\r\nUpgrade: tcp\r\n\r\n",
            self.key
        )?;
        // The answer's head, a byte at a time: nothing past it may be
        // taken from the socket (it is the sandbox's data).
        let mut reader = BufReader::with_capacity(1, &stream);
        let mut head = Vec::new();
        let mut length = 0usize;
        let mut status = 0u16;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line)? == 0 || head.len() > 64 * 1024 {
                anyhow::bail!("the daemon at {} broke off its answer", self.base);
            }
            if head.is_empty() {
                status = line
                    .split_whitespace()
                    .nth(1)
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
            } else if let Some(v) = line
                .split_once(':')
                .filter(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            {
                length = v.1.trim().parse().unwrap_or(0);
            }
            head.push(line.clone());
            if line == "\r\n" {
                break;
            }
        }
        if status == 101 {
            return Ok(stream);
        }
        let mut body = vec![0; length.min(1 << 20)];
        reader.read_exact(&mut body)?;
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        let text = |k: &str| body[k].as_str().unwrap_or("").to_string();
        Err(RemoteError {
            status,
            code: text("code"),
            message: text("message"),
        }
        .into())
    }
}

/// `KEY=VALUE` pairs from repeated flags.
/// `-e KEY=VALUE` items, `-e KEY` (the value of KEY here, as docker passes
/// it through; left out if unset) and `--env-file` files (KEY=VALUE lines,
/// `#` comments and blank lines skipped), files first so flags win.
pub fn env_pairs(
    items: &[String],
    files: &[std::path::PathBuf],
) -> anyhow::Result<serde_json::Map<String, serde_json::Value>> {
    let mut map = serde_json::Map::new();
    for file in files {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read --env-file {}", file.display()))?;
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (k, v) = line.split_once('=').with_context(|| {
                format!(
                    "{}:{}: expected KEY=VALUE, got {line:?}",
                    file.display(),
                    n + 1
                )
            })?;
            map.insert(k.trim().to_string(), v.into());
        }
    }
    for item in items {
        match item.split_once('=') {
            Some((k, v)) => {
                map.insert(k.to_string(), v.into());
            }
            None => {
                if let Ok(v) = std::env::var(item) {
                    map.insert(item.clone(), v.into());
                }
            }
        }
    }
    Ok(map)
}

pub fn pairs(
    flag: &str,
    items: &[String],
) -> anyhow::Result<serde_json::Map<String, serde_json::Value>> {
    let mut map = serde_json::Map::new();
    for item in items {
        let (k, v) = item
            .split_once('=')
            .with_context(|| format!("invalid --{flag} {item:?}: expected KEY=VALUE"))?;
        map.insert(k.to_string(), v.into());
    }
    Ok(map)
}

/// A sandbox id from the command line, checked before it goes into a URL
/// (where a `/` or `?` would address something else).
/// What may name a sandbox before the daemon is asked: an id, a start of
/// one, or a name (letters, digits, `_`, `.`, `-`).
pub fn check_sandbox_ref(given: &str) -> anyhow::Result<()> {
    let token = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-');
    if given.is_empty() || !given.bytes().all(token) {
        anyhow::bail!(
            "invalid sandbox {given:?}: name a sandbox by its id (12 hex digits), its name or a \
             unique start of its id, as `brig ls` shows"
        );
    }
    Ok(())
}

/// Milliseconds since the Unix epoch (the daemon's timestamps).
pub fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// A span of milliseconds the way people read it: `45s`, `3m20s`, `2h5m`,
/// `3d4h` (two units at most).
pub fn span(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    match (s / 86_400, s % 86_400 / 3600, s % 3600 / 60, s % 60) {
        (0, 0, 0, s) => format!("{s}s"),
        (0, 0, m, s) => format!("{m}m{s}s"),
        (0, h, m, _) => format!("{h}h{m}m"),
        (d, h, _, _) => format!("{d}d{h}h"),
    }
}

/// `3m20s ago` for a timestamp in milliseconds since the epoch.
pub fn ago(at: i64) -> String {
    format!("{} ago", span(now_millis() - at))
}

/// Bytes as people read them (1.5M).
pub fn human_size(bytes: u64) -> String {
    let units = ["B", "K", "M", "G", "T"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < units.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes}B")
    } else {
        format!("{v:.1}{}", units[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_read_like_durations() {
        assert_eq!(span(0), "0s");
        assert_eq!(span(-5), "0s");
        assert_eq!(span(45_999), "45s");
        assert_eq!(span(200_000), "3m20s");
        assert_eq!(span(2 * 3_600_000 + 5 * 60_000 + 7_000), "2h5m");
        assert_eq!(span(3 * 86_400_000 + 4 * 3_600_000), "3d4h");
    }

    #[test]
    fn daemon_errors_give_cli_remedies_not_routes() {
        let e = |status, code: &str, message: &str| {
            RemoteError {
                status,
                code: code.into(),
                message: message.into(),
            }
            .to_string()
        };
        let paused = e(
            409,
            "paused",
            "sandbox 0123456789ab is paused; resume it first (POST /v1/sandboxes/0123456789ab/resume)",
        );
        assert_eq!(
            paused,
            "sandbox 0123456789ab is paused; resume it with `brig resume 0123456789ab` (paused)"
        );
        let again = e(
            409,
            "conflict",
            "sandbox 0123456789ab is already paused; resume it with POST /v1/sandboxes/0123456789ab/resume",
        );
        assert!(
            !again.contains("/v1/") && again.contains("brig resume 0123456789ab"),
            "{again}"
        );
        let key = e(401, "unauthorized", "missing or invalid api key: pass a key from `brig keys create` as `Authorization: Bearer <key>`");
        assert!(
            key.contains("BRIG_API_KEY") && !key.contains("Authorization"),
            "{key}"
        );
        let other = e(400, "bad_request", "no such endpoint; see api/openapi.yaml");
        assert_eq!(other, "no such endpoint (bad_request)");
    }

    #[test]
    fn only_ids_and_names_are_looked_up() {
        for good in ["0123456789ab", "3f9a", "web-1", "a.b_c"] {
            check_sandbox_ref(good).unwrap();
        }
        for bad in ["", "../keys", "0123456789ab/files", "0123456789ab?x", "a b"] {
            let err = check_sandbox_ref(bad).unwrap_err().to_string();
            assert!(err.contains("brig ls"), "{err}");
        }
    }
}
