//! Defeat KASLR and learn about the host from kernel interfaces: read
//! /proc/kcore, /proc/kmsg and the kernel log (syslog READ_ALL); look for
//! non-zero addresses in /proc/kallsyms, /proc/modules, /proc/iomem and
//! /proc/self/stack; read a physical frame number from /proc/self/pagemap;
//! list debugfs. Host-wide tables Docker masks (/proc/timer_list,
//! /proc/sched_debug, /proc/interrupts) are reported for information.
//!
//! Contained: kcore, kmsg and the kernel log are unreadable, every address
//! shown is zero, the pagemap frame number is zero. Escaped: any real
//! kernel address, physical address, kernel memory or log line was read.

use brig_hostile::{errno_name, open, read_file, read_prefix, Args, Report};

fn first_hex(line: &str) -> Option<u64> {
    let tok = line
        .split_whitespace()
        .find(|t| t.starts_with("0x") || t.chars().all(|c| c.is_ascii_hexdigit()))?;
    u64::from_str_radix(tok.trim_start_matches("0x").split('-').next()?, 16).ok()
}

fn main() {
    let _args = Args::get();
    let mut report = Report::new("kernel_info_leak");

    match read_prefix("/proc/kcore", 64) {
        Ok(b) => report.escape(format!("read {} bytes of /proc/kcore", b.len())),
        Err(e) => report.note(format!("/proc/kcore: {}", errno_name(e))),
    }
    match open("/proc/kmsg", libc::O_RDONLY | libc::O_NONBLOCK) {
        Ok(_) => report.escape("opened /proc/kmsg"),
        Err(e) => report.note(format!("/proc/kmsg: {}", errno_name(e))),
    }
    let mut buf = vec![0u8; 4096];
    // SAFETY: buf is writable for its length. SYSLOG_ACTION_READ_ALL = 3.
    let n = unsafe { libc::klogctl(3, buf.as_mut_ptr().cast(), buf.len() as i32) };
    if n > 0 {
        report.escape(format!(
            "read {n} bytes of the kernel log via syslog(READ_ALL)"
        ));
    } else {
        report.note(format!(
            "syslog(READ_ALL): {}",
            if n == 0 {
                "empty".into()
            } else {
                errno_name(brig_hostile::errno())
            }
        ));
    }

    match read_prefix("/proc/kallsyms", 64 * 1024) {
        Ok(b) => {
            let text = String::from_utf8_lossy(&b);
            let nonzero = text
                .lines()
                .filter(|l| first_hex(l).is_some_and(|a| a != 0))
                .count();
            report.record(
                nonzero > 0,
                format!(
                    "/proc/kallsyms: {} lines read, {nonzero} with non-zero addresses",
                    text.lines().count()
                ),
            );
        }
        Err(e) => report.note(format!("/proc/kallsyms: {}", errno_name(e))),
    }
    match read_file("/proc/modules") {
        Ok(b) => {
            let text = String::from_utf8_lossy(&b);
            let nonzero = text
                .lines()
                .filter(|l| {
                    l.split_whitespace()
                        .last()
                        .and_then(|t| u64::from_str_radix(t.trim_start_matches("0x"), 16).ok())
                        .is_some_and(|a| a != 0)
                })
                .count();
            report.record(
                nonzero > 0,
                format!(
                    "/proc/modules: {} modules, {nonzero} with non-zero load addresses",
                    text.lines().count()
                ),
            );
        }
        Err(e) => report.note(format!("/proc/modules: {}", errno_name(e))),
    }
    match read_file("/proc/iomem") {
        Ok(b) => {
            let text = String::from_utf8_lossy(&b);
            let nonzero = text
                .lines()
                .filter(|l| first_hex(l.trim_start()).is_some_and(|a| a != 0))
                .count();
            report.record(
                nonzero > 0,
                format!(
                    "/proc/iomem: {} ranges, {nonzero} with non-zero physical addresses",
                    text.lines().count()
                ),
            );
        }
        Err(e) => report.note(format!("/proc/iomem: {}", errno_name(e))),
    }
    match read_file("/proc/self/stack") {
        Ok(b) => {
            let text = String::from_utf8_lossy(&b);
            let leaked = text.contains("0xffff");
            report.record(
                leaked,
                format!(
                    "/proc/self/stack readable ({} lines, addresses: {leaked})",
                    text.lines().count()
                ),
            );
        }
        Err(e) => report.note(format!("/proc/self/stack: {}", errno_name(e))),
    }

    // Physical frame number of one of our own pages.
    let page = Box::new([0x77u8; 4096]);
    let addr = page.as_ptr() as u64;
    match std::fs::File::open("/proc/self/pagemap") {
        Ok(f) => {
            use std::os::unix::fs::FileExt as _;
            let mut entry = [0u8; 8];
            match f.read_exact_at(&mut entry, (addr / 4096) * 8) {
                Ok(()) => {
                    let v = u64::from_ne_bytes(entry);
                    let pfn = v & ((1 << 55) - 1);
                    report.record(
                        pfn != 0,
                        format!("pagemap: present {}, pfn {pfn:#x}", v >> 63),
                    );
                }
                Err(e) => report.note(format!("pagemap read: {e}")),
            }
        }
        Err(e) => report.note(format!("pagemap: {e}")),
    }
    drop(page);

    let mut readable = Vec::new();
    for f in [
        "/proc/timer_list",
        "/proc/sched_debug",
        "/proc/interrupts",
        "/proc/latency_stats",
        "/proc/config.gz",
        "/proc/slabinfo",
        "/proc/vmallocinfo",
    ] {
        if read_prefix(f, 16).is_ok() {
            readable.push(f);
        }
    }
    report.note(format!(
        "readable host-wide tables (info; Docker masks some): {readable:?}"
    ));
    for f in [
        "/proc/sys/kernel/kptr_restrict",
        "/proc/sys/kernel/dmesg_restrict",
    ] {
        let v = read_file(f).map(|b| String::from_utf8_lossy(&b).trim().to_string());
        report.note(format!("{f} = {}", v.unwrap_or_else(errno_name)));
    }
    report.finish()
}
