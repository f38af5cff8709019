//! The sandbox's seccomp-bpf policy.
//!
//! # Model
//!
//! A **deny-list**: everything is allowed except kernel surfaces a sandbox
//! has no business with. An allow-list would be tighter, but brig runs
//! arbitrary programs (python, node, compilers, pip, gdb) whose syscall
//! needs nobody can enumerate; a deny-list keeps them working and still
//! closes what matters. The other layers do the confining: namespaces,
//! pivot_root, cgroups, a small capability set inside the sandbox's user
//! namespace, no_new_privs. Seccomp removes kernel attack surface those
//! layers cannot: module loading, kexec, eBPF, perf, io_uring, userfaultfd,
//! keyrings, the mount API, nested user namespaces, host-wide clocks,
//! NUMA placement, terminal injection and rare socket families.
//!
//! The policy is data: `resources/seccomp/sandbox.json`, in seccompiler's
//! JSON format, one filter per answer. Refused calls return an errno rather
//! than killing the process, so a program sees an ordinary failure it
//! probably already handles:
//! - group `deny` answers **EPERM**;
//! - group `hide` answers **ENOSYS**, for calls libc must believe are
//!   missing so it falls back (clone3 -> clone, whose flags the filter can
//!   read);
//! - every syscall number at or above [`SYSCALL_HORIZON`] answers
//!   **ENOSYS**: calls newer than this policy's review, and the x32 ABI
//!   (`nr | 0x40000000`), which would otherwise reach the same kernel code
//!   under numbers no rule names;
//! - a foreign ABI (i386 `int 0x80` from a 64-bit process) **kills** the
//!   process: the rules are written in x86_64 numbers and would mean
//!   something else there. 32-bit programs therefore do not run in this
//!   tier.
//!
//! `build.rs` compiles each group with seccompiler and puts the rules
//! behind a binary search on the syscall number (160 instructions, about
//! 40 µs to install on the dev machine, against 210 µs for seccompiler's
//! linear layout). It checks the result against the plain linked program in
//! an interpreter, and this module only hands out the resulting `static`.
//! [`DENIALS`] is generated from the same JSON, for tests and `brig doctor`.
//! `docs/seccomp.md` explains each rule group.

/// One syscall the policy refuses, generated from the policy file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Denial {
    /// The syscall's name, as in the policy file.
    pub syscall: &'static str,
    /// Its number on the target architecture.
    pub nr: u32,
    /// The errno a refused call returns.
    pub errno: i32,
    /// Refused only for some arguments (e.g. `clone` with `CLONE_NEWUSER`);
    /// other calls are allowed.
    pub conditional: bool,
    /// The policy file's comments for its rules, joined by ` | `.
    pub reason: &'static str,
}

mod generated {
    include!(concat!(env!("OUT_DIR"), "/seccomp_sandbox.rs"));
}

/// Every syscall the policy refuses, sorted by name.
pub const DENIALS: &[Denial] = generated::DENIALS;

/// The names in [`DENIALS`], sorted.
pub const DENIED: &[&str] = generated::DENIED;

/// Syscall numbers at or above this answer ENOSYS: they are newer than the
/// policy's last review (or are x32 numbers).
pub const SYSCALL_HORIZON: u32 = generated::SYSCALL_HORIZON;

/// The architecture the program was compiled for (`x86_64`, `aarch64`).
pub const TARGET_ARCH: &str = generated::TARGET_ARCH;

/// The compiled sandbox filter, ready for `seccomp(SECCOMP_SET_MODE_FILTER)`.
///
/// The program is a `static` built at compile time: calling this does not
/// allocate, lock or decode anything, so it is safe in a freshly cloned
/// child.
pub fn sandbox_filter() -> &'static [libc::sock_filter] {
    #[cfg(feature = "knockout")]
    if let Some(Some(marked)) = MARKED.get() {
        return marked;
    }
    &generated::PROGRAM
}

/// The shipped program with every errno it returns shifted by `mark`, so
/// that a refusal can be told apart from the kernel's own errno (the
/// kernel never returns errnos that large). For tests
/// (`crates/jail/tests/seccomp.rs`); knockout builds' `BRIG_SECCOMP_MARK`
/// uses [`with_errnos_shifted_but_hide`].
pub fn with_errnos_shifted(mark: u16) -> Vec<libc::sock_filter> {
    let mut program = generated::PROGRAM.to_vec();
    for i in program.iter_mut().filter(|i| is_ret_errno(i)) {
        i.k += u32::from(mark);
    }
    program
}

/// [`with_errnos_shifted`], except for the `hide` group's ENOSYS
/// (clone3), which stays ENOSYS: what knockout builds install for
/// `BRIG_SECCOMP_MARK`. glibc falls back from clone3 to clone only on a
/// real ENOSYS; shifted, every `pthread_create` and `posix_spawn` in the
/// sandbox fails (errno 1038 with a mark of 1000), and the hostile
/// corpus's marked run would not be the run it measures (cpu_spin and
/// thread_bomb start no thread, module_autoload never execs). The
/// horizon's ENOSYS (newer numbers, the x32 ABI) is shifted: nothing
/// falls back from those.
pub fn with_errnos_shifted_but_hide(mark: u16) -> Vec<libc::sock_filter> {
    const JMP_JGE_K: u16 = 0x35;
    let program = &generated::PROGRAM;
    let mut out = program.to_vec();
    for (at, i) in out.iter_mut().enumerate() {
        let errno = i.k & !ACTION_MASK;
        // The prologue's `jge HORIZON; ret ENOSYS` (build.rs).
        let horizon =
            at > 0 && program[at - 1].code == JMP_JGE_K && program[at - 1].k == SYSCALL_HORIZON;
        if is_ret_errno(i) && (errno != libc::ENOSYS as u32 || horizon) {
            i.k += u32::from(mark);
        }
    }
    out
}

const ACTION_MASK: u32 = 0xffff_0000;

fn is_ret_errno(i: &libc::sock_filter) -> bool {
    const RET_K: u16 = 0x06;
    i.code == RET_K && i.k & ACTION_MASK == libc::SECCOMP_RET_ERRNO
}

#[cfg(feature = "knockout")]
static MARKED: std::sync::OnceLock<Option<Vec<libc::sock_filter>>> = std::sync::OnceLock::new();

/// Prepares [`sandbox_filter`] for use after a fork: a knockout build
/// reads `BRIG_SECCOMP_MARK` here, before any clone (after one, nothing
/// may allocate). Otherwise there is nothing to do (the program is a
/// compile-time `static`); callers call it before forking anyway so the
/// ordering requirement survives any future change to how the program is
/// stored.
pub fn init() {
    #[cfg(feature = "knockout")]
    MARKED.get_or_init(|| {
        let mark = std::env::var("BRIG_SECCOMP_MARK").ok()?;
        let mark: u16 = mark
            .parse()
            .expect("BRIG_SECCOMP_MARK: a number below 4000");
        Some(with_errnos_shifted_but_hide(mark))
    });
}

/// The denial for `syscall`, if the policy refuses it.
pub fn denial(syscall: &str) -> Option<&'static Denial> {
    DENIALS.iter().find(|d| d.syscall == syscall)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BPF_CLASS_MASK: u16 = 0x07;
    const BPF_JMP: u16 = 0x05;
    const BPF_RET: u16 = 0x06;
    const BPF_JA: u16 = 0x05;

    #[test]
    fn program_is_nonempty_and_ends_in_a_return() {
        let p = sandbox_filter();
        assert!(!p.is_empty());
        assert!(
            p.len() < 4096,
            "{} instructions exceed BPF_MAXINSNS",
            p.len()
        );
        let last = p.last().unwrap();
        assert_eq!(
            last.code & BPF_CLASS_MASK,
            BPF_RET,
            "last instruction {last:?}"
        );
        // The fall-through answer of a deny-list is allow.
        assert_eq!(last.k, libc::SECCOMP_RET_ALLOW);
    }

    #[test]
    fn every_jump_lands_inside_the_program() {
        let p = sandbox_filter();
        for (at, i) in p.iter().enumerate() {
            if i.code & BPF_CLASS_MASK != BPF_JMP {
                continue;
            }
            let targets = if i.code == BPF_JA {
                vec![at + 1 + i.k as usize]
            } else {
                vec![at + 1 + usize::from(i.jt), at + 1 + usize::from(i.jf)]
            };
            for t in targets {
                assert!(
                    t < p.len(),
                    "jump at {at} to {t} leaves a {}-instruction program",
                    p.len()
                );
            }
        }
    }

    #[test]
    fn program_starts_with_the_arch_check() {
        let p = sandbox_filter();
        // ld [arch]; jeq AUDIT_ARCH_*, +1; ret KILL_PROCESS
        assert_eq!((p[0].code, p[0].k), (0x20, 4));
        assert_eq!(p[1].code, 0x15);
        assert_eq!(
            (p[2].code, p[2].k),
            (BPF_RET, libc::SECCOMP_RET_KILL_PROCESS)
        );
    }

    #[test]
    fn denial_table_is_sorted_unique_and_explained() {
        assert!(!DENIALS.is_empty());
        assert!(DENIALS.windows(2).all(|w| w[0].syscall < w[1].syscall));
        assert_eq!(DENIED.len(), DENIALS.len());
        for (d, name) in DENIALS.iter().zip(DENIED) {
            assert_eq!(d.syscall, *name);
            assert!(!d.reason.is_empty(), "{} has no reason", d.syscall);
            assert!(d.nr < SYSCALL_HORIZON, "{} is above the horizon", d.syscall);
            assert!(
                d.errno == libc::EPERM || d.errno == libc::ENOSYS,
                "{}: errno {}",
                d.syscall,
                d.errno
            );
        }
        assert_eq!(denial("clone3").map(|d| d.errno), Some(libc::ENOSYS));
        assert_eq!(denial("getpid"), None);
    }

    /// The errnos a program returns, sorted.
    fn errnos(p: &[libc::sock_filter]) -> Vec<u32> {
        let mut e: Vec<u32> = p
            .iter()
            .filter(|i| i.code == BPF_RET && i.k & 0xffff_0000 == libc::SECCOMP_RET_ERRNO)
            .map(|i| i.k & 0xffff)
            .collect();
        e.sort_unstable();
        e.dedup();
        e
    }

    #[test]
    fn the_corpus_mark_shifts_every_errno_but_the_hide_groups() {
        let (eperm, enosys) = (libc::EPERM as u32, libc::ENOSYS as u32);
        assert_eq!(errnos(sandbox_filter()), [eperm, enosys]);
        assert_eq!(
            errnos(&with_errnos_shifted(1000)),
            [1000 + eperm, 1000 + enosys]
        );
        // clone3's ENOSYS stays; the horizon's is shifted (found).
        assert_eq!(
            errnos(&with_errnos_shifted_but_hide(1000)),
            [enosys, 1000 + eperm, 1000 + enosys]
        );
    }
}
