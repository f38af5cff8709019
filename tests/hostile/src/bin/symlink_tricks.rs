//! Escape through symlinks the sandbox creates itself: links in /tmp to
//! /proc/1/root, /proc/self/root, /proc/1/cwd and to long `../../..` chains,
//! then reads of /etc/shadow and the host canaries through them, and a
//! hard link to /etc/shadow.
//!
//! Contained: every link resolves inside the sandbox's root (same device
//! and inode as `/`), a file read through a link is readable only if it is
//! readable directly, and no canary is found. Escaped: otherwise.

use brig_hostile::{cstr, dev_ino, errno, errno_name, read_file, Args, Report};

fn main() {
    let args = Args::get();
    let canary = args.canary();
    let mut report = Report::new("symlink_tricks");
    let root = dev_ino("/").expect("stat /");
    let dir = "/tmp/brig-hostile-links";
    let _ = std::fs::create_dir_all(format!("{dir}/a/b/c"));
    let direct_shadow = read_file("/etc/shadow").is_ok();
    let targets = [
        ("proc1root", "/proc/1/root".to_string()),
        ("procselfroot", "/proc/self/root".to_string()),
        ("proc1cwd", "/proc/1/cwd".to_string()),
        ("dotdot", "../../../../../../../../../..".to_string()),
        ("procdotdot", "/proc/self/root/../../../..".to_string()),
    ];
    let mut resolved = 0;
    for (name, target) in &targets {
        // Create the link deep inside so relative `..` has room to climb.
        let link = format!("{dir}/a/b/c/{name}");
        let _ = std::fs::remove_file(&link);
        if let Err(e) = std::os::unix::fs::symlink(target, &link) {
            report.note(format!("symlink {link} -> {target}: {e}"));
            continue;
        }
        match dev_ino(&format!("{link}/")) {
            Ok(di) if di == root => resolved += 1,
            Ok(_) if *name == "proc1cwd" => resolved += 1,
            Ok(di) => report.escape(format!(
                "{name} -> {target} resolves to {di:?}, not the sandbox root {root:?}"
            )),
            Err(e) => report.note(format!("{name}: {}", errno_name(e))),
        }
        let shadow = read_file(&format!("{link}/etc/shadow"));
        if shadow.is_ok() && !direct_shadow {
            report.escape(format!("read /etc/shadow through {name} but not directly"));
        }
        for f in [
            format!("{link}/root/{canary}"),
            format!("{link}/var/tmp/{canary}"),
        ] {
            if let Ok(b) = read_file(&f) {
                report.escape(format!(
                    "read host canary through {name} ({} bytes)",
                    b.len()
                ));
            }
        }
    }
    report.note(format!(
        "{resolved} of {} links resolved, inside; /etc/shadow directly readable: {direct_shadow}",
        targets.len()
    ));
    let (src, dst) = (cstr("/etc/shadow"), cstr(&format!("{dir}/shadow-hardlink")));
    // SAFETY: NUL-terminated paths.
    let r = unsafe { libc::link(src.as_ptr(), dst.as_ptr()) };
    if r == 0 {
        let readable = read_file(&format!("{dir}/shadow-hardlink")).is_ok();
        report.record(
            readable && !direct_shadow,
            format!("hard link to /etc/shadow created (readable: {readable})"),
        );
    } else {
        report.note(format!("hard link to /etc/shadow: {}", errno_name(errno())));
    }
    let _ = std::fs::remove_dir_all(dir);
    report.finish()
}
