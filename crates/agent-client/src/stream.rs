//! One stream's state, shared between the reactor (which fills it)
//! and the handle that consumes it ([`Process`](crate::Process),
//! [`FileReader`](crate::FileReader), a call).
//!
//! Lock order: the connection's writer, then its table, then a stream.
//! Nothing here writes to the socket while holding a stream's lock.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use brig_protocol::message::{self, Event, Input, CHANNEL_CONTROL, MAX_CHUNK};
use brig_protocol::{Frame, RecvWindow, ResetCode, SendWindow, StreamId};

use crate::connection::Shared;
use crate::ClientError;

/// What arrived on a stream, with Data split by channel.
#[derive(Debug)]
pub(crate) enum Item {
    Event(Event),
    Bytes { channel: u8, bytes: Vec<u8> },
}

/// Why the connection ended, kept so every stream can report it.
#[derive(Debug, Clone)]
pub(crate) enum Dead {
    /// EOF, a reset socket, or the client hung up.
    Closed,
    /// The agent broke the framing or the handshake rules, or reported a
    /// connection error on a NOTICE stream.
    Protocol(String),
}

impl Dead {
    pub(crate) fn error(&self) -> ClientError {
        match self {
            Dead::Closed => ClientError::Closed,
            Dead::Protocol(reason) => ClientError::protocol(reason.clone()),
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct State {
    /// Items not yet taken by the consumer, with the Data payload length
    /// each one was counted as in `recv`.
    queue: VecDeque<(Item, usize)>,
    recv: RecvWindow,
    send: SendWindow,
    /// The agent sent Close: nothing more will arrive.
    remote_closed: bool,
    /// The agent reset the stream.
    remote_reset: Option<ResetCode>,
    /// This side sent Close.
    local_closed: bool,
    /// This side reset the stream because the agent broke a stream rule.
    failure: Option<String>,
    /// The connection ended.
    dead: Option<Dead>,
    /// Each direction closes on its own (a `CONNECT` stream): the agent's
    /// Close ends what arrives, not what may be sent.
    half_close: bool,
    /// This side reset the stream ([`Stream::cancel`]).
    cancelled: bool,
    /// Async consumers waiting for a change (woken beside the condvar):
    /// a reader polling for items, writers polling for credit.
    wakers: Vec<Waker>,
}

#[derive(Debug)]
pub(crate) struct Stream {
    pub(crate) id: StreamId,
    state: Mutex<State>,
    /// Signalled on every change: new items, credit, close, reset, death.
    changed: Condvar,
}

impl Stream {
    pub(crate) fn new(id: StreamId) -> Stream {
        Stream {
            id,
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the state torn in a
        // way that matters more than the panic itself.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait<'a>(&self, guard: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.changed.wait(guard).unwrap_or_else(|e| e.into_inner())
    }

    /// Tell every waiter, blocked or polling, that the state changed.
    /// The guard is released first: a woken task may poll at once.
    fn notify(&self, mut guard: MutexGuard<'_, State>) {
        let wakers = std::mem::take(&mut guard.wakers);
        drop(guard);
        self.changed.notify_all();
        for w in wakers {
            w.wake();
        }
    }

    /// Have `cx`'s task woken at the next change (once per task).
    fn register(st: &mut State, cx: &Context<'_>) {
        if !st.wakers.iter().any(|w| w.will_wake(cx.waker())) {
            st.wakers.push(cx.waker().clone());
        }
    }

    // --- Called by the reactor. None of these block on a consumer.

    /// A Data payload arrived. Returns the Reset to send if the agent broke
    /// a stream rule.
    pub(crate) fn on_data(&self, payload: Vec<u8>) -> Option<ResetCode> {
        let mut st = self.lock();
        if st.failure.is_some() || st.remote_reset.is_some() {
            // Late frames of a stream this side already gave up on.
            return None;
        }
        let len = payload.len();
        let outcome = if st.remote_closed {
            Err((ResetCode::PROTOCOL, "data after close".to_string()))
        } else if let Err(e) = st.recv.receive(len) {
            Err((e.reset_code(), e.to_string()))
        } else {
            parse(&payload).map_err(|reason| (ResetCode::PROTOCOL, reason))
        };
        let reset = match outcome {
            Ok(item) => {
                st.queue.push_back((item, len));
                None
            }
            Err((code, reason)) => {
                st.failure = Some(format!("stream {}: {reason}", self.id));
                Some(code)
            }
        };
        self.notify(st);
        reset
    }

    pub(crate) fn on_credit(&self, increment: u32) -> Option<ResetCode> {
        let mut st = self.lock();
        let reset = match st.send.replenish(increment) {
            Ok(()) => None,
            Err(e) => {
                st.failure = Some(format!("stream {}: {e}", self.id));
                Some(e.reset_code())
            }
        };
        self.notify(st);
        reset
    }

    pub(crate) fn on_close(&self) {
        let mut st = self.lock();
        st.remote_closed = true;
        self.notify(st);
    }

    pub(crate) fn on_reset(&self, code: ResetCode) {
        let mut st = self.lock();
        st.remote_reset = Some(code);
        self.notify(st);
    }

    pub(crate) fn on_dead(&self, dead: &Dead) {
        let mut st = self.lock();
        st.dead.get_or_insert_with(|| dead.clone());
        self.notify(st);
    }

    // --- Called by the consumer.

    /// Why nothing more will arrive, if so: `Ok(())` for a clean Close.
    fn ended(&self, st: &State) -> Option<Result<(), ClientError>> {
        if st.cancelled {
            return Some(Err(ClientError::StreamClosed { stream: self.id.0 }));
        }
        if let Some(reason) = &st.failure {
            return Some(Err(ClientError::protocol(reason.clone())));
        }
        if let Some(code) = st.remote_reset {
            return Some(Err(ClientError::Reset {
                stream: self.id.0,
                code,
            }));
        }
        if st.remote_closed {
            return Some(Ok(()));
        }
        st.dead.as_ref().map(|d| Err(d.error()))
    }

    /// The next item, blocking until one arrives. `Ok(None)` once the agent
    /// has closed the stream and everything before the Close was taken.
    /// Taking an item is what returns credit to the agent.
    pub(crate) fn next(&self, shared: &Shared) -> Result<Option<Item>, ClientError> {
        let mut st = self.lock();
        loop {
            match self.take(st, shared) {
                Ok(taken) => return taken,
                Err(guard) => st = self.wait(guard),
            }
        }
    }

    /// [`Stream::next`] for an async consumer: `Pending` (with the task
    /// registered for a wake-up) where `next` would block.
    pub(crate) fn poll_next(
        &self,
        cx: &mut Context<'_>,
        shared: &Shared,
    ) -> Poll<Result<Option<Item>, ClientError>> {
        match self.take(self.lock(), shared) {
            Ok(taken) => Poll::Ready(taken),
            Err(mut st) => {
                Self::register(&mut st, cx);
                Poll::Pending
            }
        }
    }

    /// Take the next item or the stream's end; the guard back if there is
    /// neither yet.
    #[allow(clippy::type_complexity)]
    fn take<'a>(
        &self,
        mut st: MutexGuard<'a, State>,
        shared: &Shared,
    ) -> Result<Result<Option<Item>, ClientError>, MutexGuard<'a, State>> {
        if let Some((item, len)) = st.queue.pop_front() {
            // `len` was counted by `receive`, so releasing it cannot fail.
            let _ = st.recv.release(len);
            let credit = match self.ended(&st) {
                None => st.recv.take_credit(),
                Some(_) => None,
            };
            drop(st);
            if let Some(increment) = credit {
                // A failed write means the connection is going away;
                // the next call reports that.
                let _ = shared.send(&Frame::credit(self.id, increment));
            }
            return Ok(Ok(Some(item)));
        }
        match self.ended(&st) {
            Some(end) => Ok(end.map(|()| None)),
            None => Err(st),
        }
    }

    /// Wait for the first item without taking it: returns the agent's error
    /// if that is what came first (taking it), otherwise the pid of a
    /// `started` or `attached` event (left in the queue).
    /// Gives up after `within` with [`ClientError::NoAnswer`].
    pub(crate) fn first_event(&self, within: Duration) -> Result<Option<i32>, ClientError> {
        let deadline = std::time::Instant::now() + within;
        let mut st = self.lock();
        loop {
            if let Some(first) = self.first(&st) {
                return first;
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(ClientError::NoAnswer {
                    stream: self.id.0,
                    waited: within,
                });
            }
            st = self
                .changed
                .wait_timeout(st, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// [`Stream::first_event`] for an async caller.
    pub(crate) fn poll_first_event(
        &self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<i32>, ClientError>> {
        let mut st = self.lock();
        match self.first(&st) {
            Some(first) => Poll::Ready(first),
            None => {
                Self::register(&mut st, cx);
                Poll::Pending
            }
        }
    }

    fn first(&self, st: &State) -> Option<Result<Option<i32>, ClientError>> {
        match st.queue.front() {
            Some((Item::Event(Event::Error { code, message }), _)) => {
                return Some(Err(ClientError::Agent {
                    code: *code,
                    message: message.clone(),
                }))
            }
            Some((Item::Event(Event::Started { pid }), _))
            | Some((Item::Event(Event::Attached { pid, .. }), _)) => return Some(Ok(Some(*pid))),
            Some(_) => return Some(Ok(None)),
            None => {}
        }
        self.ended(st).map(|end| end.map(|()| None))
    }

    /// Why sending on this stream is pointless: the agent's own error if it
    /// queued one before closing, otherwise how the stream ended.
    fn send_refused(&self, st: &State) -> Option<ClientError> {
        if st.local_closed {
            return Some(ClientError::protocol(format!(
                "stream {}: this side already closed it",
                self.id
            )));
        }
        if st.half_close && !st.cancelled && st.failure.is_none() && st.remote_reset.is_none() {
            // The agent's Close ended only its direction.
            return st.dead.as_ref().map(Dead::error);
        }
        let end = self.ended(st)?;
        let agent_error = st.queue.iter().find_map(|(item, _)| match item {
            Item::Event(Event::Error { code, message }) => Some(ClientError::Agent {
                code: *code,
                message: message.clone(),
            }),
            _ => None,
        });
        Some(agent_error.unwrap_or(match end {
            Ok(()) => ClientError::StreamClosed { stream: self.id.0 },
            Err(e) => e,
        }))
    }

    /// Wait until `need` bytes of credit are available (or, if `partial`,
    /// at least `need` and up to `want`), claim them and return how many.
    fn claim(&self, need: usize, want: usize) -> Result<usize, ClientError> {
        let mut st = self.lock();
        loop {
            match self.try_claim(&mut st, need, want) {
                Some(claimed) => return claimed,
                None => st = self.wait(st),
            }
        }
    }

    fn try_claim(
        &self,
        st: &mut State,
        need: usize,
        want: usize,
    ) -> Option<Result<usize, ClientError>> {
        if let Some(e) = self.send_refused(st) {
            return Some(Err(e));
        }
        (st.send.available() as usize >= need).then(|| Ok(st.send.take(want)))
    }

    /// Send bulk bytes on `channel`, one frame per claim of credit, blocking
    /// while the send window is exhausted.
    pub(crate) fn send_bytes(
        &self,
        shared: &Shared,
        channel: u8,
        mut bytes: &[u8],
    ) -> Result<(), ClientError> {
        while !bytes.is_empty() {
            // Each payload is the channel byte plus at least one byte.
            let len = self.claim(2, bytes.len().min(MAX_CHUNK) + 1)?;
            let (chunk, rest) = bytes.split_at(len - 1);
            shared.send(&Frame::data(
                self.id,
                message::bytes_payload(channel, chunk),
            ))?;
            bytes = rest;
        }
        Ok(())
    }

    /// Send as much of `bytes` on `channel` as the credit allows now, as
    /// one frame, and say how much that was; `Pending` while there is no
    /// credit. The async counterpart of [`Stream::send_bytes`].
    pub(crate) fn poll_send_bytes(
        &self,
        cx: &mut Context<'_>,
        shared: &Shared,
        channel: u8,
        bytes: &[u8],
    ) -> Poll<Result<usize, ClientError>> {
        if bytes.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let claimed = {
            let mut st = self.lock();
            match self.try_claim(&mut st, 2, bytes.len().min(MAX_CHUNK) + 1) {
                Some(claimed) => claimed,
                None => {
                    Self::register(&mut st, cx);
                    return Poll::Pending;
                }
            }
        };
        let len = claimed? - 1;
        shared.send(&Frame::data(
            self.id,
            message::bytes_payload(channel, &bytes[..len]),
        ))?;
        Poll::Ready(Ok(len))
    }

    /// [`Stream::send_control`] for an async caller.
    pub(crate) fn poll_send_control(
        &self,
        cx: &mut Context<'_>,
        shared: &Shared,
        msg: &Input,
    ) -> Poll<Result<(), ClientError>> {
        let payload = message::control_payload(msg);
        {
            let mut st = self.lock();
            match self.try_claim(&mut st, payload.len(), payload.len()) {
                Some(claimed) => claimed?,
                None => {
                    Self::register(&mut st, cx);
                    return Poll::Pending;
                }
            };
        }
        Poll::Ready(shared.send(&Frame::data(self.id, payload)))
    }

    /// Send one control message; it cannot be split, so wait for credit
    /// for the whole of it.
    pub(crate) fn send_control(&self, shared: &Shared, msg: &Input) -> Result<(), ClientError> {
        let payload = message::control_payload(msg);
        debug_assert_eq!(payload[0], CHANNEL_CONTROL);
        self.claim(payload.len(), payload.len())?;
        shared.send(&Frame::data(self.id, payload))
    }

    /// Send Close (end of stdin, end of file) once.
    pub(crate) fn close(&self, shared: &Shared) -> Result<(), ClientError> {
        {
            let mut st = self.lock();
            if st.local_closed {
                return Ok(());
            }
            if let Some(dead) = &st.dead {
                return Err(dead.error());
            }
            st.local_closed = true;
        }
        shared.send(&Frame::close(self.id))
    }

    /// Let each direction close on its own (a `CONNECT` stream).
    pub(crate) fn set_half_close(&self) {
        self.lock().half_close = true;
    }

    /// Reset the stream from this side: the agent aborts the operation,
    /// and every blocked reader and writer here wakes with
    /// [`ClientError::StreamClosed`].
    pub(crate) fn cancel(&self, shared: &Shared) {
        let send = {
            let mut st = self.lock();
            let over = st.cancelled
                || st.dead.is_some()
                || st.remote_reset.is_some()
                || st.failure.is_some()
                || (st.remote_closed && st.local_closed);
            st.cancelled = true;
            self.notify(st);
            !over
        };
        if send {
            let _ = shared.send(&Frame::reset(self.id, ResetCode::CANCEL));
        }
    }

    /// What to tell the agent when the handle is dropped: nothing if the
    /// stream is over, Close if only this side is still open (the agent is
    /// done, e.g. the process exited), Reset(CANCEL) if the agent is still
    /// working (a foreground process is killed).
    pub(crate) fn farewell(&self) -> Option<Frame> {
        let st = self.lock();
        if st.dead.is_some() || st.remote_reset.is_some() || st.cancelled {
            return None;
        }
        if st.failure.is_some() {
            // on_data/on_credit already asked the reader to reset it.
            return None;
        }
        match (st.remote_closed, st.local_closed) {
            (true, true) => None,
            (true, false) => Some(Frame::close(self.id)),
            (false, _) => Some(Frame::reset(self.id, ResetCode::CANCEL)),
        }
    }
}

/// Split a Data payload and decode a control message.
fn parse(payload: &[u8]) -> Result<Item, String> {
    match message::DataMsg::parse(payload).map_err(|e| e.to_string())? {
        message::DataMsg::Control(json) => message::decode::<Event>("event", json)
            .map(Item::Event)
            .map_err(|e| e.to_string()),
        message::DataMsg::Bytes { channel, bytes } => Ok(Item::Bytes {
            channel,
            bytes: bytes.to_vec(),
        }),
    }
}

/// A stream this side opened, removed from the connection's table (and
/// closed or cancelled on the agent's side) when dropped.
#[derive(Debug)]
pub(crate) struct Handle {
    pub(crate) shared: Arc<Shared>,
    pub(crate) stream: Arc<Stream>,
}

impl Handle {
    pub(crate) fn id(&self) -> StreamId {
        self.stream.id
    }

    pub(crate) fn next(&self) -> Result<Option<Item>, ClientError> {
        self.stream.next(&self.shared)
    }

    pub(crate) fn poll_next(
        &self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Item>, ClientError>> {
        self.stream.poll_next(cx, &self.shared)
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.shared.forget(self.stream.id);
        if let Some(frame) = self.stream.farewell() {
            let _ = self.shared.send(&frame);
        }
    }
}
