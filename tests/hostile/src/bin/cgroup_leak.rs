//! What the sandbox learns of the host's cgroup tree and mount table:
//! /proc/self/cgroup and /proc/self/mountinfo.
//!
//! Contained: every line of /proc/self/cgroup names the root of its
//! hierarchy (`/`: brig's cgroup namespace hides where the sandbox sits on
//! the host, `/brig/<id>`), and no mount in mountinfo shows a host path as
//! its root or source that names brig's state (`/run/brig`, `/var/lib/brig`,
//! a `brig-` staging directory) or the host's home directories. Escaped:
//! otherwise (each leak is named).

use brig_hostile::{Args, Report};

const HOST_MARKERS: &[&str] = &[
    "/run/brig",
    "/var/lib/brig",
    "brig-staging",
    "/root/",
    "/home/",
];

fn main() {
    let _args = Args::get();
    let mut report = Report::new("cgroup_leak");
    let cg = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    for line in cg.lines() {
        let path = line.splitn(3, ':').nth(2).unwrap_or("");
        report.record(path != "/", format!("/proc/self/cgroup: {line}"));
    }
    let mi = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut leaks = 0;
    for line in mi.lines() {
        // Field 4 is the mount's root within its filesystem; after " - "
        // come the type and the source.
        let f: Vec<&str> = line.split_whitespace().collect();
        let root = f.get(3).copied().unwrap_or("");
        let source = line
            .split(" - ")
            .nth(1)
            .and_then(|t| t.split_whitespace().nth(1))
            .unwrap_or("");
        for m in HOST_MARKERS {
            if root.contains(m) || source.contains(m) {
                leaks += 1;
                report.escape(format!("mountinfo names a host path ({m}): {line}"));
            }
        }
    }
    report.note(format!(
        "{} mounts checked, {leaks} naming host paths",
        mi.lines().count()
    ));
    report.finish()
}
