//! A guest's network: a tap device in the sandbox's network namespace,
//! bridged to the namespace's `eth0`, so that the guest itself is the
//! sandbox on the network (brig-net's gateway, `crates/net/src/gateway.rs`,
//! and the policy it enforces see no difference from any other tier).
//!
//! ```text
//!  guest                      the sandbox's netns (host user namespace)        gateway netns
//!  eth0 10.88.x.y/32  virtio   tap0 ─┐
//!  default via 10.87.0.1  ───→        br0 (NOARP, no address) ─ eth0 ──veth──→  b-<id> 10.87.0.1
//!                                   (eth0 keeps 10.88.x.y: inert on a bridge port, it is how a
//!                                    later daemon reads the sandbox's address back)
//! ```
//!
//! brig makes the tap (it needs CAP_NET_ADMIN in the namespace, which QEMU
//! never has) from a thread that entered the namespace, and hands QEMU its
//! descriptor; QEMU, unprivileged and under its seccomp filter, only reads
//! and writes frames on it. QEMU itself runs *in* the namespace, so that
//! the namespace lives exactly as long as the guest (across daemon
//! restarts, as a process-tier sandbox's does) and a QEMU the guest broke
//! out into is held to the sandbox's policy too; with no network QEMU
//! gets an empty namespace of its own (`tier.rs`, `confine`).
//!
//! Why a bridge and not tc's mirred redirect (as Kata Containers' default
//! does): a redirect needs a classifier to match every frame (matchall or
//! u32), which are modules some kernels lack (this host's has no
//! matchall); the bridge is in every kernel brig's gateway runs on, and is
//! made with the rtnetlink calls brig-net has. br0 is NOARP so that the
//! namespace's own stack never answers for the guest's address.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use brig_net::netlink::Rtnl;
use netlink_packet_route::link::LinkFlags;

/// The guest's MAC, the same in every guest: each is alone on its link
/// (its namespace's bridge and the gateway's end of its veth), and a
/// restored copy keeps the one its device was saved with.
pub const GUEST_MAC: &str = "02:62:72:69:67:01";
const TAP: &str = "tap0";
const BRIDGE: &str = "br0";
const ETH0: &str = "eth0";

/// A guest's link, ready for QEMU.
#[derive(Debug)]
pub struct Nic {
    /// The tap's queue: QEMU's `-netdev tap,fd=`.
    pub tap: OwnedFd,
    /// The sandbox's address, the guest's.
    pub addr: Ipv4Addr,
}

/// Make the guest's link in `netns` (a namespace brig-net made: `eth0`
/// at the sandbox's address, routed to the gateway).
pub fn plug(netns: &OwnedFd) -> io::Result<Nic> {
    brig_net::sys::in_netns(netns, || {
        let addr = brig_net::gateway::address_here().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                "the network namespace has no sandbox address on eth0",
            )
        })?;
        let what =
            |op: &'static str| move |e: io::Error| io::Error::new(e.kind(), format!("{op}: {e}"));
        let tap = open_tap(TAP).map_err(what("create the tap device (/dev/net/tun)"))?;
        let mut rtnl = Rtnl::open()?;
        rtnl.add_bridge(BRIDGE).map_err(what("create the bridge"))?;
        let (bridge, eth0, tap_index) = (
            rtnl.index(BRIDGE)?,
            rtnl.index(ETH0).map_err(what("find eth0"))?,
            rtnl.index(TAP)?,
        );
        rtnl.set_controller(eth0, bridge)
            .and_then(|()| rtnl.set_controller(tap_index, bridge))
            .map_err(what("bridge eth0 and the tap"))?;
        rtnl.up(tap_index)
            .and_then(|()| rtnl.up_with(bridge, LinkFlags::Noarp))
            .map_err(what("set the guest's links up"))?;
        Ok(Nic { tap, addr })
    })
}

/// A link that leads nowhere, for a machine saved with a network device
/// and restored with no network (its devices must be the saved ones, the
/// tap's virtio-net header included): a new, empty network namespace and
/// a tap in it, down. QEMU runs in that namespace.
pub fn unplugged() -> io::Result<(OwnedFd, OwnedFd)> {
    std::thread::Builder::new()
        .name("brig-vm-unplugged".into())
        .spawn(|| {
            // SAFETY: unshare on this short-lived thread only.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok((brig_net::sys::current()?, open_tap(TAP)?))
        })?
        .join()
        .map_err(|_| io::Error::other("the thread making an empty namespace panicked"))?
}

/// A new tap device `name` in the calling thread's namespace, with the
/// virtio-net header QEMU offloads through; gone with its last descriptor
/// (not persistent).
fn open_tap(name: &str) -> io::Result<OwnedFd> {
    // SAFETY: open of a NUL-terminated path; the result is checked.
    let fd = unsafe { libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor open just returned, owned here alone.
    let tun = unsafe { OwnedFd::from_raw_fd(fd) };
    /// `struct ifreq`: the name, then the flags (a short) in its union.
    #[repr(C)]
    struct IfReq {
        name: [u8; libc::IFNAMSIZ],
        flags: libc::c_short,
        _rest: [u8; 22],
    }
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        flags: (libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as libc::c_short,
        _rest: [0; 22],
    };
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: TUNSETIFF with a struct ifreq that outlives the call.
    if unsafe { libc::ioctl(tun.as_raw_fd(), libc::TUNSETIFF, &mut req as *mut IfReq) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(tun)
}
