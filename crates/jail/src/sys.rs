//! The privileged system calls of the sandbox bring-up, behind one trait.
//!
//! [`Linux`] makes the calls; [`Recording`] only writes down what would have
//! been called, so the bring-up sequence can be unit-tested without root.
//! The trait's methods take only pre-built C strings and plain integers: the
//! real implementation runs in a freshly cloned child where allocating is
//! not safe (the parent may be multi-threaded), so nothing here allocates.

use std::ffi::CStr;
use std::fmt;
use std::os::fd::RawFd;

/// A raw `errno` value. Copy and allocation-free so the cloned child can
/// carry it back to the parent through a pipe.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Errno(pub i32);

impl Errno {
    pub fn last() -> Self {
        Errno(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", std::io::Error::from_raw_os_error(self.0))
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

pub type SysResult<T = ()> = Result<T, Errno>;

/// A system call whose failure comes back in its return value, never
/// through libc's `errno`.
///
/// Why not the libc wrappers: the init of a sandbox that runs its own
/// reaper (`Extras::as_init`) is cloned with `CLONE_VM` and keeps the
/// spawning thread's TLS, so `errno` is one word that it and that thread
/// both write, at the same time: the thread goes on creating cgroups
/// (`fs::canonicalize`, i.e. realpath, leaves `EINVAL` there from every
/// readlink of a non-link) while the init builds its root. An expected
/// `mkdir` `EEXIST` then read back as `EINVAL` failed the spawn ("cannot
/// create directory /run/brig/mnt/root/proc: Invalid argument"), and the
/// init's errors can equally corrupt the thread's. The kernel's return
/// value (`-errno`) belongs to the caller alone.
///
/// # Safety
///
/// As for `syscall(2)`: `args` must be what system call `nr` expects
/// (pointers valid for what the call reads or writes).
unsafe fn raw(nr: libc::c_long, args: &[usize]) -> SysResult<usize> {
    let mut a = [0usize; 6];
    a[..args.len()].copy_from_slice(args);
    let ret: isize;
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the x86_64 system call ABI (number and result in rax,
    // arguments in rdi, rsi, rdx, r10, r8, r9; rcx and r11 clobbered); the
    // caller vouches for the arguments.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") nr as isize => ret,
            in("rdi") a[0],
            in("rsi") a[1],
            in("rdx") a[2],
            in("r10") a[3],
            in("r8") a[4],
            in("r9") a[5],
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: the aarch64 system call ABI (number in x8, arguments in
    // x0-x5, result in x0); the caller vouches for the arguments.
    unsafe {
        std::arch::asm!(
            "svc 0",
            in("x8") nr,
            inlateout("x0") a[0] as isize => ret,
            in("x1") a[1],
            in("x2") a[2],
            in("x3") a[3],
            in("x4") a[4],
            in("x5") a[5],
            options(nostack),
        );
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    // SAFETY: as above. (errno again on other architectures: the race
    // described above is back there.)
    unsafe {
        let r = libc::syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
        ret = if r < 0 {
            -(Errno::last().0 as isize)
        } else {
            r as isize
        };
    }
    // The kernel's errors are -4095..=-1; anything else is a result.
    if (-4095..0).contains(&ret) {
        Err(Errno(-ret as i32))
    } else {
        Ok(ret as usize)
    }
}

/// A C string's address, as a system call argument.
fn ptr(s: &CStr) -> usize {
    s.as_ptr() as usize
}

fn opt_ptr(s: Option<&CStr>) -> usize {
    s.map_or(0, ptr)
}

/// `AT_FDCWD`, sign-extended as the kernel reads an `int` argument.
const CWD: usize = libc::AT_FDCWD as isize as usize;

/// Every privileged call the sandbox's init makes on its way to `execve`.
pub trait Syscalls {
    fn mount(
        &self,
        source: Option<&CStr>,
        target: &CStr,
        fstype: Option<&CStr>,
        flags: libc::c_ulong,
        data: Option<&CStr>,
    ) -> SysResult;
    fn umount(&self, target: &CStr, flags: libc::c_int) -> SysResult;
    /// Attach a detached mount (from `open_tree`) at `target`.
    fn move_mount(&self, from_fd: RawFd, target: &CStr) -> SysResult;
    /// `pivot_root(".", ".")` after `chdir(new_root)`: swaps the root without
    /// needing a directory for the old one.
    fn pivot_root_here(&self, new_root: &CStr) -> SysResult;
    fn chdir(&self, path: &CStr) -> SysResult;
    fn mkdir(&self, path: &CStr, mode: libc::mode_t) -> SysResult;
    fn symlink(&self, target: &CStr, link: &CStr) -> SysResult;
    /// Create an empty file to bind a device node or file over.
    fn touch(&self, path: &CStr) -> SysResult;
    /// Create (or replace) a file holding `data` with permissions `mode`,
    /// never through a symlink.
    fn write_file(&self, path: &CStr, data: &[u8], mode: u32) -> SysResult;
    fn chown(&self, path: &CStr, uid: u32, gid: u32) -> SysResult;
    fn sethostname(&self, name: &[u8]) -> SysResult;
    fn unshare(&self, flags: libc::c_int) -> SysResult;
    /// Enter a new time namespace for what this process starts or execs
    /// next, its CLOCK_BOOTTIME (uptime) moved back by `boottime_secs`.
    fn new_clock(&self, boottime_secs: i64) -> SysResult;
    fn setrlimit(&self, resource: libc::c_int, soft: u64, hard: u64) -> SysResult;
    /// Bring the network namespace's loopback interface up.
    fn loopback_up(&self) -> SysResult;
    /// Remove every capability not in `keep` from the bounding set.
    fn drop_bounding_set(&self, keep: u64) -> SysResult;
    /// Set the effective, permitted and inheritable sets to `caps`.
    fn set_capabilities(&self, caps: u64) -> SysResult;
    fn set_ids(&self, uid: u32, gid: u32, groups: &[libc::gid_t]) -> SysResult;
    fn set_no_new_privs(&self) -> SysResult;
    fn install_seccomp(&self, program: &[libc::sock_filter]) -> SysResult;
    /// Hold the directory `path` open (`O_PATH`, close-on-exec) as
    /// descriptor `at` exactly; `EBUSY` if `at` is taken.
    fn hold_dir(&self, path: &CStr, at: RawFd) -> SysResult {
        let _ = (path, at);
        Err(Errno(libc::ENOSYS))
    }
}

/// The real thing.
#[derive(Debug, Default, Clone, Copy)]
pub struct Linux;

// Every call below is `raw`, not the libc wrapper: see there.
impl Syscalls for Linux {
    fn mount(
        &self,
        source: Option<&CStr>,
        target: &CStr,
        fstype: Option<&CStr>,
        flags: libc::c_ulong,
        data: Option<&CStr>,
    ) -> SysResult {
        // SAFETY: every pointer is either null or a NUL-terminated string that
        // outlives the call.
        unsafe {
            raw(
                libc::SYS_mount,
                &[
                    opt_ptr(source),
                    ptr(target),
                    opt_ptr(fstype),
                    flags as usize,
                    opt_ptr(data),
                ],
            )
        }
        .map(drop)
    }

    fn umount(&self, target: &CStr, flags: libc::c_int) -> SysResult {
        // SAFETY: target is a valid C string.
        unsafe { raw(libc::SYS_umount2, &[ptr(target), flags as usize]) }.map(drop)
    }

    fn move_mount(&self, from_fd: RawFd, target: &CStr) -> SysResult {
        const MOVE_MOUNT_F_EMPTY_PATH: usize = 0x4;
        // SAFETY: a valid fd, an empty path and a valid target string; the
        // kernel does not retain the pointers.
        unsafe {
            raw(
                libc::SYS_move_mount,
                &[
                    from_fd as usize,
                    ptr(c""),
                    CWD,
                    ptr(target),
                    MOVE_MOUNT_F_EMPTY_PATH,
                ],
            )
        }
        .map(drop)
    }

    fn pivot_root_here(&self, new_root: &CStr) -> SysResult {
        self.chdir(new_root)?;
        // SAFETY: "." is a valid path for both arguments; after the call the
        // old root is stacked on top of the new one at "." and is detached
        // right away below.
        unsafe { raw(libc::SYS_pivot_root, &[ptr(c"."), ptr(c".")]) }?;
        self.umount(c".", libc::MNT_DETACH)?;
        self.chdir(c"/")
    }

    fn chdir(&self, path: &CStr) -> SysResult {
        // SAFETY: path is a valid C string.
        unsafe { raw(libc::SYS_chdir, &[ptr(path)]) }.map(drop)
    }

    fn mkdir(&self, path: &CStr, mode: libc::mode_t) -> SysResult {
        // SAFETY: path is a valid C string.
        match unsafe { raw(libc::SYS_mkdirat, &[CWD, ptr(path), mode as usize]) } {
            Err(Errno(libc::EEXIST)) => Ok(()),
            r => r.map(drop),
        }
    }

    fn symlink(&self, target: &CStr, link: &CStr) -> SysResult {
        // SAFETY: both are valid C strings.
        unsafe { raw(libc::SYS_symlinkat, &[ptr(target), CWD, ptr(link)]) }.map(drop)
    }

    fn hold_dir(&self, path: &CStr, at: RawFd) -> SysResult {
        let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC;
        // SAFETY: path is a valid C string; the result is checked.
        let fd = unsafe { raw(libc::SYS_openat, &[CWD, ptr(path), flags as usize, 0]) }?;
        // SAFETY: fcntl on the descriptor just opened.
        let moved = unsafe {
            raw(
                libc::SYS_fcntl,
                &[fd, libc::F_DUPFD_CLOEXEC as usize, at as usize],
            )
        };
        // SAFETY: fd was just opened by us; its copy (if any) stays.
        let _ = unsafe { raw(libc::SYS_close, &[fd]) };
        match moved {
            Ok(got) if got == at as usize => Ok(()),
            Ok(got) => {
                // SAFETY: the copy just made, at the wrong number.
                let _ = unsafe { raw(libc::SYS_close, &[got]) };
                Err(Errno(libc::EBUSY))
            }
            Err(e) => Err(e),
        }
    }

    fn touch(&self, path: &CStr) -> SysResult {
        let flags = libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC;
        // SAFETY: path is a valid C string; the descriptor is closed at once.
        let fd = unsafe { raw(libc::SYS_openat, &[CWD, ptr(path), flags as usize, 0o644]) }?;
        // SAFETY: fd was just opened by us.
        let _ = unsafe { raw(libc::SYS_close, &[fd]) };
        Ok(())
    }

    fn write_file(&self, path: &CStr, data: &[u8], mode: u32) -> SysResult {
        let flags =
            libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        // SAFETY: path is a valid C string.
        let fd = unsafe { raw(libc::SYS_openat, &[CWD, ptr(path), flags as usize, 0o600]) }?;
        let written = (|| {
            let mut left = data;
            while !left.is_empty() {
                // SAFETY: fd is ours and open; the buffer is `left.len()` readable bytes.
                let n = unsafe { raw(libc::SYS_write, &[fd, left.as_ptr() as usize, left.len()]) }?;
                left = &left[n..];
            }
            // The mode as given, whatever the umask.
            // SAFETY: fd is ours and open.
            unsafe { raw(libc::SYS_fchmod, &[fd, mode as usize]) }.map(drop)
        })();
        // SAFETY: fd was opened above and is closed once.
        let _ = unsafe { raw(libc::SYS_close, &[fd]) };
        written
    }

    fn chown(&self, path: &CStr, uid: u32, gid: u32) -> SysResult {
        // SAFETY: path is a valid C string; flags 0 follows symlinks, as
        // chown(2) does.
        unsafe {
            raw(
                libc::SYS_fchownat,
                &[CWD, ptr(path), uid as usize, gid as usize, 0],
            )
        }
        .map(drop)
    }

    fn sethostname(&self, name: &[u8]) -> SysResult {
        // SAFETY: pointer and length describe a live byte slice.
        unsafe { raw(libc::SYS_sethostname, &[name.as_ptr() as usize, name.len()]) }.map(drop)
    }

    fn unshare(&self, flags: libc::c_int) -> SysResult {
        // SAFETY: unshare takes only flags.
        unsafe { raw(libc::SYS_unshare, &[flags as usize]) }.map(drop)
    }

    fn new_clock(&self, boottime_secs: i64) -> SysResult {
        self.unshare(libc::CLONE_NEWTIME)?;
        // "boottime -<secs> 0": the offsets of the namespace just made,
        // writable until a process enters it. Formatted without
        // allocating (this runs in the sandbox's init).
        let mut line = [0u8; 48];
        let prefix = b"boottime -";
        line[..prefix.len()].copy_from_slice(prefix);
        let mut len = prefix.len();
        let mut digits = [0u8; 20];
        let mut n = boottime_secs.unsigned_abs();
        let mut d = digits.len();
        loop {
            d -= 1;
            digits[d] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        line[len..len + digits.len() - d].copy_from_slice(&digits[d..]);
        len += digits.len() - d;
        line[len..len + 3].copy_from_slice(b" 0\n");
        len += 3;
        // Our /proc files belong to the host's root while we are not
        // dumpable (our credentials changed), which the sandbox's root may
        // not write: dumpable for the moment of the write (nothing else
        // runs in the sandbox yet), then not again.
        let path = c"/proc/self/timens_offsets";
        // SAFETY: prctl with integers.
        unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) };
        // SAFETY: path is a valid C string.
        let opened = unsafe {
            raw(
                libc::SYS_openat,
                &[CWD, ptr(path), (libc::O_WRONLY | libc::O_CLOEXEC) as usize],
            )
        };
        // SAFETY: prctl with integers.
        unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
        let fd = opened?;
        // SAFETY: fd is ours and open; `line[..len]` is readable.
        let written = unsafe { raw(libc::SYS_write, &[fd, line.as_ptr() as usize, len]) };
        // SAFETY: fd was opened above and is closed once.
        let _ = unsafe { raw(libc::SYS_close, &[fd]) };
        written.map(drop)
    }

    fn setrlimit(&self, resource: libc::c_int, soft: u64, hard: u64) -> SysResult {
        // struct rlimit64: two u64s, as glibc's setrlimit passes it.
        let lim: [u64; 2] = [soft, hard];
        // SAFETY: prlimit64 on ourselves (pid 0) with a valid new limit on
        // the stack and no old one asked for.
        unsafe {
            raw(
                libc::SYS_prlimit64,
                &[0, resource as usize, lim.as_ptr() as usize, 0],
            )
        }
        .map(drop)
    }

    fn loopback_up(&self) -> SysResult {
        let kind = libc::SOCK_DGRAM | libc::SOCK_CLOEXEC;
        // SAFETY: plain socket creation; closed below.
        let fd = unsafe {
            raw(
                libc::SYS_socket,
                &[libc::AF_INET as usize, kind as usize, 0],
            )
        }?;
        // SAFETY: ifreq is plain old data; all-zero is a valid value.
        let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
        for (dst, src) in ifr.ifr_name.iter_mut().zip(b"lo\0") {
            *dst = *src as libc::c_char;
        }
        let ifr_ptr = &mut ifr as *mut libc::ifreq as usize;
        // SAFETY: fd is our socket and ifr a valid ifreq naming "lo"; the
        // flags union member is the one SIOCGIFFLAGS/SIOCSIFFLAGS use.
        let res = unsafe {
            raw(libc::SYS_ioctl, &[fd, libc::SIOCGIFFLAGS as usize, ifr_ptr]).and_then(|_| {
                ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
                raw(libc::SYS_ioctl, &[fd, libc::SIOCSIFFLAGS as usize, ifr_ptr])
            })
        }
        .map(drop);
        // SAFETY: fd is ours and not used after this.
        let _ = unsafe { raw(libc::SYS_close, &[fd]) };
        res
    }

    fn drop_bounding_set(&self, keep: u64) -> SysResult {
        for cap in 0..=CAP_LAST {
            if keep & (1 << cap) == 0 {
                // SAFETY: prctl with integer arguments only.
                let r = unsafe {
                    raw(
                        libc::SYS_prctl,
                        &[libc::PR_CAPBSET_DROP as usize, cap as usize, 0, 0, 0],
                    )
                };
                match r {
                    // EINVAL: the running kernel does not know this capability.
                    Ok(_) | Err(Errno(libc::EINVAL)) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        // Ambient capabilities would survive execve of non-root programs.
        // SAFETY: prctl with integer arguments only.
        let _ = unsafe {
            raw(
                libc::SYS_prctl,
                &[
                    libc::PR_CAP_AMBIENT as usize,
                    libc::PR_CAP_AMBIENT_CLEAR_ALL as usize,
                    0,
                    0,
                    0,
                ],
            )
        };
        Ok(())
    }

    fn set_capabilities(&self, caps: u64) -> SysResult {
        #[repr(C)]
        struct Header {
            version: u32,
            pid: i32,
        }
        #[repr(C)]
        #[derive(Clone, Copy)]
        struct Data {
            effective: u32,
            permitted: u32,
            inheritable: u32,
        }
        const VERSION_3: u32 = 0x2008_0522;
        let header = Header {
            version: VERSION_3,
            pid: 0,
        };
        let (lo, hi) = (caps as u32, (caps >> 32) as u32);
        let data = [
            Data {
                effective: lo,
                permitted: lo,
                inheritable: 0,
            },
            Data {
                effective: hi,
                permitted: hi,
                inheritable: 0,
            },
        ];
        // SAFETY: header and data match the kernel's v3 capability ABI
        // (one header, two 32-bit data words) and live across the call.
        unsafe {
            raw(
                libc::SYS_capset,
                &[&header as *const Header as usize, data.as_ptr() as usize],
            )
        }
        .map(drop)
    }

    fn set_ids(&self, uid: u32, gid: u32, groups: &[libc::gid_t]) -> SysResult {
        // System calls, not the libc wrappers (also for this reason): glibc's
        // set*id and setgroups broadcast the change to every thread it knows
        // of, under a lock. In a child cloned from a multi-threaded process
        // those threads do not exist, and the wrapper would wait for them
        // forever. Order matters: groups and gid while we still have
        // CAP_SETGID, uid last.
        let (uid, gid) = (uid as usize, gid as usize);
        // SAFETY: groups is a live slice of gid_t; integer arguments.
        unsafe {
            raw(
                libc::SYS_setgroups,
                &[groups.len(), groups.as_ptr() as usize],
            )
        }?;
        // SAFETY: integer arguments only.
        unsafe { raw(libc::SYS_setresgid, &[gid, gid, gid]) }?;
        // SAFETY: as above.
        unsafe { raw(libc::SYS_setresuid, &[uid, uid, uid]) }.map(drop)
    }

    fn set_no_new_privs(&self) -> SysResult {
        // SAFETY: prctl with integer arguments only.
        unsafe {
            raw(
                libc::SYS_prctl,
                &[libc::PR_SET_NO_NEW_PRIVS as usize, 1, 0, 0, 0],
            )
        }
        .map(drop)
    }

    fn install_seccomp(&self, program: &[libc::sock_filter]) -> SysResult {
        let prog = libc::sock_fprog {
            len: program.len() as u16,
            filter: program.as_ptr() as *mut _,
        };
        // SAFETY: prog points at a live, well-formed BPF program; the kernel
        // copies it. TSYNC is not needed: the caller is single-threaded.
        unsafe {
            raw(
                libc::SYS_seccomp,
                &[
                    libc::SECCOMP_SET_MODE_FILTER as usize,
                    0,
                    &prog as *const libc::sock_fprog as usize,
                ],
            )
        }
        .map(drop)
    }
}

/// Highest capability number the bring-up knows of (CAP_CHECKPOINT_RESTORE).
pub const CAP_LAST: u32 = 40;

/// One recorded call, for tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    Mount {
        source: Option<String>,
        target: String,
        fstype: Option<String>,
        flags: libc::c_ulong,
        data: Option<String>,
    },
    Umount {
        target: String,
        flags: libc::c_int,
    },
    MoveMount {
        fd: RawFd,
        target: String,
    },
    PivotRoot {
        new_root: String,
    },
    Chdir(String),
    Mkdir {
        path: String,
        mode: libc::mode_t,
    },
    Symlink {
        target: String,
        link: String,
    },
    Touch(String),
    WriteFile {
        path: String,
        len: usize,
        mode: u32,
    },
    Chown {
        path: String,
        uid: u32,
        gid: u32,
    },
    Sethostname(String),
    Unshare(libc::c_int),
    NewClock(i64),
    Setrlimit {
        resource: libc::c_int,
        soft: u64,
        hard: u64,
    },
    LoopbackUp,
    DropBoundingSet {
        keep: u64,
    },
    SetCapabilities(u64),
    SetIds {
        uid: u32,
        gid: u32,
        groups: Vec<u32>,
    },
    NoNewPrivs,
    Seccomp {
        len: usize,
    },
}

/// A fake that records calls instead of making them. `fail_on` makes the
/// first call whose debug form contains the string fail with EPERM, to test
/// error paths.
#[derive(Debug, Default)]
pub struct Recording {
    pub calls: std::cell::RefCell<Vec<Call>>,
    pub fail_on: Option<String>,
}

impl Recording {
    fn record(&self, call: Call) -> SysResult {
        let fail = self
            .fail_on
            .as_ref()
            .is_some_and(|f| format!("{call:?}").contains(f.as_str()));
        self.calls.borrow_mut().push(call);
        if fail {
            Err(Errno(libc::EPERM))
        } else {
            Ok(())
        }
    }

    pub fn calls(&self) -> Vec<Call> {
        self.calls.borrow().clone()
    }
}

fn s(c: &CStr) -> String {
    c.to_string_lossy().into_owned()
}

impl Syscalls for Recording {
    fn mount(
        &self,
        source: Option<&CStr>,
        target: &CStr,
        fstype: Option<&CStr>,
        flags: libc::c_ulong,
        data: Option<&CStr>,
    ) -> SysResult {
        self.record(Call::Mount {
            source: source.map(s),
            target: s(target),
            fstype: fstype.map(s),
            flags,
            data: data.map(s),
        })
    }
    fn umount(&self, target: &CStr, flags: libc::c_int) -> SysResult {
        self.record(Call::Umount {
            target: s(target),
            flags,
        })
    }
    fn move_mount(&self, fd: RawFd, target: &CStr) -> SysResult {
        self.record(Call::MoveMount {
            fd,
            target: s(target),
        })
    }
    fn pivot_root_here(&self, new_root: &CStr) -> SysResult {
        self.record(Call::PivotRoot {
            new_root: s(new_root),
        })
    }
    fn chdir(&self, path: &CStr) -> SysResult {
        self.record(Call::Chdir(s(path)))
    }
    fn mkdir(&self, path: &CStr, mode: libc::mode_t) -> SysResult {
        self.record(Call::Mkdir {
            path: s(path),
            mode,
        })
    }
    fn symlink(&self, target: &CStr, link: &CStr) -> SysResult {
        self.record(Call::Symlink {
            target: s(target),
            link: s(link),
        })
    }
    fn touch(&self, path: &CStr) -> SysResult {
        self.record(Call::Touch(s(path)))
    }
    fn write_file(&self, path: &CStr, data: &[u8], mode: u32) -> SysResult {
        self.record(Call::WriteFile {
            path: s(path),
            len: data.len(),
            mode,
        })
    }
    fn chown(&self, path: &CStr, uid: u32, gid: u32) -> SysResult {
        self.record(Call::Chown {
            path: s(path),
            uid,
            gid,
        })
    }
    fn sethostname(&self, name: &[u8]) -> SysResult {
        self.record(Call::Sethostname(
            String::from_utf8_lossy(name).into_owned(),
        ))
    }
    fn unshare(&self, flags: libc::c_int) -> SysResult {
        self.record(Call::Unshare(flags))
    }
    fn new_clock(&self, boottime_secs: i64) -> SysResult {
        self.record(Call::NewClock(boottime_secs))
    }
    fn setrlimit(&self, resource: libc::c_int, soft: u64, hard: u64) -> SysResult {
        self.record(Call::Setrlimit {
            resource,
            soft,
            hard,
        })
    }
    fn loopback_up(&self) -> SysResult {
        self.record(Call::LoopbackUp)
    }
    fn drop_bounding_set(&self, keep: u64) -> SysResult {
        self.record(Call::DropBoundingSet { keep })
    }
    fn set_capabilities(&self, caps: u64) -> SysResult {
        self.record(Call::SetCapabilities(caps))
    }
    fn set_ids(&self, uid: u32, gid: u32, groups: &[libc::gid_t]) -> SysResult {
        self.record(Call::SetIds {
            uid,
            gid,
            groups: groups.to_vec(),
        })
    }
    fn set_no_new_privs(&self) -> SysResult {
        self.record(Call::NoNewPrivs)
    }
    fn install_seccomp(&self, program: &[libc::sock_filter]) -> SysResult {
        self.record(Call::Seccomp { len: program.len() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

    static STOP: AtomicBool = AtomicBool::new(false);
    static WRONG: AtomicU32 = AtomicU32::new(0);

    extern "C" fn expect_eexist(_: *mut libc::c_void) -> libc::c_int {
        for _ in 0..300_000 {
            if STOP.load(Ordering::Relaxed) {
                break;
            }
            // "/" exists: EEXIST, which mkdir treats as success.
            if Linux.mkdir(c"/", 0o755).is_err() {
                WRONG.fetch_add(1, Ordering::Relaxed);
            }
        }
        STOP.store(true, Ordering::Relaxed);
        0
    }

    /// The init of an `as_init` sandbox shares this thread's memory and
    /// TLS (CLONE_VM), errno included, while the thread goes on making
    /// failing libc calls (realpath, in cgroup set-up). Its expected errors
    /// must not turn into others: the spawn failed with "cannot create
    /// directory /run/brig/mnt/root/proc: Invalid argument" when they went
    /// through errno. (With errno, hundreds of the calls here are hit on
    /// two cores.)
    #[test]
    fn errors_do_not_travel_through_a_shared_errno() {
        let mut stack = vec![0u8; 256 << 10];
        // SAFETY: the top of our own buffer, rounded down to the 16 bytes
        // the ABI wants.
        let top = unsafe { stack.as_mut_ptr().add(stack.len()) } as usize & !15;
        // SAFETY: the child runs on `stack` (alive until it is reaped
        // below) and touches only the two atomics and its own stack; it
        // makes system calls and no allocation.
        let pid = unsafe {
            libc::clone(
                expect_eexist,
                top as *mut libc::c_void,
                libc::CLONE_VM | libc::SIGCHLD,
                std::ptr::null_mut(),
            )
        };
        assert!(pid > 0, "clone: {}", Errno::last());
        while !STOP.load(Ordering::Relaxed) {
            // realpath's readlink of each non-link component sets errno
            // to EINVAL.
            let _ = std::fs::canonicalize("/usr/bin");
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        drop(stack);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
        assert_eq!(
            WRONG.load(Ordering::Relaxed),
            0,
            "mkdir saw the parent's errno"
        );
    }
}
