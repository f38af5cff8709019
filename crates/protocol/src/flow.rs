//! Per-stream flow control: credit windows in bytes.
//!
//! Each direction of each stream has its own window. The sender holds a
//! [`SendWindow`]: it may send only as many Data payload bytes as it holds
//! credit for, and a Credit frame from the receiver adds to it. The receiver
//! holds a [`RecvWindow`]: it checks every Data frame against the credit it
//! has granted and, as its application takes bytes out of the buffer, hands
//! back Credit in batches of at least half the window. A receiver therefore
//! never buffers more than its window per stream, however fast the sender.
//!
//! Both sides start every stream (in both directions) at [`INITIAL_WINDOW`]
//! without a frame being exchanged. Only Data payload bytes count; headers,
//! Open, Credit and the other control frames do not.

use crate::frame::{ResetCode, MAX_PAYLOAD};

/// Credit each side holds for each new stream before any Credit frame.
pub const INITIAL_WINDOW: u32 = 256 << 10;

/// Largest window either side will accept (1 GiB). No sensible receiver
/// buffers anywhere near this much per stream, so credit that would push a
/// send window past it is a peer bug, reported rather than wrapped.
pub const MAX_WINDOW: u32 = 1 << 30;

/// A broken flow-control rule. The first two are the peer's fault and
/// abort the stream with [`ResetCode::FLOW_CONTROL`]; the last two are bugs
/// on this side.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FlowError {
    #[error("peer sent {len} data bytes with only {available} bytes of credit")]
    WindowExceeded { len: usize, available: u32 },
    #[error("credit of {increment} bytes would raise the send window from {available} past the {MAX_WINDOW}-byte limit")]
    CreditOverflow { available: u32, increment: u32 },
    #[error("cannot send {len} data bytes with only {available} bytes of credit")]
    NoCredit { len: usize, available: u32 },
    #[error("released {len} bytes, but only {buffered} were received and not yet released")]
    ReleaseUnreceived { len: usize, buffered: u32 },
}

impl FlowError {
    /// The code to reset the stream with.
    pub fn reset_code(&self) -> ResetCode {
        match self {
            FlowError::WindowExceeded { .. } | FlowError::CreditOverflow { .. } => {
                ResetCode::FLOW_CONTROL
            }
            FlowError::NoCredit { .. } | FlowError::ReleaseUnreceived { .. } => ResetCode::INTERNAL,
        }
    }
}

/// How much Data this side may still send on one stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWindow {
    available: u32,
}

impl Default for SendWindow {
    fn default() -> Self {
        SendWindow {
            available: INITIAL_WINDOW,
        }
    }
}

impl SendWindow {
    /// A window for a new stream, holding [`INITIAL_WINDOW`] of credit.
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes that may be sent now.
    pub fn available(&self) -> u32 {
        self.available
    }

    /// Whether sending must wait for a Credit frame.
    pub fn is_blocked(&self) -> bool {
        self.available == 0
    }

    /// Claim credit for the next Data frame of a sender that has `want`
    /// bytes queued: returns how many it may put in that frame, at most one
    /// frame's worth. Zero means wait for Credit.
    pub fn take(&mut self, want: usize) -> usize {
        let len = want.min(self.available as usize).min(MAX_PAYLOAD);
        // len <= available, so it fits in u32 and cannot underflow.
        self.available -= len as u32;
        len
    }

    /// Account for a Data frame of `len` bytes about to be sent.
    pub fn consume(&mut self, len: usize) -> Result<(), FlowError> {
        match u32::try_from(len) {
            Ok(n) if n <= self.available => {
                self.available -= n;
                Ok(())
            }
            _ => Err(FlowError::NoCredit {
                len,
                available: self.available,
            }),
        }
    }

    /// Apply a Credit frame from the peer.
    pub fn replenish(&mut self, increment: u32) -> Result<(), FlowError> {
        match self.available.checked_add(increment) {
            Some(total) if total <= MAX_WINDOW => {
                self.available = total;
                Ok(())
            }
            _ => Err(FlowError::CreditOverflow {
                available: self.available,
                increment,
            }),
        }
    }
}

/// What the peer may still send on one stream, and when to tell it it may
/// send more.
///
/// Every byte of the window is in exactly one of three places, and the
/// three always add up to the window:
/// - credit the peer holds and has not used,
/// - bytes received and still buffered for the application,
/// - bytes the application has released that have not been re-granted.
///
/// Re-granting waits until at least half the window has been released, so
/// a stream costs one Credit frame per half window rather than one per
/// read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvWindow {
    window: u32,
    peer_credit: u32,
    buffered: u32,
    released: u32,
}

impl Default for RecvWindow {
    fn default() -> Self {
        Self::new(INITIAL_WINDOW)
    }
}

impl RecvWindow {
    /// A window for a new stream that lets the peer have up to `window`
    /// bytes in flight. The peer starts with [`INITIAL_WINDOW`] of credit
    /// whatever this side wants, so `window` is raised to at least that
    /// (and lowered to at most [`MAX_WINDOW`]); a larger window is granted
    /// through the first [`take_credit`](RecvWindow::take_credit).
    pub fn new(window: u32) -> Self {
        let window = window.clamp(INITIAL_WINDOW, MAX_WINDOW);
        RecvWindow {
            window,
            peer_credit: INITIAL_WINDOW,
            buffered: 0,
            released: window - INITIAL_WINDOW,
        }
    }

    /// The window size: the most this side will ever buffer for the stream.
    pub fn window(&self) -> u32 {
        self.window
    }

    /// Credit the peer holds: how much it may send before it must wait.
    pub fn peer_credit(&self) -> u32 {
        self.peer_credit
    }

    /// Bytes received and not yet released by the application.
    pub fn buffered(&self) -> u32 {
        self.buffered
    }

    /// Account for a Data frame of `len` bytes from the peer. A peer that
    /// sends past its credit is refused and nothing is counted.
    pub fn receive(&mut self, len: usize) -> Result<(), FlowError> {
        match u32::try_from(len) {
            Ok(n) if n <= self.peer_credit => {
                self.peer_credit -= n;
                self.buffered += n;
                Ok(())
            }
            _ => Err(FlowError::WindowExceeded {
                len,
                available: self.peer_credit,
            }),
        }
    }

    /// The application took `len` bytes out of the stream's buffer.
    pub fn release(&mut self, len: usize) -> Result<(), FlowError> {
        match u32::try_from(len) {
            Ok(n) if n <= self.buffered => {
                self.buffered -= n;
                self.released += n;
                Ok(())
            }
            _ => Err(FlowError::ReleaseUnreceived {
                len,
                buffered: self.buffered,
            }),
        }
    }

    /// The increment for a Credit frame, if enough has been released to be
    /// worth one. The increment counts as granted once returned, so the
    /// caller must send it.
    pub fn take_credit(&mut self) -> Option<u32> {
        if self.released == 0 || self.released < self.window / 2 {
            return None;
        }
        let increment = self.released;
        self.released = 0;
        self.peer_credit += increment;
        Some(increment)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_invariant(w: &RecvWindow) {
        assert_eq!(
            u64::from(w.peer_credit) + u64::from(w.buffered) + u64::from(w.released),
            u64::from(w.window)
        );
    }

    #[test]
    fn send_window_spends_and_replenishes() {
        let mut w = SendWindow::new();
        assert_eq!(w.available(), INITIAL_WINDOW);
        w.consume(1000).unwrap();
        assert_eq!(w.available(), INITIAL_WINDOW - 1000);
        w.consume((INITIAL_WINDOW - 1000) as usize).unwrap();
        assert!(w.is_blocked());
        assert_eq!(w.take(10), 0);
        assert_eq!(
            w.consume(1),
            Err(FlowError::NoCredit {
                len: 1,
                available: 0
            })
        );
        w.replenish(0).unwrap();
        assert!(w.is_blocked());
        w.replenish(10).unwrap();
        assert_eq!(
            w.consume(usize::MAX),
            Err(FlowError::NoCredit {
                len: usize::MAX,
                available: 10
            })
        );
        assert_eq!(w.available(), 10, "a refused send spends nothing");
    }

    #[test]
    fn take_is_bounded_by_credit_and_frame_size() {
        let mut w = SendWindow::new();
        w.replenish(MAX_WINDOW - INITIAL_WINDOW).unwrap();
        assert_eq!(w.take(usize::MAX), MAX_PAYLOAD);
        assert_eq!(w.take(5), 5);
        assert_eq!(
            w.available() as usize,
            MAX_WINDOW as usize - MAX_PAYLOAD - 5
        );

        let mut w = SendWindow::new();
        assert_eq!(w.take(usize::MAX), INITIAL_WINDOW as usize);
        assert!(w.is_blocked());
    }

    #[test]
    fn credit_past_the_limit_is_refused_without_wrapping() {
        let mut w = SendWindow::new();
        let err = w.replenish(u32::MAX).unwrap_err();
        assert_eq!(
            err,
            FlowError::CreditOverflow {
                available: INITIAL_WINDOW,
                increment: u32::MAX
            }
        );
        assert_eq!(err.reset_code(), ResetCode::FLOW_CONTROL);
        assert_eq!(w.available(), INITIAL_WINDOW);

        w.replenish(MAX_WINDOW - INITIAL_WINDOW).unwrap();
        assert_eq!(w.available(), MAX_WINDOW);
        assert!(w.replenish(1).is_err());
    }

    #[test]
    fn peer_exceeding_its_window_is_refused() {
        let mut w = RecvWindow::default();
        w.receive(INITIAL_WINDOW as usize - 1).unwrap();
        w.receive(1).unwrap();
        assert_eq!(w.peer_credit(), 0);
        let err = w.receive(1).unwrap_err();
        assert_eq!(
            err,
            FlowError::WindowExceeded {
                len: 1,
                available: 0
            }
        );
        assert_eq!(err.reset_code(), ResetCode::FLOW_CONTROL);
        assert_eq!(w.buffered(), INITIAL_WINDOW, "refused data is not counted");
        assert_invariant(&w);

        let mut w = RecvWindow::default();
        assert!(w.receive(usize::MAX).is_err());
        assert!(w.receive(INITIAL_WINDOW as usize + 1).is_err());
        w.receive(0).unwrap();
        assert_invariant(&w);
    }

    #[test]
    fn credit_is_granted_after_half_the_window_is_released() {
        let half = INITIAL_WINDOW / 2;
        let mut w = RecvWindow::default();
        assert_eq!(w.take_credit(), None, "nothing to grant on a fresh stream");
        w.receive(INITIAL_WINDOW as usize).unwrap();
        w.release(half as usize - 1).unwrap();
        assert_eq!(w.take_credit(), None);
        w.release(1).unwrap();
        assert_eq!(w.take_credit(), Some(half));
        assert_eq!(w.take_credit(), None, "a grant is handed out once");
        assert_eq!(w.peer_credit(), half);
        assert_invariant(&w);
    }

    #[test]
    fn releasing_more_than_received_is_a_local_bug() {
        let mut w = RecvWindow::default();
        w.receive(10).unwrap();
        let err = w.release(11).unwrap_err();
        assert_eq!(
            err,
            FlowError::ReleaseUnreceived {
                len: 11,
                buffered: 10
            }
        );
        assert_eq!(err.reset_code(), ResetCode::INTERNAL);
        assert_invariant(&w);
    }

    #[test]
    fn window_is_clamped_and_extra_is_granted_up_front() {
        assert_eq!(RecvWindow::new(1).window(), INITIAL_WINDOW);
        assert_eq!(RecvWindow::new(u32::MAX).window(), MAX_WINDOW);

        let mut big = RecvWindow::new(4 * INITIAL_WINDOW);
        assert_invariant(&big);
        assert_eq!(big.take_credit(), Some(3 * INITIAL_WINDOW));
        assert_eq!(big.peer_credit(), 4 * INITIAL_WINDOW);

        let mut w = RecvWindow::new(MAX_WINDOW);
        let mut send = SendWindow::new();
        send.replenish(w.take_credit().unwrap()).unwrap();
        assert_eq!(send.available(), MAX_WINDOW);
    }

    /// A sender and a receiver joined by a lossless in-order channel, with
    /// a slow, irregular reader: everything arrives, the receiver never
    /// buffers past its window, and nobody stalls for good.
    #[test]
    fn transfer_completes_within_the_window() {
        for window in [INITIAL_WINDOW, INITIAL_WINDOW + 12_345, 3 * INITIAL_WINDOW] {
            let total = 10 * window as usize + 777;
            let mut send = SendWindow::new();
            let mut recv = RecvWindow::new(window);
            if let Some(c) = recv.take_credit() {
                send.replenish(c).unwrap();
            }
            let (mut sent, mut delivered, mut step) = (0usize, 0usize, 0usize);
            while delivered < total {
                step += 1;
                assert!(
                    step < 100_000,
                    "transfer stalled at {delivered} of {total} bytes"
                );
                let n = send.take((total - sent).min(50_000));
                sent += n;
                recv.receive(n).unwrap();
                assert!(recv.buffered() <= recv.window());

                let read = (recv.buffered() as usize).min(1 + step * 7919 % 40_000);
                recv.release(read).unwrap();
                delivered += read;
                if let Some(c) = recv.take_credit() {
                    send.replenish(c).unwrap();
                }
                assert_invariant(&recv);
            }
            assert_eq!(sent, total);
        }
    }
}
