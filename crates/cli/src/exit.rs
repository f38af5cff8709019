//! The one place where errors and outcomes meet the user: a one-line
//! message on stderr and an exit code.
//!
//! Exit codes of `brig run`, as in `docker run`: the command's own status;
//! 124 on --timeout; 137 when the memory limit killed the sandbox; 128+N
//! when brig itself got signal N; 125 when brig could not start the
//! sandbox; 126 when the command exists but cannot be executed; 127 when it
//! is not found.

use std::time::Duration;

use brig_core::{ByteSize, CommandFault, Ended, TierError, TierErrorKind};

pub const START_FAILED: i32 = 125;
pub const NOT_EXECUTABLE: i32 = 126;
pub const NOT_FOUND: i32 = 127;
pub const TIMED_OUT: i32 = 124;
pub const OOM: i32 = 137;
/// Killed (128 + SIGKILL): what a command whose sandbox was ended exits with.
pub const KILLED: i32 = 137;

/// Why the supervise loop stopped watching.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Exited,
    TimedOut(Duration),
    OutOfMemory,
    Signalled(libc::c_int),
}

/// Print `err` (with its chain, once) and return the exit code for it.
pub fn report(err: &anyhow::Error) -> i32 {
    eprintln!("brig: {err:#}");
    match err.downcast_ref::<TierError>().map(TierError::kind) {
        Some(TierErrorKind::Command(CommandFault::NotFound)) => NOT_FOUND,
        Some(TierErrorKind::Command(CommandFault::NotExecutable)) => NOT_EXECUTABLE,
        _ => START_FAILED,
    }
}

/// The exit code for a sandbox that ran (under `memory_limit`), with a
/// message where the command did not simply exit.
pub fn finish(outcome: Outcome, ended: &Ended, memory_limit: ByteSize) -> i32 {
    if ended.oom || outcome == Outcome::OutOfMemory {
        eprintln!("brig: out of memory (limit {memory_limit}); the sandbox was killed");
        return OOM;
    }
    match outcome {
        // A one-shot sandbox's tier always knows the command's status.
        Outcome::Exited => ended.code.unwrap_or(START_FAILED),
        Outcome::TimedOut(limit) => {
            eprintln!(
                "brig: timed out after {}; the sandbox was killed",
                humantime(limit)
            );
            TIMED_OUT
        }
        Outcome::Signalled(sig) => 128 + sig,
        Outcome::OutOfMemory => OOM,
    }
}

pub(crate) fn humantime(d: Duration) -> String {
    let ms = d.as_millis();
    if !ms.is_multiple_of(1000) {
        format!("{ms}ms")
    } else {
        let s = d.as_secs();
        match (s / 3600, (s % 3600) / 60, s % 60) {
            (0, 0, s) => format!("{s}s"),
            (0, m, 0) => format!("{m}m"),
            (0, m, s) => format!("{m}m{s}s"),
            (h, m, s) => format!("{h}h{m}m{s}s"),
        }
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The process tier needs root for now (user namespaces with a full uid
/// range, idmapped mounts, cgroups).
pub fn require_root() -> anyhow::Result<()> {
    if !is_root() {
        anyhow::bail!("brig run needs root on this host (it maps each sandbox to its own unprivileged uid range and creates cgroups); run it with sudo")
    }
    // uid 0 inside someone else's user namespace (a rootless container,
    // `unshare -r`) has none of the privileges the process tier needs.
    let map = std::fs::read_to_string("/proc/self/uid_map").unwrap_or_default();
    if map.split_whitespace().collect::<Vec<_>>() != ["0", "0", "4294967295"] {
        anyhow::bail!(
            "brig run needs root in the host's user namespace, but it runs inside a user namespace (uid map {:?}); run it on the host or in a privileged container",
            map.trim()
        )
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finish(outcome: Outcome, ended: &Ended) -> i32 {
        super::finish(outcome, ended, ByteSize::mib(512))
    }

    fn exit(code: i32, oom: bool) -> Ended {
        Ended {
            code: Some(code),
            oom,
        }
    }

    #[test]
    fn outcomes_map_to_conventional_codes() {
        assert_eq!(finish(Outcome::Exited, &exit(3, false)), 3);
        assert_eq!(finish(Outcome::Exited, &exit(137, true)), OOM);
        assert_eq!(finish(Outcome::OutOfMemory, &exit(137, false)), OOM);
        assert_eq!(
            finish(Outcome::TimedOut(Duration::from_secs(2)), &exit(137, false)),
            TIMED_OUT
        );
        assert_eq!(
            finish(Outcome::Signalled(libc::SIGTERM), &exit(137, false)),
            143
        );
    }

    #[test]
    fn errors_map_to_exit_codes() {
        let nf = anyhow::Error::new(TierError::Command {
            fault: CommandFault::NotFound,
            message: "command not found in sandbox: foo".into(),
        });
        assert_eq!(report(&nf), NOT_FOUND);
        assert_eq!(nf.to_string(), "command not found in sandbox: foo");
        let ne = anyhow::Error::new(TierError::Command {
            fault: CommandFault::NotExecutable,
            message: "cannot execute /x in sandbox: EACCES".into(),
        });
        assert_eq!(report(&ne), NOT_EXECUTABLE);
        assert_eq!(report(&anyhow::anyhow!("other")), START_FAILED);
    }

    #[test]
    fn durations_print_like_they_are_typed() {
        assert_eq!(humantime(Duration::from_secs(2)), "2s");
        assert_eq!(humantime(Duration::from_secs(90)), "1m30s");
        assert_eq!(humantime(Duration::from_millis(1500)), "1500ms");
    }
}
