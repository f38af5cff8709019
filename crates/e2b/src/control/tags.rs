//! E2B's template tags and template deletion, on the templates built
//! through E2B (`templates.rs`: each name, bare or `name:tag`, is an image
//! of the store with its meta file beside it):
//!
//! | Call | Answer |
//! |---|---|
//! | `POST /templates/tags` `{target, tags}` (`Template.assign_tags`) | 201 `{tags, buildID}`: the target's build also named `name:tag` for each tag |
//! | `DELETE /templates/tags` `{name, tags}` (`Template.remove_tags`) | 204; 404 for a tag the template does not have |
//! | `GET /templates/{name}/tags` (`Template.get_tags`) | 200 `[{tag, buildID, createdAt}]` |
//! | `DELETE /templates/{id}` | a snapshot's id or name (`snapshots.rs`), else the template with all its tags: 204; 404 for neither |
//!
//! Only the tenant that built a template sees or changes its tags (another
//! tenant's is 404, as if it did not exist).

use std::path::Path;
use std::sync::Arc;

use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use brig_image::ImageStore;
use serde::Deserialize;
use serde_json::json;

use super::templates::{self, TemplateMeta};
use super::wire::{self, E2bError};
use super::ApiKey;
use crate::E2bState;
use brig_runtime::TenantId;

#[derive(Debug, Default, Deserialize)]
struct Assign {
    #[serde(default)]
    target: String,
    #[serde(default)]
    tags: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
struct Remove {
    #[serde(default)]
    name: String,
    #[serde(default)]
    tags: Vec<String>,
}

fn not_found(name: &str) -> E2bError {
    E2bError::new(StatusCode::NOT_FOUND, format!("template {name} not found"))
}

/// The bare name of `name` (`name:tag` → `name`).
fn base(name: &str) -> &str {
    name.split_once(':').map_or(name, |(b, _)| b)
}

/// `tenant`'s template `name` (bare or tagged): its meta, or 404.
fn own(home: &Path, tenant: &TenantId, name: &str) -> Result<TemplateMeta, E2bError> {
    templates::meta(home, name)
        .filter(|m| m.tenant.as_ref() == Some(tenant))
        .ok_or_else(|| not_found(name))
}

fn check_tags(tags: &[String]) -> Result<(), E2bError> {
    if tags.is_empty() {
        return Err(E2bError::bad_request("tags: name at least one tag"));
    }
    for t in tags {
        let ok = !t.is_empty()
            && t.len() <= 128
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        if !ok {
            return Err(E2bError::bad_request(format!(
                "tag {t:?}: use letters, digits, '-', '_' and '.', at most 128"
            )));
        }
    }
    Ok(())
}

pub(super) async fn assign(
    State(state): State<E2bState>,
    ApiKey(tenant): ApiKey,
    body: axum::body::Bytes,
) -> Result<Response, E2bError> {
    let req: Assign = wire::body(&body)?;
    check_tags(&req.tags)?;
    let home = templates::home_of(&state)?;
    let answer = tokio::task::spawn_blocking(move || -> Result<serde_json::Value, E2bError> {
        let meta = own(&home, &tenant, &req.target)?;
        let store = ImageStore::open(&home).map_err(templates::store_err)?;
        let image = store
            .get(&req.target)
            .map_err(templates::store_err)?
            .ok_or_else(|| not_found(&req.target))?;
        for tag in &req.tags {
            let name = format!("{}:{tag}", base(&req.target));
            // Someone else's name (another tenant's tag of the same
            // template name cannot exist: the bare name is the owner's).
            if let Some(m) = templates::meta(&home, &name) {
                if m.tenant.as_ref() != Some(&tenant) {
                    return Err(not_found(&req.target));
                }
            }
            let mut tagged = image.clone();
            tagged.name = name.clone();
            store.register(&tagged).map_err(templates::store_err)?;
            templates::write_meta(&home, &name, &meta)?;
        }
        Ok(json!({"tags": req.tags, "buildID": meta.build_id}))
    })
    .await
    .map_err(E2bError::from)??;
    Ok((StatusCode::CREATED, Json(answer)).into_response())
}

pub(super) async fn remove(
    State(state): State<E2bState>,
    ApiKey(tenant): ApiKey,
    body: axum::body::Bytes,
) -> Result<Response, E2bError> {
    let req: Remove = wire::body(&body)?;
    check_tags(&req.tags)?;
    let home = templates::home_of(&state)?;
    tokio::task::spawn_blocking(move || -> Result<(), E2bError> {
        own(&home, &tenant, base(&req.name))?;
        // All or nothing: every tag named must be there.
        let names: Vec<String> = req
            .tags
            .iter()
            .map(|t| format!("{}:{t}", base(&req.name)))
            .collect();
        for n in &names {
            own(&home, &tenant, n)?;
        }
        let store = ImageStore::open(&home).map_err(templates::store_err)?;
        for n in &names {
            templates::forget(&home, &store, n);
        }
        Ok(())
    })
    .await
    .map_err(E2bError::from)??;
    Ok(StatusCode::NO_CONTENT.into_response())
}

pub(super) async fn list(
    State(state): State<E2bState>,
    ApiKey(tenant): ApiKey,
    UrlPath(name): UrlPath<String>,
) -> Result<Response, E2bError> {
    let home = templates::home_of(&state)?;
    let tags = tokio::task::spawn_blocking(move || -> Result<serde_json::Value, E2bError> {
        own(&home, &tenant, base(&name))?;
        let store = ImageStore::open(&home).map_err(templates::store_err)?;
        let prefix = format!("{}:", base(&name));
        let mut out = Vec::new();
        for tagged in templates::names(&home)
            .into_iter()
            .filter(|n| n.starts_with(&prefix))
        {
            let Ok(meta) = own(&home, &tenant, &tagged) else {
                continue;
            };
            let created = store
                .get(&tagged)
                .ok()
                .flatten()
                .map_or(0, |i| i.created_at);
            out.push(json!({
                "tag": &tagged[prefix.len()..],
                "buildID": meta.build_id,
                "createdAt": super::time::rfc3339(created),
            }));
        }
        Ok(serde_json::Value::Array(out))
    })
    .await
    .map_err(E2bError::from)??;
    Ok(Json(tags).into_response())
}

/// `DELETE /templates/{id}`: a snapshot (its id or name), else a template
/// built through E2B with every tag of it.
pub(super) async fn delete(
    State(state): State<E2bState>,
    ApiKey(tenant): ApiKey,
    UrlPath(key): UrlPath<String>,
) -> Result<Response, E2bError> {
    let snapshot = key.strip_suffix(":default").unwrap_or(&key).to_string();
    let manager = Arc::clone(&state.manager);
    let owner = tenant.clone();
    let found = tokio::task::spawn_blocking(move || manager.delete_snapshot(&owner, &snapshot))
        .await
        .map_err(E2bError::from)?;
    match found {
        Ok(_) => return Ok(StatusCode::NO_CONTENT.into_response()),
        Err(brig_runtime::ManagerError::SnapshotNotFound { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    let home = templates::home_of(&state)?;
    tokio::task::spawn_blocking(move || -> Result<(), E2bError> {
        let name = base(&key);
        own(&home, &tenant, name)?;
        let store = ImageStore::open(&home).map_err(templates::store_err)?;
        let prefix = format!("{name}:");
        for n in templates::names(&home)
            .into_iter()
            .filter(|n| n == name || n.starts_with(&prefix))
        {
            if own(&home, &tenant, &n).is_ok() {
                templates::forget(&home, &store, &n);
            }
        }
        Ok(())
    })
    .await
    .map_err(E2bError::from)??;
    Ok(StatusCode::NO_CONTENT.into_response())
}
