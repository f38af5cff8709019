//! `run_code`: a cell in a stateful Jupyter kernel, through the code
//! interpreter brig-e2b runs in `code-interpreter-v1` sandboxes (its
//! `server.py` on port 49999; started here on first use, as E2B's create
//! starts it). One `POST /execute` per call, through brig-http's proxy to
//! the port inside the sandbox, read as the NDJSON lines it streams:
//! stdout and stderr text, results (text, and PNG or JPEG images, which
//! become MCP image content), and errors with their traceback.
//!
//! Cancelling the call drops the response body; the server sees its
//! client go and interrupts the kernel.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use brig_core::SandboxId;
use brig_e2b::control::interpreter;
use brig_e2b::CODE_INTERPRETER_PORT;
use http_body_util::BodyExt;
use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::json;

use crate::error::ToolError;
use crate::tools::RunCodeArgs;
use crate::Structured;
use crate::{lock, Call, DEFAULT_WAIT};

/// A sandbox whose interpreter is up.
#[derive(Debug, Clone)]
pub struct Interpreter {
    pub user: String,
}

/// Make sure the sandbox's code interpreter runs: started once per
/// sandbox (its kernels keep their state between calls).
async fn ensure(call: &Call<'_>, id: &SandboxId) -> Result<(), ToolError> {
    if lock(&call.shared().interpreters).contains_key(id) {
        return Ok(());
    }
    let (m, t, i) = (Arc::clone(call.manager()), call.tenant.clone(), id.clone());
    let record = tokio::task::spawn_blocking(move || m.get(&t, &i))
        .await
        .map_err(|e| ToolError::Failed(format!("the lookup failed: {e}")))??;
    let template = crate::sandboxes::template_name(&record.attrs, &record.template);
    if !interpreter::wanted(&template) {
        return Err(ToolError::Invalid(format!(
            "run_code needs a sandbox of the code-interpreter-v1 template, and sandbox {id} is \
             of {template}; omit sandbox_id to use this session's default sandbox, create one \
             with create_sandbox {{\"template\": \"code-interpreter-v1\"}}, or run a script \
             with run_command"
        )));
    }
    let (user, home) = crate::command::default_user(call, id).await;
    call.progress(0.0, "starting the code interpreter").await;
    let (m, t, i, u) = (
        Arc::clone(call.manager()),
        call.tenant.clone(),
        id.clone(),
        user.clone(),
    );
    tokio::task::spawn_blocking(move || interpreter::start_in(&m, &t, &i, &u, &home))
        .await
        .map_err(|e| ToolError::Failed(format!("the start task failed: {e}")))?
        .map_err(|e| ToolError::Failed(crate::error::chain(&e)))?;
    lock(&call.shared().interpreters).insert(id.clone(), Interpreter { user });
    Ok(())
}

/// A sandbox just restored from the code interpreter's warm start (see
/// `sandboxes::make`): its server is told the create's env vars and
/// checked to listen, then known to be up. If it is not, `run_code`
/// starts one as in any other sandbox.
pub(crate) async fn resumed(call: &Call<'_>, id: &SandboxId, envs: BTreeMap<String, String>) {
    let (user, _) = crate::command::default_user(call, id).await;
    let (m, t, i, u) = (
        Arc::clone(call.manager()),
        call.tenant.clone(),
        id.clone(),
        user.clone(),
    );
    let resumed =
        tokio::task::spawn_blocking(move || interpreter::resume_warm_in(&m, &t, &i, &u, &envs))
            .await;
    match resumed {
        Ok(Ok(())) => {
            lock(&call.shared().interpreters).insert(id.clone(), Interpreter { user });
        }
        Ok(Err(e)) => tracing::warn!("{}", crate::error::chain(&e)),
        Err(e) => tracing::warn!("sandbox {id}: the resume task failed: {e}"),
    }
}

pub(crate) async fn run_code(
    call: &Call<'_>,
    args: RunCodeArgs,
) -> Result<CallToolResult, ToolError> {
    let id = call.sandbox(args.sandbox_id.as_deref()).await?;
    ensure(call, &id).await?;
    let timeout = args
        .timeout_seconds
        .map_or(DEFAULT_WAIT, Duration::from_secs);
    let body = json!({
        "code": args.code,
        "language": args.language.as_deref().unwrap_or("python"),
        "timeout": timeout.as_secs(),
    });
    let req = axum::http::Request::post("/execute")
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .map_err(|e| ToolError::Failed(format!("cannot build the request: {e}")))?;
    let resp = brig_http::ports::proxy(
        Arc::clone(call.manager()),
        call.tenant.clone(),
        id.clone(),
        CODE_INTERPRETER_PORT,
        req,
    )
    .await
    .map_err(|e| {
        if matches!(e, brig_http::ports::ProxyError::PortClosed { .. }) {
            // Killed from inside the sandbox: start it again next time.
            lock(&call.shared().interpreters).remove(&id);
        }
        ToolError::Failed(format!(
            "the code interpreter did not answer: {}; retry (it is restarted on the next call)",
            crate::error::chain(&e)
        ))
    })?;
    let status = resp.status();
    let mut body = resp.into_body();
    if !status.is_success() {
        let text = body
            .collect()
            .await
            .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
            .unwrap_or_default();
        return Err(ToolError::Failed(format!(
            "the code interpreter refused the code ({status}): {}",
            text.trim()
        )));
    }
    let mut cell = Cell::default();
    let mut pending = Vec::new();
    let started = tokio::time::Instant::now();
    loop {
        let frame = tokio::select! {
            f = body.frame() => f,
            () = call.ctx.ct.cancelled() => {
                // Dropping the body closes the connection: the server
                // interrupts the kernel.
                return Err(ToolError::Cancelled);
            }
        };
        let Some(frame) = frame else { break };
        let frame = frame
            .map_err(|e| ToolError::Failed(format!("the code interpreter's answer broke: {e}")))?;
        let Some(data) = frame.data_ref() else {
            continue;
        };
        pending.extend_from_slice(data);
        while let Some(nl) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=nl).collect();
            if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&line) {
                if v["type"] == "keepalive" {
                    let secs = started.elapsed().as_secs();
                    call.progress(secs as f64, format!("running for {secs} s"))
                        .await;
                }
                cell.take(v);
            }
        }
    }
    Ok(cell.into_result(&id))
}

/// What one execution printed and returned.
#[derive(Default)]
struct Cell {
    stdout: String,
    stderr: String,
    results: Vec<ContentBlock>,
    texts: Vec<String>,
    error: Option<String>,
    images: usize,
}

impl Cell {
    fn take(&mut self, v: serde_json::Value) {
        let s = |k: &str| v[k].as_str().unwrap_or_default().to_string();
        match v["type"].as_str().unwrap_or_default() {
            "stdout" => self.stdout.push_str(&s("text")),
            "stderr" => self.stderr.push_str(&s("text")),
            "result" => {
                let mut imaged = false;
                for (field, mime) in [("png", "image/png"), ("jpeg", "image/jpeg")] {
                    if let Some(data) = v[field].as_str() {
                        self.results
                            .push(ContentBlock::image(data.replace('\n', ""), mime));
                        self.images += 1;
                        imaged = true;
                    }
                }
                if let Some(text) = v["text"].as_str() {
                    // A figure's text is "<Figure size ...>": noise beside
                    // its image.
                    if !(imaged && text.starts_with("<Figure")) {
                        self.texts.push(text.to_string());
                    }
                } else if let Some(html) = v["html"].as_str() {
                    self.texts.push(html.to_string());
                }
            }
            "error" => {
                self.error = Some(format!(
                    "{}: {}\n{}",
                    s("name"),
                    s("value"),
                    strip_ansi(&s("traceback"))
                ))
            }
            _ => {}
        }
    }

    fn into_result(self, id: &SandboxId) -> CallToolResult {
        let mut text = String::new();
        if !self.stdout.is_empty() {
            text.push_str(&format!("--- stdout ---\n{}", cut(&self.stdout)));
            if !self.stdout.ends_with('\n') {
                text.push('\n');
            }
        }
        if !self.stderr.is_empty() {
            text.push_str(&format!("--- stderr ---\n{}", cut(&self.stderr)));
            if !self.stderr.ends_with('\n') {
                text.push('\n');
            }
        }
        for t in &self.texts {
            text.push_str(&format!("--- result ---\n{}\n", cut(t)));
        }
        if self.images > 0 {
            text.push_str(&format!("[{} image(s) below]\n", self.images));
        }
        if let Some(e) = &self.error {
            text.push_str(&format!("--- error ---\n{}\n", cut(e)));
        }
        if text.is_empty() {
            text.push_str("(no output)\n");
        }
        let structured = json!({
            "sandbox_id": id.as_str(),
            "stdout": self.stdout,
            "stderr": self.stderr,
            "results": self.texts,
            "images": self.images,
            "error": self.error,
        });
        let mut content = vec![ContentBlock::text(text)];
        content.extend(self.results);
        let result = if self.error.is_some() {
            CallToolResult::error(content)
        } else {
            CallToolResult::success(content)
        };
        result.with_structured_content(structured)
    }
}

fn cut(s: &str) -> String {
    if s.len() <= crate::command::SHOWN {
        return s.to_string();
    }
    let mut at = crate::command::SHOWN;
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    format!("{}\n[... {} more bytes not shown]", &s[..at], s.len() - at)
}

/// Tracebacks come coloured for a terminal.
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_figure_becomes_an_image_and_a_traceback_loses_its_colours() {
        let mut cell = Cell::default();
        cell.take(json!({"type": "stdout", "text": "hi\n"}));
        cell.take(
            json!({"type": "result", "text": "<Figure size 640x480 with 1 Axes>",
                         "png": "iVBORw0KGgo=", "is_main_result": false}),
        );
        cell.take(json!({"type": "result", "text": "3", "is_main_result": true}));
        let r = cell.into_result(&SandboxId::parse("0123456789ab").unwrap());
        assert_ne!(r.is_error, Some(true));
        assert_eq!(r.content.len(), 2);
        assert!(r.content[1].as_image().is_some());
        let text = &r.content[0].as_text().unwrap().text;
        assert!(
            text.contains("hi") && text.contains("--- result ---\n3"),
            "{text}"
        );
        assert!(!text.contains("<Figure"));

        let mut cell = Cell::default();
        cell.take(
            json!({"type": "error", "name": "ZeroDivisionError", "value": "division by zero",
                         "traceback": "\u{1b}[0;31mZeroDivisionError\u{1b}[0m"}),
        );
        let r = cell.into_result(&SandboxId::parse("0123456789ab").unwrap());
        assert_eq!(r.is_error, Some(true));
        assert!(!r.content[0].as_text().unwrap().text.contains('\u{1b}'));
    }
}
