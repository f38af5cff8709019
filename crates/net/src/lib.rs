//! brig-net: a sandbox's network, and the policy it is held to.
//!
//! Start with [`Gateway`] (`gateway.rs`): one network namespace per daemon
//! that every sandbox's link leads to. [`Gateway::attach`] makes a
//! sandbox's namespace, linked to it, under a [`Policy`] (`policy.rs`:
//! `none`, `public` or `allow`, with allow and deny rules). Everything a
//! sandbox sends reaches the gateway and nothing else; the BPF program of
//! `sys.rs` hands its TCP connections to the egress proxy (`proxy.rs`),
//! its DNS questions to the resolver (`dns.rs`; over TCP too, through the
//! proxy) and its other UDP to the relay (`udp.rs`), which decide by the
//! policy, with the TLS SNI or HTTP Host read by `peek.rs` when a domain
//! rule needs it.
//!
//! What a sandbox can never reach, whatever its rules: the host itself,
//! private and link-local ranges, cloud metadata addresses, other
//! sandboxes.

pub mod dns;
pub mod gateway;
pub mod inject;
pub mod netlink;
pub mod peek;
pub mod policy;
pub mod proxy;
pub mod publish;
pub mod relay;
pub mod sys;
pub mod tls;
pub mod udp;

pub use gateway::{Attachment, Gateway, GatewayConfig, NetError, Pin, SandboxNet, GATEWAY_ADDR};
pub use policy::{Mode, Policy, Rule, Target};
