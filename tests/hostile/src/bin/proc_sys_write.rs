//! Change host kernel settings through /proc: write the sandbox hostname
//! via /proc/sys/kernel/hostname (allowed: it is the sandbox's own uts
//! namespace), and open for writing the host-global knobs
//! /proc/sys/vm/drop_caches, kernel/core_pattern (host code execution),
//! kernel/modprobe, kernel/panic, kernel/sysrq, fs/file-max, kernel/pid_max,
//! vm/overcommit_memory, kernel/randomize_va_space and /proc/sysrq-trigger;
//! then lower /proc/self/oom_score_adj to -1000 (unkillable by the OOM
//! killer).
//!
//! Only the hostname is ever written; every other file is just opened for
//! writing and closed without a byte. Contained: every host-global open
//! fails (EACCES: host root is not mapped; or EROFS), and oom_score_adj
//! cannot go below its start. Escaped: any of those succeeded. The harness
//! checks that the host's hostname is unchanged. Knobs of the sandbox's own
//! namespaces (net.*, kernel.shm*, kernel.ns_last_pid) belong to sandbox
//! root, so only brig's read-only /proc/sys refuses them: opening one for
//! writing is an escape of that protection too. Needs `--armed` and a user
//! namespace, because of the hostname write.

use brig_hostile::{guard_destructive, open, outcome, Args, Report};

const GLOBAL: &[&str] = &[
    "/proc/sys/vm/drop_caches",
    "/proc/sys/kernel/core_pattern",
    "/proc/sys/kernel/modprobe",
    "/proc/sys/kernel/panic",
    "/proc/sys/kernel/sysrq",
    "/proc/sys/fs/file-max",
    "/proc/sys/kernel/pid_max",
    "/proc/sys/vm/overcommit_memory",
    "/proc/sys/kernel/randomize_va_space",
    "/proc/sys/kernel/kptr_restrict",
    "/proc/sys/kernel/dmesg_restrict",
    "/proc/sys/fs/binfmt_misc/register",
    "/proc/sysrq-trigger",
];

const NAMESPACED: &[&str] = &[
    "/proc/sys/net/ipv4/ip_forward",
    "/proc/sys/net/ipv4/ping_group_range",
    "/proc/sys/kernel/shmmax",
    "/proc/sys/kernel/msgmax",
    "/proc/sys/user/max_user_namespaces",
    "/proc/sys/kernel/ns_last_pid",
];

fn main() {
    let args = Args::get();
    guard_destructive("proc_sys_write", &args);
    let mut report = Report::new("proc_sys_write");

    let before = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let w = std::fs::write("/proc/sys/kernel/hostname", "brig-hostile-sysctl");
    let after = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    report.note(format!("hostname via /proc/sys/kernel/hostname: {} -> write {} -> {} (sandbox's own uts namespace)", before.trim(), if w.is_ok() { "ok" } else { "refused" }, after.trim()));

    for path in GLOBAL {
        let r = open(path, libc::O_WRONLY);
        if r.as_ref().err() == Some(&libc::ENOENT) {
            continue;
        }
        // The fd is dropped (closed) without any write.
        report.record(
            r.is_ok(),
            format!("open {path} for writing: {}", outcome(&r)),
        );
    }
    // The sandbox's own namespaces' knobs belong to sandbox root, so only
    // brig's read-only /proc/sys stops them: opening one for writing is
    // that freeze gone (nothing is written).
    for path in NAMESPACED {
        let r = open(path, libc::O_WRONLY);
        if r.as_ref().err() == Some(&libc::ENOENT) {
            continue;
        }
        report.record(
            r.is_ok(),
            format!(
                "open {path} for writing (the sandbox's own namespace): {}",
                outcome(&r)
            ),
        );
    }
    let start = std::fs::read_to_string("/proc/self/oom_score_adj").unwrap_or_default();
    let w = std::fs::write("/proc/self/oom_score_adj", "-1000");
    let now = std::fs::read_to_string("/proc/self/oom_score_adj").unwrap_or_default();
    let lowered = now.trim().parse::<i32>().unwrap_or(0) < start.trim().parse::<i32>().unwrap_or(0);
    report.record(
        lowered,
        format!(
            "oom_score_adj {} -> -1000: {} (now {})",
            start.trim(),
            if w.is_ok() { "ok" } else { "refused" },
            now.trim()
        ),
    );
    report.finish()
}
