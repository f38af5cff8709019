//! What the daemon's client subcommands share: where the daemon is
//! (`BRIG_URL`), which key to present (`BRIG_API_KEY`, else the key the
//! local daemon wrote to `$BRIG_HOME/local.key`), and turning an error
//! answer (`{"code","message"}`) into an error carrying its message.

use std::path::PathBuf;

use anyhow::Context;

/// Where a local daemon writes the first key, for the local CLI.
pub const LOCAL_KEY_FILE: &str = "local.key";
pub const DEFAULT_URL: &str = "http://127.0.0.1:7777";
pub const DEFAULT_HOME: &str = "/var/lib/brig";

/// `$BRIG_HOME`, else /var/lib/brig.
pub fn home_dir() -> PathBuf {
    std::env::var_os("BRIG_HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_HOME))
}

/// A connection to the daemon: base URL and key.
#[derive(Debug)]
pub struct Client {
    base: String,
    key: String,
    agent: ureq::Agent,
}

/// An error answer from the daemon.
#[derive(Debug, thiserror::Error)]
#[error("{message} (HTTP {status}, {code})")]
pub struct RemoteError {
    pub status: u16,
    pub code: String,
    pub message: String,
}

impl Client {
    /// From the environment, or a clear error saying what to set.
    pub fn from_env() -> anyhow::Result<Client> {
        let base = std::env::var("BRIG_URL")
            .ok()
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| DEFAULT_URL.to_string());
        let key = match std::env::var("BRIG_API_KEY").ok().filter(|k| !k.is_empty()) {
            Some(k) => k,
            None => {
                let path = home_dir().join(LOCAL_KEY_FILE);
                std::fs::read_to_string(&path)
                    .with_context(|| {
                        format!(
                            "no api key: set BRIG_API_KEY, or run where the local daemon's key \
                             {} is readable (BRIG_HOME selects the daemon's home)",
                            path.display()
                        )
                    })?
                    .trim()
                    .to_string()
            }
        };
        Ok(Client {
            base: base.trim_end_matches('/').to_string(),
            key,
            agent: ureq::AgentBuilder::new().build(),
        })
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
            Err(e) => Err(anyhow::Error::new(e)
                .context(format!("cannot reach the brig daemon at {}", self.base))),
        }
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

/// `KEY=VALUE` pairs from repeated flags.
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
