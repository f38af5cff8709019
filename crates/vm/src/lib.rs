//! brig's vm tier: every sandbox is a virtual machine with its own Linux
//! kernel, run by QEMU: a program in it that breaks its kernel has broken
//! only the guest's.
//!
//! The principal types: [`VmTier`] (brig-core's [`brig_core::Tier`]:
//! launch, adopt, discard, running) and its guests' [`VmInstance`] (pause,
//! resume, usage, limits, kill, wait); [`kernel::GuestKernel`], the guest
//! kernel brig fetches from Debian's archive; [`initramfs::build`], the
//! archive the guest starts from, brig-agent its init; [`disk`], the
//! template's read-only image and the writable disk; [`qemu::args`], the
//! machine; [`qmp::Qmp`], QEMU's control socket; [`line::connect`], an
//! agent connection over the guest's virtio-serial port.
//!
//! On the host:
//!
//! ```text
//! $BRIG_HOME/vm/kernel/<version>/   vmlinuz, modules/*.ko, modules.order
//! $BRIG_HOME/vm/initramfs-<key>.cpio /init = brig-agent, the modules (<key>: the
//!                                   agent's and the kernel's)
//! $BRIG_HOME/vm/images/<key>.ext4   a template's read-only image
//! $BRIG_HOME/vm/disks/<id>.ext4     a sandbox's writable disk (--disk): on a
//!                                   disk, not in /run's tmpfs, whose pages
//!                                   would count as QEMU's memory
//! /run/brig/vm/<id>/state           "<owner>\n<pid> <start time> <uid>\n": the
//!                                   daemon (database) that launched it, QEMU,
//!                                   the uid QEMU runs as
//! /run/brig/vm/<id>/agent.sock      the agent's line (virtio-serial)
//! /run/brig/vm/<id>/qmp.sock        QEMU's control socket
//! /run/brig/vm/<id>/console.log     the guest's console; qemu.log (its stderr), qemu.pid
//! (the sandbox's netns)  tap0, br0  a networked guest's link (net.rs): gone
//!                                   with QEMU, the namespace's last user
//! /sys/fs/cgroup/.../brig-vm/<id>   QEMU's cgroups
//! <checkpoint>/memory               a memory snapshot (the runtime's
//!                                   $BRIG_HOME/checkpoints/<snap>/image/):
//!                                   the machine's state and RAM as QEMU
//!                                   migrates them; disk.ext4, the writable
//!                                   disk then (sparse); machine.json, its
//!                                   RAM, vCPUs and template image
//! ```
//!
//! A memory snapshot ([`brig_core::Instance::checkpoint`]) stops the
//! machine, migrates it to a file through a descriptor passed over QMP,
//! copies its disk and lets it run on; a restore
//! ([`brig_core::Tier::restore`]) starts QEMU waiting for that state
//! (`-incoming defer`), loads it, runs it, and gives the guest its own
//! identity over its line (`brig_protocol::serial`'s `Renew`: clock,
//! kernel entropy, host name, machine id). See `tier.rs`.
//!
//! A guest outlives the daemon: QEMU is detached, parented by nobody brig
//! runs, and a later daemon finds it by its directory
//! ([`brig_core::Tier::adopt`]: the recorded pid and start time agree)
//! and reconnects to its agent over the same line.
//!
//! Under TCG (hosts without hardware virtualization, these machines) a
//! guest boots in seconds; with KVM in a fraction of one.
//!
//! A sandbox on a network ([`brig_core::NetworkAttachment::Namespace`]):
//! its guest has a virtio NIC on a tap brig makes in the sandbox's
//! namespace, bridged to that namespace's `eth0`, and QEMU runs in that
//! namespace (`net.rs`); without one, no NIC, and QEMU an empty namespace.
//! What is not here yet: copy-on-write sharing of a snapshot's memory between the
//! sandboxes restored from it (QEMU 7.2 opens a file-backed RAM
//! read-write even when mapped private: each restore loads its own copy),
//! a terminal for `brig run --isolation vm` (`oneshot.rs`: a command on
//! the caller's stdio), live memory changes.

pub mod cgroup;
pub mod disk;
pub mod initramfs;
pub mod kernel;
pub mod line;
pub mod net;
mod oneshot;
pub mod qemu;
pub mod qmp;
pub mod tier;

pub use qemu::Accelerator;
pub use tier::{accelerator, find_qemu, VmConfig, VmInstance, VmTier};
