//! The sandbox's log: what its background processes printed, kept for
//! `LOGS` readers (`brig logs`).
//!
//! One bounded buffer for the whole sandbox ([`LOG_KEEP`] bytes with their
//! bookkeeping, the oldest dropped first) rather than one per process: memory stays bounded however
//! many processes run, and output of several processes reads interleaved
//! as it arrived, as `docker logs` shows a container's. Each byte ever
//! logged has an offset; a reader is a cursor over those offsets, so
//! reading copies nothing into a per-reader queue and takes nothing away
//! (a second `brig logs` sees the same output, unlike `ATTACH`, which
//! drains its process's ring). A reader slower than the output loses what
//! fell out of the buffer before it got there and is told how much.

use std::collections::{BTreeMap, VecDeque};

use brig_protocol::message::{LogsRequest, LOG_KEEP};

/// What a chunk costs beyond its bytes (its header and allocation),
/// counted against [`LOG_KEEP`] so that output in tiny pieces (a spinner
/// printing a dot a second for days) cannot make the log's memory grow
/// past its bound in headers. The agent runs in the sandbox's memory
/// cgroup: an unbounded log would be the sandbox's own OOM.
const CHUNK_OVERHEAD: usize = 64;
/// Consecutive output of the same process and channel is appended to the
/// last chunk while it is smaller than this.
const COALESCE: usize = 16 << 10;

#[derive(Debug)]
struct Chunk {
    /// Offset of the chunk's first byte.
    start: u64,
    pid: i32,
    channel: u8,
    bytes: Vec<u8>,
}

impl Chunk {
    fn end(&self) -> u64 {
        self.start + self.bytes.len() as u64
    }
}

#[derive(Debug)]
struct Reader {
    pid: Option<i32>,
    /// Offset of the next byte to send.
    at: u64,
    /// Stop here (the end of the log when the reader came) unless it
    /// follows.
    until: Option<u64>,
}

impl Reader {
    fn wants(&self, chunk: &Chunk) -> bool {
        self.pid.is_none_or(|p| p == chunk.pid)
    }
}

/// What a reader gets next.
#[derive(Debug, PartialEq, Eq)]
pub enum Pulled {
    Bytes(u8, Vec<u8>),
    /// These many bytes fell out of the buffer before the reader got there.
    Skipped(u64),
    /// A reader that does not follow has everything it came for.
    Done,
    Nothing,
}

#[derive(Debug, Default)]
pub struct Logs {
    chunks: VecDeque<Chunk>,
    kept: usize,
    /// Offset just past the newest byte.
    end: u64,
    readers: BTreeMap<u32, Reader>,
}

impl Logs {
    /// Add output of process `pid`, dropping the oldest beyond [`LOG_KEEP`].
    pub fn append(&mut self, pid: i32, channel: u8, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        match self.chunks.back_mut() {
            Some(last)
                if last.pid == pid && last.channel == channel && last.bytes.len() < COALESCE =>
            {
                last.bytes.extend_from_slice(bytes);
            }
            _ => {
                self.chunks.push_back(Chunk {
                    start: self.end,
                    pid,
                    channel,
                    bytes: bytes.to_vec(),
                });
                self.kept += CHUNK_OVERHEAD;
            }
        }
        self.kept += bytes.len();
        self.end += bytes.len() as u64;
        while self.kept > LOG_KEEP {
            let excess = self.kept - LOG_KEEP;
            let Some(old) = self.chunks.front_mut() else {
                break;
            };
            if old.bytes.len() > excess {
                // Trim the oldest chunk rather than drop it whole.
                old.bytes.drain(..excess);
                old.start += excess as u64;
                self.kept -= excess;
            } else {
                self.kept -= old.bytes.len() + CHUNK_OVERHEAD;
                self.chunks.pop_front();
            }
        }
    }

    /// Offset of the oldest byte kept.
    fn start(&self) -> u64 {
        self.chunks.front().map_or(self.end, |c| c.start)
    }

    /// A new reader on stream `id`. Returns how many bytes had already
    /// been dropped from the log.
    pub fn open(&mut self, id: u32, req: &LogsRequest) -> u64 {
        let mut reader = Reader {
            pid: req.pid,
            at: self.start(),
            until: (!req.follow).then_some(self.end),
        };
        if let Some(lines) = req.tail {
            reader.at = self.tail_start(&reader, lines);
        }
        self.readers.insert(id, reader);
        self.start()
    }

    /// Where the last `lines` lines of what `reader` wants begin. A final
    /// newline ends the last line rather than starting another.
    fn tail_start(&self, reader: &Reader, lines: u32) -> u64 {
        if lines == 0 {
            return self.end;
        }
        let mut newlines = 0;
        let mut last = true;
        for chunk in self.chunks.iter().rev().filter(|c| reader.wants(c)) {
            for (i, b) in chunk.bytes.iter().enumerate().rev() {
                if *b == b'\n' && !last {
                    newlines += 1;
                    if newlines == lines {
                        return chunk.start + i as u64 + 1;
                    }
                }
                last = false;
            }
        }
        self.start()
    }

    pub fn close(&mut self, id: u32) {
        self.readers.remove(&id);
    }

    /// The next piece for the reader on stream `id`, at most `room` bytes.
    pub fn pull(&mut self, id: u32, room: usize) -> Pulled {
        let start = self.start();
        let Some(reader) = self.readers.get_mut(&id) else {
            return Pulled::Done;
        };
        if reader.at < start {
            let lost = start - reader.at;
            reader.at = start;
            return Pulled::Skipped(lost);
        }
        let first = self.chunks.partition_point(|c| c.end() <= reader.at);
        for chunk in self.chunks.range(first..) {
            if reader.until.is_some_and(|u| chunk.start >= u) {
                break;
            }
            if !reader.wants(chunk) {
                reader.at = chunk.end();
                continue;
            }
            if room == 0 {
                return Pulled::Nothing;
            }
            let from = (reader.at - chunk.start) as usize;
            let take = (chunk.bytes.len() - from).min(room);
            reader.at += take as u64;
            return Pulled::Bytes(chunk.channel, chunk.bytes[from..from + take].to_vec());
        }
        match reader.until {
            Some(_) => Pulled::Done,
            None => {
                reader.at = self.end;
                Pulled::Nothing
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(pid: Option<i32>, follow: bool, tail: Option<u32>) -> LogsRequest {
        LogsRequest { pid, follow, tail }
    }

    fn drain(logs: &mut Logs, id: u32, room: usize) -> (Vec<u8>, Pulled) {
        let mut got = Vec::new();
        loop {
            match logs.pull(id, room) {
                Pulled::Bytes(_, b) => got.extend(b),
                end => return (got, end),
            }
        }
    }

    #[test]
    fn a_reader_gets_what_was_there_and_the_log_keeps_it() {
        let mut logs = Logs::default();
        logs.append(10, 1, b"a1\n");
        logs.append(11, 2, b"b1\n");
        assert_eq!(logs.open(1, &req(None, false, None)), 0);
        logs.append(10, 1, b"later\n");
        assert_eq!(drain(&mut logs, 1, 2), (b"a1\nb1\n".to_vec(), Pulled::Done));
        // A second reader sees it all again.
        logs.open(3, &req(None, false, None));
        assert_eq!(drain(&mut logs, 3, 100).0, b"a1\nb1\nlater\n");
    }

    #[test]
    fn a_follower_waits_for_more_and_a_pid_filter_skips_others() {
        let mut logs = Logs::default();
        logs.append(10, 1, b"a");
        logs.open(1, &req(Some(11), true, None));
        assert_eq!(logs.pull(1, 100), Pulled::Nothing);
        logs.append(11, 2, b"b");
        logs.append(10, 1, b"c");
        assert_eq!(logs.pull(1, 100), Pulled::Bytes(2, b"b".to_vec()));
        assert_eq!(logs.pull(1, 100), Pulled::Nothing);
        logs.append(11, 1, b"d");
        assert_eq!(logs.pull(1, 100), Pulled::Bytes(1, b"d".to_vec()));
    }

    #[test]
    fn output_in_tiny_pieces_is_coalesced_and_its_bookkeeping_bounded() {
        let mut logs = Logs::default();
        // A million one-byte writes of one process: a few chunks.
        for _ in 0..1_000_000 {
            logs.append(10, 1, b".");
        }
        assert!(
            logs.chunks.len() <= LOG_KEEP / COALESCE + 2,
            "{}",
            logs.chunks.len()
        );
        // Two processes taking turns byte by byte cannot be coalesced: the
        // bookkeeping counts, so fewer bytes are kept and memory stays at
        // the bound.
        for i in 0..1_000_000 {
            logs.append(10 + (i % 2), 1, b".");
        }
        assert!(logs.kept <= LOG_KEEP);
        assert!(
            logs.chunks.len() * CHUNK_OVERHEAD <= LOG_KEEP,
            "{}",
            logs.chunks.len()
        );
    }

    #[test]
    fn tail_counts_lines_from_the_end() {
        let mut logs = Logs::default();
        logs.append(10, 1, b"one\ntw");
        logs.append(10, 1, b"o\nthree\n");
        for (n, want) in [
            (0, &b""[..]),
            (1, b"three\n"),
            (2, b"two\nthree\n"),
            (3, b"one\ntwo\nthree\n"),
            (9, b"one\ntwo\nthree\n"),
        ] {
            logs.open(n + 1, &req(None, false, Some(n)));
            assert_eq!(drain(&mut logs, n + 1, 100).0, want, "tail {n}");
        }
        logs.append(10, 1, b"unfinished");
        logs.open(50, &req(None, false, Some(1)));
        assert_eq!(drain(&mut logs, 50, 100).0, b"unfinished");
    }

    #[test]
    fn the_log_is_bounded_and_a_slow_reader_is_told_what_it_lost() {
        let mut logs = Logs::default();
        logs.open(1, &req(None, true, None));
        let block = vec![b'x'; 64 << 10];
        let blocks = LOG_KEEP / block.len() + 4;
        for _ in 0..blocks {
            logs.append(10, 1, &block);
        }
        assert_eq!(logs.kept, LOG_KEEP);
        let Pulled::Skipped(lost) = logs.pull(1, 100) else {
            panic!("the reader was not told of the loss")
        };
        let (got, end) = drain(&mut logs, 1, 1 << 20);
        assert_eq!(end, Pulled::Nothing);
        // Nothing lost unsaid, and the bytes kept are the bound less the
        // chunks' bookkeeping.
        assert_eq!(lost as usize + got.len(), blocks * block.len());
        assert_eq!(got.len() + logs.chunks.len() * CHUNK_OVERHEAD, LOG_KEEP);
        // A new reader is told what had gone before it came.
        assert_eq!(logs.open(2, &req(None, false, None)), lost);
    }
}
