//! Reach host services over unix sockets: the abstract socket
//! `@brig-hostile-canary` the harness listens on in the host's network
//! namespace, and well-known path sockets (docker, containerd, dbus,
//! systemd, journald, /dev/log, brig's own API socket).
//!
//! Contained: abstract sockets are scoped to the network namespace, so the
//! canary is unreachable (ECONNREFUSED), /proc/net/unix does not list it,
//! and the path sockets do not exist in the sandbox (ENOENT). Escaped: any
//! connect succeeded (nothing inside the sandbox listens) or the canary is
//! listed.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use brig_hostile::{errno, Args, Report};

fn connect_unix(name: &[u8]) -> Result<(), i32> {
    // SAFETY: socket takes plain integers.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: fd was just created.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: all-zero is a valid sockaddr_un.
    let mut sa: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    sa.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (i, b) in name.iter().take(sa.sun_path.len() - 1).enumerate() {
        sa.sun_path[i] = *b as libc::c_char;
    }
    let len = (std::mem::size_of::<libc::sa_family_t>() + name.len()) as libc::socklen_t;
    // SAFETY: sa is valid for len bytes.
    let r = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&sa as *const libc::sockaddr_un).cast(),
            len,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(errno())
    }
}

fn main() {
    let args = Args::get();
    let canary = args.canary();
    let mut report = Report::new("unix_socket_escape");
    let mut abstract_name = vec![0u8];
    abstract_name.extend_from_slice(canary.as_bytes());
    let r = connect_unix(&abstract_name);
    report.record(
        r.is_ok(),
        format!("connect abstract @{canary}: {}", brig_hostile::outcome(&r)),
    );

    let paths = [
        "/run/docker.sock",
        "/var/run/docker.sock",
        "/run/containerd/containerd.sock",
        "/run/dbus/system_bus_socket",
        "/var/run/dbus/system_bus_socket",
        "/run/systemd/private",
        "/run/systemd/notify",
        "/run/systemd/journal/socket",
        "/run/systemd/journal/stdout",
        "/dev/log",
        "/run/user/0/bus",
        "/run/brig/brig.sock",
        "/var/lib/brig/brig.sock",
        "/run/brig.sock",
        "/tmp/.X11-unix/X0",
    ];
    let mut absent = 0;
    for p in paths {
        match connect_unix(p.as_bytes()) {
            Ok(()) => report.escape(format!("connected to {p}")),
            Err(libc::ENOENT) => absent += 1,
            Err(e) => report.note(format!("{p}: {}", brig_hostile::errno_name(e))),
        }
    }
    report.note(format!(
        "{absent} of {} well-known host sockets absent",
        paths.len()
    ));
    let listing = std::fs::read_to_string("/proc/net/unix").unwrap_or_default();
    if listing.contains(&canary) {
        report.escape(format!(
            "/proc/net/unix lists @{canary}: the host's network namespace"
        ));
    }
    report.note(format!(
        "/proc/net/unix has {} sockets",
        listing.lines().count().saturating_sub(1)
    ));
    report.finish()
}
