//! Use eBPF, the in-kernel virtual machine behind many privilege
//! escalations and a way to enumerate the host's programs: BPF_MAP_CREATE
//! (a 1-entry array), BPF_PROG_LOAD (a two-instruction socket filter), and
//! BPF_PROG_GET_NEXT_ID / BPF_MAP_GET_NEXT_ID (list every program and map
//! loaded on the host); also lists /sys/fs/bpf.
//!
//! Contained: every bpf() call answers EPERM (seccomp; the sandbox has no
//! CAP_BPF either). Escaped: any call succeeded (a created map or program
//! is closed at once).

use brig_hostile::{check, list_dir, outcome, Args, Report};

const BPF_MAP_CREATE: i64 = 0;
const BPF_PROG_LOAD: i64 = 5;
const BPF_PROG_GET_NEXT_ID: i64 = 11;
const BPF_MAP_GET_NEXT_ID: i64 = 12;

fn bpf(cmd: i64, attr: &mut [u8; 128]) -> Result<libc::c_long, i32> {
    // SAFETY: attr is a 128-byte union bpf_attr buffer.
    check(unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len()) })
}

fn put32(attr: &mut [u8; 128], off: usize, v: u32) {
    attr[off..off + 4].copy_from_slice(&v.to_ne_bytes());
}

fn put64(attr: &mut [u8; 128], off: usize, v: u64) {
    attr[off..off + 8].copy_from_slice(&v.to_ne_bytes());
}

fn close_ok(r: &Result<libc::c_long, i32>) {
    if let Ok(fd) = r {
        // SAFETY: fd was just returned by bpf().
        unsafe { libc::close(*fd as i32) };
    }
}

fn main() {
    let _args = Args::get();
    let mut report = Report::new("bpf");

    let mut attr = [0u8; 128];
    put32(&mut attr, 0, 2); // BPF_MAP_TYPE_ARRAY
    put32(&mut attr, 4, 4); // key_size
    put32(&mut attr, 8, 4); // value_size
    put32(&mut attr, 12, 1); // max_entries
    let r = bpf(BPF_MAP_CREATE, &mut attr);
    close_ok(&r);
    report.record(r.is_ok(), format!("BPF_MAP_CREATE: {}", outcome(&r)));

    // r0 = 0; exit
    let insns: [u8; 16] = [0xb7, 0, 0, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0];
    let license = b"GPL\0";
    let mut attr = [0u8; 128];
    put32(&mut attr, 0, 1); // BPF_PROG_TYPE_SOCKET_FILTER
    put32(&mut attr, 4, 2); // insn_cnt
    put64(&mut attr, 8, insns.as_ptr() as u64);
    put64(&mut attr, 16, license.as_ptr() as u64);
    let r = bpf(BPF_PROG_LOAD, &mut attr);
    close_ok(&r);
    report.record(
        r.is_ok(),
        format!("BPF_PROG_LOAD socket filter: {}", outcome(&r)),
    );

    for (what, cmd) in [
        ("BPF_PROG_GET_NEXT_ID", BPF_PROG_GET_NEXT_ID),
        ("BPF_MAP_GET_NEXT_ID", BPF_MAP_GET_NEXT_ID),
    ] {
        let mut attr = [0u8; 128];
        let r = bpf(cmd, &mut attr);
        // ENOENT means "no more ids": the call ran, and the host simply has none.
        let reached = r.is_ok() || r == Err(libc::ENOENT);
        report.record(reached, format!("{what}: {}", outcome(&r)));
    }
    report.note(format!(
        "/sys/fs/bpf: {:?}",
        list_dir("/sys/fs/bpf").map_err(brig_hostile::errno_name)
    ));
    report.finish()
}
