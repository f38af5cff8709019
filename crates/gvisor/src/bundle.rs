//! The OCI bundle a sandbox runs from: `config.json`, made from the
//! sandbox's launch (limits, setuid, network) and where brig put its root
//! and its agent on the host.
//!
//! Pure: [`config`] builds the JSON, so what runsc is asked for is
//! unit-tested without runsc.

use std::path::{Path, PathBuf};

use brig_core::{Limits, SandboxId, VolumeMount};

use crate::compat::{Compat, STATX_SHIM_INSIDE};
use serde_json::{json, Value};

/// Where the agent's directory appears inside the sandbox: its socket
/// (bound by the agent) and its binary. 0700, root's: the sandbox's other
/// users cannot reach the agent.
pub const AGENT_DIR: &str = "/run/brig-agent";
/// The agent's socket, inside the sandbox.
pub const AGENT_SOCKET_INSIDE: &str = "/run/brig-agent/agent.sock";
/// The agent's binary, inside the sandbox.
pub const AGENT_BIN_INSIDE: &str = "/run/brig-agent/brig-agent";

/// The capabilities a container's root normally keeps (Docker's default
/// set) minus CAP_NET_RAW, as the process tier grants its agent. They act
/// inside gVisor's kernel only.
pub const CAPS: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_MKNOD",
    "CAP_AUDIT_WRITE",
    "CAP_SETFCAP",
];

/// The PATH of the agent (and of what it starts unless told otherwise).
pub const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The cgroup parent of every gvisor sandbox, beside the process tier's
/// `brig` (whose reconcile removes any `brig/<id>` without a live process
/// tier sandbox, so runsc's groups must not be there).
pub const CGROUP_PARENT: &str = "brig-gvisor";

/// The host pids limit of a sandbox allowed `pids` tasks. The host's group
/// counts gVisor's own threads (its kernel's and the gofer's) and, on the
/// ptrace platform, the stub processes and threads the programs run in:
/// measured here, an idle sandbox takes 44 host tasks and 80 `sleep`s
/// about 1,000 more (9 to 13 per program process, more as gVisor's
/// kernel runs more threads). So: twenty per task, plus gVisor's own
/// (the default 256 tasks: 5,376 host tasks). Beyond that,
/// gVisor's kernel cannot make a thread and the sandbox ends (a fork bomb
/// ends its sandbox, not only its forks).
pub fn host_pids(pids: u32) -> u64 {
    20 * u64::from(pids) + 256
}

/// A sandbox's first process.
#[derive(Debug, Clone)]
pub enum Init<'a> {
    /// brig-agent, listening (a daemon's sandbox).
    Agent {
        /// The host directory shown at [`AGENT_DIR`] (the agent's socket).
        dir: &'a Path,
        /// The agent's binary on the host (on a file system that allows
        /// exec).
        bin: &'a Path,
    },
    /// One command on the caller's stdio (`brig run`), or on a terminal
    /// runsc makes (`terminal`: its master goes to `--console-socket`).
    Command {
        args: &'a [String],
        terminal: bool,
        /// `KEY=VALUE`, PATH included.
        env: Vec<String>,
        cwd: &'a str,
        uid: u32,
        gid: u32,
    },
}

/// Everything a sandbox's `config.json` says.
#[derive(Debug, Clone)]
pub struct BundleSpec<'a> {
    pub id: &'a SandboxId,
    /// The root filesystem on the host (an overlay brig mounted).
    pub root: &'a Path,
    /// Host directories shown read-only at the same path (the `host`
    /// template).
    pub binds: &'a [PathBuf],
    /// Entries under `binds` covered by an empty stand-in (host path,
    /// stand-in): see `rootfs::mask_root_only`.
    pub masks: &'a [(PathBuf, PathBuf)],
    /// What the sandbox's first process is.
    pub init: Init<'a>,
    pub limits: &'a Limits,
    pub allow_setuid: bool,
    /// A network namespace to run in (`/proc/PID/fd/N`), or none (the
    /// sandbox gets gVisor's loopback only).
    pub netns: Option<&'a str>,
    /// The host's CPU count, to turn a CPU limit into a quota.
    pub cfs_period_us: u64,
    /// Volumes, each its host mount shown read-write at its path, last so
    /// that they go over what the template has there. No user namespace
    /// maps ids here: the gofer creates files with the ids the sandbox
    /// sees, as a volume stores them.
    pub volumes: &'a [VolumeMount],
    /// The statx shim and the `/etc/ld.so.preload` naming it
    /// ([`crate::compat`]).
    pub compat: Option<&'a Compat>,
}

/// The `config.json` of a sandbox.
pub fn config(b: &BundleSpec<'_>) -> Value {
    let caps: Vec<&str> = CAPS.to_vec();
    let mut mounts = vec![
        json!({"destination": "/proc", "type": "proc", "source": "proc"}),
        json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
               "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
        json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts",
               "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]}),
        json!({"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
               "options": ["nosuid", "noexec", "nodev", "mode=1777"]}),
        json!({"destination": "/sys", "type": "sysfs", "source": "sysfs",
               "options": ["nosuid", "noexec", "nodev", "ro"]}),
    ];
    for dir in b.binds {
        mounts.push(json!({"destination": dir, "type": "bind", "source": dir,
                           "options": ["rbind", "ro", "nosuid", "nodev"]}));
    }
    for (path, stand_in) in b.masks {
        mounts.push(
            json!({"destination": path, "type": "bind", "source": stand_in,
                           "options": ["bind", "ro", "nosuid", "nodev", "noexec"]}),
        );
    }
    let (args, env, cwd, uid, gid) = match &b.init {
        Init::Agent { dir, bin } => {
            mounts.push(
                json!({"destination": AGENT_DIR, "type": "bind", "source": dir,
                               "options": ["rbind", "rw", "nosuid", "nodev"]}),
            );
            mounts.push(
                json!({"destination": AGENT_BIN_INSIDE, "type": "bind", "source": bin,
                               "options": ["rbind", "ro", "nodev"]}),
            );
            (
                vec![
                    AGENT_BIN_INSIDE.to_string(),
                    "--listen-at".into(),
                    AGENT_SOCKET_INSIDE.into(),
                ],
                vec![format!("PATH={PATH}"), "HOME=/root".into()],
                "/",
                0,
                0,
            )
        }
        Init::Command {
            args,
            env,
            cwd,
            uid,
            gid,
            ..
        } => (args.to_vec(), env.clone(), *cwd, *uid, *gid),
    };
    let terminal = matches!(b.init, Init::Command { terminal: true, .. });
    if let Some(c) = b.compat {
        mounts.push(
            json!({"destination": STATX_SHIM_INSIDE, "type": "bind", "source": c.shim,
                           "options": ["rbind", "ro", "nosuid", "nodev"]}),
        );
        mounts.push(json!({"destination": "/etc/ld.so.preload", "type": "bind",
                           "source": c.preload, "options": ["rbind", "ro", "nosuid", "nodev"]}));
    }
    for v in b.volumes {
        mounts.push(
            json!({"destination": v.path, "type": "bind", "source": v.source,
                           "options": ["rbind", "rw", "nosuid", "nodev"]}),
        );
    }
    // Root keeps a container root's capabilities; another user none (as
    // the process tier's commands).
    let caps: Vec<&str> = if uid == 0 { caps } else { Vec::new() };

    let mut namespaces = vec![
        json!({"type": "pid"}),
        json!({"type": "ipc"}),
        json!({"type": "uts"}),
        json!({"type": "mount"}),
    ];
    namespaces.push(match b.netns {
        Some(path) => json!({"type": "network", "path": path}),
        None => json!({"type": "network"}),
    });

    let mut resources = json!({
        "memory": {"limit": b.limits.memory.bytes()},
        "pids": {"limit": host_pids(b.limits.pids)},
    });
    if let Some(cpus) = b.limits.cpus {
        resources["cpu"] = json!({
            "quota": (cpus * b.cfs_period_us as f64).round() as i64,
            "period": b.cfs_period_us,
        });
    }

    json!({
        "ociVersion": "1.0.2",
        "hostname": b.id.as_str(),
        "process": {
            "terminal": terminal,
            "user": {"uid": uid, "gid": gid},
            "args": args,
            "env": env,
            "cwd": cwd,
            "capabilities": {
                "bounding": caps, "effective": caps, "permitted": caps,
            },
            // Without setuid programs allowed, nothing the agent starts can
            // gain privileges (as in the process tier).
            "noNewPrivileges": !b.allow_setuid,
            "rlimits": [
                {"type": "RLIMIT_NOFILE", "hard": 1048576u64, "soft": 1048576u64},
            ],
        },
        "root": {"path": b.root, "readonly": false},
        "mounts": mounts,
        // Where its volumes are, for a later daemon that adopts it
        // ([`volume_paths`]).
        "annotations": {
            VOLUMES_ANNOTATION: b.volumes.iter().map(|v| v.path.as_str()).collect::<Vec<_>>().join(","),
        },
        "linux": {
            "namespaces": namespaces,
            "cgroupsPath": format!("/{CGROUP_PARENT}/{}", b.id),
            "resources": resources,
        },
    })
}

/// The `config.json` annotation listing a sandbox's volume paths.
const VOLUMES_ANNOTATION: &str = "org.brig.volumes";

/// The volume paths a sandbox's `config.json` names (none if it names
/// none or cannot be read).
pub fn volume_paths(config: &Value) -> Vec<String> {
    config["annotations"][VOLUMES_ANNOTATION]
        .as_str()
        .unwrap_or_default()
        .split(',')
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use brig_core::ByteSize;

    fn spec<'a>(id: &'a SandboxId, limits: &'a Limits, netns: Option<&'a str>) -> Value {
        config(&BundleSpec {
            id,
            root: Path::new("/run/brig/gvisor/x/rootfs"),
            binds: &[],
            masks: &[],
            init: Init::Agent {
                dir: Path::new("/run/brig/gvisor/x/agent"),
                bin: Path::new("/var/lib/brig/gvisor/brig-agent"),
            },
            limits,
            allow_setuid: false,
            netns,
            cfs_period_us: 100_000,
            volumes: &[],
            compat: None,
        })
    }

    #[test]
    fn config_runs_the_agent_listening_with_the_limits() {
        let id = SandboxId::from_random(7);
        let limits = Limits {
            memory: ByteSize::mib(256),
            pids: 64,
            cpus: Some(1.5),
            ..Limits::default()
        };
        let c = spec(&id, &limits, None);
        assert_eq!(
            c["process"]["args"],
            json!([AGENT_BIN_INSIDE, "--listen-at", AGENT_SOCKET_INSIDE])
        );
        assert_eq!(c["hostname"], id.as_str());
        assert_eq!(c["process"]["noNewPrivileges"], true);
        assert_eq!(c["linux"]["resources"]["memory"]["limit"], 256 << 20);
        assert_eq!(c["linux"]["resources"]["pids"]["limit"], 20 * 64 + 256);
        assert_eq!(c["linux"]["resources"]["cpu"]["quota"], 150_000);
        assert_eq!(
            c["linux"]["cgroupsPath"],
            format!("/brig-gvisor/{id}").as_str()
        );
        // No namespace path: gVisor's own loopback-only stack.
        let ns = c["linux"]["namespaces"].as_array().unwrap();
        assert!(ns.contains(&json!({"type": "network"})));
        let caps = c["process"]["capabilities"]["bounding"].as_array().unwrap();
        assert!(!caps.contains(&json!("CAP_SYS_ADMIN")));
        assert!(!caps.contains(&json!("CAP_NET_RAW")));
        let agent = c["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["destination"] == AGENT_DIR)
            .unwrap();
        assert_eq!(agent["source"], "/run/brig/gvisor/x/agent");
    }

    #[test]
    fn config_joins_a_given_network_namespace() {
        let id = SandboxId::from_random(1);
        let limits = Limits::default();
        let c = spec(&id, &limits, Some("/proc/42/fd/7"));
        let ns = c["linux"]["namespaces"].as_array().unwrap();
        assert!(ns.contains(&json!({"type": "network", "path": "/proc/42/fd/7"})));
        assert!(c["linux"]["resources"].get("cpu").is_none());
    }
}
