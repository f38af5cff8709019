//! The control plane's JSON: E2B's request and response schemas (field
//! names exact, reference §1.4) and its error body (§1.2).

use std::collections::BTreeMap;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::time::rfc3339;
use crate::{E2bSandbox, ENVD_VERSION};
use brig_http::BlockingError;
use brig_runtime::{chain, ErrorKind, ManagerError};
use brig_runtime::{SandboxMetrics, SandboxRecord, SandboxState};

/// Upstream always answers this constant `clientID` (a legacy field the
/// Python client still requires).
pub const CLIENT_ID: &str = "6532622b";

/// A control-plane error: `{"code": <status>, "message": "..."}`. The
/// generated Python client parses the body of every documented error
/// status, so it is never empty and never anything but this shape.
#[derive(Debug)]
pub struct E2bError {
    pub status: StatusCode,
    pub message: String,
    /// `Retry-After` (seconds): E2B's clients wait that long before they
    /// retry a 503 (three times, within their request timeout).
    pub retry_after: Option<u64>,
}

impl E2bError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> E2bError {
        E2bError {
            status,
            retry_after: None,
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> E2bError {
        E2bError::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn not_found(id: &str) -> E2bError {
        E2bError::new(StatusCode::NOT_FOUND, format!("sandbox {id} not found"))
    }

    /// A bug or a host failure: logged in full, reported with its chain.
    pub fn internal(err: &(dyn std::error::Error + 'static)) -> E2bError {
        E2bError::from_kind(ErrorKind::Internal, chain(err))
    }

    /// The status of a runtime error of this kind, with `message` (an
    /// internal one is logged).
    pub fn from_kind(kind: ErrorKind, message: String) -> E2bError {
        use StatusCode as S;
        let status = match kind {
            ErrorKind::NotFound => S::NOT_FOUND,
            ErrorKind::BadRequest => S::BAD_REQUEST,
            ErrorKind::Conflict | ErrorKind::NotRunning | ErrorKind::Paused => S::CONFLICT,
            ErrorKind::Forbidden => S::FORBIDDEN,
            ErrorKind::Unauthorized => S::UNAUTHORIZED,
            ErrorKind::Unsupported => S::NOT_IMPLEMENTED,
            ErrorKind::NoSpace => S::INSUFFICIENT_STORAGE,
            ErrorKind::Unavailable => S::SERVICE_UNAVAILABLE,
            ErrorKind::Internal => {
                tracing::error!("internal error: {message}");
                S::INTERNAL_SERVER_ERROR
            }
        };
        E2bError::new(status, message)
    }
}

/// How long a client is asked to wait before it retries a create of a
/// template still being prepared: three retries (the clients' default)
/// then span 30 s of the build, inside their 60 s request timeout.
pub const PREPARING_RETRY_SECS: u64 = 10;

impl IntoResponse for E2bError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({
            "code": self.status.as_u16(),
            "message": self.message,
        });
        let mut response = (self.status, Json(body)).into_response();
        if let Some(secs) = self.retry_after {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, secs.into());
        }
        response
    }
}

/// The runtime's error kind decides the status; the message is the
/// runtime's, with its sources.
impl From<ManagerError> for E2bError {
    fn from(e: ManagerError) -> E2bError {
        let mut err = E2bError::from_kind(e.kind(), chain(&e));
        if let ManagerError::Preparing { .. } | ManagerError::Warming { .. } = e {
            // The clients' retries then wait out part of the build.
            err.retry_after = Some(PREPARING_RETRY_SECS);
        }
        err
    }
}

impl From<tokio::task::JoinError> for E2bError {
    fn from(e: tokio::task::JoinError) -> E2bError {
        E2bError::internal(&e)
    }
}

impl<E: Into<E2bError>> From<BlockingError<E>> for E2bError {
    fn from(e: BlockingError<E>) -> E2bError {
        match e {
            BlockingError::Call(e) => e.into(),
            BlockingError::Task(e) => e.into(),
        }
    }
}

/// A list's `limit` (E2B's pages: 1 to 100), or a 400 saying so.
pub fn page_limit(v: &str) -> Result<usize, E2bError> {
    v.parse()
        .ok()
        .filter(|l| (1..=100).contains(l))
        .ok_or_else(|| E2bError::bad_request(format!("invalid limit {v:?}: from 1 to 100")))
}

/// Parse a JSON body leniently: an empty body is the default, unknown
/// fields are ignored (each client generation sends some of its own:
/// `secure`, `allow_internet_access`, `autoResume`, ...).
pub fn body<T: for<'de> Deserialize<'de> + Default>(bytes: &[u8]) -> Result<T, E2bError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(bytes)
        .map_err(|e| E2bError::bad_request(format!("invalid request body: {e}")))
}

/// `POST /v2/sandboxes` (`NewSandboxV2`) and `POST /sandboxes`
/// (`NewSandbox`): the fields brig acts on.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox {
    #[serde(rename = "templateID")]
    pub template_id: Option<String>,
    /// Seconds; 300 when absent (the current clients send it only when the
    /// user gives one).
    pub timeout: Option<i64>,
    pub env_vars: Option<BTreeMap<String, String>>,
    pub metadata: Option<BTreeMap<String, String>>,
    /// Pause rather than kill when the timeout passes.
    pub auto_pause: Option<bool>,
    /// With `autoPause`: `false` keeps only the filesystem.
    pub auto_pause_memory: Option<bool>,
    pub auto_resume: Option<AutoResume>,
    /// `false` refuses `allowPublicTraffic: false` (the clients send `true`).
    pub secure: Option<bool>,
    /// `false`: as `denyOut: ["0.0.0.0/0"]` (snake_case on the wire).
    #[serde(rename = "allow_internet_access")]
    pub allow_internet_access: Option<bool>,
    pub network: Option<NetworkConfig>,
    /// Workload-identity tokens: refused until brig mints them.
    pub iam: Option<serde_json::Value>,
    /// Volumes to mount, by name (`volumes.rs`).
    pub volume_mounts: Option<Vec<super::volumes::VolumeMount>>,
}

/// `SandboxNetworkConfig`: a create's `network`, kept as given and shown
/// again by `GET /sandboxes/{id}` (an update replaces its egress part).
#[derive(Debug, Default, Clone, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkConfig {
    /// IPs, CIDRs and domains (`a.com`, `*.a.com`, `*`) let through.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_out: Option<Vec<String>>,
    /// IPs and CIDRs refused unless `allowOut` lets them through.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deny_out: Option<Vec<String>>,
    /// Per-host header transforms: refused until brig injects headers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rules: Option<serde_json::Map<String, serde_json::Value>>,
    /// A SOCKS5 proxy for egress: refused until brig tunnels through one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress_proxy: Option<serde_json::Value>,
    /// `false`: the sandbox's ports need `e2b-traffic-access-token`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_public_traffic: Option<bool>,
    /// The `Host` the sandbox's ports are sent (`${PORT}` is the port).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mask_request_host: Option<String>,
    /// Ports the data plane would reach over TLS: refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub https_ports: Option<Vec<u16>>,
    /// Resolvers (accepted and shown: DNS always goes through brig's
    /// resolver, which answers by the policy).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dns_servers: Option<Vec<String>>,
}

/// `SandboxNetworkUpdateConfig` (`PUT /sandboxes/{id}/network`): replaces
/// the whole egress configuration; an absent field is cleared.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkUpdate {
    pub allow_out: Option<Vec<String>>,
    pub deny_out: Option<Vec<String>>,
    pub rules: Option<serde_json::Map<String, serde_json::Value>>,
    pub egress_proxy: Option<serde_json::Value>,
    pub dns_servers: Option<Vec<String>>,
    #[serde(rename = "allow_internet_access")]
    pub allow_internet_access: Option<bool>,
}

/// `autoResume` of a create.
#[derive(Debug, Default, Deserialize)]
pub struct AutoResume {
    pub enabled: bool,
}

/// `POST /sandboxes/{id}/pause` (`SandboxPauseRequest`; older clients send
/// no body). Its `requireHealthyGuest` changes nothing here: brig's pause
/// never keeps an agent that does not answer (a frozen agent is thawed
/// as it was).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Pause {
    /// `false`: keep only the filesystem (a resume reboots).
    pub memory: Option<bool>,
}

/// `POST /v2/sandboxes/{id}/connect` (`{timeout?, memory?}`), its v1 form
/// (`{timeout}`) and the legacy `POST /sandboxes/{id}/resume`
/// (`{timeout?, autoPause?}`).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Connect {
    pub timeout: Option<i64>,
    /// `false` (`on_resume="reboot"`): a paused sandbox resumes with its
    /// files only, its processes ended.
    pub memory: Option<bool>,
}

/// `POST /sandboxes/{id}/timeout`.
#[derive(Debug, Default, Deserialize)]
pub struct SetTimeout {
    pub timeout: Option<i64>,
}

/// `Sandbox`: the answer to create, connect and resume.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Sandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: &'static str,
    pub envd_version: &'static str,
    pub envd_access_token: String,
    pub traffic_access_token: Option<String>,
    pub domain: Option<String>,
    pub alias: String,
}

impl Sandbox {
    /// `domain`: the daemon's E2B domain, if it serves one
    /// ([`crate::E2bState::domain`]).
    pub fn new(sb: &E2bSandbox, domain: Option<&str>) -> Sandbox {
        Sandbox {
            template_id: sb.template.clone(),
            sandbox_id: sb.id.to_string(),
            client_id: CLIENT_ID,
            envd_version: ENVD_VERSION,
            envd_access_token: sb.access_token.clone(),
            traffic_access_token: sb.traffic_token.clone(),
            domain: domain.map(str::to_string),
            alias: sb.template.clone(),
        }
    }
}

/// `SandboxDetail` (`GET /sandboxes/{id}`) and, without the token,
/// `ListedSandbox` (`GET /v2/sandboxes`, `GET /sandboxes`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Detail {
    #[serde(rename = "templateID")]
    pub template_id: String,
    pub alias: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: &'static str,
    pub started_at: String,
    pub end_at: String,
    pub envd_version: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub envd_access_token: Option<String>,
    pub cpu_count: u32,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u64,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u64,
    /// `running` or `paused`: anything else makes the Python client raise.
    pub state: &'static str,
    pub metadata: BTreeMap<String, String>,
    pub domain: Option<String>,
    /// What happens when the timeout passes (`SandboxDetail` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<Lifecycle>,
    /// How a paused sandbox was paused (`full` or `filesystem`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pause_mode: Option<&'static str>,
    /// Create's `allow_internet_access` (or the last update's), null if
    /// never given (`SandboxDetail` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_internet_access: Option<Option<bool>>,
    /// The network configuration as given (`SandboxDetail` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkConfig>,
    /// The volumes it mounts, by name.
    pub volume_mounts: Vec<super::volumes::VolumeMount>,
}

/// `SandboxLifecycle`: both keys are required when it is present.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Lifecycle {
    pub auto_resume: bool,
    /// `kill` or `pause`.
    pub on_timeout: &'static str,
}

impl Detail {
    /// `with_token`: `SandboxDetail` (Python 1.x connects with it) rather
    /// than `ListedSandbox`.
    pub fn new(sb: &E2bSandbox, record: &SandboxRecord, with_token: bool) -> Detail {
        Detail::with_pause(sb, record, with_token, None)
    }

    /// With the daemon's E2B domain, if it serves one.
    pub fn in_domain(mut self, domain: Option<&str>) -> Detail {
        self.domain = domain.map(str::to_string);
        self
    }

    /// [`Detail::new`] of a sandbox paused as `paused` says.
    pub fn with_pause(
        sb: &E2bSandbox,
        record: &SandboxRecord,
        with_token: bool,
        paused: Option<brig_runtime::PauseMode>,
    ) -> Detail {
        let limits = record
            .spec
            .get("limits")
            .cloned()
            .and_then(|l| serde_json::from_value::<brig_core::Limits>(l).ok())
            .unwrap_or_default();
        let cpu_count = match limits.cpus {
            Some(c) => c.ceil().max(1.0) as u32,
            None => brig_core::host_cpus() as u32,
        };
        Detail {
            template_id: sb.template.clone(),
            alias: sb.template.clone(),
            sandbox_id: sb.id.to_string(),
            client_id: CLIENT_ID,
            started_at: rfc3339(record.created_at),
            end_at: rfc3339(record.expires_at),
            envd_version: ENVD_VERSION,
            envd_access_token: with_token.then(|| sb.access_token.clone()),
            cpu_count,
            memory_mb: limits.memory.0 / brig_core::ByteSize::MIB,
            disk_size_mb: limits.disk.0 / brig_core::ByteSize::MIB,
            state: state_name(record.state),
            metadata: sb.metadata.clone(),
            domain: None,
            lifecycle: with_token.then_some(Lifecycle {
                auto_resume: sb.lifecycle.auto_resume,
                on_timeout: match sb.lifecycle.on_timeout {
                    Some(_) => "pause",
                    None => "kill",
                },
            }),
            pause_mode: paused.map(|m| match m {
                brig_runtime::PauseMode::Full => "full",
                brig_runtime::PauseMode::Filesystem => "filesystem",
            }),
            allow_internet_access: with_token.then_some(sb.allow_internet_access),
            network: with_token.then(|| sb.network.clone()).flatten(),
            volume_mounts: super::volumes::echoed(record),
        }
    }
}

/// E2B knows two states; a sandbox that is ending is still `running` until
/// it is gone (it then disappears from every answer).
pub fn state_name(state: SandboxState) -> &'static str {
    match state {
        SandboxState::Paused => "paused",
        _ => "running",
    }
}

/// `SandboxMetric`: one sample.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Metric {
    pub timestamp: String,
    pub timestamp_unix: i64,
    pub cpu_count: u32,
    pub cpu_used_pct: f64,
    pub mem_used: u64,
    pub mem_total: u64,
    pub mem_cache: u64,
    pub disk_used: u64,
    pub disk_total: u64,
}

impl Metric {
    pub fn new(m: &SandboxMetrics, cpu_count: u32) -> Metric {
        Metric {
            timestamp: rfc3339(m.timestamp),
            timestamp_unix: m.timestamp / 1000,
            cpu_count,
            // brig measures percent of one core; E2B of the whole sandbox.
            cpu_used_pct: m.cpu_percent.unwrap_or(0.0) / f64::from(cpu_count.max(1)),
            mem_used: m.memory_bytes,
            mem_total: m.memory_limit_bytes,
            // Not measured separately: page cache is part of `memUsed`.
            mem_cache: 0,
            disk_used: m.disk_used_bytes.unwrap_or(0),
            disk_total: m.disk_total_bytes.unwrap_or(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use brig_core::SandboxId;

    /// Runtime errors keep their status class and their message, and never
    /// name a route of brig's native API.
    #[test]
    fn runtime_errors_become_e2b_errors_without_native_hints() {
        let id = SandboxId::from_random(7);
        for (err, status) in [
            (ManagerError::Paused { id: id.clone() }, 409),
            (ManagerError::AlreadyPaused { id: id.clone() }, 409),
            (
                ManagerError::NotRunning {
                    id: id.clone(),
                    state: SandboxState::Stopped,
                },
                409,
            ),
            (
                ManagerError::BadRequest {
                    reason: "no".into(),
                },
                400,
            ),
            (ManagerError::ShuttingDown, 503),
        ] {
            let runtime = err.to_string();
            let e = E2bError::from(err);
            assert_eq!(e.status.as_u16(), status, "{runtime}");
            assert_eq!(e.message, runtime);
            assert!(!e.message.contains("/v1/"), "{}", e.message);
        }
    }
}
