//! [`Reply`]: the typed answer to a one-shot [`Call`](crate::Call).

use brig_protocol::message::{Entry, Event, ProcessInfo};

use crate::stream::{Handle, Item};
use crate::ClientError;

/// What a call returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `mkdir`, `rename`, `remove`, `signal` succeeded.
    Done,
    /// `list`: every entry, across however many `entries` messages the
    /// agent split them into.
    Entries(Vec<Entry>),
    /// `stat`.
    Stat(Entry),
    /// `list_processes`.
    Processes(Vec<ProcessInfo>),
}

/// Read a call's stream to its end and assemble the reply.
pub(crate) fn collect(handle: &Handle) -> Result<Reply, ClientError> {
    let mut entries: Option<Vec<Entry>> = None;
    let mut reply = None;
    while let Some(item) = handle.next()? {
        let event = match item {
            Item::Event(e) => e,
            Item::Bytes { .. } => {
                return Err(ClientError::protocol(format!(
                    "stream {}: bytes in reply to a call",
                    handle.id()
                )))
            }
        };
        match event {
            Event::Error { code, message } => return Err(ClientError::Agent { code, message }),
            Event::Entries { entries: more } => entries.get_or_insert_with(Vec::new).extend(more),
            Event::Done => {
                reply = Some(match entries.take() {
                    Some(all) => Reply::Entries(all),
                    None => Reply::Done,
                })
            }
            Event::Stat { entry } => reply = Some(Reply::Stat(*entry)),
            Event::Processes { processes } => reply = Some(Reply::Processes(processes)),
            other => {
                return Err(ClientError::protocol(format!(
                    "stream {}: unexpected {other:?} in reply to a call",
                    handle.id()
                )))
            }
        }
    }
    reply.ok_or_else(|| {
        ClientError::protocol(format!(
            "stream {}: closed without a reply to the call",
            handle.id()
        ))
    })
}
