//! E2B's template builder (`Template.build`, `build_in_background`,
//! `get_build_status`, `exists`) on brig's image builds.
//!
//! The clients' flow, and brig's answer at each step:
//!
//! 1. `POST /v3/templates` `{name, tags?, cpuCount?, memoryMB?}`: a build
//!    is registered (`waiting`) under the template `name` (its id too);
//!    202 `{templateID, buildID, names, tags, aliases, public}`.
//! 2. For each `copy` step, `GET /templates/{id}/files/{hash}`: `present`
//!    when this tenant uploaded files of that hash before (the clients
//!    then skip the upload unless `force_upload`), and a one-time `url`
//!    on this same listener that takes the tar (gzip or not) by `PUT`
//!    with no API key: the token in the URL is the authority.
//! 3. `POST /v2/templates/{id}/builds/{build}` with the steps: checked,
//!    then built on a thread of its own, one build at a time on the
//!    daemon. Each step becomes a step of brig-image's [`Builder`]: RUN in
//!    a one-shot sandbox of the process tier with the daemon's network
//!    ([`SandboxManager::run_to_end`]), COPY from the uploaded files, ENV,
//!    WORKDIR and USER in the image's config; each is cached by its inputs
//!    exactly as a Dockerfile's are, and `force` (`skip_cache`) rebuilds
//!    it and every later one.
//! 4. `GET /templates/{id}/builds/{build}/status?logsOffset=&limit=`:
//!    `waiting`, `building`, `ready` or `error` (with `reason.message` and
//!    `reason.step`, the step's number as the clients count them), and the
//!    log entries from the offset (a RUN's output line by line).
//!
//! The result is an image of the daemon's store named after the template
//! (and `name:tag` for each tag), so `Sandbox.create(template=NAME)` and
//! `brig template ls` find it. What an image cannot say (the start and
//! ready commands, the owner) is kept beside it in
//! `$BRIG_HOME/e2b/templates/NAME.json`. A failed build registers nothing.
//!
//! Templates are the daemon's (like its images), each owned by the tenant
//! that built it first: another tenant cannot build over it (409) and sees
//! it as someone else's in `exists` (403, which the clients read as
//! "exists").

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Path as UrlPath, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use brig_agent_client::ExecRequest;
use brig_core::{ByteSize, EnvVar, SandboxId, SandboxSpec, TemplateRef, UserSpec};
use brig_image::build::{Builder, CopyExtra, Instruction, RunStep, Step};
use brig_image::{ImageError, ImageRecord, ImageStore};
use brig_runtime::{SandboxManager, TenantId};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::time::rfc3339;
use super::wire::{self, E2bError};
use super::{lock, now_millis, ApiKey};
use crate::E2bState;

/// The image E2B's `from_base_image()` names: brig's `base` template.
const E2B_BASE_IMAGES: &[&str] = &["e2bdev/base", "e2bdev/base:latest", "docker.io/e2bdev/base"];
/// The most an upload may hold (bytes, as sent).
const MAX_UPLOAD: u64 = 8 << 30;
/// Log entries a status answer carries at most (E2B's default page).
const LOG_PAGE: usize = 100;
/// How long a create waits for a template's ready command to succeed.
pub const READY_WAIT: Duration = Duration::from_secs(45);
/// The most `cpuCount` and `memoryMB` may ask for.
const MAX_CPUS: i64 = 64;
const MAX_MEMORY_MB: i64 = 64 << 10;
/// How long one RUN step may take before it is killed (and the build
/// fails): builds run one at a time, so a step that never ends must not
/// hold the others forever.
const STEP_LIMIT: Duration = Duration::from_secs(30 * 60);
/// How long the request that starts a build waits for it to end (a
/// cached rebuild takes milliseconds).
const QUICK_BUILD: Duration = Duration::from_millis(250);
/// How long a finished build's status and logs, and an unused upload
/// link, are kept.
const KEEP: Duration = Duration::from_secs(3600);

/// The template builds of this daemon (in memory: a build in progress
/// when the daemon stops is lost, and nothing of it was registered).
#[derive(Debug, Default)]
pub struct Builds {
    builds: Mutex<HashMap<String, Arc<Build>>>,
    /// Upload tokens: token → (tenant, files hash, when given).
    uploads: Mutex<HashMap<String, (TenantId, String, Instant)>>,
    /// Held by the build that runs: one at a time on the daemon.
    running: Mutex<()>,
}

/// One build.
#[derive(Debug)]
struct Build {
    id: String,
    template: String,
    tenant: TenantId,
    /// What the image is registered as: the name, `name:tag` per tag.
    names: Vec<String>,
    /// `cpuCount` and `memoryMB`: the build steps' and the sandboxes'.
    cpu_count: Option<u32>,
    memory_mb: Option<u64>,
    state: Mutex<BuildState>,
}

#[derive(Debug)]
struct BuildState {
    status: &'static str,
    logs: Vec<LogEntry>,
    reason: Option<Reason>,
    /// Its steps were sent (a second `POST .../builds/{id}` is refused).
    started: bool,
    /// When it ended (kept [`KEEP`] after, then forgotten).
    ended: Option<Instant>,
}

#[derive(Debug, Clone, Serialize)]
struct LogEntry {
    timestamp: String,
    level: &'static str,
    message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    step: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
struct Reason {
    message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    step: Option<String>,
    log_entries: Vec<LogEntry>,
}

impl Build {
    fn log(&self, level: &'static str, step: Option<usize>, message: impl Into<String>) {
        let entry = LogEntry {
            timestamp: rfc3339(now_millis()),
            level,
            message: message.into(),
            step: step.map(step_name),
        };
        lock(&self.state).logs.push(entry);
    }
}

/// A step's name as the clients count them: `base` for FROM, then 1, 2, …
fn step_name(n: usize) -> String {
    if n == 0 {
        "base".into()
    } else {
        n.to_string()
    }
}

/// What an E2B template keeps beside its image.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateMeta {
    pub tenant: Option<TenantId>,
    pub build_id: String,
    pub start_cmd: Option<String>,
    pub ready_cmd: Option<String>,
    /// The template's `cpuCount` and `memoryMB`: what its sandboxes get
    /// unless the create says otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_count: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
}

/// Where the E2B side of `home` keeps its files.
fn e2b_dir(home: &Path) -> PathBuf {
    home.join("e2b")
}

fn meta_path(home: &Path, name: &str) -> PathBuf {
    e2b_dir(home).join("templates").join(format!("{name}.json"))
}

/// The files a tenant uploaded, by their hash.
fn files_dir(home: &Path, tenant: &TenantId, hash: &str) -> PathBuf {
    e2b_dir(home).join("files").join(tenant.as_str()).join(hash)
}

/// What an E2B template named `name` (a name or `name:tag`) keeps, if it
/// is one whose image is still in the store (`brig template rm` removes
/// only the image: what it left beside it goes here).
pub fn meta(home: &Path, name: &str) -> Option<TemplateMeta> {
    if check_name(name).is_err() {
        return None;
    }
    let path = meta_path(home, name);
    let text = std::fs::read(&path).ok()?;
    let image = ImageStore::open(home).ok()?.get(name).ok()?;
    if image.is_none() {
        let _ = std::fs::remove_file(&path);
        return None;
    }
    serde_json::from_slice(&text).ok()
}

/// Remove what uploads that died with an earlier daemon left under
/// `$BRIG_HOME/e2b/files/` (temporary files and half-unpacked
/// directories), once they are a day old: younger ones may be another
/// live process's uploads in progress (daemons sharing a home).
pub fn reconcile(home: &Path) {
    const STALE: Duration = Duration::from_secs(24 * 3600);
    let Ok(tenants) = std::fs::read_dir(e2b_dir(home).join("files")) else {
        return;
    };
    for tenant in tenants.flatten() {
        let Ok(entries) = std::fs::read_dir(tenant.path()) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            let leftover = name.starts_with(".upload-") || name.starts_with(".tmp");
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().unwrap_or_default() > STALE);
            if leftover && old {
                let p = e.path();
                let gone = if p.is_dir() {
                    std::fs::remove_dir_all(&p)
                } else {
                    std::fs::remove_file(&p)
                };
                if let Err(err) = gone {
                    tracing::warn!("cannot remove the upload leftover {}: {err}", p.display());
                }
            }
        }
    }
}

/// E2B's template names: lowercase letters, digits, `-` and `_` (and `.`),
/// at most 128; optionally `:TAG`.
fn check_name(name: &str) -> Result<(), String> {
    let (base, tag) = match name.split_once(':') {
        Some((b, t)) => (b, Some(t)),
        None => (name, None),
    };
    let ok_base = !base.is_empty()
        && base.len() <= 128
        && base
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b))
        && !base.starts_with(['.', '-']);
    let ok_tag = tag.is_none_or(|t| {
        !t.is_empty()
            && t.len() <= 128
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    });
    if ok_base && ok_tag {
        Ok(())
    } else {
        Err(format!(
            "template name {name:?}: use lowercase letters, digits, '-', '_' and '.', optionally \
             ':TAG' (letters, digits, '-', '_', '.'); at most 128 characters each"
        ))
    }
}

/// The daemon's home, where templates live (`tags.rs` too).
pub(super) fn home_of(state: &E2bState) -> Result<PathBuf, E2bError> {
    home(state)
}

/// Keep `meta` beside the image named `name` (a tag of a template, too).
pub(super) fn write_meta(home: &Path, name: &str, meta: &TemplateMeta) -> Result<(), E2bError> {
    let path = meta_path(home, name);
    let write = || -> std::io::Result<()> {
        std::fs::create_dir_all(path.parent().unwrap_or(home))?;
        let tmp = path.with_extension("json.tmp");
        std::fs::write(
            &tmp,
            serde_json::to_vec_pretty(meta).map_err(std::io::Error::other)?,
        )?;
        std::fs::rename(&tmp, &path)
    };
    write().map_err(|e| {
        E2bError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot write {}: {e}", path.display()),
        )
    })
}

/// Forget the template name `name` (its image and meta file); its layers
/// go with the store's next prune.
pub(super) fn forget(home: &Path, store: &ImageStore, name: &str) {
    if let Err(e) = store.remove(name) {
        tracing::warn!("cannot remove the image of template {name}: {e}");
    }
    let _ = std::fs::remove_file(meta_path(home, name));
}

/// Every template name built through E2B (bare and tagged), by its meta
/// files.
pub(super) fn names(home: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(e2b_dir(home).join("templates")) else {
        return Vec::new();
    };
    let mut out: Vec<String> = entries
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_suffix(".json"))
                .map(str::to_string)
        })
        .collect();
    out.sort();
    out
}

fn home(state: &E2bState) -> Result<PathBuf, E2bError> {
    state.manager.config().home.clone().ok_or_else(|| {
        E2bError::bad_request(
            "this daemon has no home for templates and images: start brig serve with a --home",
        )
    })
}

pub(super) fn store_err(e: ImageError) -> E2bError {
    E2bError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
}

/// Who may use the template name `name`: free, this tenant's, or taken.
enum Owner {
    Free,
    Mine,
    Taken(String),
}

fn owner(home: &Path, tenant: &TenantId, name: &str) -> Result<Owner, E2bError> {
    if brig_template::recipe(name).is_ok() {
        return Ok(Owner::Taken(format!(
            "{name} is one of brig's named templates ({}): choose another name",
            brig_template::known_names()
        )));
    }
    if let Some(m) = meta(home, name) {
        return Ok(if m.tenant.as_ref() == Some(tenant) {
            Owner::Mine
        } else {
            Owner::Taken(format!(
                "template {name} belongs to another team: choose another name"
            ))
        });
    }
    let store = ImageStore::open(home).map_err(store_err)?;
    Ok(match store.get(name).map_err(store_err)? {
        Some(_) => Owner::Taken(format!(
            "{name} is an image of this daemon's store (brig template ls) that was not built \
             through E2B: choose another name"
        )),
        None => Owner::Free,
    })
}

/// `POST /v3/templates`'s body.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct BuildRequest {
    name: Option<String>,
    alias: Option<String>,
    tags: Option<Vec<String>>,
    cpu_count: Option<i64>,
    #[serde(rename = "memoryMB")]
    memory_mb: Option<i64>,
}

/// `POST /v3/templates`: 202, a build waiting for its steps.
pub async fn request(
    State(state): State<E2bState>,
    ApiKey(tenant): ApiKey,
    body: axum::body::Bytes,
) -> Result<Response, E2bError> {
    let req: BuildRequest = wire::body(&body)?;
    let given = req
        .name
        .or(req.alias)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            E2bError::bad_request("name is required (Template.build(template, \"my-template\"))")
        })?;
    check_name(&given).map_err(E2bError::bad_request)?;
    if req.cpu_count.is_some_and(|c| !(1..=MAX_CPUS).contains(&c))
        || req
            .memory_mb
            .is_some_and(|m| !(128..=MAX_MEMORY_MB).contains(&m))
    {
        return Err(E2bError::bad_request(format!(
            "cpuCount is 1 to {MAX_CPUS} and memoryMB 128 to {MAX_MEMORY_MB}"
        )));
    }
    let (template, first_tag) = match given.split_once(':') {
        Some((n, t)) => (n.to_string(), Some(t.to_string())),
        None => (given.clone(), None),
    };
    let mut tags: Vec<String> = first_tag.into_iter().collect();
    for t in req.tags.unwrap_or_default() {
        check_name(&format!("{template}:{t}")).map_err(E2bError::bad_request)?;
        if !tags.contains(&t) {
            tags.push(t);
        }
    }
    // The bare name always: what `Sandbox.create(template=NAME)` finds.
    let mut names = vec![template.clone()];
    names.extend(tags.iter().map(|t| format!("{template}:{t}")));
    let home = home(&state)?;
    for n in &names {
        if let Owner::Taken(why) = owner(&home, &tenant, n)? {
            return Err(E2bError::new(StatusCode::CONFLICT, why));
        }
    }
    let build = Arc::new(Build {
        id: uuid_like(),
        template: template.clone(),
        tenant,
        names: names.clone(),
        cpu_count: req.cpu_count.map(|c| c as u32),
        memory_mb: req.memory_mb.map(|m| m as u64),
        state: Mutex::new(BuildState {
            status: "waiting",
            logs: Vec::new(),
            reason: None,
            started: false,
            ended: None,
        }),
    });
    let mut builds = lock(&state.builds.builds);
    // Finished builds are kept an hour for their status, then forgotten.
    builds.retain(|_, b| lock(&b.state).ended.is_none_or(|t| t.elapsed() < KEEP));
    builds.insert(build.id.clone(), Arc::clone(&build));
    drop(builds);
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({
            "templateID": template,
            "buildID": build.id,
            "public": false,
            "names": names,
            "aliases": [template],
            "tags": tags,
        })),
    )
        .into_response())
}

/// A build id: 32 random hex digits in UUID form, as E2B's.
fn uuid_like() -> String {
    let b: [u8; 16] = rand::random();
    let h: String = b.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// `GET /templates/{id}/files/{hash}`: 201 `{present, url}`.
pub async fn upload_link(
    State(state): State<E2bState>,
    ApiKey(tenant): ApiKey,
    UrlPath((template, hash)): UrlPath<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, E2bError> {
    if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(E2bError::bad_request(format!(
            "files hash {hash:?}: expected 64 hex digits (the clients' sha256 of the files)"
        )));
    }
    let hash = hash.to_ascii_lowercase();
    let pending = lock(&state.builds.builds)
        .values()
        .any(|b| b.template == template && b.tenant == tenant);
    if !pending {
        return Err(E2bError::new(
            StatusCode::NOT_FOUND,
            format!(
                "template {template} has no build of yours: request one first (POST /v3/templates)"
            ),
        ));
    }
    let home = home(&state)?;
    let present = files_dir(&home, &tenant, &hash).is_dir();
    let token = brig_http::random_token();
    let mut uploads = lock(&state.builds.uploads);
    uploads.retain(|_, (_, _, at)| at.elapsed() < KEEP);
    uploads.insert(token.clone(), (tenant, hash.clone(), Instant::now()));
    drop(uploads);
    // On the listener the client reached: the Host it used.
    let host = headers
        .get("host")
        .and_then(|h| h.to_str().ok())
        .unwrap_or("127.0.0.1");
    let url = format!("http://{host}/templates/{template}/files/{hash}?token={token}");
    Ok((
        StatusCode::CREATED,
        Json(json!({"present": present, "url": url})),
    )
        .into_response())
}

/// `PUT /templates/{id}/files/{hash}?token=`: the files (a tar, gzip or
/// not), unpacked for the build's COPY steps.
pub async fn upload(
    State(state): State<E2bState>,
    UrlPath((_template, hash)): UrlPath<(String, String)>,
    RawQuery(query): RawQuery,
    body: Body,
) -> Result<Response, E2bError> {
    let token = query
        .as_deref()
        .and_then(|q| serde_urlencoded::from_str::<HashMap<String, String>>(q).ok())
        .and_then(|q| q.get("token").cloned())
        .unwrap_or_default();
    let (tenant, want, _) = lock(&state.builds.uploads).remove(&token).ok_or_else(|| {
        E2bError::new(
            StatusCode::FORBIDDEN,
            "this upload link is not valid (used already, or never given): ask for a new one",
        )
    })?;
    if want != hash.to_ascii_lowercase() {
        return Err(E2bError::new(
            StatusCode::FORBIDDEN,
            "this upload link is for other files",
        ));
    }
    let home = home(&state)?;
    private_dir(&e2b_dir(&home)).map_err(|e| E2bError::internal(&e))?;
    let parent = e2b_dir(&home).join("files").join(tenant.as_str());
    std::fs::create_dir_all(&parent).map_err(|e| E2bError::internal(&e))?;
    let file = tempfile::NamedTempFile::new_in(&parent).map_err(|e| E2bError::internal(&e))?;
    let (std_file, path) = file.into_parts();
    let mut out = std::io::BufWriter::new(std_file);
    let mut total = 0u64;
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| E2bError::bad_request(format!("reading the upload: {e}")))?;
        total += chunk.len() as u64;
        if total > MAX_UPLOAD {
            return Err(E2bError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("an upload may be at most {MAX_UPLOAD} bytes: copy less at once"),
            ));
        }
        out.write_all(&chunk).map_err(|e| E2bError::internal(&e))?;
    }
    out.flush().map_err(|e| E2bError::internal(&e))?;
    drop(out);
    let target = files_dir(&home, &tenant, &want);
    tokio::task::spawn_blocking(move || unpack_upload(&path, &parent, &target))
        .await
        .map_err(|e| E2bError::internal(&e))??;
    Ok(StatusCode::OK.into_response())
}

/// `dir`, made if missing, for root only: what clients upload lands
/// under it, and no other user of the host may reach it.
fn private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

/// Unpack the tar at `archive` (gzip or not) into `target`, by way of a
/// directory beside it: only files, directories, symlinks and hard links,
/// never outside (the tar crate's `unpack_in` checks each path), owned by
/// root, modes kept but for setuid and setgid bits: a client's file never
/// becomes a setuid-root program on the host (nor, copied, in a layer).
fn unpack_upload(archive: &Path, parent: &Path, target: &Path) -> Result<(), E2bError> {
    let bad = |e: std::io::Error| {
        E2bError::bad_request(format!(
            "the upload is not a tar archive brig can read ({e}): upload it again"
        ))
    };
    let mut f = std::fs::File::open(archive).map_err(|e| E2bError::internal(&e))?;
    let mut magic = [0u8; 2];
    let n = f.read(&mut magic).map_err(|e| E2bError::internal(&e))?;
    let f = std::fs::File::open(archive).map_err(|e| E2bError::internal(&e))?;
    let reader: Box<dyn Read> = if n == 2 && magic == [0x1f, 0x8b] {
        Box::new(flate2::read::GzDecoder::new(f))
    } else {
        Box::new(f)
    };
    let tmp = tempfile::Builder::new()
        .prefix(".upload-")
        .tempdir_in(parent)
        .map_err(|e| E2bError::internal(&e))?;
    let mut tar = tar::Archive::new(reader);
    tar.set_preserve_permissions(true);
    tar.set_preserve_ownerships(false);
    tar.set_unpack_xattrs(false);
    for entry in tar.entries().map_err(bad)? {
        let mut entry = entry.map_err(bad)?;
        use tar::EntryType as T;
        match entry.header().entry_type() {
            T::Regular | T::Directory | T::Symlink | T::Link | T::Continuous => {
                entry.set_mask(0o6000);
                entry.unpack_in(tmp.path()).map_err(bad)?;
            }
            _ => {}
        }
    }
    match std::fs::rename(tmp.path(), target) {
        Ok(()) => {
            // The directory is the target's now.
            let _ = tmp.keep();
            Ok(())
        }
        // Uploaded meanwhile by another build: the same files (the hash
        // says so), kept; ours goes with `tmp`.
        Err(_) if target.is_dir() => Ok(()),
        Err(e) => Err(E2bError::internal(&e)),
    }
}

/// `POST /v2/templates/{id}/builds/{build}`'s body (`TemplateBuildStartV2`).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StartBuild {
    from_image: Option<String>,
    from_template: Option<String>,
    from_image_registry: Option<Value>,
    #[serde(default)]
    force: bool,
    #[serde(default)]
    steps: Vec<WireStep>,
    start_cmd: Option<String>,
    ready_cmd: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireStep {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    args: Vec<String>,
    files_hash: Option<String>,
    #[serde(default)]
    force: bool,
}

/// Where the build starts: an image to pull or find, or a template.
#[derive(Debug, Clone)]
enum Base {
    Image {
        reference: String,
        credentials: Option<(String, String)>,
    },
    Template(String),
}

/// The steps as brig-image's, each numbered as the clients count it (1…).
fn steps(home: &Path, tenant: &TenantId, start: &StartBuild) -> Result<Vec<Step>, E2bError> {
    let mut out = Vec::new();
    for (i, s) in start.steps.iter().enumerate() {
        let n = i + 1;
        let bad =
            |why: &str| E2bError::bad_request(format!("step {n} ({} {:?}): {why}", s.kind, s.args));
        let arg = |k: usize| s.args.get(k).map(String::as_str).filter(|a| !a.is_empty());
        let instruction = match s.kind.as_str() {
            "RUN" => {
                let cmd = arg(0).ok_or_else(|| bad("RUN needs a command"))?;
                let argv = vec!["/bin/sh".into(), "-c".into(), cmd.to_string()];
                match arg(1) {
                    Some(user) => Instruction::RunAs(argv, user.to_string()),
                    None => Instruction::Run(argv),
                }
            }
            "COPY" => {
                let (src, dest) = arg(0).zip(arg(1)).ok_or_else(|| bad("COPY needs a source and a destination"))?;
                let hash = s
                    .files_hash
                    .as_deref()
                    .ok_or_else(|| bad("COPY needs filesHash (the clients send it)"))?;
                let context = files_dir(home, tenant, &hash.to_ascii_lowercase());
                if !context.is_dir() {
                    return Err(bad(
                        "its files were never uploaded: ask for the upload link (GET /templates/{id}/files/{hash}) and upload them first",
                    ));
                }
                let mode = match arg(3) {
                    Some(m) => Some(
                        u32::from_str_radix(m, 8)
                            .ok()
                            .filter(|m| *m <= 0o7777)
                            .ok_or_else(|| bad("the mode is octal, e.g. 0755"))?,
                    ),
                    None => None,
                };
                Instruction::Copy {
                    sources: vec![src.to_string()],
                    dest: dest.to_string(),
                    chown: None,
                    extra: Some(CopyExtra {
                        context,
                        owner: arg(2).map(str::to_string),
                        mode,
                    }),
                }
            }
            "ENV" => {
                if s.args.len() % 2 != 0 || s.args.is_empty() {
                    return Err(bad("ENV takes NAME, VALUE pairs"));
                }
                let pairs = s
                    .args
                    .chunks(2)
                    .map(|kv| {
                        EnvVar::parse(&format!("{}={}", kv[0], kv[1]))
                            .map(|_| (kv[0].clone(), kv[1].clone()))
                            .map_err(|e| bad(&e.to_string()))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Instruction::Env(pairs)
            }
            "WORKDIR" => Instruction::Workdir(
                arg(0).ok_or_else(|| bad("WORKDIR needs a directory"))?.to_string(),
            ),
            "USER" => {
                Instruction::User(arg(0).ok_or_else(|| bad("USER needs a user"))?.to_string())
            }
            other => {
                return Err(bad(&format!(
                    "brig does not know the step type {other:?} (it knows RUN, COPY, ENV, WORKDIR, USER)"
                )))
            }
        };
        out.push(Step {
            line: n,
            instruction,
            force: s.force || (start.force && i == 0),
        });
    }
    Ok(out)
}

/// `POST /v2/templates/{id}/builds/{build}`: 202; the build runs on.
pub async fn start(
    State(state): State<E2bState>,
    ApiKey(tenant): ApiKey,
    UrlPath((template, build_id)): UrlPath<(String, String)>,
    body: axum::body::Bytes,
) -> Result<Response, E2bError> {
    let build = find(&state, &tenant, &template, &build_id)?;
    let start: StartBuild = wire::body(&body)?;
    let home = home(&state)?;
    let base = match (&start.from_template, &start.from_image) {
        (Some(t), _) if !t.is_empty() => Base::Template(t.clone()),
        (_, Some(i)) if !i.is_empty() => Base::Image {
            reference: i.clone(),
            credentials: registry_credentials(start.from_image_registry.as_ref())?,
        },
        _ => {
            return Err(E2bError::bad_request(
                "the build names no base: fromImage or fromTemplate is required",
            ))
        }
    };
    // `force` (skip_cache for the whole template) is the first step's.
    let steps = steps(&home, &tenant, &start)?;
    {
        let mut st = lock(&build.state);
        if st.started {
            return Err(E2bError::new(
                StatusCode::CONFLICT,
                format!("build {build_id} was started already: request a new build"),
            ));
        }
        st.started = true;
    }
    let meta = TemplateMeta {
        tenant: Some(tenant),
        build_id: build.id.clone(),
        start_cmd: start.start_cmd.clone().filter(|c| !c.is_empty()),
        ready_cmd: start.ready_cmd.clone().filter(|c| !c.is_empty()),
        cpu_count: build.cpu_count,
        memory_mb: build.memory_mb,
    };
    let manager = Arc::clone(&state.manager);
    let builds = Arc::clone(&state.builds);
    let (done, ended) = tokio::sync::oneshot::channel::<()>();
    std::thread::Builder::new()
        .name(format!("e2b-build-{}", &build.id[..8]))
        .spawn(move || {
            run(&manager, &builds, &home, &build, base, steps, meta);
            let _ = done.send(());
        })
        .map_err(|e| E2bError::internal(&e))?;
    // A build that is over at once (every step cached) is over before the
    // answer: the client's first status poll finds it ended instead of
    // sleeping its 0.2 s poll interval. Anything longer runs on.
    let _ = tokio::time::timeout(QUICK_BUILD, ended).await;
    Ok(StatusCode::ACCEPTED.into_response())
}

/// `fromImageRegistry`: only `{"type": "registry", username, password}`.
fn registry_credentials(v: Option<&Value>) -> Result<Option<(String, String)>, E2bError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    match v["type"].as_str() {
        Some("registry") => {
            let user = v["username"].as_str().unwrap_or_default();
            let pass = v["password"].as_str().unwrap_or_default();
            if user.is_empty() || pass.is_empty() {
                return Err(E2bError::bad_request(
                    "fromImageRegistry needs a username and a password",
                ));
            }
            Ok(Some((user.to_string(), pass.to_string())))
        }
        other => Err(E2bError::bad_request(format!(
            "fromImageRegistry type {other:?} is not supported by brig: use from_image(..., username=, password=) (a registry with basic or token auth)"
        ))),
    }
}

fn find(
    state: &E2bState,
    tenant: &TenantId,
    template: &str,
    build_id: &str,
) -> Result<Arc<Build>, E2bError> {
    lock(&state.builds.builds)
        .get(build_id)
        .filter(|b| &b.tenant == tenant && b.template == template)
        .cloned()
        .ok_or_else(|| {
            E2bError::new(
                StatusCode::NOT_FOUND,
                format!("template {template} has no build {build_id}"),
            )
        })
}

/// The build, to its end (on its own thread).
fn run(
    manager: &SandboxManager,
    builds: &Builds,
    home: &Path,
    build: &Build,
    base: Base,
    steps: Vec<Step>,
    meta: TemplateMeta,
) {
    let _one = lock(&builds.running);
    lock(&build.state).status = "building";
    let started = Instant::now();
    build.log(
        "info",
        None,
        format!(
            "Building template {} (build {})",
            build.names.join(", "),
            build.id
        ),
    );
    let outcome = build_image(manager, home, build, &base, &steps)
        .and_then(|image| register(home, build, &image, &meta).map(|()| image.digest));
    if let Ok(store) = ImageStore::open(home) {
        let _ = store.remove(&private_pull_name(&build.id));
    }
    let mut st = lock(&build.state);
    st.ended = Some(Instant::now());
    match outcome {
        Ok(digest) => {
            let secs = started.elapsed().as_secs_f64();
            let entry = LogEntry {
                timestamp: rfc3339(now_millis()),
                level: "info",
                message: format!(
                    "Build finished in {secs:.1} s: template {} is ready (image {digest})",
                    build.template
                ),
                step: Some("finalize".into()),
            };
            st.logs.push(entry);
            st.status = "ready";
        }
        Err((step, message)) => {
            let entry = LogEntry {
                timestamp: rfc3339(now_millis()),
                level: "error",
                message: message.clone(),
                step: step.clone(),
            };
            st.logs.push(entry);
            let tail: Vec<LogEntry> = st.logs.iter().rev().take(20).rev().cloned().collect();
            st.reason = Some(Reason {
                message,
                step,
                log_entries: tail,
            });
            st.status = "error";
        }
    }
}

type Failure = (Option<String>, String);

/// Build the steps on the base; the image (registered under the build's
/// first name only once every step succeeded).
fn build_image(
    manager: &SandboxManager,
    home: &Path,
    build: &Build,
    base: &Base,
    steps: &[Step],
) -> Result<ImageRecord, Failure> {
    let at_base = |m: String| (Some("base".to_string()), m);
    build.log("info", Some(0), format!("FROM {}", describe(base)));
    let base_image = resolve_base(manager, home, base, build).map_err(at_base)?;
    let store = ImageStore::open(home).map_err(|e| at_base(e.to_string()))?;
    let _lease = store
        .lease(&base_image)
        .map_err(|e| at_base(e.to_string()))?;
    let empty = tempfile::tempdir().map_err(|e| at_base(e.to_string()))?;
    let mut all = vec![Step {
        line: 0,
        instruction: Instruction::From(base_image.name.clone()),
        force: false,
    }];
    all.extend(steps.iter().cloned());
    let current = Mutex::new(0usize);
    let mut base_fn = |_: &str| -> Result<ImageRecord, String> { Ok(base_image.clone()) };
    let mut run = |step: &RunStep<'_>| -> Result<(), String> {
        let mut spec = SandboxSpec::new(
            // stdin is the build's terminal: empty, not waited on.
            ["/bin/sh", "-c", "exec \"$@\" </dev/null", "sh"]
                .iter()
                .map(|s| s.to_string())
                .chain(step.argv.iter().cloned())
                .collect(),
        );
        spec.template = TemplateRef::Layers {
            image: build.template.clone(),
            lowers: step.lowers.clone(),
        };
        spec.upper_dir = Some(step.upper_dir.to_path_buf());
        spec.env = step
            .env
            .iter()
            .filter_map(|kv| EnvVar::parse(kv).ok())
            .collect();
        spec.workdir = step.workdir.map(str::to_string);
        spec.user = step
            .user
            .map(UserSpec::parse)
            .transpose()
            .map_err(|e| e.to_string())?;
        spec.limits.memory = ByteSize::mib(build.memory_mb.unwrap_or(2048));
        spec.limits.cpus = build.cpu_count.map(f64::from);
        spec.limits.pids = 1024;
        spec.limits.disk = ByteSize::mib(4096);
        spec.allow_setuid = true;
        spec.validate().map_err(|e| e.to_string())?;
        let mut lines = Lines::default();
        let mut tail: Vec<String> = Vec::new();
        let mut emit = |line: String| {
            build.log("info", Some(step.line), line.clone());
            tail.push(line);
            if tail.len() > 10 {
                tail.remove(0);
            }
        };
        let run = manager
            .run_to_end(spec, STEP_LIMIT, &mut |bytes| lines.push(bytes, &mut emit))
            .map_err(|e| super::error_chain(&e))?;
        lines.finish(&mut emit);
        let ended = run.ended;
        let last = if tail.is_empty() {
            String::from(" (it printed nothing)")
        } else {
            format!("; its last output:\n{}", tail.join("\n"))
        };
        match ended.code {
            _ if run.timed_out => Err(format!(
                "it ran longer than {} minutes and was killed{last}",
                STEP_LIMIT.as_secs() / 60
            )),
            Some(0) => Ok(()),
            _ if ended.oom => Err(format!(
                "it ran out of memory ({} MiB; give the build more with memory_mb=){last}",
                build.memory_mb.unwrap_or(2048)
            )),
            Some(code) => Err(format!("the command exited with {code}{last}")),
            None => Err(format!("the command's exit status is unknown{last}")),
        }
    };
    let mut say = |line: &str| {
        let step = *lock(&current);
        if let Some(rest) = line.strip_prefix("Step ") {
            // "Step N/T (line L): …": L is the clients' step number.
            let n = rest
                .split_once("(line ")
                .and_then(|(_, r)| r.split_once(')'))
                .and_then(|(l, _)| l.parse::<usize>().ok())
                .unwrap_or(step);
            *lock(&current) = n;
            let shown = line.split_once("): ").map_or(line, |(_, s)| s);
            if n > 0 {
                build.log("info", Some(n), format!("[{n}/{}] {shown}", steps.len()));
            }
        } else {
            build.log("info", Some(step), line.trim().to_string());
        }
    };
    let mut builder = Builder {
        store: &store,
        context: empty.path(),
        build_args: HashMap::new(),
        base: &mut base_fn,
        run: &mut run,
        say: &mut say,
    };
    let name = &build.names[0];
    builder
        .build_steps(&all, name, &format!("e2b template build {}", build.id))
        .map_err(|e| match e {
            ImageError::Dockerfile { line, reason } => {
                let what = all
                    .iter()
                    .find(|s| s.line == line)
                    .map(|s| s.instruction.to_string())
                    .unwrap_or_default();
                (
                    Some(step_name(line)),
                    format!("step {} ({what}) failed: {reason}", step_name(line)),
                )
            }
            other => (Some(step_name(*lock(&current))), other.to_string()),
        })
}

fn describe(base: &Base) -> String {
    match base {
        Base::Image { reference, .. } => format!("image {reference}"),
        Base::Template(t) => format!("template {t}"),
    }
}

/// The base as an image of the store: a template (built through E2B, an
/// image of the store, or one of brig's named templates), or an image
/// (E2B's base image is brig's `base`; others found in the store or
/// pulled).
fn resolve_base(
    manager: &SandboxManager,
    home: &Path,
    base: &Base,
    build: &Build,
) -> Result<ImageRecord, String> {
    let store = ImageStore::open(home).map_err(|e| e.to_string())?;
    let recipe = |name: &str| {
        build.log(
            "info",
            Some(0),
            format!("Using brig's {name} template (made an image the first time: up to a minute)"),
        );
        brig_template::recipe_image(home, name, brig_template::Progress::Quiet)
            .map_err(|e| e.to_string())
    };
    match base {
        Base::Template(t) => {
            if brig_template::recipe(t).is_ok() {
                return recipe(t);
            }
            if let Some(m) = meta(home, t) {
                if m.tenant.as_ref() != Some(&build.tenant) {
                    return Err(format!("template {t} belongs to another team"));
                }
            }
            store.get(t).map_err(|e| e.to_string())?.ok_or_else(|| {
                format!(
                    "there is no template {t}: build it first, or start from one of {} or an image",
                    brig_template::known_names()
                )
            })
        }
        Base::Image {
            reference,
            credentials,
        } => {
            if E2B_BASE_IMAGES.contains(&reference.as_str()) {
                return recipe("base");
            }
            if credentials.is_none() {
                if let Some(found) = store.get(reference).map_err(|e| e.to_string())? {
                    return Ok(found);
                }
            }
            if !manager.config().pull_images {
                return Err(format!(
                    "image {reference} is not in this daemon's store and the daemon does not pull \
                     (brig serve --pull never): pull it on its host with `brig template pull {reference}`"
                ));
            }
            build.log("info", Some(0), format!("Pulling {reference}"));
            let opts = brig_image::pull::PullOptions {
                credentials: credentials.clone(),
                ..Default::default()
            };
            let store = Arc::new(store);
            // Pulled with someone's credentials: under a name of this
            // build only, gone when it ends (the template keeps the
            // layers), so no other tenant can start from the image by its
            // reference without them.
            let name = credentials.is_some().then(|| private_pull_name(&build.id));
            brig_image::pull::pull(&store, reference, name.as_deref(), &opts, Arc::new(|_| {}))
                .map_err(|e| format!("{e}: check the image's name, and for a private registry from_image(..., username=, password=)"))
        }
    }
}

/// The name an image pulled with credentials has during build `id`.
fn private_pull_name(id: &str) -> String {
    format!("e2b-build-base/{id}")
}

/// Register the built image under the build's other names and keep what
/// the image cannot say; on a failure nothing of it stays.
fn register(
    home: &Path,
    build: &Build,
    image: &ImageRecord,
    meta: &TemplateMeta,
) -> Result<(), Failure> {
    let fin = |e: String| (Some("finalize".to_string()), e);
    let store = ImageStore::open(home).map_err(|e| fin(e.to_string()))?;
    let dir = e2b_dir(home).join("templates");
    let outcome = (|| -> Result<(), String> {
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let text = serde_json::to_vec_pretty(meta).map_err(|e| e.to_string())?;
        for name in &build.names {
            if name != &image.name {
                let mut other = image.clone();
                other.name = name.clone();
                store.register(&other).map_err(|e| e.to_string())?;
            }
            let path = meta_path(home, name);
            let tmp = path.with_extension("json.tmp");
            std::fs::write(&tmp, &text)
                .and_then(|_| std::fs::rename(&tmp, &path))
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        }
        Ok(())
    })();
    if let Err(e) = outcome {
        for name in build.names.iter() {
            let _ = store.remove(name);
            let _ = std::fs::remove_file(meta_path(home, name));
        }
        return Err(fin(e));
    }
    Ok(())
}

/// Output split into lines as a terminal shows them: `\r\n` ends a line,
/// a lone `\r` (a progress bar redrawing) keeps only what follows it.
#[derive(Default)]
struct Lines {
    partial: Vec<u8>,
}

impl Lines {
    fn push(&mut self, bytes: &[u8], emit: &mut dyn FnMut(String)) {
        for &b in bytes {
            if b == b'\n' {
                let line = std::mem::take(&mut self.partial);
                emit(Self::shown(&line));
            } else {
                self.partial.push(b);
            }
        }
        // A runaway line without a newline is cut into pieces.
        if self.partial.len() > 16 << 10 {
            let line = std::mem::take(&mut self.partial);
            emit(Self::shown(&line));
        }
    }

    fn finish(&mut self, emit: &mut dyn FnMut(String)) {
        if !self.partial.is_empty() {
            let line = std::mem::take(&mut self.partial);
            emit(Self::shown(&line));
        }
    }

    fn shown(line: &[u8]) -> String {
        let s = String::from_utf8_lossy(line);
        let s = s.trim_end_matches('\r');
        s.rsplit('\r').next().unwrap_or("").to_string()
    }
}

/// `?logsOffset=&limit=&level=` of a status request.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StatusQuery {
    logs_offset: Option<usize>,
    limit: Option<usize>,
    level: Option<String>,
}

/// `GET /templates/{id}/builds/{build}/status`: 200 `TemplateBuildInfo`.
pub async fn status(
    State(state): State<E2bState>,
    ApiKey(tenant): ApiKey,
    UrlPath((template, build_id)): UrlPath<(String, String)>,
    RawQuery(query): RawQuery,
) -> Result<Response, E2bError> {
    let q: StatusQuery = serde_urlencoded::from_str(query.as_deref().unwrap_or(""))
        .map_err(|e| E2bError::bad_request(format!("invalid query: {e}")))?;
    let build = find(&state, &tenant, &template, &build_id)?;
    let rank = |l: &str| {
        ["debug", "info", "warn", "error"]
            .iter()
            .position(|x| *x == l)
    };
    let min = match q.level.as_deref() {
        None => 0,
        Some(l) => rank(l)
            .ok_or_else(|| E2bError::bad_request("level is one of debug, info, warn, error"))?,
    };
    let st = lock(&build.state);
    let entries: Vec<&LogEntry> = st
        .logs
        .iter()
        .filter(|e| rank(e.level).unwrap_or(0) >= min)
        .skip(q.logs_offset.unwrap_or(0))
        .take(q.limit.unwrap_or(LOG_PAGE).min(LOG_PAGE))
        .collect();
    let mut body = json!({
        "templateID": build.template,
        "buildID": build.id,
        "status": st.status,
        "logs": [],
        "logEntries": entries,
    });
    if let Some(r) = &st.reason {
        body["reason"] = json!(r);
    }
    Ok(Json(body).into_response())
}

/// `GET /templates/aliases/{alias}`: 200 for a template of this tenant
/// (or one of the daemon's own), 403 for another tenant's, 404 for none.
pub async fn alias(
    State(state): State<E2bState>,
    ApiKey(tenant): ApiKey,
    UrlPath(alias): UrlPath<String>,
) -> Result<Response, E2bError> {
    let home = home(&state)?;
    let answer =
        |public: bool| Json(json!({"templateID": alias, "public": public})).into_response();
    if let Some(m) = meta(&home, &alias) {
        return if m.tenant.as_ref() == Some(&tenant) {
            Ok(answer(false))
        } else {
            Err(E2bError::new(
                StatusCode::FORBIDDEN,
                format!("template {alias} belongs to another team"),
            ))
        };
    }
    let known = brig_template::recipe(&alias).is_ok()
        || ImageStore::open(&home)
            .and_then(|s| s.get(&alias))
            .map_err(store_err)?
            .is_some();
    if known {
        return Ok(answer(true));
    }
    Err(E2bError::new(
        StatusCode::NOT_FOUND,
        format!("template {alias} not found"),
    ))
}

/// What a sandbox of an E2B-built template starts with: the image's user
/// and working directory as the defaults, then its start command in the
/// background and its ready command waited for.
#[derive(Debug, Clone, Default)]
pub struct Startup {
    pub user: Option<String>,
    pub workdir: Option<String>,
    pub start_cmd: Option<String>,
    pub ready_cmd: Option<String>,
}

/// The startup of template `name`, if it was built through E2B.
pub fn startup(manager: &SandboxManager, name: &str) -> Option<Startup> {
    let home = manager.config().home.clone()?;
    let meta = meta(&home, name)?;
    let image = ImageStore::open(&home).ok()?.get(name).ok()??;
    Some(Startup {
        user: image.config.user.clone().filter(|u| !u.is_empty()),
        workdir: image.config.working_dir.clone().filter(|w| !w.is_empty()),
        start_cmd: meta.start_cmd,
        ready_cmd: meta.ready_cmd,
    })
}

/// Start `startup`'s command in sandbox `id` (as `user`, in `cwd`) and
/// wait until its ready command exits 0 ([`READY_WAIT`] at most).
pub fn run_startup(
    manager: &SandboxManager,
    tenant: &TenantId,
    id: &SandboxId,
    user: &str,
    cwd: &str,
    env: &BTreeMap<String, String>,
    startup: &Startup,
) -> Result<(), String> {
    let req = |cmd: &str, background: bool| ExecRequest {
        argv: ["/bin/bash", "-l", "-c", cmd].map(String::from).to_vec(),
        cwd: Some(cwd.to_string()),
        user: Some(user.to_string()),
        env: env.clone(),
        background,
        ..ExecRequest::default()
    };
    if let Some(cmd) = &startup.start_cmd {
        // Dropping the handle detaches: it keeps running.
        let started = manager
            .exec(tenant, id, &req(cmd, true))
            .map_err(|e| format!("cannot start the template's start command {cmd:?}: {e}"))?;
        drop(started);
    }
    let Some(ready) = &startup.ready_cmd else {
        return Ok(());
    };
    let deadline = Instant::now() + READY_WAIT;
    loop {
        let ok = manager
            .exec(tenant, id, &req(ready, false))
            .ok()
            .and_then(|p| p.wait_with_output().ok())
            .is_some_and(|(_, _, status)| status.success());
        if ok {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "the template's ready command {ready:?} did not succeed within {} s of the start \
                 command {:?}: check both (they run as {user} in {cwd})",
                READY_WAIT.as_secs(),
                startup.start_cmd.as_deref().unwrap_or("")
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_as_e2b_does() {
        for ok in ["my-template", "a", "x_1.2", "tpl:v1.0", "tpl:Stable-2"] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "Upper", "-x", "a/b", "a:", "a:b:c", "sp ace", "../x"] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn reconcile_removes_only_old_upload_leftovers() {
        let home = tempfile::tempdir().unwrap();
        let tenant: TenantId = serde_json::from_str("\"0123456789ab\"").unwrap();
        let dir = e2b_dir(home.path()).join("files").join(tenant.as_str());
        let old = std::time::SystemTime::now() - Duration::from_secs(2 * 24 * 3600);
        let make = |name: &str, is_dir: bool, aged: bool| {
            let p = dir.join(name);
            if is_dir {
                std::fs::create_dir_all(p.join("inside")).unwrap();
            } else {
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(&p, "x").unwrap();
            }
            if aged {
                std::fs::File::open(&p).unwrap().set_modified(old).unwrap();
            }
            p
        };
        let stale_dir = make(".upload-abc", true, true);
        let stale_file = make(".tmpXYZ", false, true);
        let fresh = make(".upload-new", true, false);
        let files = make(&"a".repeat(64), true, true);
        reconcile(home.path());
        assert!(!stale_dir.exists() && !stale_file.exists());
        assert!(fresh.exists(), "an upload in progress stays");
        assert!(files.exists(), "uploaded files stay");
    }

    #[test]
    fn uploads_unpack_without_setuid_devices_or_escapes() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let tar_of = |entries: &[(&str, tar::EntryType, u32, &str)]| {
            let mut b = tar::Builder::new(Vec::new());
            for (path, kind, mode, link) in entries {
                let mut h = tar::Header::new_gnu();
                h.set_entry_type(*kind);
                h.set_mode(*mode);
                h.set_size(if *kind == tar::EntryType::Regular {
                    2
                } else {
                    0
                });
                if !link.is_empty() {
                    h.set_link_name(link).unwrap();
                }
                // Paths set raw: the builder refuses `..` itself.
                let name = h.as_old_mut().name.as_mut();
                name[..path.len()].copy_from_slice(path.as_bytes());
                h.set_cksum();
                let data: &[u8] = if *kind == tar::EntryType::Regular {
                    b"x\n"
                } else {
                    b""
                };
                b.append(&h, data).unwrap();
            }
            let path = dir.path().join("up.tar");
            std::fs::write(&path, b.into_inner().unwrap()).unwrap();
            path
        };
        let archive = tar_of(&[
            ("bin/", tar::EntryType::Directory, 0o755, ""),
            ("bin/suid", tar::EntryType::Regular, 0o4755, ""),
            ("dev", tar::EntryType::Char, 0o666, ""),
            ("link", tar::EntryType::Symlink, 0o777, "/etc/passwd"),
        ]);
        let target = dir.path().join("files");
        unpack_upload(&archive, dir.path(), &target).unwrap();
        let m = std::fs::metadata(target.join("bin/suid")).unwrap();
        assert_eq!(m.permissions().mode() & 0o7777, 0o755, "setuid stripped");
        assert!(
            target.join("dev").symlink_metadata().is_err(),
            "no device nodes"
        );
        assert_eq!(
            std::fs::read_link(target.join("link")).unwrap(),
            Path::new("/etc/passwd")
        );
        // A path out of the directory is refused, and nothing is left.
        let evil = tar_of(&[("../evil", tar::EntryType::Regular, 0o644, "")]);
        let target2 = dir.path().join("files2");
        let e = unpack_upload(&evil, dir.path(), &target2);
        assert!(e.is_err() || !dir.path().join("evil").exists());
        assert!(!dir.path().join("evil").exists());
    }

    #[test]
    fn terminal_output_becomes_lines() {
        let mut got = Vec::new();
        let mut l = Lines::default();
        l.push(b"one\r\ntw", &mut |s| got.push(s));
        l.push(b"o\r\n10%\r50%\r100%\r\nlast", &mut |s| got.push(s));
        l.finish(&mut |s| got.push(s));
        assert_eq!(got, ["one", "two", "100%", "last"]);
    }

    #[test]
    fn steps_map_onto_image_instructions() {
        let home = tempfile::tempdir().unwrap();
        let tenant: TenantId = serde_json::from_str("\"0123456789ab\"").unwrap();
        let hash = "a".repeat(64);
        std::fs::create_dir_all(files_dir(home.path(), &tenant, &hash)).unwrap();
        let start: StartBuild = serde_json::from_value(json!({
            "fromImage": "e2bdev/base",
            "force": false,
            "steps": [
                {"type": "RUN", "args": ["echo hi"], "force": false},
                {"type": "RUN", "args": ["id", "root"], "force": true},
                {"type": "COPY", "args": ["a.txt", "/x/", "user", "0755"], "filesHash": hash, "force": false},
                {"type": "ENV", "args": ["A", "1", "B", "two"], "force": false},
                {"type": "WORKDIR", "args": ["/app"], "force": false},
                {"type": "USER", "args": ["user"], "force": false},
            ],
        }))
        .unwrap();
        let s = steps(home.path(), &tenant, &start).unwrap();
        assert_eq!(s.len(), 6);
        assert_eq!(s[0].line, 1);
        assert!(matches!(&s[0].instruction, Instruction::Run(a) if a[2] == "echo hi"));
        assert!(matches!(&s[1].instruction, Instruction::RunAs(_, u) if u == "root"));
        assert!(s[1].force && !s[0].force);
        match &s[2].instruction {
            Instruction::Copy {
                sources,
                dest,
                extra: Some(e),
                ..
            } => {
                assert_eq!(sources, &["a.txt"]);
                assert_eq!(dest, "/x/");
                assert_eq!(e.owner.as_deref(), Some("user"));
                assert_eq!(e.mode, Some(0o755));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(&s[3].instruction, Instruction::Env(p) if p.len() == 2));
        // Bad input says which step and why.
        for (step, says) in [
            (
                json!({"type": "EXPOSE", "args": ["80"]}),
                "does not know the step type",
            ),
            (
                json!({"type": "COPY", "args": ["a", "/b"], "filesHash": "b".repeat(64)}),
                "never uploaded",
            ),
            (
                json!({"type": "COPY", "args": ["a", "/b", "", "999"], "filesHash": hash}),
                "octal",
            ),
            (json!({"type": "ENV", "args": ["A"]}), "pairs"),
        ] {
            let start: StartBuild =
                serde_json::from_value(json!({"fromImage": "x", "steps": [step]})).unwrap();
            let e = steps(home.path(), &tenant, &start).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
            assert!(
                e.message.contains(says) && e.message.starts_with("step 1"),
                "{}",
                e.message
            );
        }
    }
}
