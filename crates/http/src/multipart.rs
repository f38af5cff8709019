//! A bound on what a multipart body may make the daemon hold.
//!
//! axum's `Multipart` (multer underneath) streams a part's data, but it
//! buffers everything before the first boundary and a part's headers
//! until their blank line, with no limit: a client that sends endless
//! "headers" makes the daemon hold all of it (found by
//! `crates/e2b/tests/e2b_hostile.rs`; the upload routes take bodies of any
//! size, so no body limit stops it). [`bounded`] wraps a request's body so
//! that, while the parser looks for a boundary or the end of a part's
//! headers, at most [`MAX_BETWEEN_PARTS`] bytes may arrive; past that the
//! body fails, and the parser with it (a "malformed multipart body" 400).
//! The handler says which phase it is in through the [`Phase`] it gets
//! back: [`Phase::headers`] before asking for the next part,
//! [`Phase::data`] once it has one. A part's data is not counted: it is
//! streamed, and its size is the client's business.
//!
//! The wrapper also works around a race in multer 3.1 (rwf2/multer#70,
//! unmerged): looking for the first boundary, the parser polls the body a
//! second time after searching its buffer, and if that poll brings the
//! rest of the body *and* its end, it reports "incomplete multipart
//! stream" without searching again. A whole small upload that arrives
//! between the two polls (HTTP/2 sends each part of it as its own frame)
//! failed that way about once in a hundred. [`bounded`] never lets the
//! poll that ends the body bring data: it answers "not yet" once (waking
//! the task at once) before the end, so the parser always searches what
//! it holds before it learns that nothing more will come.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Poll;

use axum::body::Body;
use axum::extract::Request;
use futures_util::StreamExt;

/// The most bytes a multipart body may send between the end of one part's
/// data and the start of the next one's (a boundary, the part's headers,
/// and before the first part, a preamble). Real clients send a few
/// hundred. Generous, because the parser pulls whatever has arrived at
/// once, and a body chunk can be 400 KiB: a legitimate upload must never
/// come near it.
pub const MAX_BETWEEN_PARTS: usize = 8 << 20;

/// Where the multipart parser is, as the handler tells it; see the module
/// docs.
#[derive(Debug, Clone, Default)]
pub struct Phase(Arc<PhaseState>);

#[derive(Debug, Default)]
struct PhaseState {
    in_data: AtomicBool,
    /// The bound was crossed: the body failed because of it.
    exceeded: AtomicBool,
    /// Bytes arrived since the handler last said `headers`.
    between: AtomicUsize,
}

impl Phase {
    /// The handler is about to ask for the next part: bytes count from
    /// here.
    pub fn headers(&self) {
        self.0.between.store(0, Ordering::SeqCst);
        self.0.in_data.store(false, Ordering::SeqCst);
    }

    /// The handler has a part and reads its data: bytes do not count.
    pub fn data(&self) {
        self.0.in_data.store(true, Ordering::SeqCst);
    }

    /// What to tell the client about a parser error: the bound, if that
    /// is what failed the body (the parser's own message would only say
    /// that reading the body failed), else the parser's message.
    pub fn explain(&self, err: &axum::extract::multipart::MultipartError) -> String {
        if self.0.exceeded.load(Ordering::SeqCst) {
            format!(
                "more than {MAX_BETWEEN_PARTS} bytes without a part's data: a boundary or a \
                 part's headers that never end"
            )
        } else {
            err.body_text()
        }
    }
}

/// `req` with its body bounded as the module docs say, and the [`Phase`]
/// to steer it with. The phase starts at `headers`.
pub fn bounded(req: Request) -> (Request, Phase) {
    let phase = Phase::default();
    let state = Arc::clone(&phase.0);
    let (parts, body) = req.into_parts();
    let stream = body.into_data_stream().map(move |chunk| {
        let chunk = chunk?;
        if !state.in_data.load(Ordering::SeqCst) {
            let between = state.between.fetch_add(chunk.len(), Ordering::SeqCst) + chunk.len();
            if between > MAX_BETWEEN_PARTS {
                state.exceeded.store(true, Ordering::SeqCst);
                return Err(axum::Error::new(std::io::Error::other(
                    "multipart bound crossed",
                )));
            }
        }
        Ok(chunk)
    });
    (
        Request::from_parts(parts, Body::from_stream(end_apart(stream))),
        phase,
    )
}

/// `stream` with its end held back by one "not yet": the end always
/// comes on a poll of its own (see the module docs for why).
fn end_apart<S: futures_util::Stream + Unpin>(
    mut stream: S,
) -> impl futures_util::Stream<Item = S::Item> {
    let mut ended = false;
    futures_util::stream::poll_fn(move |cx| {
        if ended {
            return Poll::Ready(None);
        }
        match stream.poll_next_unpin(cx) {
            Poll::Ready(None) => {
                ended = true;
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            other => other,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::extract::{FromRequest, Multipart};

    /// Bytes of every part's data, read as the upload handlers do; the
    /// routes disable axum's body limit, so this one is served the same way.
    async fn upload(req: Request) -> Result<String, String> {
        let (req, phase) = bounded(req);
        let mut multipart = Multipart::from_request(req, &())
            .await
            .map_err(|e| e.body_text())?;
        let mut got = 0;
        while let Some(mut field) = {
            phase.headers();
            multipart
                .next_field()
                .await
                .map_err(|e| phase.explain(&e))?
        } {
            phase.data();
            while let Some(chunk) = field.chunk().await.map_err(|e| phase.explain(&e))? {
                got += chunk.len();
            }
        }
        Ok(got.to_string())
    }

    /// `body` uploaded through a router like the daemon's (no body limit),
    /// in 256 KiB chunks, each after a pause, as a socket delivers them (an
    /// always-ready stream would be drained whole at the first poll,
    /// headers and data alike): the bytes of data read, or the refusal.
    async fn serve(body: Vec<u8>) -> String {
        use tower::ServiceExt;
        let chunks: Vec<Vec<u8>> = body.chunks(256 << 10).map(<[u8]>::to_vec).collect();
        let stream = futures_util::stream::iter(chunks).then(|c| async move {
            tokio::task::yield_now().await;
            Ok::<_, std::io::Error>(c)
        });
        let req = Request::builder()
            .method("POST")
            .uri("/")
            .header("content-type", "multipart/form-data; boundary=B")
            .body(Body::from_stream(stream))
            .unwrap();
        let app = axum::Router::new()
            .route(
                "/",
                axum::routing::post(|req: Request| async move {
                    upload(req)
                        .await
                        .unwrap_or_else(|e| format!("refused: {e}"))
                }),
            )
            .layer(axum::extract::DefaultBodyLimit::disable());
        let resp = app.oneshot(req).await.unwrap();
        let text = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        String::from_utf8(text.to_vec()).unwrap()
    }

    /// The race of rwf2/multer#70: the parser's first poll finds nothing,
    /// its second brings the whole body and its end. Without the held-back
    /// end this fails with "incomplete multipart stream" every time.
    #[tokio::test]
    async fn a_body_that_arrives_whole_between_two_polls_is_parsed() {
        let body = b"--B\r\ncontent-disposition: form-data; name=\"f\"; filename=\"a\"\r\n\r\n\
                     hello\r\n--B--\r\n"
            .to_vec();
        let mut polls = 0;
        let mut body = Some(body);
        let stream = futures_util::stream::poll_fn(move |cx| {
            polls += 1;
            if polls == 1 {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            Poll::Ready(body.take().map(Ok::<_, std::io::Error>))
        });
        let req = Request::builder()
            .method("POST")
            .uri("/")
            .header("content-type", "multipart/form-data; boundary=B")
            .body(Body::from_stream(stream))
            .unwrap();
        assert_eq!(upload(req).await, Ok("5".to_string()));
    }

    #[tokio::test]
    async fn endless_part_headers_fail_past_the_bound() {
        let mut body = b"--B\r\ncontent-disposition: form-data; name=\"f\"\r\nx-pad: ".to_vec();
        body.resize(2 * MAX_BETWEEN_PARTS, b'a');
        let answer = serve(body).await;
        assert!(
            answer.starts_with("refused: ") && answer.contains("never end"),
            "{answer}"
        );
        // So is a preamble that never reaches the first boundary.
        let answer = serve(vec![b'-'; 2 * MAX_BETWEEN_PARTS]).await;
        assert!(answer.contains("never end"), "{answer}");
    }

    #[tokio::test]
    async fn part_data_is_not_counted() {
        let data = vec![b'x'; MAX_BETWEEN_PARTS + (1 << 20)];
        let mut body = Vec::new();
        for name in ["one", "two"] {
            body.extend(
                format!("--B\r\ncontent-disposition: form-data; name=\"{name}\"\r\n\r\n")
                    .as_bytes(),
            );
            body.extend(&data);
            body.extend(b"\r\n");
        }
        body.extend(b"--B--\r\n");
        assert_eq!(serve(body).await, (2 * data.len()).to_string());
    }
}
