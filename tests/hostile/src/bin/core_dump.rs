//! Dump core: raise RLIMIT_CORE as far as the hard limit lets us (and try
//! past it), then crash a child with SIGSEGV in /tmp and look for the core
//! file. The host's `core_pattern` decides where a dump goes — a file in
//! the crashing process's directory, or a pipe to a helper the kernel
//! runs as host root (the classic container escape) — so a sandbox must
//! not dump at all.
//!
//! Contained: RLIMIT_CORE's hard limit is 0 (brig sets it), raising it
//! fails, and no core file appears. Escaped: the limit could be raised
//! above 0, or a core file was written. The pattern is reported for
//! information. Destructive if mis-run (it crashes a process): needs
//! `--armed` and a user namespace.

use brig_hostile::{describe_child, errno, errno_name, guard_destructive, in_child, Args, Report};

fn main() {
    let args = Args::get();
    guard_destructive("core_dump", &args);
    let mut report = Report::new("core_dump");
    let pattern = std::fs::read_to_string("/proc/sys/kernel/core_pattern").unwrap_or_default();
    report.note(format!("core_pattern {:?}", pattern.trim()));
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid out-pointer.
    unsafe { libc::getrlimit(libc::RLIMIT_CORE, &mut rl) };
    report.record(
        rl.rlim_max != 0,
        format!("RLIMIT_CORE soft {} hard {}", rl.rlim_cur, rl.rlim_max),
    );
    let up = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: a valid rlimit.
    let r = unsafe { libc::setrlimit(libc::RLIMIT_CORE, &up) };
    report.record(
        r == 0,
        format!(
            "raise RLIMIT_CORE to unlimited: {}",
            if r == 0 {
                "ok".into()
            } else {
                errno_name(errno())
            }
        ),
    );
    // As far as the hard limit allows, in case it is not 0.
    // SAFETY: valid pointers.
    unsafe {
        libc::getrlimit(libc::RLIMIT_CORE, &mut rl);
        rl.rlim_cur = rl.rlim_max;
        libc::setrlimit(libc::RLIMIT_CORE, &rl);
    }
    let dir = "/tmp/brig-hostile-core";
    let _ = std::fs::create_dir_all(dir);
    let c = std::ffi::CString::new(dir).unwrap();
    // SAFETY: a NUL-terminated path.
    unsafe { libc::chdir(c.as_ptr()) };
    let end = in_child(|| {
        // SAFETY: a deliberate crash of this child only.
        unsafe {
            libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0);
            libc::raise(libc::SIGSEGV);
        }
        0
    });
    report.note(format!("crashed child: {}", describe_child(end)));
    std::thread::sleep(std::time::Duration::from_millis(200));
    let cores: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("core"))
                .collect()
        })
        .unwrap_or_default();
    report.record(!cores.is_empty(), format!("core files in {dir}: {cores:?}"));
    report.finish()
}
