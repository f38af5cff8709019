//! Escape or widen the filesystem view with mounts: mount proc, tmpfs,
//! sysfs and devtmpfs, bind-mount `/`, clone the tree with open_tree, build
//! a filesystem with fsopen, pivot_root(".", ".") plus a detach of the old
//! root, and detach /tmp and /proc.
//!
//! Contained: every call fails (the seccomp policy answers EPERM for the
//! whole mount family, and the sandbox has no CAP_SYS_ADMIN). Escaped: any
//! of them succeeded. Each attempt only touches the sandbox's own mount
//! namespace, and the program refuses to run outside a user namespace.

use brig_hostile::{check, cstr, guard_destructive, outcome, Args, Report};

fn mount(src: &str, target: &str, fstype: &str, flags: libc::c_ulong) -> Result<libc::c_long, i32> {
    let (s, t, f) = (cstr(src), cstr(target), cstr(fstype));
    // SAFETY: NUL-terminated strings, NULL data.
    check(
        unsafe { libc::mount(s.as_ptr(), t.as_ptr(), f.as_ptr(), flags, std::ptr::null()) }
            as libc::c_long,
    )
}

fn main() {
    let args = Args::get();
    guard_destructive("mount_escape", &args);
    let mut report = Report::new("mount_escape");
    let dir = "/tmp/brig-hostile-mnt";
    let _ = std::fs::create_dir_all(dir);

    let attempts: Vec<(&str, Result<libc::c_long, i32>)> = vec![
        ("mount proc", mount("proc", dir, "proc", 0)),
        ("mount tmpfs", mount("tmpfs", dir, "tmpfs", 0)),
        ("mount sysfs", mount("sysfs", dir, "sysfs", 0)),
        ("mount devtmpfs", mount("devtmpfs", dir, "devtmpfs", 0)),
        ("bind /", mount("/", dir, "", libc::MS_BIND | libc::MS_REC)),
        ("remount / rw", mount("", "/", "", libc::MS_REMOUNT)),
        (
            "make / shared",
            mount("", "/", "", libc::MS_SHARED | libc::MS_REC),
        ),
        ("open_tree / clone", {
            let p = cstr("/");
            // SAFETY: NUL-terminated path; flags are plain integers.
            check(unsafe {
                libc::syscall(
                    libc::SYS_open_tree,
                    libc::AT_FDCWD,
                    p.as_ptr(),
                    1 /* OPEN_TREE_CLONE */ | libc::AT_RECURSIVE,
                )
            })
        }),
        ("fsopen tmpfs", {
            let p = cstr("tmpfs");
            // SAFETY: NUL-terminated name.
            check(unsafe { libc::syscall(libc::SYS_fsopen, p.as_ptr(), 0) })
        }),
        ("mount_setattr /usr clear ro", {
            let p = cstr("/usr");
            // struct mount_attr { attr_set, attr_clr, propagation, userns_fd }
            let attr: [u64; 4] = [0, 1 /* MOUNT_ATTR_RDONLY */, 0, 0];
            // SAFETY: attr is a valid mount_attr of the size passed.
            check(unsafe {
                libc::syscall(
                    libc::SYS_mount_setattr,
                    libc::AT_FDCWD,
                    p.as_ptr(),
                    0,
                    attr.as_ptr(),
                    32,
                )
            })
        }),
        ("pivot_root . .", {
            let (slash, dot) = (cstr("/"), cstr("."));
            // SAFETY: NUL-terminated paths.
            unsafe { libc::chdir(slash.as_ptr()) };
            // SAFETY: NUL-terminated paths.
            check(unsafe { libc::syscall(libc::SYS_pivot_root, dot.as_ptr(), dot.as_ptr()) })
        }),
        ("umount2 /tmp detach", {
            let p = cstr("/tmp");
            // SAFETY: NUL-terminated path.
            check(unsafe { libc::umount2(p.as_ptr(), libc::MNT_DETACH) } as libc::c_long)
        }),
        ("umount2 /proc detach", {
            let p = cstr("/proc");
            // SAFETY: NUL-terminated path.
            check(unsafe { libc::umount2(p.as_ptr(), libc::MNT_DETACH) } as libc::c_long)
        }),
    ];
    for (what, r) in attempts {
        report.record(r.is_ok(), format!("{what}: {}", outcome(&r)));
    }
    report.finish()
}
