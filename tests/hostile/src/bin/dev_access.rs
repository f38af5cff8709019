//! Reach hardware and kernel memory through device nodes: open /dev/kvm,
//! /dev/mem, /dev/kmem, /dev/port, disks (/dev/sda, /dev/vda, nvme, xvda,
//! loop), /dev/kmsg, consoles, /dev/fuse, /dev/net/tun, msr; then mknod
//! block and character devices (sda 8:0, vda 254:0, mem 1:1, kmsg 1:11) in
//! /tmp and /dev and open them.
//!
//! Contained: none of these opens succeeds — the nodes do not exist in the
//! sandbox's minimal /dev, mknod is refused, and a node made anyway cannot
//! be opened (the filesystem is nodev for the sandbox). The program only
//! opens, never reads or writes. Escaped: any open succeeded.

use brig_hostile::{cstr, errno, errno_name, list_dir, open, Args, Report};

const DEVICES: &[&str] = &[
    "/dev/kvm",
    "/dev/mem",
    "/dev/kmem",
    "/dev/port",
    "/dev/sda",
    "/dev/sda1",
    "/dev/vda",
    "/dev/vda1",
    "/dev/vdb",
    "/dev/nvme0n1",
    "/dev/xvda",
    "/dev/loop0",
    "/dev/loop-control",
    "/dev/mapper/control",
    "/dev/kmsg",
    "/dev/tty0",
    "/dev/tty1",
    "/dev/ttyS0",
    "/dev/fuse",
    "/dev/net/tun",
    "/dev/cpu/0/msr",
    "/dev/hwrng",
    "/dev/rtc0",
    "/dev/btrfs-control",
    "/dev/autofs",
    "/dev/vhost-net",
    "/dev/vsock",
    "/dev/dri/card0",
    "/dev/sg0",
    "/dev/uinput",
    "/dev/userfaultfd",
];

/// Devices whose mere opening has effects (a watchdog starts counting down
/// and may reboot the machine when closed; snapshot prepares hibernation):
/// only their existence is checked.
const STAT_ONLY: &[&str] = &["/dev/watchdog", "/dev/watchdog0", "/dev/snapshot"];

const EXPECTED: &[&str] = &[
    "null", "zero", "full", "random", "urandom", "tty", "ptmx", "pts", "shm", "fd", "stdin",
    "stdout", "stderr", "console", "mqueue", "core",
];

fn main() {
    let _args = Args::get();
    let mut report = Report::new("dev_access");
    match list_dir("/dev") {
        Ok(names) => {
            let extra: Vec<&String> = names
                .iter()
                .filter(|n| !EXPECTED.contains(&n.as_str()))
                .collect();
            report.note(format!(
                "/dev has {} entries; beyond the minimal set: {extra:?}",
                names.len()
            ));
        }
        Err(e) => report.note(format!("/dev: {}", errno_name(e))),
    }
    let mut absent = 0;
    for dev in DEVICES {
        match open(dev, libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY) {
            Ok(_) => report.escape(format!("opened {dev}")),
            Err(libc::ENOENT) => absent += 1,
            Err(e) => report.note(format!("{dev}: {}", errno_name(e))),
        }
    }
    report.note(format!(
        "{absent} of {} sensitive device paths do not exist",
        DEVICES.len()
    ));
    for dev in STAT_ONLY {
        if let Ok(meta) = std::fs::metadata(dev) {
            use std::os::unix::fs::FileTypeExt as _;
            report.record(
                meta.file_type().is_char_device(),
                format!("{dev} exists ({:?})", meta.file_type()),
            );
        }
    }
    // /dev/console may legitimately be the sandbox's own pty; the host's
    // console is character device 5:1.
    if let Ok(fd) = open(
        "/dev/console",
        libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY,
    ) {
        use std::os::fd::AsRawFd as _;
        // SAFETY: zeroed stat is a valid out-parameter.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fd is open, st is a valid out-pointer.
        unsafe { libc::fstat(fd.as_raw_fd(), &mut st) };
        let (ma, mi) = (libc::major(st.st_rdev), libc::minor(st.st_rdev));
        report.record(
            (ma, mi) == (5, 1),
            format!("opened /dev/console, device {ma}:{mi}"),
        );
    }

    // A private devpts instance shows no terminal but the sandbox's own (and
    // none at all without -t); the host's /dev/pts would list the host's.
    // SAFETY: isatty only queries the fd.
    let have_tty = (0..3).any(|fd| unsafe { libc::isatty(fd) } == 1);
    match list_dir("/dev/pts") {
        Ok(names) => {
            let ptys: Vec<&String> = names.iter().filter(|n| n.parse::<u32>().is_ok()).collect();
            let mut opened = Vec::new();
            for p in &ptys {
                if open(
                    &format!("/dev/pts/{p}"),
                    libc::O_RDWR | libc::O_NOCTTY | libc::O_NONBLOCK,
                )
                .is_ok()
                {
                    opened.push(p.to_string());
                }
            }
            let foreign = !have_tty && !ptys.is_empty();
            report.record(
                foreign,
                format!("/dev/pts terminals: {ptys:?} (opened: {opened:?}; we have a terminal: {have_tty})"),
            );
        }
        Err(e) => report.note(format!("/dev/pts: {}", errno_name(e))),
    }

    let nodes: &[(&str, libc::mode_t, u32, u32)] = &[
        ("/tmp/brig-hostile-sda", libc::S_IFBLK, 8, 0),
        ("/tmp/brig-hostile-vda", libc::S_IFBLK, 254, 0),
        ("/tmp/brig-hostile-mem", libc::S_IFCHR, 1, 1),
        ("/tmp/brig-hostile-kmsg", libc::S_IFCHR, 1, 11),
        ("/dev/brig-hostile-vda", libc::S_IFBLK, 254, 0),
        ("/dev/shm/brig-hostile-sda", libc::S_IFBLK, 8, 0),
    ];
    for (path, kind, major, minor) in nodes {
        let p = cstr(path);
        // SAFETY: NUL-terminated path; makedev is a pure computation.
        let r = unsafe { libc::mknod(p.as_ptr(), kind | 0o600, libc::makedev(*major, *minor)) };
        if r != 0 {
            report.note(format!(
                "mknod {path} ({major}:{minor}): {}",
                errno_name(errno())
            ));
            continue;
        }
        match open(path, libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY) {
            Ok(_) => report.escape(format!("mknod {path} ({major}:{minor}) and opened it")),
            Err(e) => report.note(format!(
                "mknod {path} ({major}:{minor}): ok, but open: {}",
                errno_name(e)
            )),
        }
        let _ = std::fs::remove_file(path);
    }
    report.finish()
}
