//! Report the sandbox's mount table (/proc/self/mountinfo): each mount
//! point with its filesystem type, source and the root of the mount within
//! its filesystem, which can reveal host paths (where the template or the
//! writable layer lives on the host).
//!
//! Information only: never an escape. Host paths that show up (for example
//! under /var/lib/brig) are listed so a reviewer can judge the leak.

use brig_hostile::{Args, Report};

fn main() {
    let _args = Args::get();
    let mut report = Report::new("mountinfo");
    let info = match std::fs::read_to_string("/proc/self/mountinfo") {
        Ok(s) => s,
        Err(e) => {
            report.note(format!("/proc/self/mountinfo: {e}"));
            report.finish()
        }
    };
    let mut host_paths = Vec::new();
    for line in info.lines() {
        // id parent major:minor root mountpoint options [optional...] - fstype source superoptions
        let (left, right) = line.split_once(" - ").unwrap_or((line, ""));
        let l: Vec<&str> = left.split_whitespace().collect();
        let r: Vec<&str> = right.split_whitespace().collect();
        if l.len() < 6 || r.len() < 2 {
            continue;
        }
        let (root, mp, opts, fstype, source) = (l[3], l[4], l[5], r[0], r[1]);
        let ro = if opts.split(',').any(|o| o == "ro") {
            "ro"
        } else {
            "rw"
        };
        report.note(format!("{mp} {fstype} {ro} src={source} root={root}"));
        for s in [root, source] {
            if s.starts_with("/var/")
                || s.starts_with("/home/")
                || s.starts_with("/root")
                || s.starts_with("/run/")
                || s.starts_with("/tmp/")
            {
                host_paths.push(s.to_string());
            }
        }
    }
    host_paths.sort();
    host_paths.dedup();
    report.note(format!(
        "host paths visible in mountinfo (info): {host_paths:?}"
    ));
    report.finish()
}
