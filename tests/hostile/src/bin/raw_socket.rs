//! Open raw and packet sockets, which let a process forge traffic or sniff
//! every frame on an interface: AF_INET/AF_INET6 SOCK_RAW, AF_PACKET
//! SOCK_RAW and SOCK_DGRAM. Nothing is sent.
//!
//! Contained: CAP_NET_RAW is not in the sandbox's set and the seccomp policy
//! refuses AF_PACKET, so every socket() fails with EPERM (or EAFNOSUPPORT).
//! Escaped: any of these sockets was created. Unprivileged ICMP "ping"
//! sockets are reported for information only.

use brig_hostile::{errno, Args, Report};

fn try_socket(domain: i32, ty: i32, proto: i32) -> Result<(), i32> {
    // SAFETY: socket takes plain integers.
    let fd = unsafe { libc::socket(domain, ty | libc::SOCK_CLOEXEC, proto) };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: fd was just created.
    unsafe { libc::close(fd) };
    Ok(())
}

fn main() {
    let _args = Args::get();
    let mut report = Report::new("raw_socket");
    let eth_p_all = (libc::ETH_P_ALL as u16).to_be() as i32;
    let attempts = [
        (
            "AF_INET SOCK_RAW IPPROTO_ICMP",
            libc::AF_INET,
            libc::SOCK_RAW,
            libc::IPPROTO_ICMP,
        ),
        (
            "AF_INET SOCK_RAW IPPROTO_RAW",
            libc::AF_INET,
            libc::SOCK_RAW,
            libc::IPPROTO_RAW,
        ),
        (
            "AF_INET SOCK_RAW IPPROTO_TCP",
            libc::AF_INET,
            libc::SOCK_RAW,
            libc::IPPROTO_TCP,
        ),
        (
            "AF_INET6 SOCK_RAW IPPROTO_ICMPV6",
            libc::AF_INET6,
            libc::SOCK_RAW,
            libc::IPPROTO_ICMPV6,
        ),
        (
            "AF_PACKET SOCK_RAW ETH_P_ALL",
            libc::AF_PACKET,
            libc::SOCK_RAW,
            eth_p_all,
        ),
        (
            "AF_PACKET SOCK_DGRAM ETH_P_ALL",
            libc::AF_PACKET,
            libc::SOCK_DGRAM,
            eth_p_all,
        ),
        (
            "AF_PACKET SOCK_PACKET (legacy)",
            libc::AF_PACKET,
            10, /* SOCK_PACKET */
            eth_p_all,
        ),
    ];
    for (what, d, t, p) in attempts {
        let r = try_socket(d, t, p);
        report.record(r.is_ok(), format!("{what}: {}", brig_hostile::outcome(&r)));
    }
    let ping = try_socket(libc::AF_INET, libc::SOCK_DGRAM, libc::IPPROTO_ICMP);
    report.note(format!(
        "ICMP ping socket (SOCK_DGRAM, info only): {}",
        brig_hostile::outcome(&ping)
    ));
    report.finish()
}
