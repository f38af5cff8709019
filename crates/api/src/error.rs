//! [`ApiError`]: the one place where errors meet HTTP.
//!
//! Every failure a handler can have becomes an `ApiError`, and its
//! [`IntoResponse`] decides the status and writes the one body shape of the
//! API: `{"code": "...", "message": "..."}`. `code` is a stable word for
//! programs; `message` is for a person and says what to change.
//!
//! Runtime errors are mapped by their [`ErrorKind`] ([`ApiError::from_kind`]);
//! their message is the runtime's, chained with its sources, plus the hints
//! that only this API can give (which of its routes resumes a paused
//! sandbox).

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use brig_agent_client::{ClientError, ErrorCode};
use brig_http::{AuthRejection, BlockingError};
use brig_runtime::{chain, ErrorKind, KeyError, ManagerError};

/// The one message a client gets for every refused key, so probing cannot
/// tell an unknown key from a revoked one.
pub const UNAUTHORIZED_MESSAGE: &str =
    "missing or invalid api key: pass a key from `brig keys create` as `Authorization: Bearer <key>`";

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
            UNAUTHORIZED_MESSAGE,
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

    /// The status and code of a runtime error of this kind, with `message`
    /// (an internal one is logged).
    pub fn from_kind(kind: ErrorKind, message: String) -> ApiError {
        use StatusCode as S;
        let (status, code) = match kind {
            ErrorKind::NotFound => (S::NOT_FOUND, "not_found"),
            ErrorKind::BadRequest => (S::BAD_REQUEST, "bad_request"),
            ErrorKind::Conflict | ErrorKind::NotRunning | ErrorKind::Paused => {
                (S::CONFLICT, "conflict")
            }
            ErrorKind::Forbidden => (S::FORBIDDEN, "forbidden"),
            ErrorKind::Unauthorized => return ApiError::unauthorized(),
            ErrorKind::Unsupported => (S::NOT_IMPLEMENTED, "unsupported"),
            ErrorKind::NoSpace => (S::INSUFFICIENT_STORAGE, "no_space"),
            ErrorKind::Unavailable => (S::SERVICE_UNAVAILABLE, "unavailable"),
            ErrorKind::Internal => {
                tracing::error!("internal error: {message}");
                (S::INTERNAL_SERVER_ERROR, "internal")
            }
        };
        ApiError::new(status, code, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "code": self.code, "message": self.message });
        (self.status, Json(body)).into_response()
    }
}

impl From<ManagerError> for ApiError {
    fn from(err: ManagerError) -> ApiError {
        let mut message = chain(&err);
        if let Some(hint) = hint(&err) {
            message.push_str(&hint);
        }
        ApiError::from_kind(err.kind(), message)
    }
}

/// What this API adds to a runtime error's message: the route that gets
/// the client further.
fn hint(err: &ManagerError) -> Option<String> {
    match err {
        ManagerError::Paused { id } => Some(format!(" (POST /v1/sandboxes/{id}/resume)")),
        ManagerError::AlreadyPaused { id } => {
            Some(format!("; resume it with POST /v1/sandboxes/{id}/resume"))
        }
        _ => None,
    }
}

impl From<brig_runtime::TenantError> for ApiError {
    fn from(err: brig_runtime::TenantError) -> ApiError {
        ApiError::from_kind(err.kind(), chain(&err))
    }
}

impl From<brig_runtime::SecretError> for ApiError {
    fn from(err: brig_runtime::SecretError) -> ApiError {
        ApiError::from_kind(err.kind(), chain(&err))
    }
}

impl From<KeyError> for ApiError {
    fn from(err: KeyError) -> ApiError {
        ApiError::from_kind(err.kind(), chain(&err))
    }
}

/// A refused key is 401 with [`UNAUTHORIZED_MESSAGE`] whatever the reason
/// (brig-http logged it); a failed check is the server's fault.
impl From<AuthRejection> for ApiError {
    fn from(r: AuthRejection) -> ApiError {
        match r {
            AuthRejection::Missing => ApiError::unauthorized(),
            AuthRejection::Key(e) if e.is_rejection() => ApiError::unauthorized(),
            AuthRejection::Key(e) => ApiError::internal(&e),
            AuthRejection::Task(e) => ApiError::internal(&e),
        }
    }
}

impl<E: Into<ApiError>> From<BlockingError<E>> for ApiError {
    fn from(e: BlockingError<E>) -> ApiError {
        match e {
            BlockingError::Call(e) => e.into(),
            BlockingError::Task(e) => e.into(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use brig_runtime::AuthError;

    #[test]
    fn every_refused_key_gets_one_public_message() {
        let refused = [
            AuthError::Malformed { reason: "x" },
            AuthError::Unknown { id: "a".into() },
            AuthError::WrongSecret { id: "a".into() },
            AuthError::Revoked { id: "a".into() },
        ];
        for err in refused.into_iter().map(AuthRejection::Key) {
            let e = ApiError::from(err);
            assert_eq!(
                (e.status, e.code),
                (StatusCode::UNAUTHORIZED, "unauthorized")
            );
            // What clients see does not depend on why.
            assert_eq!(e.message, UNAUTHORIZED_MESSAGE);
        }
        assert_eq!(
            ApiError::from(AuthRejection::Missing).message,
            UNAUTHORIZED_MESSAGE
        );
        assert!(UNAUTHORIZED_MESSAGE.contains("invalid api key"));
    }

    #[test]
    fn paused_sandboxes_name_the_native_resume_route() {
        let id = brig_core::SandboxId::from_random(7);
        let e = ApiError::from(ManagerError::Paused { id: id.clone() });
        assert_eq!((e.status, e.code), (StatusCode::CONFLICT, "conflict"));
        assert_eq!(
            e.message,
            format!("sandbox {id} is paused; resume it first (POST /v1/sandboxes/{id}/resume)")
        );
        let e = ApiError::from(ManagerError::AlreadyPaused { id: id.clone() });
        assert_eq!(
            e.message,
            format!(
                "sandbox {id} is already paused; resume it with POST /v1/sandboxes/{id}/resume"
            )
        );
    }
}
