//! Inspect and try to widen the process's privileges: capability sets,
//! no_new_privs, seccomp mode and uid/gid maps from /proc/self/status and
//! /proc/self/{uid,gid}_map; then try to raise CAP_SYS_ADMIN with capset
//! and as an ambient capability, and to clear no_new_privs.
//!
//! Contained: every capability set is within [`brig_hostile::ROOT_CAPS`]
//! (Docker's default minus NET_RAW), NoNewPrivs is 1 (in every mode but
//! E2B's, where `sudo` needs it off: there only the rest applies),
//! Seccomp is 2 (filter), host uid 0 and gid 0 are not mapped into the
//! sandbox, and the attempts to widen fail. Escaped: otherwise.

use brig_hostile::{errno, errno_name, status_field, Args, Report, ROOT_CAPS};

const CAP_SYS_ADMIN: u32 = 21;

/// Whether an id map ("inside outside count" lines) maps any id to host id 0.
fn maps_host_root(map: &str) -> bool {
    map.lines().any(|l| {
        let f: Vec<u64> = l
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        f.len() == 3 && f[1] == 0 && f[2] > 0
    })
}

fn main() {
    let args = Args::get();
    let mode = args.mode();
    let mut report = Report::new("capabilities");
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        let v = status_field("self", set).unwrap_or_default();
        let bits = u64::from_str_radix(&v, 16).unwrap_or(u64::MAX);
        let extra = bits & !ROOT_CAPS;
        report.record(
            extra != 0,
            format!(
                "{set} {v}{}",
                if extra != 0 {
                    format!(" has capabilities outside the allowed set: {extra:#x}")
                } else {
                    String::new()
                }
            ),
        );
    }
    let nnp = status_field("self", "NoNewPrivs").unwrap_or_default();
    if mode.no_new_privs() {
        report.record(nnp != "1", format!("NoNewPrivs {nnp}"));
    } else {
        report.note(format!(
            "NoNewPrivs {nnp} (off by design in this mode: sudo)"
        ));
    }
    let sc = status_field("self", "Seccomp").unwrap_or_default();
    report.record(
        sc != "2",
        format!(
            "Seccomp {sc} (filters: {})",
            status_field("self", "Seccomp_filters").unwrap_or_default()
        ),
    );
    for map in ["uid_map", "gid_map"] {
        let m = std::fs::read_to_string(format!("/proc/self/{map}")).unwrap_or_default();
        let flat = m.split_whitespace().collect::<Vec<_>>().join(" ");
        report.record(maps_host_root(&m), format!("{map}: {flat}"));
    }
    // SAFETY: getuid/geteuid have no preconditions.
    let (uid, euid) = unsafe { (libc::getuid(), libc::geteuid()) };
    report.note(format!("uid {uid} euid {euid}"));

    // capset: add CAP_SYS_ADMIN to effective and permitted.
    let mut hdr = CapHeader {
        version: 0x2008_0522,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget/capset with a v3 header and two data structs.
    unsafe { libc::syscall(libc::SYS_capget, &mut hdr, data.as_mut_ptr()) };
    data[0].effective |= 1 << CAP_SYS_ADMIN;
    data[0].permitted |= 1 << CAP_SYS_ADMIN;
    // SAFETY: as above.
    let r = unsafe { libc::syscall(libc::SYS_capset, &mut hdr, data.as_ptr()) };
    report.record(
        r == 0,
        format!(
            "capset +CAP_SYS_ADMIN: {}",
            if r == 0 {
                "ok".into()
            } else {
                errno_name(errno())
            }
        ),
    );
    // SAFETY: prctl with integer arguments.
    let r = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_RAISE,
            CAP_SYS_ADMIN as libc::c_ulong,
            0,
            0,
        )
    };
    report.record(
        r == 0,
        format!(
            "ambient raise CAP_SYS_ADMIN: {}",
            if r == 0 {
                "ok".into()
            } else {
                errno_name(errno())
            }
        ),
    );
    // SAFETY: prctl with integer arguments; clearing no_new_privs is impossible by design.
    let r = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 0, 0, 0, 0) };
    let after = status_field("self", "NoNewPrivs").unwrap_or_default();
    report.record(
        after != "1" && nnp == "1",
        format!(
            "PR_SET_NO_NEW_PRIVS 0: {} (now {after})",
            if r == 0 {
                "ok".into()
            } else {
                errno_name(errno())
            }
        ),
    );
    report.finish()
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}
