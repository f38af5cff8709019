//! [`ToolError`]: why a tool call failed, said to the model.
//!
//! MCP clients show a protocol error opaquely ("tool failed"), so every
//! failure of a tool, bad arguments included, is answered as a tool result
//! with `isError: true` and a message saying what went wrong and what to do
//! ([`ToolError::into_result`]). This is the one place a failure meets the
//! wire.

use brig_runtime::{ErrorKind, ManagerError};
use rmcp::model::{CallToolResult, ContentBlock};

/// A tool call that failed.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// The arguments do not match the tool's schema.
    #[error("invalid arguments for {tool}: {field}: {reason}")]
    Arguments {
        tool: String,
        field: String,
        reason: String,
    },
    /// A value the schema cannot express was wrong (a size, a duration).
    #[error("{0}")]
    Invalid(String),
    /// The runtime refused or failed.
    #[error("{message}")]
    Manager { message: String, kind: ErrorKind },
    /// The code interpreter or a file operation failed.
    #[error("{0}")]
    Failed(String),
    /// The client cancelled the call.
    #[error("cancelled by the client; the command was killed")]
    Cancelled,
}

impl ToolError {
    /// A runtime error with this front-end's hint on what to do.
    pub fn manager(e: ManagerError) -> ToolError {
        let kind = e.kind();
        let hint = match kind {
            ErrorKind::NotFound => {
                " (list_sandboxes shows the sandboxes this key can use; omit sandbox_id to use \
                 this session's default sandbox)"
            }
            ErrorKind::NotRunning => {
                " (the sandbox has ended; create_sandbox makes a new one, or omit sandbox_id to \
                 get a fresh default sandbox)"
            }
            ErrorKind::Paused => " (resume it with `brig resume` first)",
            _ => "",
        };
        ToolError::Manager {
            message: format!("{}{hint}", chain(&e)),
            kind,
        }
    }

    /// The error as a tool result the model reads.
    pub fn into_result(self) -> CallToolResult {
        CallToolResult::error(vec![ContentBlock::text(format!("error: {self}"))])
    }
}

impl From<ManagerError> for ToolError {
    fn from(e: ManagerError) -> ToolError {
        ToolError::manager(e)
    }
}

/// An error and its sources, once each, joined by ": ".
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        next = s.source();
    }
    out
}
