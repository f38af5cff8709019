//! The streamed NDJSON answers (exec, process output, watch, logs): one
//! JSON document per line, sent as a pump task produces them.

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::header::CONTENT_TYPE;
use axum::response::Response;
use tokio::sync::mpsc;

use super::ApiError;

/// One line: the document and its newline.
pub(crate) fn line(v: &serde_json::Value) -> Bytes {
    let mut s = v.to_string();
    s.push('\n');
    Bytes::from(s)
}

/// The answer whose body is what a pump sends on `rx`, line by line.
pub(crate) fn response(
    rx: mpsc::Receiver<Result<Bytes, Infallible>>,
) -> Result<Response, ApiError> {
    Response::builder()
        .header(CONTENT_TYPE, "application/x-ndjson")
        .body(Body::from_stream(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        ))
        .map_err(|e| ApiError::internal(&e))
}
