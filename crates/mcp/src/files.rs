//! `read_file`, `write_file`, `upload_file`, `list_files`, and a sandbox's
//! files as MCP resources: `brig://SANDBOX_ID/PATH` (the path absolute
//! inside the sandbox, so `brig://0123456789ab/etc/hostname`), listed
//! for the session's default sandbox and readable in any of the tenant's.

use std::io::Read;
use std::sync::Arc;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use brig_agent_client::{Call as AgentCall, Reply};
use brig_core::SandboxId;
use brig_runtime::{SandboxManager, TenantId};
use rmcp::model::{
    CallToolResult, ContentBlock, ReadResourceResult, Resource, ResourceContents, ResourceTemplate,
};
use serde_json::json;

use crate::error::ToolError;
use crate::tools::{ListFilesArgs, ReadFileArgs, UploadFileArgs, WriteFileArgs};
use crate::Call;
use crate::Structured;

/// The most of a file `read_file` returns.
const MAX_READ: u64 = 8 << 20;
/// The URI scheme of a sandbox's files.
pub const SCHEME: &str = "brig://";

/// A path relative to the default user's home made absolute.
async fn absolute(call: &Call<'_>, id: &SandboxId, path: &str) -> String {
    if path.starts_with('/') {
        return path.to_string();
    }
    let (_, home) = crate::command::default_user(call, id).await;
    format!("{}/{}", home.trim_end_matches('/'), path)
}

/// Read at most `max` bytes of a file; (bytes, whole size known to be larger).
fn read(
    manager: &SandboxManager,
    tenant: &TenantId,
    id: &SandboxId,
    path: &str,
    max: u64,
) -> Result<(Vec<u8>, bool), ToolError> {
    let reader = manager.read_file(tenant, id, path).map_err(|e| {
        ToolError::Failed(format!(
            "cannot read {path}: {} (list_files shows what is there)",
            crate::error::chain(&e)
        ))
    })?;
    let mut buf = Vec::new();
    reader
        .take(max + 1)
        .read_to_end(&mut buf)
        .map_err(|e| ToolError::Failed(format!("cannot read {path}: {e}")))?;
    let more = buf.len() as u64 > max;
    buf.truncate(max as usize);
    Ok((buf, more))
}

fn image_mime(b: &[u8]) -> Option<&'static str> {
    match b {
        [0x89, b'P', b'N', b'G', ..] => Some("image/png"),
        [0xff, 0xd8, 0xff, ..] => Some("image/jpeg"),
        [b'G', b'I', b'F', b'8', ..] => Some("image/gif"),
        [b'R', b'I', b'F', b'F', _, _, _, _, b'W', b'E', b'B', b'P', ..] => Some("image/webp"),
        _ => None,
    }
}

pub(crate) async fn read_file(
    call: &Call<'_>,
    args: ReadFileArgs,
) -> Result<CallToolResult, ToolError> {
    let id = call.sandbox(args.sandbox_id.as_deref()).await?;
    let path = absolute(call, &id, &args.path).await;
    let (m, t, i, p) = (
        Arc::clone(call.manager()),
        call.tenant.clone(),
        id.clone(),
        path.clone(),
    );
    let (bytes, more) = tokio::task::spawn_blocking(move || read(&m, &t, &i, &p, MAX_READ))
        .await
        .map_err(|e| ToolError::Failed(format!("the read task failed: {e}")))??;
    let note = if more {
        format!(
            "\n[only the first {} MiB of {path} are shown; use run_command with head, tail or \
             grep for the rest]",
            MAX_READ >> 20
        )
    } else {
        String::new()
    };
    let content = if let Some(mime) = image_mime(&bytes) {
        vec![
            ContentBlock::text(format!(
                "{path}: an image ({mime}, {} bytes){note}",
                bytes.len()
            )),
            ContentBlock::image(BASE64.encode(&bytes), mime),
        ]
    } else {
        match String::from_utf8(bytes) {
            Ok(text) => vec![ContentBlock::text(format!("{text}{note}"))],
            Err(e) => {
                let bytes = e.into_bytes();
                vec![
                    ContentBlock::text(format!(
                        "{path} is binary ({} bytes); its bytes, base64-encoded, follow{note}",
                        bytes.len()
                    )),
                    ContentBlock::resource(
                        ResourceContents::blob(BASE64.encode(&bytes), uri(&id, &path))
                            .with_mime_type("application/octet-stream"),
                    ),
                ]
            }
        }
    };
    Ok(CallToolResult::success(content))
}

async fn write(
    call: &Call<'_>,
    id: &SandboxId,
    path: &str,
    data: Vec<u8>,
) -> Result<u64, ToolError> {
    let (m, t, i, p) = (
        Arc::clone(call.manager()),
        call.tenant.clone(),
        id.clone(),
        path.to_string(),
    );
    tokio::task::spawn_blocking(move || {
        if let Some((parent, _)) = p.rsplit_once('/').filter(|(d, _)| !d.is_empty()) {
            let _ = m.call(
                &t,
                &i,
                &AgentCall::Mkdir {
                    path: parent.to_string(),
                    parents: true,
                },
            );
        }
        m.write_file(&t, &i, &p, &data[..]).map_err(|e| {
            ToolError::Failed(format!("cannot write {p}: {}", crate::error::chain(&e)))
        })
    })
    .await
    .map_err(|e| ToolError::Failed(format!("the write task failed: {e}")))?
}

pub(crate) async fn write_file(
    call: &Call<'_>,
    args: WriteFileArgs,
) -> Result<CallToolResult, ToolError> {
    let id = call.sandbox(args.sandbox_id.as_deref()).await?;
    let path = absolute(call, &id, &args.path).await;
    let n = write(call, &id, &path, args.content.into_bytes()).await?;
    Ok(CallToolResult::success(vec![ContentBlock::text(format!(
        "wrote {n} bytes to {path} in sandbox {id}"
    ))]))
}

pub(crate) async fn upload_file(
    call: &Call<'_>,
    args: UploadFileArgs,
) -> Result<CallToolResult, ToolError> {
    let data = base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(args.data_base64.trim().trim_end_matches('='))
        .map_err(|e| ToolError::Invalid(format!("data_base64 is not base64: {e}")))?;
    let id = call.sandbox(args.sandbox_id.as_deref()).await?;
    let path = absolute(call, &id, &args.path).await;
    let n = write(call, &id, &path, data).await?;
    Ok(CallToolResult::success(vec![ContentBlock::text(format!(
        "uploaded {n} bytes to {path} in sandbox {id}"
    ))]))
}

pub(crate) async fn list_files(
    call: &Call<'_>,
    args: ListFilesArgs,
) -> Result<CallToolResult, ToolError> {
    let id = call.sandbox(args.sandbox_id.as_deref()).await?;
    let path = match &args.path {
        Some(p) => absolute(call, &id, p).await,
        None => crate::command::default_user(call, &id).await.1,
    };
    let depth = args.depth.unwrap_or(1).clamp(1, 5);
    let (m, t, i, p) = (
        Arc::clone(call.manager()),
        call.tenant.clone(),
        id.clone(),
        path.clone(),
    );
    let reply = tokio::task::spawn_blocking(move || {
        m.call(
            &t,
            &i,
            &AgentCall::List {
                path: p,
                depth,
                xattrs: None,
            },
        )
    })
    .await
    .map_err(|e| ToolError::Failed(format!("the list task failed: {e}")))?
    .map_err(|e| ToolError::Failed(format!("cannot list {path}: {}", crate::error::chain(&e))))?;
    let Reply::Entries(entries) = reply else {
        return Err(ToolError::Failed(format!(
            "cannot list {path}: no entries came back"
        )));
    };
    let mut text = format!("{path} ({} entries)\n", entries.len());
    let mut items = Vec::new();
    for e in &entries {
        let kind = format!("{:?}", e.kind).to_lowercase();
        text.push_str(&format!("{kind:<8} {:>10}  {}\n", e.size, e.path));
        items.push(json!({"path": e.path, "name": e.name, "type": kind, "size": e.size}));
    }
    Ok(CallToolResult::success(vec![ContentBlock::text(text)])
        .with_structured_content(json!({ "path": path, "entries": items })))
}

/// `brig://ID/PATH` for a file.
pub fn uri(id: &SandboxId, path: &str) -> String {
    format!("{SCHEME}{id}/{}", path.trim_start_matches('/'))
}

pub fn resource_templates() -> Vec<ResourceTemplate> {
    vec![
        ResourceTemplate::new("brig://{sandbox_id}/{+path}", "sandbox file")
            .with_title("A file in a brig sandbox")
            .with_description(
                "A file inside one of your sandboxes, by its absolute path without the leading \
             slash: brig://SANDBOX_ID/home/user/report.csv",
            ),
    ]
}

/// The files in the default sandbox's home (two levels down, at most
/// 200); nothing before the session has a default sandbox.
pub async fn list_resources(
    manager: &Arc<SandboxManager>,
    tenant: &TenantId,
    default: Option<&SandboxId>,
) -> Vec<Resource> {
    let Some(id) = default.cloned() else {
        return Vec::new();
    };
    let (m, t) = (Arc::clone(manager), tenant.clone());
    let found = tokio::task::spawn_blocking(move || {
        let (_, home) = brig_e2b::control::default_user(&m, &t, &id);
        let reply = m.call(
            &t,
            &id,
            &AgentCall::List {
                path: home,
                depth: 2,
                xattrs: None,
            },
        );
        (id, reply)
    })
    .await;
    let Ok((id, Ok(Reply::Entries(entries)))) = found else {
        return Vec::new();
    };
    entries
        .into_iter()
        .filter(|e| format!("{:?}", e.kind).eq_ignore_ascii_case("file"))
        .filter(|e| !e.name.starts_with('.'))
        .take(200)
        .map(|e| Resource::new(uri(&id, &e.path), e.name.clone()).with_size(e.size))
        .collect()
}

/// Why a resource could not be read.
#[derive(Debug)]
pub enum ResourceError {
    NotFound(String),
    Invalid(String),
}

pub async fn read_resource(
    manager: &Arc<SandboxManager>,
    tenant: &TenantId,
    uri_text: &str,
) -> Result<ReadResourceResult, ResourceError> {
    let rest = uri_text.strip_prefix(SCHEME).ok_or_else(|| {
        ResourceError::Invalid(format!(
            "{uri_text}: brig's resources are brig://SANDBOX_ID/PATH"
        ))
    })?;
    let (id, path) = rest.split_once('/').unwrap_or((rest, ""));
    let id = SandboxId::parse(id)
        .ok_or_else(|| ResourceError::NotFound(format!("{uri_text}: no sandbox {id}")))?;
    let path = format!("/{path}");
    let (m, t, i, p) = (
        Arc::clone(manager),
        tenant.clone(),
        id.clone(),
        path.clone(),
    );
    let (bytes, _) = tokio::task::spawn_blocking(move || read(&m, &t, &i, &p, MAX_READ))
        .await
        .map_err(|e| ResourceError::NotFound(e.to_string()))?
        .map_err(|e| ResourceError::NotFound(format!("{uri_text}: {e}")))?;
    let contents = match (image_mime(&bytes), String::from_utf8(bytes)) {
        (None, Ok(text)) => ResourceContents::text(text, uri_text).with_mime_type("text/plain"),
        (mime, Err(e)) => ResourceContents::blob(BASE64.encode(e.into_bytes()), uri_text)
            .with_mime_type(mime.unwrap_or("application/octet-stream")),
        (Some(mime), Ok(text)) => {
            ResourceContents::blob(BASE64.encode(text.into_bytes()), uri_text).with_mime_type(mime)
        }
    };
    Ok(ReadResourceResult::new(vec![contents]))
}
