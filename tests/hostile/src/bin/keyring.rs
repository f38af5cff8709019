//! Use the kernel keyring, a shared kernel service with a long CVE history
//! and no namespace of its own for most purposes: keyctl(GET_KEYRING_ID),
//! KEYCTL_JOIN_SESSION_KEYRING, add_key("user") into the process keyring,
//! request_key, and read /proc/keys and /proc/key-users.
//!
//! Contained: keyctl, add_key and request_key all answer EPERM (seccomp).
//! Escaped: any of them reached the keyring. Harmless if unfiltered: the
//! key goes to this process's own keyring, which dies with it.

use brig_hostile::{check, outcome, read_file, Args, Report};

fn main() {
    let _args = Args::get();
    let mut report = Report::new("keyring");
    let (user, desc, payload) = (c"user", c"brig-hostile", b"x");
    // SAFETY: integer arguments.
    let session = check(unsafe { libc::syscall(libc::SYS_keyctl, 0, -3, 0) });
    // SAFETY: integer arguments.
    let user_ring = check(unsafe { libc::syscall(libc::SYS_keyctl, 0, -4, 0) });
    // SAFETY: integer arguments; a NULL name asks for an anonymous keyring.
    let join = check(unsafe { libc::syscall(libc::SYS_keyctl, 1, 0) });
    // SAFETY: static NUL-terminated strings and a 1-byte payload.
    let add = check(unsafe {
        libc::syscall(
            libc::SYS_add_key,
            user.as_ptr(),
            desc.as_ptr(),
            payload.as_ptr(),
            1,
            -2,
        )
    });
    // SAFETY: static NUL-terminated strings.
    let request =
        check(unsafe { libc::syscall(libc::SYS_request_key, user.as_ptr(), desc.as_ptr(), 0, 0) });
    let attempts = [
        ("keyctl(GET_KEYRING_ID, session)", session),
        ("keyctl(GET_KEYRING_ID, user)", user_ring),
        ("keyctl(JOIN_SESSION_KEYRING, NULL)", join),
        ("add_key(user, process keyring)", add),
        ("request_key(user)", request),
    ];
    for (what, r) in attempts {
        let denied = matches!(r, Err(e) if brig_hostile::policy_denied(e));
        report.record(!denied, format!("{what}: {}", outcome(&r)));
    }
    for f in ["/proc/keys", "/proc/key-users"] {
        match read_file(f) {
            Ok(b) => report.note(format!(
                "{f}: {} lines",
                String::from_utf8_lossy(&b).lines().count()
            )),
            Err(e) => report.note(format!("{f}: {}", brig_hostile::errno_name(e))),
        }
    }
    report.finish()
}
