//! E2B's snapshots and fork, on brig's (the runtime's `snapshots.rs`):
//!
//! | Call | Answer |
//! |---|---|
//! | `POST /sandboxes/{id}/snapshots` `{name?, memory?}` | 201 `{snapshotID, names}`; 404 unknown or paused (E2B snapshots running sandboxes only) |
//! | `GET /snapshots?sandboxID=&name=&limit=1..100&nextToken=` | 200 `[{snapshotID, names}]`, newest first, the next page's token in `X-Next-Token` |
//! | `DELETE /templates/{snapshotID}` (`tags.rs`) | 204; 404 unknown (`delete_snapshot` returns False) |
//! | `POST /sandboxes/{id}/fork` `{timeout?, count?}` | 201 `[{sandbox} or {error: {code, message}}]`, one per fork; 409 paused |
//!
//! What a snapshot keeps is the sandbox's tier's to say, whatever `memory`
//! asks: on the process tier the files (what the sandbox wrote, deleted or
//! linked), and a sandbox made from one starts fresh on those files, as
//! E2B's filesystem snapshots do; on the gvisor tier (a sandbox without
//! internet access) its processes and memory too, and a sandbox made from
//! one runs on where it was. Its id is the `templateID` a create names to
//! start from it.

use std::sync::Arc;

use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::wire::{self, E2bError};
use super::{lookup, register, seconds, ApiKey, Wanted, DEFAULT_TIMEOUT_SECS};
use crate::E2bState;
use brig_runtime::SnapshotInfo;

/// `SandboxSnapshotRequest`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SnapshotRequest {
    name: Option<String>,
    /// Accepted and ignored: the sandbox's tier decides what is kept.
    #[allow(dead_code)]
    memory: Option<bool>,
}

/// `SnapshotInfo`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Snapshot {
    #[serde(rename = "snapshotID")]
    snapshot_id: String,
    names: Vec<String>,
}

impl From<SnapshotInfo> for Snapshot {
    fn from(s: SnapshotInfo) -> Snapshot {
        Snapshot {
            snapshot_id: s.id,
            names: s.name.into_iter().collect(),
        }
    }
}

/// `SandboxForkRequest`.
#[derive(Debug, Default, Deserialize)]
struct ForkRequest {
    timeout: Option<i64>,
    count: Option<i64>,
}

/// `SandboxForkResult`: one of the two.
#[derive(Debug, Serialize)]
struct ForkResult {
    #[serde(skip_serializing_if = "Option::is_none")]
    sandbox: Option<wire::Sandbox>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<ForkError>,
}

#[derive(Debug, Serialize)]
struct ForkError {
    code: u16,
    message: String,
}

pub(super) async fn create(
    State(state): State<E2bState>,
    ApiKey(tenant): ApiKey,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<Response, E2bError> {
    let req: SnapshotRequest = wire::body(&body)?;
    let sb = lookup(&state, &tenant, &id)?;
    let manager = Arc::clone(&state.manager);
    let info = tokio::task::spawn_blocking(move || -> Result<SnapshotInfo, E2bError> {
        // E2B snapshots running sandboxes: a paused one is not found.
        if paused(&manager, &tenant, &sb.id)? {
            return Err(E2bError::not_found(sb.id.as_str()));
        }
        Ok(manager.snapshot(&tenant, &sb.id, req.name.as_deref())?)
    })
    .await
    .map_err(E2bError::from)??;
    Ok((StatusCode::CREATED, Json(Snapshot::from(info))).into_response())
}

pub(super) async fn list(
    State(state): State<E2bState>,
    ApiKey(tenant): ApiKey,
    RawQuery(query): RawQuery,
) -> Result<Response, E2bError> {
    let mut limit = 100usize;
    let (mut sandbox, mut name, mut after) = (None, None, None);
    for (k, v) in
        serde_urlencoded::from_str::<Vec<(String, String)>>(query.as_deref().unwrap_or(""))
            .map_err(|e| E2bError::bad_request(format!("invalid query: {e}")))?
    {
        match k.as_str() {
            "limit" => limit = wire::page_limit(&v)?,
            "sandboxID" => sandbox = Some(v),
            "name" => name = Some(v),
            "nextToken" => after = Some(v),
            _ => {}
        }
    }
    let sandbox = match sandbox {
        // An id that cannot exist has no snapshots.
        Some(s) => match brig_core::SandboxId::parse(&s) {
            Some(id) => Some(id),
            None => return Ok(Json(Vec::<Snapshot>::new()).into_response()),
        },
        None => None,
    };
    // `name:default` is the name (E2B's default tag).
    let name = name.map(|n| n.strip_suffix(":default").map(str::to_string).unwrap_or(n));
    let manager = Arc::clone(&state.manager);
    let all = tokio::task::spawn_blocking(move || {
        manager.snapshots(&tenant, sandbox.as_ref(), name.as_deref())
    })
    .await
    .map_err(E2bError::from)??;
    let start = match &after {
        Some(token) => all
            .iter()
            .position(|s| &s.id == token)
            .map(|i| i + 1)
            .ok_or_else(|| {
                E2bError::bad_request(format!(
                    "invalid nextToken {token:?}: pass back the X-Next-Token of the previous page"
                ))
            })?,
        None => 0,
    };
    let page: Vec<SnapshotInfo> = all.into_iter().skip(start).take(limit + 1).collect();
    let next = (page.len() > limit).then(|| page[limit - 1].id.clone());
    let body: Vec<Snapshot> = page.into_iter().take(limit).map(Snapshot::from).collect();
    let mut r = Json(body).into_response();
    if let Some(next) = next.and_then(|n| HeaderValue::from_str(&n).ok()) {
        r.headers_mut().insert("x-next-token", next);
    }
    Ok(r)
}

pub(super) async fn fork(
    State(state): State<E2bState>,
    ApiKey(tenant): ApiKey,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<Response, E2bError> {
    let req: ForkRequest = wire::body(&body)?;
    let count = req.count.unwrap_or(1);
    if !(1..=i64::from(brig_runtime::snapshots::MAX_FORKS)).contains(&count) {
        return Err(E2bError::bad_request(format!(
            "invalid count {count}: fork makes 1 to {} sandboxes at a time",
            brig_runtime::snapshots::MAX_FORKS
        )));
    }
    let timeout = seconds(req.timeout.unwrap_or(DEFAULT_TIMEOUT_SECS))?;
    let parent = lookup(&state, &tenant, &id)?;
    let state2 = state.clone();
    let results = tokio::task::spawn_blocking(move || -> Result<Vec<ForkResult>, E2bError> {
        let manager = &state2.manager;
        if paused(manager, &tenant, &parent.id)? {
            return Err(E2bError::new(
                StatusCode::CONFLICT,
                format!(
                    "sandbox {} is paused: resume it before forking it",
                    parent.id
                ),
            ));
        }
        let config = manager.fork_config(&tenant, &parent.id, Some(timeout))?;
        let records = manager.fork(&tenant, &parent.id, count as u32, |template| {
            let mut c = config(template);
            c.wait_for_template = false;
            c
        })?;
        Ok(records
            .into_iter()
            .map(|r| {
                let made = r.map_err(E2bError::from).and_then(|record| {
                    register(
                        &state2,
                        tenant.clone(),
                        record,
                        Wanted {
                            template_id: parent.template.clone(),
                            lifecycle: parent.lifecycle,
                            timeout,
                            env: parent.env.clone(),
                            metadata: parent.metadata.clone(),
                            allow_internet_access: parent.allow_internet_access,
                            network: parent.network.clone(),
                            traffic_token: parent
                                .traffic_token
                                .as_ref()
                                .map(|_| brig_http::random_token()),
                            warm: false,
                        },
                    )
                });
                match made {
                    Ok(sb) => ForkResult {
                        sandbox: Some(wire::Sandbox::new(&sb, state.domain())),
                        error: None,
                    },
                    Err(e) => ForkResult {
                        sandbox: None,
                        error: Some(ForkError {
                            code: e.status.as_u16(),
                            message: e.message,
                        }),
                    },
                }
            })
            .collect())
    })
    .await
    .map_err(E2bError::from)??;
    Ok((StatusCode::CREATED, Json(results)).into_response())
}

fn paused(
    manager: &brig_runtime::SandboxManager,
    tenant: &brig_runtime::TenantId,
    id: &brig_core::SandboxId,
) -> Result<bool, E2bError> {
    Ok(manager.get(tenant, id)?.state == brig_runtime::SandboxState::Paused)
}
