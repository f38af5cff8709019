//! `/v1/sandboxes`: create, list, get, delete, extend the timeout, pause,
//! resume, metrics.

use std::collections::BTreeMap;

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, RawQuery, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use brig_core::{parse_duration, EnvVar, Isolation, Limits, TemplateRef};
use serde::{Deserialize, Serialize};

use super::{blocking, sandbox_id, ApiError, AppState, Auth};
use brig_runtime::CreateConfig;
use brig_runtime::{Cursor, ListFilter, SandboxState};
use brig_runtime::{PauseMode, SandboxMetrics, SandboxRecord, UnixMillis};

/// Page size when the client names none, and the most it may ask for.
const DEFAULT_PAGE: usize = 100;
const MAX_PAGE: usize = 1000;

/// The body of `POST /v1/sandboxes`. Every field is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateSandboxConfig {
    /// `host` or `dir:/path/to/rootfs`.
    pub template: Option<String>,
    /// The isolation tier: `process` (the default, and today the only one
    /// this daemon runs; `GET /v1/info` lists what the host could offer).
    pub isolation: Option<String>,
    /// A size such as `512M` or `1G`.
    pub memory: Option<String>,
    pub cpus: Option<f64>,
    pub pids: Option<u32>,
    pub disk: Option<String>,
    /// A duration such as `90s`, `10m` or `1h30m`.
    pub timeout: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// A name unique among the tenant's sandboxes until its record is
    /// removed: letters, digits, `_`, `.`, `-`, at most 64.
    pub name: Option<String>,
    /// Its network (see `network.rs`); absent: the daemon's default,
    /// `public` (loopback only if the daemon cannot give sandboxes a network).
    pub network: Option<crate::network::NetworkConfig>,
    /// Ports to publish on the host's loopback: `"[HOSTPORT:]PORT"` each
    /// (no HOSTPORT: any free one; the answer's `ports.published` says
    /// which).
    #[serde(default)]
    pub publish: Vec<String>,
    /// Whether requests to its ports by host name
    /// (`http://PORT-ID.localhost:7777/`) need no token. Default false:
    /// they carry the sandbox's `ports.token` in `X-Brig-Traffic-Token`
    /// (or the tenant's key).
    #[serde(default)]
    pub public_ports: bool,
    /// Secrets of this sandbox alone, for its injections'
    /// `${secrets.NAME}` (before the tenant's of the same name): name →
    /// value. Never shown back.
    #[serde(default)]
    pub secrets: BTreeMap<String, String>,
    /// Volumes to mount (see `volumes.rs`): `{"volume": ID_OR_NAME,
    /// "path": "/mnt/data"}` each, on the process tier.
    #[serde(default)]
    pub volumes: Vec<VolumeMountRequest>,
}

/// One volume a create mounts.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeMountRequest {
    /// The volume's id or name.
    pub volume: String,
    /// Where it appears inside: absolute, clean, not a system directory.
    pub path: String,
}

/// What a create asked of its ports, checked before anything is made.
struct PortsAsked {
    publish: Vec<(u16, u16)>,
    public: bool,
}

impl CreateSandboxConfig {
    /// What a create would be asked to make, or the 400 it is answered
    /// with: stage two without the create (the `spec_limits` fuzz target).
    pub fn validate(self) -> Result<CreateConfig, ApiError> {
        self.parse().map(|(config, _)| config)
    }

    /// Stage two: every field parsed, or a 400 naming the field.
    fn parse(self) -> Result<(CreateConfig, PortsAsked), ApiError> {
        let bad = |field: &str, e: &dyn std::fmt::Display| {
            ApiError::bad_request(format!("invalid {field}: {e}"))
        };
        let isolation = match self.isolation.as_deref() {
            None => Isolation::Process,
            Some(t) => t.parse::<Isolation>().map_err(|e| bad("isolation", &e))?,
        };
        let limits = Limits::from_request(
            self.memory.as_deref(),
            self.disk.as_deref(),
            self.pids,
            self.cpus,
        )
        .map_err(|(field, e)| bad(field, &e))?;
        let template = match &self.template {
            Some(t) => TemplateRef::parse(t).map_err(|e| ApiError::bad_request(e.to_string()))?,
            None => TemplateRef::Host,
        };
        let timeout = self
            .timeout
            .as_deref()
            .map(parse_duration)
            .transpose()
            .map_err(|e| bad("timeout", &e))?;
        let env = EnvVar::from_map(&self.env).map_err(|e| ApiError::bad_request(e.to_string()))?;
        let network = self.network.map(|n| n.parse()).transpose()?;
        let publish = self
            .publish
            .iter()
            .map(|p| brig_net::publish::parse(p).map_err(ApiError::bad_request))
            .collect::<Result<Vec<_>, _>>()?;
        let config = CreateConfig {
            template,
            limits,
            env,
            labels: self.labels,
            name: self.name,
            timeout,
            network,
            secrets: self.secrets,
            isolation,
            volumes: self
                .volumes
                .into_iter()
                .map(|v| brig_runtime::VolumeRequest {
                    volume: v.volume,
                    path: v.path,
                })
                .collect(),
            ..CreateConfig::default()
        };
        let ports = PortsAsked {
            publish,
            public: self.public_ports,
        };
        Ok((config, ports))
    }
}

/// The body of `POST /v1/sandboxes/{id}/timeout`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimeoutConfig {
    /// New time to live from now, e.g. `10m`.
    pub timeout: String,
}

/// A sandbox as the API shows it. Times are milliseconds since the epoch.
#[derive(Debug, Serialize)]
pub struct SandboxView {
    pub id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub state: SandboxState,
    pub template: String,
    pub isolation: String,
    pub labels: BTreeMap<String, String>,
    pub created_at: UnixMillis,
    pub expires_at: UnixMillis,
    pub ended_at: Option<UnixMillis>,
    pub exit_code: Option<i32>,
    /// Why it ended (`{"cause": "timeout"}`, `{"cause": "deleted", "by":
    /// TENANT}`, ...) and the same as a sentence; absent while it lives.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end: Option<serde_json::Value>,
    /// The limits it was created with: memory and disk in bytes, pids,
    /// cpus (null: unlimited).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limits: Option<serde_json::Value>,
    /// How its ports are reached from outside: `{"public": bool, "token":
    /// "…", "published": [{"port", "host_port"}]}` (absent for a sandbox
    /// made by another front-end).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ports: Option<serde_json::Value>,
    /// The volumes it mounts: `[{"id", "name", "path"}]` (absent: none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<brig_runtime::MountedVolume>,
}

impl From<SandboxRecord> for SandboxView {
    fn from(r: SandboxRecord) -> SandboxView {
        SandboxView {
            id: r.id.to_string(),
            name: r.name,
            state: r.state,
            template: r.template,
            isolation: r.isolation,
            labels: r.labels,
            created_at: r.created_at,
            expires_at: r.expires_at,
            ended_at: r.ended_at,
            exit_code: r.exit_code,
            limits: r.spec.get("limits").map(|l| {
                serde_json::json!({
                    "memory_bytes": l["memory"],
                    "disk_bytes": l["disk"],
                    "pids": l["pids"],
                    "cpus": l["cpus"],
                })
            }),
            ports: r.attrs.get(crate::ports::ATTR).cloned(),
            volumes: brig_runtime::volumes::mounted(&r.attrs),
            end: r.end.map(|cause| {
                let mut v = serde_json::to_value(&cause).unwrap_or_default();
                v["message"] = cause.describe().into();
                v
            }),
        }
    }
}

/// A page of sandboxes; pass `next` back as `cursor` for the following one.
#[derive(Debug, Serialize)]
pub struct SandboxList {
    pub items: Vec<SandboxView>,
    pub next: Option<String>,
}

pub async fn create(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    body: Result<Json<CreateSandboxConfig>, JsonRejection>,
) -> Result<(StatusCode, Json<SandboxView>), ApiError> {
    let (mut config, ports) = body?.0.parse()?;
    if !state.manager.tiers().contains(&config.isolation) {
        // A 4xx: the request asks for what this host cannot give, the
        // server is not failing.
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "unsupported",
            format!(
                "the {} isolation tier is not offered by this daemon; GET /v1/info says which \
                 tiers this host has and how to get a missing one",
                config.isolation
            ),
        ));
    }
    // Host ports are bound first: a taken one fails the create with
    // nothing made.
    let bound = brig_http::publish::bind(&ports.publish)?;
    let kept = crate::ports::Kept {
        public: ports.public,
        token: brig_http::random_token(),
        published: bound.iter().map(|b| b.published()).collect(),
    };
    config.attrs.insert(
        crate::ports::ATTR.into(),
        serde_json::to_value(&kept).unwrap_or_default(),
    );
    let manager = state.manager.clone();
    let owner = tenant.clone();
    let record = blocking(move || manager.create(&owner, config)).await?;
    if !bound.is_empty() {
        state.publisher.start(&tenant, &record.id, bound);
    }
    Ok((StatusCode::CREATED, Json(record.into())))
}

/// `?state=running&label=k=v&label=k2=v2&limit=50&cursor=...`
pub async fn list(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    RawQuery(query): RawQuery,
) -> Result<Json<SandboxList>, ApiError> {
    let pairs: Vec<(String, String)> =
        serde_urlencoded::from_str(query.as_deref().unwrap_or(""))
            .map_err(|e| ApiError::bad_request(format!("invalid query string: {e}")))?;
    let mut filter = ListFilter::default();
    let mut cursor = None;
    let mut limit = DEFAULT_PAGE;
    for (k, v) in pairs {
        match k.as_str() {
            "state" => {
                filter.state = Some(SandboxState::parse(&v).ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "invalid state {v:?}: use creating, running, paused, stopped or dead"
                    ))
                })?)
            }
            "label" => {
                let (lk, lv) = v.split_once('=').ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "invalid label filter {v:?}: use label=KEY=VALUE"
                    ))
                })?;
                filter.labels.insert(lk.to_string(), lv.to_string());
            }
            "cursor" => {
                cursor = Some(Cursor::parse(&v).map_err(|e| ApiError::bad_request(e.to_string()))?)
            }
            "limit" => {
                limit = v
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=MAX_PAGE).contains(n))
                    .ok_or_else(|| {
                        ApiError::bad_request(format!(
                            "invalid limit {v:?}: use a number from 1 to {MAX_PAGE}"
                        ))
                    })?
            }
            other => {
                return Err(ApiError::bad_request(format!(
                    "unknown query parameter {other:?}: use state, label, limit or cursor"
                )))
            }
        }
    }
    let manager = state.manager.clone();
    let page = blocking(move || manager.list(&tenant, &filter, cursor.as_ref(), limit)).await?;
    Ok(Json(SandboxList {
        items: page.items.into_iter().map(SandboxView::from).collect(),
        next: page.next.map(|c| c.as_str().to_string()),
    }))
}

pub async fn get(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<SandboxView>, ApiError> {
    let id = sandbox_id(&id?.0)?;
    let manager = state.manager.clone();
    let record = blocking(move || manager.get(&tenant, &id)).await?;
    Ok(Json(record.into()))
}

/// `DELETE /v1/sandboxes/{id}?remove=true`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeleteQuery {
    /// Forget an ended sandbox's record instead of ending a live one.
    #[serde(default)]
    pub remove: bool,
}

/// Kill the sandbox; answers once it is torn down, with its final record.
/// With `?remove=true`, forget an ended one's record (204; a live one is
/// 409).
pub async fn delete(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    id: Result<Path<String>, PathRejection>,
    query: Result<Query<DeleteQuery>, QueryRejection>,
) -> Result<axum::response::Response, ApiError> {
    let id = sandbox_id(&id?.0)?;
    let remove = query.map_err(ApiError::from)?.0.remove;
    let manager = state.manager.clone();
    if remove {
        blocking(move || manager.remove(&tenant, &id)).await?;
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    let record = blocking(move || manager.delete(&tenant, &id)).await?;
    Ok(Json(SandboxView::from(record)).into_response())
}

pub async fn extend(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    id: Result<Path<String>, PathRejection>,
    body: Result<Json<TimeoutConfig>, JsonRejection>,
) -> Result<Json<SandboxView>, ApiError> {
    let id = sandbox_id(&id?.0)?;
    let timeout = parse_duration(&body?.0.timeout)
        .map_err(|e| ApiError::bad_request(format!("invalid timeout: {e}")))?;
    let manager = state.manager.clone();
    let record = blocking(move || manager.extend(&tenant, &id, timeout)).await?;
    Ok(Json(record.into()))
}

/// The optional body of `POST /v1/sandboxes/{id}/resume`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResumeConfig {
    /// Time to live from the resume, e.g. `10m`; by default the time the
    /// sandbox had left when it was paused.
    pub timeout: Option<String>,
    /// End every process but the agent as it resumes (what a `filesystem`
    /// pause did already).
    #[serde(default)]
    pub reboot: bool,
}

/// `POST /v1/sandboxes/{id}/pause` (body optional).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PauseConfig {
    /// `full` (default) keeps memory and processes; `filesystem` ends
    /// every process but the agent and keeps the files.
    #[serde(default)]
    pub mode: PauseMode,
}

/// An optional JSON body: absent or blank is the default.
pub(crate) fn optional_body<T: Default + for<'de> Deserialize<'de>>(
    body: &[u8],
) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))
}

/// Freeze every process of the sandbox and suspend its timeout.
pub async fn pause(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    id: Result<Path<String>, PathRejection>,
    body: axum::body::Bytes,
) -> Result<Json<SandboxView>, ApiError> {
    let id = sandbox_id(&id?.0)?;
    let config: PauseConfig = optional_body(&body)?;
    let manager = state.manager.clone();
    let record = blocking(move || manager.pause_with(&tenant, &id, config.mode)).await?;
    Ok(Json(record.into()))
}

/// Thaw a paused sandbox. The body is optional.
pub async fn resume(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    id: Result<Path<String>, PathRejection>,
    body: axum::body::Bytes,
) -> Result<Json<SandboxView>, ApiError> {
    let id = sandbox_id(&id?.0)?;
    let config: ResumeConfig = optional_body(&body)?;
    let timeout = config
        .timeout
        .as_deref()
        .map(parse_duration)
        .transpose()
        .map_err(|e| ApiError::bad_request(format!("invalid timeout: {e}")))?;
    let manager = state.manager.clone();
    let (record, _) =
        blocking(move || manager.resume_with(&tenant, &id, timeout, config.reboot)).await?;
    Ok(Json(record.into()))
}

/// `GET /v1/sandboxes/{id}/metrics/series`'s query: a range of Unix
/// times in milliseconds, both optional and included.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeriesQuery {
    pub since: Option<i64>,
    pub until: Option<i64>,
}

/// The samples of a sandbox's metrics series in a range.
#[derive(Debug, Serialize)]
pub struct MetricsSeries {
    /// How often a running sandbox is sampled.
    pub interval_ms: u64,
    pub items: Vec<SandboxMetrics>,
}

/// The sandbox's metrics series (a sample every `interval_ms` while it
/// runs, the last hour kept): the samples from `since` to `until`.
pub async fn metrics_series(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    id: Result<Path<String>, PathRejection>,
    query: Result<Query<SeriesQuery>, QueryRejection>,
) -> Result<Json<MetricsSeries>, ApiError> {
    let id = sandbox_id(&id?.0)?;
    let range = query.map_err(ApiError::from)?.0;
    let (since, until) = (range.since.unwrap_or(0), range.until.unwrap_or(i64::MAX));
    if since > until {
        return Err(ApiError::bad_request(format!(
            "since ({since}) is after until ({until}): give a range that runs forwards"
        )));
    }
    let manager = state.manager.clone();
    let interval_ms = manager.config().metrics_interval.as_millis() as u64;
    let items = blocking(move || manager.metrics_series(&tenant, &id, since, until)).await?;
    Ok(Json(MetricsSeries { interval_ms, items }))
}

/// A sample of the sandbox's CPU, memory, disk and task use.
pub async fn metrics(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<SandboxMetrics>, ApiError> {
    let id = sandbox_id(&id?.0)?;
    let manager = state.manager.clone();
    Ok(Json(blocking(move || manager.metrics(&tenant, &id)).await?))
}
