//! Errors of the process tier. Each names what failed and, where a person
//! can fix it, how.

use std::path::PathBuf;

use brig_core::SpecError;

use crate::cgroup::CgroupError;
use crate::slot::SlotError;
use crate::sys::Errno;
use crate::template::TemplateError;

#[derive(Debug, thiserror::Error)]
pub enum JailError {
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error(transparent)]
    Slot(#[from] SlotError),
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error("--cpus needs the cgroup cpu controller, which this host does not offer (see `brig doctor`)")]
    NoCpuController,
    #[error("cannot create the sandbox's namespaces: {errno}; {hint}")]
    Namespaces { errno: Errno, hint: &'static str },
    #[error("cannot {op} {path}")]
    Host {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot {op}: {errno}")]
    HostCall { op: &'static str, errno: Errno },
    #[error("sandbox set-up failed: cannot {step}: {errno}")]
    Setup { step: String, errno: Errno },
    #[error("command not found in sandbox: {command}")]
    CommandNotFound { command: String },
    #[error("cannot execute {command} in sandbox: {errno}")]
    CommandNotExecutable { command: String, errno: Errno },
    #[error("cannot enter working directory {path} in sandbox: {errno}")]
    Workdir { path: String, errno: Errno },
    /// A volume could not be mounted (a bad path, a filesystem that cannot
    /// be idmapped).
    #[error("{0}")]
    Volume(String),
}

impl JailError {
    /// The hint for a failed `clone` of the sandbox's namespaces.
    pub fn namespaces(errno: Errno) -> Self {
        let hint = match errno.0 {
            libc::EPERM => "brig's process tier needs root (run it with sudo) and a kernel that allows user namespaces",
            libc::ENOSPC | libc::EUSERS => {
                "the host's namespace limit is reached (raise /proc/sys/user/max_user_namespaces or end some sandboxes)"
            }
            libc::EINVAL => "this kernel lacks a namespace type brig needs (run `brig doctor`)",
            _ => "run `brig doctor` to see what this host lacks",
        };
        JailError::Namespaces { errno, hint }
    }
}
