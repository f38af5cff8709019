//! Change host kernel state through /sys: open for writing
//! /sys/kernel/uevent_helper (host code execution on every uevent),
//! /sys/power/state, transparent hugepage and KSM knobs, block queue
//! schedulers and module parameters; create a file in /sys; list debugfs,
//! securityfs and firmware tables.
//!
//! Nothing is ever written: files are opened and closed. Contained: /sys is
//! read-only in the sandbox, so every open fails (EROFS or EACCES) and
//! debugfs/securityfs are not listable. Escaped: a host-global file opened
//! for writing. Network device files under /sys/class/net (the sandbox's
//! own network namespace) are reported for information.

use brig_hostile::{errno_name, list_dir, open, open_mode, outcome, Args, Report};

fn main() {
    let _args = Args::get();
    let mut report = Report::new("sysfs_write");
    let mut targets: Vec<String> = [
        "/sys/kernel/uevent_helper",
        "/sys/power/state",
        "/sys/power/disk",
        "/sys/kernel/mm/transparent_hugepage/enabled",
        "/sys/kernel/mm/ksm/run",
        "/sys/kernel/profiling",
        "/sys/kernel/kexec_crash_size",
        "/sys/fs/cgroup/cgroup.procs",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for dev in list_dir("/sys/block")
        .unwrap_or_default()
        .into_iter()
        .take(3)
    {
        targets.push(format!("/sys/block/{dev}/queue/scheduler"));
        targets.push(format!("/sys/block/{dev}/device/delete"));
    }
    for module in list_dir("/sys/module")
        .unwrap_or_default()
        .into_iter()
        .take(40)
    {
        for p in list_dir(&format!("/sys/module/{module}/parameters"))
            .unwrap_or_default()
            .into_iter()
            .take(1)
        {
            targets.push(format!("/sys/module/{module}/parameters/{p}"));
        }
    }
    let mut refused = 0;
    for t in &targets {
        match open(t, libc::O_WRONLY) {
            Ok(_) => report.escape(format!("opened {t} for writing (nothing written)")),
            Err(libc::ENOENT) => {}
            Err(e) => {
                refused += 1;
                if refused <= 6 {
                    report.note(format!("{t}: {}", errno_name(e)));
                }
            }
        }
    }
    report.note(format!(
        "{refused} of {} existing sysfs files refused opening for writing",
        targets.len()
    ));
    let created = open_mode(
        "/sys/brig-hostile",
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
        0o600,
    );
    report.record(
        created.is_ok(),
        format!("create /sys/brig-hostile: {}", outcome(&created)),
    );
    let mtu = open("/sys/class/net/lo/mtu", libc::O_WRONLY);
    report.note(format!(
        "/sys/class/net/lo/mtu for writing (own netns, info): {}",
        outcome(&mtu)
    ));
    for d in [
        "/sys/kernel/debug",
        "/sys/kernel/security",
        "/sys/kernel/tracing",
    ] {
        match list_dir(d) {
            Ok(n) if !n.is_empty() => {
                report.escape(format!("{d} is listable ({} entries)", n.len()))
            }
            Ok(_) => report.note(format!("{d}: empty")),
            Err(e) => report.note(format!("{d}: {}", errno_name(e))),
        }
    }
    match list_dir("/sys/firmware") {
        Ok(n) => report.note(format!("/sys/firmware (info): {n:?}")),
        Err(e) => report.note(format!("/sys/firmware: {}", errno_name(e))),
    }
    report.finish()
}
