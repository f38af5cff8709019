//! Reach the network from a sandbox that should only have loopback.
//!
//! First it reads /proc/net/dev, /proc/net/route and /proc/net/ipv6_route.
//! Any interface other than `lo`, or any route not via `lo`, is reported as
//! an escape and nothing is sent at all. Only when no route exists does it
//! try TCP connects (10.0.2.2:80, 1.1.1.1:53, 8.8.8.8:53, the cloud
//! metadata address 169.254.169.254:80, 2606:4700:4700::1111 port 53), a
//! UDP sendto 1.1.1.1:53 and SO_BINDTODEVICE eth0 — with no route these fail
//! locally with ENETUNREACH and no packet leaves. Contained: all fail and
//! loopback works. Escaped: a route exists, or anything got out.
//!
//! In a networked sandbox (a daemon's, even under `--network none`, and
//! E2B's), having an interface is the design; there the program tries to reach a listener the harness opened
//! on the host (`--host-port`) at the gateway and at the host's addresses
//! (`--host-addr`). Contained: every connect fails.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use brig_hostile::{errno, errno_name, Args, Report};

fn socket(domain: i32, ty: i32) -> Result<OwnedFd, i32> {
    // SAFETY: socket takes plain integers.
    let fd = unsafe { libc::socket(domain, ty | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK, 0) };
    if fd < 0 {
        Err(errno())
    } else {
        // SAFETY: fd was just created.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

fn v4(addr: [u8; 4], port: u16) -> libc::sockaddr_in {
    // SAFETY: all-zero is a valid sockaddr_in.
    let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    sa.sin_family = libc::AF_INET as libc::sa_family_t;
    sa.sin_port = port.to_be();
    sa.sin_addr.s_addr = u32::from_ne_bytes(addr);
    sa
}

fn v6(addr: [u8; 16], port: u16) -> libc::sockaddr_in6 {
    // SAFETY: all-zero is a valid sockaddr_in6.
    let mut sa: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
    sa.sin6_family = libc::AF_INET6 as libc::sa_family_t;
    sa.sin6_port = port.to_be();
    sa.sin6_addr.s6_addr = addr;
    sa
}

/// Non-blocking connect with a 2 s wait; Ok means a connection was made.
fn connect<T>(domain: i32, sa: &T) -> Result<(), i32> {
    let fd = socket(domain, libc::SOCK_STREAM)?;
    // SAFETY: sa points to a sockaddr of the given size.
    let r = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (sa as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if r == 0 {
        return Ok(());
    }
    let e = errno();
    if e != libc::EINPROGRESS {
        return Err(e);
    }
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    if unsafe { libc::poll(&mut pfd, 1, 2000) } == 0 {
        return Err(libc::ETIMEDOUT);
    }
    let mut soerr: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: soerr/len are valid out-pointers of the right size.
    unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ERROR,
            (&mut soerr as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if soerr == 0 {
        Ok(())
    } else {
        Err(soerr)
    }
}

/// A networked sandbox (E2B's by default): it has an interface and a
/// default route by design, so what is judged is whether it reaches the
/// host: a TCP listener the harness opened on all of the host's addresses
/// (`--host-port`), tried at the gateway and at every host address the
/// harness names (`--host-addr`, repeatable). Its egress policy is
/// attacked in tests/network.rs, against a fake internet.
fn networked(args: &Args, mut report: Report) -> ! {
    let dev = std::fs::read_to_string("/proc/net/dev").unwrap_or_default();
    let ifaces: Vec<String> = dev
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next())
        .map(|s| s.trim().to_string())
        .collect();
    report.note(format!("interfaces: {ifaces:?} (networked by design)"));
    let Some(port) = args
        .u64_value("--host-port")
        .and_then(|p| u16::try_from(p).ok())
    else {
        report.escape("the harness named no --host-port: nothing was tried");
        report.finish()
    };
    let mut addrs: Vec<[u8; 4]> = Vec::new();
    let routes4 = std::fs::read_to_string("/proc/net/route").unwrap_or_default();
    for l in routes4.lines().skip(1) {
        let f: Vec<&str> = l.split_whitespace().collect();
        if let Some(gw) = f.get(2).and_then(|g| u32::from_str_radix(g, 16).ok()) {
            if gw != 0 {
                addrs.push(gw.to_ne_bytes());
            }
        }
    }
    let mut it = std::env::args();
    while let Some(a) = it.next() {
        if a == "--host-addr" {
            if let Some(ip) = it.next().and_then(|v| v.parse::<std::net::Ipv4Addr>().ok()) {
                addrs.push(ip.octets());
            }
        }
    }
    addrs.sort();
    addrs.dedup();
    if addrs.is_empty() {
        report.escape("no gateway and no host address to try: nothing was tried");
    }
    for a in addrs {
        // brig's egress proxy accepts every connection and then decides,
        // so a connect that succeeds proves nothing: what counts is
        // whether the host's listener answers (with the canary's name;
        // the harness also counts what it accepted).
        let ip = std::net::Ipv4Addr::from(a);
        let r = connect_and_read(&v4(a, port));
        let reached = r
            .as_ref()
            .is_ok_and(|got| got.contains(brig_hostile::CANARY));
        report.record(
            reached,
            format!(
                "tcp to the host's listener at {ip}:{port}: {}",
                match &r {
                    Ok(got) => format!("connected, read {got:?}"),
                    Err(e) => errno_name(*e),
                }
            ),
        );
    }
    report.finish()
}

/// Connect (2 s) and read what the other end says within 2 s.
fn connect_and_read(sa: &libc::sockaddr_in) -> Result<String, i32> {
    let fd = socket(libc::AF_INET, libc::SOCK_STREAM)?;
    // SAFETY: sa is a sockaddr_in of the size passed.
    let r = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (sa as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    if r != 0 && errno() != libc::EINPROGRESS {
        return Err(errno());
    }
    let mut got = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(4);
    while std::time::Instant::now() < deadline {
        let mut pfd = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut pfd, 1, 500) } <= 0 {
            continue;
        }
        let mut buf = [0u8; 256];
        // SAFETY: buf is valid for its length.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            if got.is_empty() && n < 0 {
                return Err(errno());
            }
            break;
        }
        got.extend_from_slice(&buf[..n as usize]);
    }
    Ok(String::from_utf8_lossy(&got).into_owned())
}

fn main() {
    let args = Args::get();
    let mut report = Report::new("network_egress");
    if args.mode().networked() {
        networked(&args, report);
    }

    let dev = std::fs::read_to_string("/proc/net/dev").unwrap_or_default();
    let ifaces: Vec<String> = dev
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next())
        .map(|s| s.trim().to_string())
        .collect();
    report.note(format!("interfaces: {ifaces:?}"));
    for i in ifaces.iter().filter(|i| i.as_str() != "lo") {
        report.escape(format!("non-loopback interface {i} is present"));
    }
    let routes4 = std::fs::read_to_string("/proc/net/route").unwrap_or_default();
    for l in routes4.lines().skip(1) {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() > 2 && f[0] != "lo" {
            report.escape(format!(
                "IPv4 route via {} (dest {}, gateway {})",
                f[0], f[1], f[2]
            ));
        }
    }
    let routes6 = std::fs::read_to_string("/proc/net/ipv6_route").unwrap_or_default();
    for l in routes6.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if let Some(iface) = f.last() {
            if *iface != "lo" {
                report.escape(format!("IPv6 route via {iface} (dest {})", f[0]));
            }
        }
    }
    if report.escaped() {
        report.note("a route or interface exists: not sending anything");
        report.finish();
    }

    // Loopback should work: a refused connection proves the stack is up.
    let lo = connect(libc::AF_INET, &v4([127, 0, 0, 1], 1));
    report.note(format!(
        "connect 127.0.0.1:1 (loopback, expect ECONNREFUSED): {}",
        brig_hostile::outcome(&lo)
    ));

    let targets: [(&str, [u8; 4], u16); 4] = [
        ("10.0.2.2:80", [10, 0, 2, 2], 80),
        ("1.1.1.1:53", [1, 1, 1, 1], 53),
        ("8.8.8.8:53", [8, 8, 8, 8], 53),
        ("169.254.169.254:80", [169, 254, 169, 254], 80),
    ];
    for (name, addr, port) in targets {
        let r = connect(libc::AF_INET, &v4(addr, port));
        report.record(
            r.is_ok(),
            format!("tcp connect {name}: {}", brig_hostile::outcome(&r)),
        );
    }
    let cf6 = [
        0x26, 0x06, 0x47, 0x00, 0x47, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0x11, 0x11,
    ];
    let r = connect(libc::AF_INET6, &v6(cf6, 53));
    report.record(
        r.is_ok(),
        format!(
            "tcp connect [2606:4700:4700::1111]:53: {}",
            brig_hostile::outcome(&r)
        ),
    );

    match socket(libc::AF_INET, libc::SOCK_DGRAM) {
        Ok(fd) => {
            let sa = v4([1, 1, 1, 1], 53);
            let msg = [0u8; 1];
            // SAFETY: msg and sa are valid for the lengths passed.
            let r = unsafe {
                libc::sendto(
                    fd.as_raw_fd(),
                    msg.as_ptr().cast(),
                    1,
                    0,
                    (&sa as *const libc::sockaddr_in).cast(),
                    std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
                )
            };
            let res = if r >= 0 { Ok(()) } else { Err(errno()) };
            report.record(
                res.is_ok(),
                format!("udp sendto 1.1.1.1:53: {}", brig_hostile::outcome(&res)),
            );

            let ifname = b"eth0\0";
            // SAFETY: ifname is a valid buffer of the given length.
            let r = unsafe {
                libc::setsockopt(
                    fd.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_BINDTODEVICE,
                    ifname.as_ptr().cast(),
                    ifname.len() as libc::socklen_t,
                )
            };
            let res = if r == 0 { Ok(()) } else { Err(errno()) };
            report.record(
                res.is_ok(),
                format!("SO_BINDTODEVICE eth0: {}", brig_hostile::outcome(&res)),
            );
        }
        Err(e) => report.note(format!("udp socket: {}", errno_name(e))),
    }
    let resolv = std::fs::read_to_string("/etc/resolv.conf")
        .map(|s| s.lines().filter(|l| l.starts_with("nameserver")).count());
    report.note(format!("/etc/resolv.conf nameservers (info): {resolv:?}"));
    report.finish()
}
