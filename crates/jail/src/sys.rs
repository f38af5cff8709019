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

fn check(ret: libc::c_long) -> SysResult<libc::c_long> {
    if ret < 0 {
        Err(Errno::last())
    } else {
        Ok(ret)
    }
}

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
    fn chown(&self, path: &CStr, uid: u32, gid: u32) -> SysResult;
    fn sethostname(&self, name: &[u8]) -> SysResult;
    fn unshare(&self, flags: libc::c_int) -> SysResult;
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
}

/// The real thing.
#[derive(Debug, Default, Clone, Copy)]
pub struct Linux;

fn opt_ptr(s: Option<&CStr>) -> *const libc::c_char {
    s.map_or(std::ptr::null(), CStr::as_ptr)
}

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
        let r = unsafe {
            libc::mount(
                opt_ptr(source),
                target.as_ptr(),
                opt_ptr(fstype),
                flags,
                opt_ptr(data).cast(),
            )
        };
        check(r.into()).map(drop)
    }

    fn umount(&self, target: &CStr, flags: libc::c_int) -> SysResult {
        // SAFETY: target is a valid C string.
        check(unsafe { libc::umount2(target.as_ptr(), flags) }.into()).map(drop)
    }

    fn move_mount(&self, from_fd: RawFd, target: &CStr) -> SysResult {
        const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
        // SAFETY: raw syscall with a valid fd, an empty path and a valid
        // target string; the kernel does not retain the pointers.
        let r = unsafe {
            libc::syscall(
                libc::SYS_move_mount,
                from_fd,
                c"".as_ptr(),
                libc::AT_FDCWD,
                target.as_ptr(),
                MOVE_MOUNT_F_EMPTY_PATH,
            )
        };
        check(r).map(drop)
    }

    fn pivot_root_here(&self, new_root: &CStr) -> SysResult {
        self.chdir(new_root)?;
        // SAFETY: "." is a valid path for both arguments; after the call the
        // old root is stacked on top of the new one at "." and is detached
        // right away below.
        check(unsafe { libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) })?;
        self.umount(c".", libc::MNT_DETACH)?;
        self.chdir(c"/")
    }

    fn chdir(&self, path: &CStr) -> SysResult {
        // SAFETY: path is a valid C string.
        check(unsafe { libc::chdir(path.as_ptr()) }.into()).map(drop)
    }

    fn mkdir(&self, path: &CStr, mode: libc::mode_t) -> SysResult {
        // SAFETY: path is a valid C string.
        match check(unsafe { libc::mkdir(path.as_ptr(), mode) }.into()) {
            Err(Errno(libc::EEXIST)) => Ok(()),
            r => r.map(drop),
        }
    }

    fn symlink(&self, target: &CStr, link: &CStr) -> SysResult {
        // SAFETY: both are valid C strings.
        check(unsafe { libc::symlink(target.as_ptr(), link.as_ptr()) }.into()).map(drop)
    }

    fn touch(&self, path: &CStr) -> SysResult {
        // SAFETY: path is a valid C string; the descriptor is closed at once.
        let fd = check(
            unsafe {
                libc::open(
                    path.as_ptr(),
                    libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
                    0o644,
                )
            }
            .into(),
        )?;
        // SAFETY: fd was just opened by us.
        unsafe { libc::close(fd as RawFd) };
        Ok(())
    }

    fn chown(&self, path: &CStr, uid: u32, gid: u32) -> SysResult {
        // SAFETY: path is a valid C string.
        check(unsafe { libc::chown(path.as_ptr(), uid, gid) }.into()).map(drop)
    }

    fn sethostname(&self, name: &[u8]) -> SysResult {
        // SAFETY: pointer and length describe a live byte slice.
        check(unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) }.into()).map(drop)
    }

    fn unshare(&self, flags: libc::c_int) -> SysResult {
        // SAFETY: unshare takes only flags.
        check(unsafe { libc::unshare(flags) }.into()).map(drop)
    }

    fn setrlimit(&self, resource: libc::c_int, soft: u64, hard: u64) -> SysResult {
        let lim = libc::rlimit {
            rlim_cur: soft,
            rlim_max: hard,
        };
        // SAFETY: lim is a valid rlimit on the stack. The resource type is
        // u32 in glibc's prototype; the values used are small constants.
        check(unsafe { libc::setrlimit(resource as _, &lim) }.into()).map(drop)
    }

    fn loopback_up(&self) -> SysResult {
        // SAFETY: plain socket creation; closed below.
        let fd = check(
            unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) }.into(),
        )? as RawFd;
        // SAFETY: ifreq is plain old data; all-zero is a valid value.
        let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
        for (dst, src) in ifr.ifr_name.iter_mut().zip(b"lo\0") {
            *dst = *src as libc::c_char;
        }
        // SAFETY: fd is our socket and ifr a valid ifreq naming "lo"; the
        // flags union member is the one SIOCGIFFLAGS/SIOCSIFFLAGS use.
        let r = unsafe {
            if libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut ifr) < 0 {
                -1
            } else {
                ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
                libc::ioctl(fd, libc::SIOCSIFFLAGS, &ifr)
            }
        };
        let res = check(r.into()).map(drop);
        // SAFETY: fd is ours and not used after this.
        unsafe { libc::close(fd) };
        res
    }

    fn drop_bounding_set(&self, keep: u64) -> SysResult {
        for cap in 0..=CAP_LAST {
            if keep & (1 << cap) == 0 {
                // SAFETY: prctl with integer arguments only.
                let r =
                    unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
                // EINVAL: the running kernel does not know this capability.
                if r < 0 && Errno::last() != Errno(libc::EINVAL) {
                    return Err(Errno::last());
                }
            }
        }
        // Ambient capabilities would survive execve of non-root programs.
        // SAFETY: prctl with integer arguments only.
        let _ = unsafe {
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL,
                0,
                0,
                0,
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
        check(unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) }).map(drop)
    }

    fn set_ids(&self, uid: u32, gid: u32, groups: &[libc::gid_t]) -> SysResult {
        // Raw system calls, not the libc wrappers: glibc's set*id and
        // setgroups broadcast the change to every thread it knows of, under
        // a lock. In a child cloned from a multi-threaded process those
        // threads do not exist, and the wrapper would wait for them forever.
        // Order matters: groups and gid while we still have CAP_SETGID,
        // uid last.
        // SAFETY: groups is a live slice of gid_t; integer arguments.
        check(unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) })?;
        // SAFETY: integer arguments only.
        check(unsafe { libc::syscall(libc::SYS_setresgid, gid, gid, gid) })?;
        // SAFETY: as above.
        check(unsafe { libc::syscall(libc::SYS_setresuid, uid, uid, uid) }).map(drop)
    }

    fn set_no_new_privs(&self) -> SysResult {
        // SAFETY: prctl with integer arguments only.
        check(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) }.into()).map(drop)
    }

    fn install_seccomp(&self, program: &[libc::sock_filter]) -> SysResult {
        let prog = libc::sock_fprog {
            len: program.len() as u16,
            filter: program.as_ptr() as *mut _,
        };
        // SAFETY: prog points at a live, well-formed BPF program; the kernel
        // copies it. TSYNC is not needed: the caller is single-threaded.
        check(unsafe { libc::syscall(libc::SYS_seccomp, libc::SECCOMP_SET_MODE_FILTER, 0, &prog) })
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
    Chown {
        path: String,
        uid: u32,
        gid: u32,
    },
    Sethostname(String),
    Unshare(libc::c_int),
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
