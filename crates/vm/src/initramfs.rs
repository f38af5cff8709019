//! The initramfs brig assembles for every guest: a newc cpio archive
//! (the format the kernel unpacks, `Documentation/driver-api/early-userspace`)
//! written here, uncompressed (the kernel reads it as is; compressing
//! would only add the guest's decompression to every boot).
//!
//! ```text
//! /init                 brig-agent (static), started as `/init --vm-init`
//! /brig/modules/*.ko    the guest kernel's modules, /brig/modules.order
//! /dev/console          the console the kernel opens for /init's stdio
//! /dev /proc /sys /lower /disk /newroot   mount points
//! ```

use std::fs;
use std::io;
use std::path::Path;

use crate::kernel::GuestKernel;

/// A newc archive being written.
#[derive(Debug, Default)]
pub struct Cpio {
    out: Vec<u8>,
    ino: u32,
}

const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFCHR: u32 = 0o020000;

impl Cpio {
    pub fn new() -> Cpio {
        Cpio::default()
    }

    fn entry(&mut self, name: &str, mode: u32, rdev: (u32, u32), data: &[u8]) {
        self.ino += 1;
        let name_len = name.len() + 1;
        let fields = [
            self.ino,
            mode,
            0, // uid
            0, // gid
            if mode & S_IFDIR != 0 { 2 } else { 1 },
            0, // mtime
            data.len() as u32,
            0, // dev major
            0, // dev minor
            rdev.0,
            rdev.1,
            name_len as u32,
            0, // check
        ];
        self.out.extend_from_slice(b"070701");
        for f in fields {
            self.out.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
    }

    pub fn dir(&mut self, name: &str) {
        self.entry(name, S_IFDIR | 0o755, (0, 0), &[]);
    }

    pub fn file(&mut self, name: &str, mode: u32, data: &[u8]) {
        self.entry(name, S_IFREG | mode, (0, 0), data);
    }

    pub fn char_device(&mut self, name: &str, mode: u32, major: u32, minor: u32) {
        self.entry(name, S_IFCHR | mode, (major, minor), &[]);
    }

    /// The archive, with its trailer.
    pub fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, (0, 0), &[]);
        // The kernel reads whole 512-byte blocks, as cpio writes them.
        while !self.out.len().is_multiple_of(512) {
            self.out.push(0);
        }
        self.out
    }
}

/// Write the guest's initramfs to `out` (made aside and renamed: QEMU
/// processes starting meanwhile read the old one whole).
pub fn build(kernel: &GuestKernel, agent: &Path, out: &Path) -> io::Result<()> {
    let mut cpio = Cpio::new();
    for d in [
        "dev",
        "proc",
        "sys",
        "lower",
        "disk",
        "newroot",
        "brig",
        "brig/modules",
    ] {
        cpio.dir(d);
    }
    // /dev/console (5, 1): without it /init starts with no stdio, and its
    // last words (why a bring-up failed) reach nobody.
    cpio.char_device("dev/console", 0o600, 5, 1);
    cpio.file("init", 0o755, &fs::read(agent)?);
    let mut order = String::new();
    for m in &kernel.modules {
        let name = m
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "module name"))?;
        cpio.file(&format!("brig/modules/{name}"), 0o644, &fs::read(m)?);
        order.push_str(name);
        order.push('\n');
    }
    cpio.file("brig/modules.order", 0o644, order.as_bytes());
    let tmp = out.with_extension(format!("tmp{}", std::process::id()));
    fs::write(&tmp, cpio.finish())?;
    fs::rename(&tmp, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_newc_headers_padded_to_four_bytes() {
        let mut c = Cpio::new();
        c.dir("dev");
        c.file("init", 0o755, b"abc");
        c.char_device("dev/console", 0o600, 5, 1);
        let out = c.finish();
        assert_eq!(out.len() % 512, 0);
        assert!(out.starts_with(b"070701"));
        // The first header: inode 1, a directory 0755, name "dev\0".
        let field = |at: usize, i: usize| {
            u32::from_str_radix(
                std::str::from_utf8(&out[at + 6 + 8 * i..][..8]).unwrap(),
                16,
            )
            .unwrap()
        };
        assert_eq!(field(0, 1), 0o040755);
        assert_eq!(field(0, 11), 4);
        assert_eq!(&out[110..114], b"dev\0");
        // The second starts on a 4-byte boundary after the first.
        let second = out
            .windows(6)
            .enumerate()
            .skip(1)
            .find(|(_, w)| *w == b"070701")
            .map(|(i, _)| i)
            .unwrap();
        assert_eq!(second % 4, 0);
        assert_eq!(field(second, 1), 0o100755);
        assert_eq!(field(second, 6), 3);
        let name_end = second + 110 + 5;
        let data_at = name_end.div_ceil(4) * 4;
        assert_eq!(&out[data_at..data_at + 3], b"abc");
        let third = out[data_at..]
            .windows(6)
            .position(|w| w == b"070701")
            .unwrap()
            + data_at;
        assert_eq!(field(third, 1), 0o020600);
        assert_eq!((field(third, 9), field(third, 10)), (5, 1));
        assert!(out.windows(10).any(|w| w == b"TRAILER!!!"));
    }

    /// What the kernel unpacks is what cpio(1) reads back.
    #[test]
    fn cpio_lists_the_archive() {
        if std::process::Command::new("cpio")
            .arg("--version")
            .output()
            .is_err()
        {
            eprintln!("skipped: no cpio(1) to read the archive back (apt-get install cpio)");
            return;
        }
        let mut c = Cpio::new();
        c.dir("brig");
        c.file("brig/modules.order", 0o644, b"a.ko\n");
        c.file("init", 0o755, &[0u8; 1001]);
        let dir = tempfile::tempdir().unwrap();
        let archive = dir.path().join("a.cpio");
        fs::write(&archive, c.finish()).unwrap();
        let out = std::process::Command::new("cpio")
            .args(["-itv", "-F"])
            .arg(&archive)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let listing = String::from_utf8_lossy(&out.stdout);
        assert!(listing.contains("brig/modules.order"), "{listing}");
        assert!(
            listing
                .lines()
                .any(|l| l.contains(" 1001 ") && l.ends_with("init")),
            "{listing}"
        );
    }
}
