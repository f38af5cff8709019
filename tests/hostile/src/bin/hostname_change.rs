//! Change the hostname and domain name with sethostname/setdomainname.
//!
//! Contained: both answer EPERM. The sandbox's root does not hold
//! CAP_SYS_ADMIN (brig's capability set leaves it out, E2B's `sudo` root
//! too), and the kernel asks for it over the uts namespace; the uts
//! namespace is the second layer (the harness checks that the host's name
//! is unchanged). Escaped: either call succeeded. Not harmful by itself —
//! only the sandbox's own name would change — but a root holding
//! CAP_SYS_ADMIN is a capability set that is not brig's. On a tier with a
//! kernel of its own (gVisor's, a vm guest's) that kernel's root may rename
//! its own machine: the outcome is reported, not judged.
//!
//! Destructive if mis-run (it would rename the host): needs `--armed` and
//! a user namespace.

use brig_hostile::{check, guard_destructive, outcome, Args, Report};

fn uname() -> (String, String) {
    // SAFETY: zeroed utsname is valid; uname fills it.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: u is a valid out-pointer.
    unsafe { libc::uname(&mut u) };
    let s = |f: &[libc::c_char]| {
        // SAFETY: the kernel NUL-terminates both fields.
        let c = unsafe { std::ffi::CStr::from_ptr(f.as_ptr()) };
        c.to_string_lossy().into_owned()
    };
    (s(&u.nodename), s(&u.domainname))
}

fn main() {
    let args = Args::get();
    guard_destructive("hostname_change", &args);
    let mut report = Report::new("hostname_change");
    let (host, domain) = uname();
    let name = b"brig-hostile-host";
    // SAFETY: name is valid for its length.
    let r = check(unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) } as libc::c_long);
    let dom = b"brig-hostile-domain";
    // SAFETY: dom is valid for its length.
    let r2 = check(unsafe { libc::setdomainname(dom.as_ptr().cast(), dom.len()) } as libc::c_long);
    let (host2, domain2) = uname();
    let what = format!(
        "sethostname: {} ({host} -> {host2}); setdomainname: {} ({domain} -> {domain2})",
        outcome(&r),
        outcome(&r2)
    );
    if args.mode().own_kernel() {
        report.note(format!("{what} (that kernel's own machine)"));
    } else {
        let refused = r == Err(libc::EPERM) && r2 == Err(libc::EPERM);
        report.record(!refused, what);
    }
    report.finish()
}
