//! Small messages with descriptors attached (SCM_RIGHTS) over the
//! SOCK_SEQPACKET pair between the host and a sandbox's init. Stack buffers
//! only: the init calls these before it may allocate.

use std::os::fd::RawFd;

use crate::sys::{Errno, SysResult};

/// Most descriptors one message carries: an image's layers (each its own
/// idmapped mount, at most [`brig_core::spec::MAX_LAYERS`]), the pooled
/// network's sysfs, the program and the stdio socket, with room to spare
/// (the kernel takes up to 253).
pub const MAX_FDS: usize = 136;
const _: () = assert!(brig_core::spec::MAX_LAYERS + 4 <= MAX_FDS);

/// The control buffer: one SCM_RIGHTS header (16 bytes) and MAX_FDS ints,
/// in 8-byte words.
const CBUF_WORDS: usize = (16 + MAX_FDS * 4).div_ceil(8) + 1;

/// Receive one message into `buf` and up to [`MAX_FDS`] descriptors (made
/// close-on-exec). Returns (bytes, descriptors); 0 bytes means the peer
/// closed its end.
pub fn recv(sock: RawFd, buf: &mut [u8], fds: &mut [RawFd; MAX_FDS]) -> SysResult<(usize, usize)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // Room for one SCM_RIGHTS header and MAX_FDS ints, 8-byte aligned.
    let mut cbuf = [0u64; CBUF_WORDS];
    // SAFETY: msghdr is plain old data; all-zero is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf);
    let n = loop {
        // SAFETY: msg points at live stack buffers sized as declared.
        let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 || Errno::last() != Errno(libc::EINTR) {
            break n;
        }
    };
    if n < 0 {
        return Err(Errno::last());
    }
    let mut count = 0;
    // SAFETY: CMSG_* walk the control buffer the kernel filled, bounded by
    // msg_controllen.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg) as *const RawFd;
                let len = ((*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize)
                    / std::mem::size_of::<RawFd>();
                for i in 0..len {
                    let fd = std::ptr::read_unaligned(data.add(i));
                    if count < MAX_FDS {
                        fds[count] = fd;
                        count += 1;
                    } else {
                        // More than we asked for: do not leak them.
                        libc::close(fd);
                    }
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    Ok((n as usize, count))
}

/// Send `payload` (at least one byte, so the peer can tell it from EOF)
/// with up to [`MAX_FDS`] descriptors attached.
pub fn send(sock: RawFd, payload: &[u8], fds: &[RawFd]) -> SysResult {
    let one = [1u8];
    let payload = if payload.is_empty() {
        &one[..]
    } else {
        payload
    };
    let mut iov = libc::iovec {
        iov_base: payload.as_ptr() as *mut _,
        iov_len: payload.len(),
    };
    let mut cbuf = [0u64; CBUF_WORDS];
    // SAFETY: msghdr is plain old data; all-zero is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    // More than the peer can take is refused, never cut short.
    if fds.len() > MAX_FDS {
        return Err(Errno(libc::E2BIG));
    }
    if !fds.is_empty() {
        let bytes = std::mem::size_of_val(fds) as u32;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        // SAFETY: CMSG_SPACE is a pure size computation.
        msg.msg_controllen = unsafe { libc::CMSG_SPACE(bytes) } as usize;
        // SAFETY: the control buffer is large enough for one header and
        // MAX_FDS descriptors; CMSG_FIRSTHDR is non-null for it.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(bytes) as usize;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr(),
                libc::CMSG_DATA(cmsg) as *mut RawFd,
                fds.len(),
            );
        }
    }
    // SAFETY: msg points at live buffers; sendmsg does not write to them.
    if unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) } < 0 {
        return Err(Errno::last());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    #[test]
    fn payload_and_descriptors_cross_a_socketpair() {
        let mut sv = [-1; 2];
        // SAFETY: valid out-array.
        let r =
            unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0, sv.as_mut_ptr()) };
        assert_eq!(r, 0);
        // SAFETY: fresh descriptors.
        let (a, b) = unsafe { (OwnedFd::from_raw_fd(sv[0]), OwnedFd::from_raw_fd(sv[1])) };
        let file = std::fs::File::open("/proc/self/status").unwrap();
        send(a.as_raw_fd(), b"hello", &[file.as_raw_fd()]).unwrap();
        let mut buf = [0u8; 16];
        let mut fds = [-1; MAX_FDS];
        let (n, nfd) = recv(b.as_raw_fd(), &mut buf, &mut fds).unwrap();
        assert_eq!((&buf[..n], nfd), (&b"hello"[..], 1));
        // SAFETY: the received descriptor is ours now.
        let got = unsafe { OwnedFd::from_raw_fd(fds[0]) };
        assert_ne!(got.as_raw_fd(), file.as_raw_fd());
        // An empty payload still arrives as one byte; EOF is 0 bytes.
        send(a.as_raw_fd(), &[], &[]).unwrap();
        assert_eq!(recv(b.as_raw_fd(), &mut buf, &mut fds).unwrap(), (1, 0));
        drop(a);
        assert_eq!(recv(b.as_raw_fd(), &mut buf, &mut fds).unwrap(), (0, 0));
    }
}
