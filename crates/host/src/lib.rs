//! brig-host: what this host offers brig. It reads the host (a probe may
//! fork a short-lived child or run a helper's `--version`); it starts no
//! sandbox, and no sandbox crate is below it.
//!
//! Where to start reading:
//! - [`probe::probe`] makes the [`probe::HostReport`] behind `brig doctor`
//!   and `GET /v1/info`: one [`probe::Feature`] per kernel feature, cgroup
//!   controller, density limit and helper program (each with a `fix` when
//!   it is not ok), and the [`probe::Tiers`] they add up to.
//!   [`probe::check_process_tier`] is the quick subset `brig run` checks
//!   when a sandbox could not be set up.
//! - [`cgroup`] is the one cgroup detector: [`cgroup::CgroupLayout`] (where
//!   the v1 hierarchies and the cgroup2 mount are, from
//!   `/proc/self/mountinfo`) and the [`cgroup::Hierarchy`] brig makes its
//!   groups in. The doctor judges the layout; brig-jail creates groups in
//!   the hierarchy, so the two always agree about a host.
//!
//! Reading the host is kept apart from judging what was read, so the
//! judging is unit-tested with sample text from v1, v2 and hybrid hosts,
//! without root.

pub mod cgroup;
pub mod probe;

pub use cgroup::Hierarchy;
pub use probe::{probe, HostReport};
