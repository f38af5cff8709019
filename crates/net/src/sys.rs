//! The privileged system calls of the gateway, in one place: entering a
//! network namespace, the socket options that let one socket answer for
//! every address, reading and writing datagrams with their original
//! destination, the UDP relay's per-flow sockets bound to an address that
//! is not the gateway's, and the BPF socket-lookup program that steers
//! every connection and datagram a sandbox sends to the gateway's few
//! sockets.
//!
//! # Why a BPF socket-lookup program (and not nftables)
//!
//! The gateway must receive connections to *any* address and port from a
//! sandbox, learn where each was going, and decide. The usual tools are a
//! netfilter REDIRECT or TPROXY rule, which need nftables or iptables —
//! neither is installed on a minimal Debian — or a userspace TCP stack,
//! which costs throughput. Since Linux 5.9 a `BPF_PROG_TYPE_SK_LOOKUP`
//! program attached to a network namespace may pick the socket that
//! receives a packet the kernel delivers locally. With every address
//! routed as local in the gateway namespace (see `gateway.rs`), the
//! program below hands every TCP connection to the proxy's listener,
//! every UDP datagram to port 53 to the resolver and every other UDP
//! datagram to the UDP relay; the accepted socket's local address is the
//! destination the sandbox asked for, and a datagram's comes with it
//! (`IP_ORIGDSTADDR`). The program is 24 instructions, written out here;
//! the kernel's verifier checks it at load. Its link lives as long as the
//! daemon's descriptor: when the daemon is gone nothing is steered
//! anywhere, so the sandboxes' egress fails closed until the next daemon
//! attaches its own.
//!
//! The kernel looks for a connected UDP socket (one bound to the
//! datagram's destination and connected to its source) *before* it runs
//! the program, so the relay's per-flow sockets ([`flow_socket`]) receive
//! the rest of their flow themselves; the program only ever sees a flow's
//! first datagrams.

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Slots of the socket map the program reads.
pub const SLOT_TCP: u32 = 0;
pub const SLOT_DNS: u32 = 1;
pub const SLOT_UDP: u32 = 2;

const BPF_MAP_CREATE: libc::c_int = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_int = 2;
const BPF_PROG_LOAD: libc::c_int = 5;
const BPF_LINK_CREATE: libc::c_int = 28;
const BPF_MAP_TYPE_SOCKMAP: u32 = 15;
const BPF_PROG_TYPE_SK_LOOKUP: u32 = 30;
const BPF_SK_LOOKUP: u32 = 36;

/// One eBPF instruction (`struct bpf_insn`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct Insn {
    code: u8,
    regs: u8,
    off: i16,
    imm: i32,
}

const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: dst | (src << 4),
        off,
        imm,
    }
}

// Opcodes used below.
const MOV64_REG: u8 = 0xbf;
const MOV64_IMM: u8 = 0xb7;
const ADD64_IMM: u8 = 0x07;
const LDX_W: u8 = 0x61;
const STX_W: u8 = 0x63;
const JEQ_IMM: u8 = 0x15;
const JNE_IMM: u8 = 0x55;
const LD_IMM64: u8 = 0x18;
const CALL: u8 = 0x85;
const EXIT: u8 = 0x95;
/// `src_reg` of a 64-bit immediate load that names a map by descriptor.
const PSEUDO_MAP_FD: u8 = 1;
// Helpers.
const MAP_LOOKUP_ELEM: i32 = 1;
const SK_RELEASE: i32 = 86;
const SK_ASSIGN: i32 = 124;
// `struct bpf_sk_lookup` field offsets.
const CTX_PROTOCOL: i16 = 12;
const CTX_LOCAL_PORT: i16 = 60;

/// The steering program: TCP → the socket in [`SLOT_TCP`], UDP to port
/// 53 → [`SLOT_DNS`], any other UDP → [`SLOT_UDP`], anything else → the
/// kernel's own lookup (no socket there: refused).
fn program(map: RawFd) -> Vec<Insn> {
    let mut p = vec![
        // 0: keep the context; the protocol decides the slot.
        insn(MOV64_REG, 6, 1, 0, 0),
        insn(LDX_W, 2, 6, CTX_PROTOCOL, 0),
        insn(MOV64_IMM, 7, 0, 0, SLOT_TCP as i32),
        insn(JEQ_IMM, 2, 0, 5, libc::IPPROTO_TCP), // → 9
        insn(JNE_IMM, 2, 0, 0, libc::IPPROTO_UDP), // → pass (patched)
        // 5: UDP goes to the relay, unless it is to port 53.
        insn(MOV64_IMM, 7, 0, 0, SLOT_UDP as i32),
        insn(LDX_W, 2, 6, CTX_LOCAL_PORT, 0),
        insn(JNE_IMM, 2, 0, 1, 53), // → 9
        insn(MOV64_IMM, 7, 0, 0, SLOT_DNS as i32),
        // 9: look the slot up: r0 = the socket (a reference) or null.
        insn(STX_W, 10, 7, -4, 0),
        insn(MOV64_REG, 2, 10, 0, 0),
        insn(ADD64_IMM, 2, 0, 0, -4),
        insn(LD_IMM64, 1, PSEUDO_MAP_FD, 0, map),
        insn(0, 0, 0, 0, 0),
        insn(CALL, 0, 0, 0, MAP_LOOKUP_ELEM),
        insn(JEQ_IMM, 0, 0, 0, 0), // null → pass (patched)
        // 16: assign it, then drop the reference the lookup took.
        insn(MOV64_REG, 7, 0, 0, 0),
        insn(MOV64_REG, 1, 6, 0, 0),
        insn(MOV64_REG, 2, 0, 0, 0),
        insn(MOV64_IMM, 3, 0, 0, 0),
        insn(CALL, 0, 0, 0, SK_ASSIGN),
        insn(MOV64_REG, 1, 7, 0, 0),
        insn(CALL, 0, 0, 0, SK_RELEASE),
        // pass: SK_PASS — the kernel delivers to what was assigned, or
        // looks up as usual.
        insn(MOV64_IMM, 0, 0, 0, 1),
        insn(EXIT, 0, 0, 0, 0),
    ];
    let pass = (p.len() - 2) as i16;
    for at in PATCHED {
        p[at].off = pass - at as i16 - 1;
    }
    p
}

/// The jumps of [`program`] that go to its last two instructions.
const PATCHED: [usize; 2] = [4, 15];

fn bpf(cmd: libc::c_int, attr: &mut [u8; 128]) -> io::Result<i64> {
    // SAFETY: `attr` is a zero-padded `union bpf_attr` of 128 bytes that
    // outlives the call; the kernel reads (and for some commands writes)
    // only within the size given.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len()) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn put(attr: &mut [u8; 128], at: usize, bytes: &[u8]) {
    attr[at..at + bytes.len()].copy_from_slice(bytes);
}

/// The steering attached to one network namespace. Dropping it detaches
/// the program.
#[derive(Debug)]
pub struct Steering {
    _map: OwnedFd,
    _prog: OwnedFd,
    _link: OwnedFd,
}

/// Load the program, fill its map with `tcp` (a listening TCP socket),
/// `dns` and `udp` (unconnected UDP sockets), and attach it to the network
/// namespace `netns`.
pub fn steer(netns: &OwnedFd, tcp: RawFd, dns: RawFd, udp: RawFd) -> io::Result<Steering> {
    let owned = |fd: i64| {
        // SAFETY: the kernel returned a fresh descriptor.
        unsafe { OwnedFd::from_raw_fd(fd as RawFd) }
    };
    let mut attr = [0u8; 128];
    put(&mut attr, 0, &BPF_MAP_TYPE_SOCKMAP.to_ne_bytes());
    put(&mut attr, 4, &4u32.to_ne_bytes()); // key: u32
    put(&mut attr, 8, &8u32.to_ne_bytes()); // value: u64 descriptor
    put(&mut attr, 12, &3u32.to_ne_bytes()); // entries
    let map = owned(bpf(BPF_MAP_CREATE, &mut attr).map_err(ctx("create the socket map"))?);
    for (slot, fd) in [(SLOT_TCP, tcp), (SLOT_DNS, dns), (SLOT_UDP, udp)] {
        let value = fd as u64;
        let mut attr = [0u8; 128];
        put(&mut attr, 0, &(map.as_raw_fd() as u32).to_ne_bytes());
        put(&mut attr, 8, &(&slot as *const u32 as u64).to_ne_bytes());
        put(&mut attr, 16, &(&value as *const u64 as u64).to_ne_bytes());
        bpf(BPF_MAP_UPDATE_ELEM, &mut attr).map_err(ctx("put a socket in the map"))?;
    }
    let code = program(map.as_raw_fd());
    let license = c"Dual BSD/GPL";
    let mut log = vec![0u8; 16 * 1024];
    let mut attr = [0u8; 128];
    put(&mut attr, 0, &BPF_PROG_TYPE_SK_LOOKUP.to_ne_bytes());
    put(&mut attr, 4, &(code.len() as u32).to_ne_bytes());
    put(&mut attr, 8, &(code.as_ptr() as u64).to_ne_bytes());
    put(&mut attr, 16, &(license.as_ptr() as u64).to_ne_bytes());
    put(&mut attr, 24, &1u32.to_ne_bytes()); // log level
    put(&mut attr, 28, &(log.len() as u32).to_ne_bytes());
    put(&mut attr, 32, &(log.as_mut_ptr() as u64).to_ne_bytes());
    put(&mut attr, 68, &BPF_SK_LOOKUP.to_ne_bytes()); // expected attach type
    let prog = match bpf(BPF_PROG_LOAD, &mut attr) {
        Ok(fd) => owned(fd),
        Err(e) => {
            let text = String::from_utf8_lossy(&log);
            let text = text.trim_end_matches('\0').trim();
            return Err(io::Error::new(
                e.kind(),
                format!("load the socket-lookup program: {e} (verifier: {text})"),
            ));
        }
    };
    let mut attr = [0u8; 128];
    put(&mut attr, 0, &(prog.as_raw_fd() as u32).to_ne_bytes());
    put(&mut attr, 4, &(netns.as_raw_fd() as u32).to_ne_bytes());
    put(&mut attr, 8, &BPF_SK_LOOKUP.to_ne_bytes());
    let link = owned(bpf(BPF_LINK_CREATE, &mut attr).map_err(ctx(
        "attach the socket-lookup program to the gateway namespace",
    ))?);
    Ok(Steering {
        _map: map,
        _prog: prog,
        _link: link,
    })
}

fn ctx(op: &'static str) -> impl Fn(io::Error) -> io::Error {
    move |e| io::Error::new(e.kind(), format!("{op}: {e}"))
}

/// Enter the network namespace `ns` on the calling thread.
pub fn enter(ns: &OwnedFd) -> io::Result<()> {
    // SAFETY: setns with a namespace descriptor we own.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The calling thread's network namespace.
pub fn current() -> io::Result<OwnedFd> {
    Ok(OwnedFd::from(std::fs::File::open(
        "/proc/thread-self/ns/net",
    )?))
}

/// Run `f` on a short-lived thread inside `ns`: sockets it makes belong to
/// `ns` for their whole life, whichever thread uses them later.
pub fn in_netns<T: Send + 'static>(
    ns: &OwnedFd,
    f: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    let ns = ns.try_clone()?;
    std::thread::Builder::new()
        .name("brig-net-enter".into())
        .spawn(move || {
            enter(&ns)?;
            f()
        })?
        .join()
        .map_err(|_| io::Error::other("a thread inside the gateway namespace panicked"))?
}

fn set_int(fd: RawFd, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: setsockopt with a pointer to a live int and its size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Let the socket accept connections for, and send from, addresses that
/// are not its own (the destinations the sandbox asked for).
pub fn set_transparent(fd: RawFd) -> io::Result<()> {
    set_int(fd, libc::SOL_IP, libc::IP_TRANSPARENT, 1)
}

/// Have `recvmsg` report each datagram's destination, address and port
/// (`IP_ORIGDSTADDR`: read from the datagram's headers, so it is where the
/// sandbox sent it, whichever socket the program chose).
pub fn set_recv_orig_dst(fd: RawFd) -> io::Result<()> {
    set_int(fd, libc::SOL_IP, libc::IP_RECVORIGDSTADDR, 1)
}

/// One datagram read with [`recv_with_dst`].
#[derive(Debug, Clone, Copy)]
pub struct Datagram {
    pub len: usize,
    pub from: SocketAddrV4,
    /// Where it was sent.
    pub to: SocketAddrV4,
    /// It was longer than the buffer, and cut: not to be passed on.
    pub truncated: bool,
}

/// `recvmsg` on a non-blocking UDP socket with [`set_recv_orig_dst`].
pub fn recv_with_dst(fd: RawFd, buf: &mut [u8]) -> io::Result<Datagram> {
    // SAFETY: all-zero is a valid sockaddr_in and msghdr.
    let mut from: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut control = [0u64; 16];
    // SAFETY: as above.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = (&mut from as *mut libc::sockaddr_in).cast();
    msg.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    // SAFETY: msg points at live buffers of the sizes it states.
    let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut to = None;
    // SAFETY: walking the control buffer the kernel filled, with the
    // kernel's own macros' equivalents.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_IP && (*c).cmsg_type == libc::IP_ORIGDSTADDR {
                let sin: libc::sockaddr_in = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                to = Some(from_sockaddr(&sin));
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok(Datagram {
        len: n as usize,
        from: from_sockaddr(&from),
        to: to.ok_or_else(|| io::Error::other("a datagram came without its destination"))?,
        truncated: msg.msg_flags & libc::MSG_TRUNC != 0,
    })
}

fn from_sockaddr(sin: &libc::sockaddr_in) -> SocketAddrV4 {
    SocketAddrV4::new(
        Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
        u16::from_be(sin.sin_port),
    )
}

fn to_sockaddr(a: SocketAddrV4) -> libc::sockaddr_in {
    // SAFETY: all-zero is a valid sockaddr_in.
    let mut sin: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    sin.sin_family = libc::AF_INET as libc::sa_family_t;
    sin.sin_port = a.port().to_be();
    sin.sin_addr.s_addr = u32::from(*a.ip()).to_be();
    sin
}

/// A non-blocking UDP socket bound to `local` — an address that is not
/// this namespace's own (transparent) and that other flows' sockets may
/// share (`SO_REUSEADDR`) — and connected to `peer`: in the gateway, a
/// relayed flow's end, which receives what `peer` sends to `local` before
/// the steering program is asked, and answers from `local`.
pub fn flow_socket(local: SocketAddrV4, peer: SocketAddrV4) -> io::Result<std::net::UdpSocket> {
    // SAFETY: socket(2) with constant arguments; the descriptor is owned
    // at once.
    let fd = unsafe {
        libc::socket(
            libc::AF_INET,
            libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nothing else owns.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    set_int(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
    set_transparent(fd)?;
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    let local = to_sockaddr(local);
    // SAFETY: bind with a live sockaddr_in and its size.
    if unsafe { libc::bind(fd, (&local as *const libc::sockaddr_in).cast(), len) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let peer = to_sockaddr(peer);
    // SAFETY: connect with a live sockaddr_in and its size.
    if unsafe { libc::connect(fd, (&peer as *const libc::sockaddr_in).cast(), len) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(std::net::UdpSocket::from(socket))
}

/// `send` on a connected datagram socket, without waiting: a full buffer
/// fails with `WouldBlock` (a datagram dropped, as a router would drop
/// it). Not tokio's `try_send`, which refuses until the reactor has seen
/// the socket writable once, and so drops a new socket's first datagram.
pub fn send_now(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: send(2) from a live buffer of the length given.
    let n = unsafe { libc::send(fd, buf.as_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// `sendmsg` of `buf` to `to`, from the address `from` (an address the
/// sandbox sent to: the socket is transparent).
pub fn send_from(fd: RawFd, buf: &[u8], from: Ipv4Addr, to: SocketAddrV4) -> io::Result<()> {
    let mut dest = to_sockaddr(to);
    let mut iov = libc::iovec {
        iov_base: buf.as_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    let mut control = [0u64; 8];
    // SAFETY: all-zero is a valid msghdr.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = (&mut dest as *mut libc::sockaddr_in).cast();
    msg.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE is a pure size computation.
    msg.msg_controllen =
        unsafe { libc::CMSG_SPACE(std::mem::size_of::<libc::in_pktinfo>() as u32) } as usize;
    // SAFETY: the control buffer is large enough for one in_pktinfo
    // message (checked by the size above being within `control`).
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_IP;
        (*c).cmsg_type = libc::IP_PKTINFO;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::in_pktinfo>() as u32) as usize;
        let mut info: libc::in_pktinfo = std::mem::zeroed();
        info.ipi_spec_dst.s_addr = u32::from(from).to_be();
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast(), info);
    }
    // SAFETY: msg points at live buffers of the sizes it states.
    let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The addresses of every interface of the calling thread's network
/// namespace: the proxy refuses to dial them (the host itself).
pub fn local_addresses() -> Vec<std::net::IpAddr> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned.
        let ifa = unsafe { &*cur };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: ifa_addr points at a sockaddr of the family it names.
            match unsafe { (*ifa.ifa_addr).sa_family } as libc::c_int {
                libc::AF_INET => {
                    // SAFETY: an AF_INET address is a sockaddr_in.
                    let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                    out.push(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)).into());
                }
                libc::AF_INET6 => {
                    // SAFETY: an AF_INET6 address is a sockaddr_in6.
                    let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                    out.push(std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr).into());
                }
                _ => {}
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: the list getifaddrs allocated, freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_programs_jumps_land_where_they_should() {
        let p = program(3);
        let pass = p.len() - 2;
        for at in PATCHED {
            assert_eq!(at as i16 + 1 + p[at].off, pass as i16, "jump at {at}");
        }
        // The TCP branch, and UDP to a port other than 53, land on the
        // lookup, which stores r7 (the slot) first.
        let lookup = 9;
        assert_eq!((p[lookup].code, p[lookup].regs >> 4), (STX_W, 7));
        assert_eq!(3 + 1 + p[3].off, lookup as i16);
        assert_eq!(7 + 1 + p[7].off, lookup as i16);
        // The slot each path leaves in r7.
        assert_eq!((p[2].regs & 0xf, p[2].imm), (7, SLOT_TCP as i32));
        assert_eq!((p[5].regs & 0xf, p[5].imm), (7, SLOT_UDP as i32));
        assert_eq!((p[8].regs & 0xf, p[8].imm), (7, SLOT_DNS as i32));
        assert_eq!(p[7].imm, 53);
        assert_eq!(p[pass].imm, 1, "SK_PASS");
    }
}
