//! brig-protocol: the framed, versioned byte protocol between the host and
//! the agent inside a sandbox. See [`frame`].
#![forbid(unsafe_code)]

pub mod frame;
