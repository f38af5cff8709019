//! Make the host kernel load a module on the sandbox's behalf: sockets of
//! families whose modules load on demand (AF_ALG with a crypto algorithm
//! name, AF_CAN, AF_TIPC, AF_RDS, AF_APPLETALK, AF_X25, AF_DECnet, AF_NFC,
//! AF_VSOCK, SCTP and DCCP over IPv4), and executing a file whose first
//! bytes name no known format (the kernel asks for `binfmt-XXXX`).
//!
//! Contained: nothing here loads a module — the harness compares the
//! host's /proc/modules before and after every program — and the program
//! reports what each attempt returned. Escaped: judged by the harness
//! (a module appeared); the program itself reports only.

use std::os::unix::fs::PermissionsExt;

use brig_hostile::{errno, errno_name, Args, Report};

fn try_socket(report: &mut Report, name: &str, domain: i32, ty: i32, proto: i32) {
    // SAFETY: socket with integer arguments; closed at once.
    let fd = unsafe { libc::socket(domain, ty | libc::SOCK_CLOEXEC, proto) };
    let what = if fd >= 0 {
        // SAFETY: our own descriptor.
        unsafe { libc::close(fd) };
        "ok".to_string()
    } else {
        errno_name(errno())
    };
    report.note(format!("socket({name}): {what}"));
}

fn main() {
    let _args = Args::get();
    let mut report = Report::new("module_autoload");
    let families: &[(&str, i32, i32, i32)] = &[
        ("AF_CAN raw", libc::AF_CAN, libc::SOCK_RAW, 1),
        ("AF_TIPC", libc::AF_TIPC, libc::SOCK_RDM, 0),
        ("AF_RDS", libc::AF_RDS, libc::SOCK_SEQPACKET, 0),
        ("AF_APPLETALK", libc::AF_APPLETALK, libc::SOCK_DGRAM, 0),
        ("AF_X25", libc::AF_X25, libc::SOCK_SEQPACKET, 0),
        ("AF_DECnet", libc::AF_DECnet, libc::SOCK_SEQPACKET, 0),
        ("AF_NFC", libc::AF_NFC, libc::SOCK_SEQPACKET, 0),
        ("AF_VSOCK", libc::AF_VSOCK, libc::SOCK_STREAM, 0),
        ("SCTP", libc::AF_INET, libc::SOCK_STREAM, libc::IPPROTO_SCTP),
        ("DCCP", libc::AF_INET, libc::SOCK_DCCP, libc::IPPROTO_DCCP),
        ("AF_KEY", libc::AF_KEY, libc::SOCK_RAW, 2),
        ("AF_LLC", libc::AF_LLC, libc::SOCK_DGRAM, 0),
    ];
    for (name, d, t, p) in families {
        try_socket(&mut report, name, *d, *t, *p);
    }
    // AF_ALG: binding names an algorithm, which the kernel may load.
    // SAFETY: socket with integer arguments.
    let alg = unsafe { libc::socket(libc::AF_ALG, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if alg >= 0 {
        // SAFETY: an all-zero sockaddr_alg is valid; the names are copied in.
        let mut sa: libc::sockaddr_alg = unsafe { std::mem::zeroed() };
        sa.salg_family = libc::AF_ALG as u16;
        for (dst, src) in sa.salg_type.iter_mut().zip(b"skcipher") {
            *dst = *src;
        }
        for (dst, src) in sa.salg_name.iter_mut().zip(b"anubis") {
            *dst = *src;
        }
        // SAFETY: sa is valid for its size.
        let r = unsafe {
            libc::bind(
                alg,
                (&sa as *const libc::sockaddr_alg).cast(),
                std::mem::size_of::<libc::sockaddr_alg>() as u32,
            )
        };
        report.note(format!(
            "AF_ALG bind skcipher anubis: {}",
            if r == 0 {
                "ok".into()
            } else {
                errno_name(errno())
            }
        ));
        // SAFETY: our own descriptor.
        unsafe { libc::close(alg) };
    } else {
        report.note(format!("socket(AF_ALG): {}", errno_name(errno())));
    }
    // An executable whose first bytes match no format: the kernel asks
    // for binfmt-XXXX (XXXX from bytes 2-3).
    let path = "/tmp/brig-hostile-binfmt";
    let wrote = std::fs::write(path, [0x7fu8, 0x42, 0xf3, 0x7e, 0, 0, 0, 0])
        .and_then(|()| std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)));
    match wrote {
        Ok(()) => {
            let r = std::process::Command::new(path).output();
            report.note(format!(
                "exec an unknown binary format: {}",
                match r {
                    Ok(o) => format!("ran?! {}", o.status),
                    Err(e) => e.to_string(),
                }
            ));
        }
        Err(e) => report.note(format!("write {path}: {e}")),
    }
    let _ = std::fs::remove_file(path);
    report.finish()
}
