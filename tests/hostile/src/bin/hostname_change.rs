//! Change the hostname and domain name with sethostname/setdomainname.
//!
//! Inside brig's uts namespace this is harmless either way: if it succeeds
//! (CAP_SYS_ADMIN over the uts namespace) only the sandbox's own name
//! changes, and without that capability it fails with EPERM. The program
//! reports what happened and never claims an escape; the harness checks the
//! host's hostname is unchanged.
//! Destructive if mis-run (it would rename the host): needs `--armed` and a
//! user namespace.

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
    report.note(format!("sethostname: {} ({host} -> {host2}); setdomainname: {} ({domain} -> {domain2}); either outcome is contained (own uts namespace)", outcome(&r), outcome(&r2)));
    report.finish()
}
