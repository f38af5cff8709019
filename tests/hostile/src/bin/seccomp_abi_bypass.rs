//! Bypass the seccomp policy through another system-call ABI: the 32-bit
//! `int 0x80` entry (i386 syscall numbers) and the x32 ABI (x86_64 numbers
//! with bit 0x40000000 set). A filter that matches x86_64 numbers without
//! checking the architecture — or without rejecting the x32 bit — lets the
//! very calls it denies through.
//!
//! Each attempt runs in a forked child with harmless arguments (NULL
//! pointers, fd -1, invalid commands; unshare(CLONE_NEWUSER) only affects
//! the child). Contained: every call answers EPERM or ENOSYS, or the child
//! is killed by SIGSYS (a filter that kills foreign-architecture calls).
//! An x32 call's ENOSYS may be the filter's or a kernel built without x32;
//! the attribution pass (`--seccomp-mark`, the filter's ENOSYS marked)
//! requires each to be the filter's. Escaped: a denied call reached the
//! kernel (success, or EFAULT/EBADF/EINVAL showing it ran). Destructive only if mis-run: needs `--armed` and
//! a user namespace.

use brig_hostile::{
    child_denied, describe_child, filter_refusals, guard_destructive, in_child, Args, Report,
};

/// A 32-bit system call through `int 0x80`; returns the raw result
/// (negative errno on failure). Arguments are 32-bit, so only integers and
/// NULL are passed.
fn int80(nr: u32, a: u32, b: u32, c: u32) -> i32 {
    let ret: i32;
    // SAFETY: int 0x80 only reads eax/ebx/ecx/edx for these calls and
    // clobbers r8-r11 on 64-bit kernels; rbx is saved and restored around
    // the call because LLVM reserves it.
    unsafe {
        std::arch::asm!(
            "push rbx",
            "mov ebx, {a:e}",
            "int 0x80",
            "pop rbx",
            a = in(reg) a,
            inlateout("eax") nr as i32 => ret,
            in("ecx") b,
            in("edx") c,
            out("r8") _, out("r9") _, out("r10") _, out("r11") _,
        );
    }
    ret
}

fn code(ret: i64) -> i32 {
    if ret < 0 {
        (-ret).clamp(1, 255) as i32
    } else {
        0
    }
}

fn main() {
    let args = Args::get();
    guard_destructive("seccomp_abi_bypass", &args);
    let mut report = Report::new("seccomp_abi_bypass");
    let newuser = libc::CLONE_NEWUSER as u32;

    // i386 numbers, from arch/x86/entry/syscalls/syscall_32.tbl.
    let i386: &[(&str, u32, u32, u32, u32)] = &[
        ("unshare(CLONE_NEWUSER)", 310, newuser, 0, 0),
        ("keyctl(GET_KEYRING_ID)", 288, 0, (-1i32) as u32, 0),
        ("add_key(NULL)", 286, 0, 0, 0),
        ("userfaultfd(USER_MODE_ONLY)", 374, 1, 0, 0),
        ("io_uring_setup(0, NULL)", 425, 0, 0, 0),
        ("perf_event_open(NULL)", 336, 0, 0, 0),
        ("setns(-1)", 346, (-1i32) as u32, 0, 0),
        ("mount(NULL, NULL)", 21, 0, 0, 0),
        ("umount2(NULL)", 52, 0, 0, 0),
        (
            "ioctl(-1, TIOCSTI)",
            54,
            (-1i32) as u32,
            libc::TIOCSTI as u32,
            0,
        ),
        ("clone3(NULL, 0)", 435, 0, 0, 0),
        ("fsopen(NULL)", 430, 0, 0, 0),
        ("bpf(bad command)", 357, 0xffff, 0, 0),
    ];
    let mut refused = 0;
    let mut how = std::collections::BTreeMap::<String, u32>::new();
    for &(name, nr, a, b, c) in i386 {
        let end = in_child(|| code(int80(nr, a, b, c) as i64));
        if child_denied(&end) {
            refused += 1;
            *how.entry(describe_child(end)).or_default() += 1;
        } else if end == Ok(brig_hostile::ChildEnd::Signaled(libc::SIGSEGV)) {
            // Without IA32 emulation int 0x80 is a general protection fault.
            report.note(format!(
                "int 0x80 {name}: SIGSEGV (32-bit emulation disabled)"
            ));
            refused += 1;
        } else {
            report.escape(format!(
                "int 0x80 {name} reached the kernel: {}",
                describe_child(end)
            ));
        }
    }
    report.note(format!(
        "int 0x80: {refused} of {} denied calls refused ({how:?})",
        i386.len()
    ));

    // x32: same numbers as x86_64 plus __X32_SYSCALL_BIT.
    const X32: libc::c_long = 0x4000_0000;
    let x32: &[(&str, libc::c_long, libc::c_long)] = &[
        (
            "unshare(CLONE_NEWUSER)",
            libc::SYS_unshare,
            libc::CLONE_NEWUSER as libc::c_long,
        ),
        ("keyctl(GET_KEYRING_ID)", libc::SYS_keyctl, 0),
        ("io_uring_setup(0, NULL)", libc::SYS_io_uring_setup, 0),
        ("setns(-1)", libc::SYS_setns, -1),
    ];
    let mut refused = 0;
    let mut how = std::collections::BTreeMap::<String, u32>::new();
    for &(name, nr, a) in x32 {
        let before = filter_refusals();
        let end = in_child(|| {
            // SAFETY: integer/NULL arguments only.
            let r = unsafe { libc::syscall(nr | X32, a, 0, 0) };
            brig_hostile::exit_code_for(brig_hostile::check(r))
        });
        // The attribution pass tells the filter's ENOSYS (its horizon,
        // marked) from a kernel without x32 (this one's own ENOSYS).
        if before.is_some() && filter_refusals() == before {
            report.escape(format!(
                "x32 {name}: {} without the seccomp filter refusing it",
                describe_child(end)
            ));
        } else if child_denied(&end) {
            refused += 1;
            *how.entry(describe_child(end)).or_default() += 1;
        } else {
            report.escape(format!(
                "x32 {name} reached the kernel: {}",
                describe_child(end)
            ));
        }
    }
    report.note(format!(
        "x32: {refused} of {} denied calls refused ({how:?}; ENOSYS also when the kernel lacks x32: the attribution pass tells them apart)",
        x32.len()
    ));
    report.finish()
}
