//! [`ApiError`]: the one place where errors meet HTTP.
//!
//! Every failure a handler can have becomes an `ApiError`, and its
//! [`IntoResponse`] decides the status and writes the one body shape of the
//! API: `{"code": "...", "message": "..."}`. `code` is a stable word for
//! programs; `message` is for a person and says what to change.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use brig_agent_client::{ClientError, ErrorCode};
use brig_jail::JailError;

use crate::manager::ManagerError;
use crate::sandboxes::SandboxError;
use crate::AuthError;

/// An error answer: status, stable code and a message for people.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub fn unauthorized() -> ApiError {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            AuthError::PUBLIC_MESSAGE,
        )
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// A bug or a host failure: logged in full, reported with its chain.
    pub fn internal(err: &(dyn std::error::Error + 'static)) -> ApiError {
        let message = chain(err);
        tracing::error!("internal error: {message}");
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "code": self.code, "message": self.message });
        (self.status, Json(body)).into_response()
    }
}

/// `err: its source: its source's source`, each message once.
fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut next = err.source();
    while let Some(e) = next {
        let message = e.to_string();
        // Some errors show their source in their own message (`sandbox
        // {id}: {source}`): it is not repeated.
        if !out.ends_with(&message) {
            out.push_str(": ");
            out.push_str(&message);
        }
        next = e.source();
    }
    out
}

impl From<ManagerError> for ApiError {
    fn from(err: ManagerError) -> ApiError {
        use StatusCode as S;
        match &err {
            ManagerError::Spec(_) | ManagerError::BadRequest { .. } => {
                ApiError::bad_request(err.to_string())
            }
            ManagerError::NotRunning { .. } => {
                ApiError::new(S::CONFLICT, "conflict", err.to_string())
            }
            ManagerError::Sandbox(e) => match e {
                SandboxError::NotFound { .. } => ApiError::not_found(e.to_string()),
                SandboxError::InvalidTransition { .. } | SandboxError::Ended { .. } => {
                    ApiError::new(S::CONFLICT, "conflict", e.to_string())
                }
                SandboxError::BadCursor { .. } => ApiError::bad_request(e.to_string()),
                _ => ApiError::internal(&err),
            },
            ManagerError::Agent { source, .. } => agent_error(&err, source),
            ManagerError::Paused { .. }
            | ManagerError::AlreadyPaused { .. }
            | ManagerError::NotPaused { .. } => {
                ApiError::new(S::CONFLICT, "conflict", err.to_string())
            }
            ManagerError::Cgroup {
                source: brig_jail::cgroup::CgroupError::NoGroup { .. },
                ..
            } => ApiError::new(S::NOT_IMPLEMENTED, "unsupported", chain(&err)),
            ManagerError::TemplateNotAllowed { .. } => {
                ApiError::new(S::FORBIDDEN, "forbidden", err.to_string())
            }
            ManagerError::Spawn(
                JailError::Spec(_) | JailError::Template(_) | JailError::NoCpuController,
            ) => ApiError::bad_request(chain(&err)),
            ManagerError::Template { .. } => {
                ApiError::new(S::SERVICE_UNAVAILABLE, "unavailable", chain(&err))
            }
            ManagerError::ShuttingDown => {
                ApiError::new(S::SERVICE_UNAVAILABLE, "unavailable", err.to_string())
            }
            _ => ApiError::internal(&err),
        }
    }
}

impl ApiError {
    /// A command could not be started (exec, background process). A
    /// missing program gets its own code, `command_not_found`, so clients
    /// can tell it from an unknown sandbox (both are 404) and exit 127 as
    /// `brig run` does.
    pub fn command_start(err: ManagerError) -> ApiError {
        if let ManagerError::Agent {
            source:
                ClientError::Agent {
                    code: ErrorCode::NotFound,
                    ..
                },
            ..
        } = &err
        {
            return ApiError::new(StatusCode::NOT_FOUND, "command_not_found", err.to_string());
        }
        err.into()
    }
}

/// An operation in the sandbox failed: the agent's code picks the status.
fn agent_error(err: &ManagerError, source: &ClientError) -> ApiError {
    use StatusCode as S;
    let msg = err.to_string();
    match source {
        ClientError::Agent { code, .. } => match code {
            ErrorCode::NotFound | ErrorCode::NoSuchProcess => ApiError::not_found(msg),
            ErrorCode::PermissionDenied => ApiError::new(S::FORBIDDEN, "forbidden", msg),
            ErrorCode::AlreadyExists
            | ErrorCode::DirectoryNotEmpty
            | ErrorCode::Busy
            | ErrorCode::NotADirectory
            | ErrorCode::IsADirectory => ApiError::new(S::CONFLICT, "conflict", msg),
            ErrorCode::InvalidRequest | ErrorCode::Unsupported => ApiError::bad_request(msg),
            _ => ApiError::internal(err),
        },
        // The sandbox ended under the request.
        ClientError::Closed | ClientError::StreamClosed { .. } | ClientError::Reset { .. } => {
            ApiError::new(S::CONFLICT, "conflict", msg)
        }
        _ => ApiError::internal(err),
    }
}

impl From<AuthError> for ApiError {
    fn from(err: AuthError) -> ApiError {
        if err.is_rejection() {
            tracing::info!("refused an api key: {err}");
            ApiError::unauthorized()
        } else {
            ApiError::internal(&err)
        }
    }
}

/// Malformed JSON, a wrong content type, unknown or missing fields: 400
/// with serde's explanation (it names the field and the position).
impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> ApiError {
        let message = match &r {
            JsonRejection::MissingJsonContentType(_) => {
                "expected a JSON body with `Content-Type: application/json`".to_string()
            }
            _ => r.body_text(),
        };
        ApiError::bad_request(message)
    }
}

impl From<QueryRejection> for ApiError {
    fn from(r: QueryRejection) -> ApiError {
        ApiError::bad_request(r.body_text())
    }
}

impl From<PathRejection> for ApiError {
    fn from(r: PathRejection) -> ApiError {
        ApiError::bad_request(r.body_text())
    }
}

impl From<tokio::task::JoinError> for ApiError {
    fn from(e: tokio::task::JoinError) -> ApiError {
        ApiError::internal(&e)
    }
}
