//! The guest kernel: Debian's cloud kernel (`linux-image-cloud-amd64`,
//! built for virtual machines), fetched from Debian's archive with apt and
//! unpacked into brig's state, once. Never the host's /boot: the guest's
//! kernel is brig's choice, not the host's.
//!
//! ```text
//! $BRIG_HOME/vm/kernel/<version>/vmlinuz         the kernel
//! $BRIG_HOME/vm/kernel/<version>/modules/*.ko    the modules the guest loads
//! $BRIG_HOME/vm/kernel/<version>/modules.order   their load order
//! $BRIG_HOME/vm/kernel/current                   "<version>\n": the one in use
//! ```
//!
//! Debian's cloud kernel builds virtio and overlayfs as modules
//! (`CONFIG_VIRTIO=m`, `CONFIG_VIRTIO_PCI=m`, `CONFIG_OVERLAY_FS=m`; ext4
//! is built in), so the initramfs carries them and the guest's init loads
//! them. Their order comes from each module's own `depends=` (its
//! `.modinfo`): the package ships no modules.dep (depmod makes it at
//! install time).

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The meta-package that names the current cloud kernel.
pub const PACKAGE: &str = "linux-image-cloud-amd64";

/// What the guest needs, without dependencies: the virtio-pci transport
/// (`-M q35`), its disks, the agent's port, the root's overlay, its
/// network device (`virtio_net`, which brings `net_failover` and
/// `failover`).
pub const WANTED: &[&str] = &[
    "virtio_pci",
    "virtio_blk",
    "virtio_console",
    "overlay",
    "virtio_net",
];

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("cannot {op} {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("`{command}` failed: {output}")]
    Command { command: String, output: String },
    #[error("{0}")]
    Package(String),
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> KernelError + 'a {
    move |source| KernelError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// A guest kernel unpacked in brig's state.
#[derive(Debug, Clone)]
pub struct GuestKernel {
    /// `6.1.0-56-cloud-amd64`: what `uname -r` says in the guest.
    pub version: String,
    pub vmlinuz: PathBuf,
    /// The modules to load, in order.
    pub modules: Vec<PathBuf>,
}

impl GuestKernel {
    /// The kernel in `dir` (`$BRIG_HOME/vm/kernel`), fetched first if
    /// there is none.
    pub fn get(dir: &Path) -> Result<GuestKernel, KernelError> {
        if let Some(k) = Self::cached(dir) {
            return Ok(k);
        }
        fetch(dir)?;
        Self::cached(dir).ok_or_else(|| {
            KernelError::Package(format!(
                "{} has no usable kernel after a fetch",
                dir.display()
            ))
        })
    }

    fn cached(dir: &Path) -> Option<GuestKernel> {
        let version = fs::read_to_string(dir.join("current")).ok()?;
        Self::cached_at(dir, version.trim())
    }

    fn cached_at(dir: &Path, version: &str) -> Option<GuestKernel> {
        let version = version.to_owned();
        let at = dir.join(&version);
        let order = fs::read_to_string(at.join("modules.order")).ok()?;
        let modules: Vec<PathBuf> = order
            .lines()
            .filter(|l| !l.is_empty())
            .map(|l| at.join("modules").join(l))
            .collect();
        let vmlinuz = at.join("vmlinuz");
        // A kernel kept for another set of modules is fetched again.
        let complete = WANTED
            .iter()
            .all(|w| order.lines().any(|l| l == format!("{w}.ko")));
        (complete && vmlinuz.is_file() && modules.iter().all(|m| m.is_file())).then_some(
            GuestKernel {
                version,
                vmlinuz,
                modules,
            },
        )
    }
}

fn run(cmd: &mut Command) -> Result<String, KernelError> {
    let command = format!("{cmd:?}");
    let out = cmd.output().map_err(|e| KernelError::Command {
        command: command.clone(),
        output: e.to_string(),
    })?;
    if !out.status.success() {
        return Err(KernelError::Command {
            command,
            output: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Fetch and unpack the current cloud kernel: apt names it (the
/// meta-package's dependency), downloads its .deb into a scratch
/// directory, dpkg-deb unpacks it there; the kernel and the modules the
/// guest needs are kept, the rest is removed.
fn fetch(dir: &Path) -> Result<(), KernelError> {
    let deps = run(Command::new("apt-cache").args(["depends", PACKAGE]))?;
    let package = deps
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .find(|p| p.starts_with("linux-image-") && p.ends_with("-cloud-amd64"))
        .ok_or_else(|| {
            KernelError::Package(format!(
                "apt knows no kernel for {PACKAGE} (is Debian's archive in apt's sources? \
                 run apt-get update)"
            ))
        })?
        .to_owned();
    let version = package.trim_start_matches("linux-image-").to_owned();
    fs::create_dir_all(dir).map_err(io_err("create", dir))?;
    let scratch = dir.join(format!(".fetch-{}", std::process::id()));
    let _ = fs::remove_dir_all(&scratch);
    fs::create_dir_all(&scratch).map_err(io_err("create", &scratch))?;
    let kept = unpack(&scratch, &package, &version, dir);
    let _ = fs::remove_dir_all(&scratch);
    kept?;
    let tmp = dir.join(".current");
    fs::write(&tmp, format!("{version}\n"))
        .and_then(|()| fs::rename(&tmp, dir.join("current")))
        .map_err(io_err("record the kernel in", dir))
}

fn unpack(scratch: &Path, package: &str, version: &str, dir: &Path) -> Result<(), KernelError> {
    run(Command::new("apt-get")
        .args(["download", "-q", package])
        .current_dir(scratch))?;
    let deb = fs::read_dir(scratch)
        .map_err(io_err("list", scratch))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .ok_or_else(|| KernelError::Package(format!("apt-get download {package} left no .deb")))?;
    let tree = scratch.join("x");
    run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&tree))?;
    let vmlinuz = tree.join(format!("boot/vmlinuz-{version}"));
    let modules_dir = tree.join(format!("lib/modules/{version}/kernel"));
    let all = index_modules(&modules_dir)?;
    let order = load_order(&all, WANTED)?;

    let staged = scratch.join("kept");
    let kept_modules = staged.join("modules");
    fs::create_dir_all(&kept_modules).map_err(io_err("create", &kept_modules))?;
    fs::copy(&vmlinuz, staged.join("vmlinuz")).map_err(io_err("copy", &vmlinuz))?;
    let mut names = String::new();
    for name in &order {
        let from = &all[name].0;
        let file = format!("{name}.ko");
        fs::copy(from, kept_modules.join(&file)).map_err(io_err("copy", from))?;
        names.push_str(&file);
        names.push('\n');
    }
    fs::write(staged.join("modules.order"), names).map_err(io_err("write", &staged))?;
    let target = dir.join(version);
    if GuestKernel::cached_at(dir, version).is_some() {
        // Another daemon fetched it meanwhile (and may be reading it).
        return Ok(());
    }
    let _ = fs::remove_dir_all(&target);
    fs::rename(&staged, &target).map_err(io_err("keep the kernel at", &target))
}

/// Every module under `dir`: its file and the modules it depends on.
fn index_modules(dir: &Path) -> Result<BTreeMap<String, (PathBuf, Vec<String>)>, KernelError> {
    let mut found = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).map_err(io_err("list", &d))?.flatten() {
            let path = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(path);
                continue;
            }
            let Some(name) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".ko"))
            else {
                continue;
            };
            let bytes = fs::read(&path).map_err(io_err("read", &path))?;
            found.insert(name.replace('-', "_"), (path, depends(&bytes)));
        }
    }
    Ok(found)
}

/// A module's `depends=` (its .modinfo entries are NUL-separated
/// `key=value` strings).
pub fn depends(ko: &[u8]) -> Vec<String> {
    const KEY: &[u8] = b"\0depends=";
    let Some(at) = ko.windows(KEY.len()).position(|w| w == KEY) else {
        return Vec::new();
    };
    let rest = &ko[at + KEY.len()..];
    let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    String::from_utf8_lossy(&rest[..end])
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.replace('-', "_"))
        .collect()
}

/// `wanted` and what they depend on, each after its dependencies.
pub fn load_order(
    all: &BTreeMap<String, (PathBuf, Vec<String>)>,
    wanted: &[&str],
) -> Result<Vec<String>, KernelError> {
    fn visit(
        name: &str,
        all: &BTreeMap<String, (PathBuf, Vec<String>)>,
        order: &mut Vec<String>,
        path: &mut Vec<String>,
    ) -> Result<(), KernelError> {
        if order.iter().any(|o| o == name) {
            return Ok(());
        }
        if path.iter().any(|p| p == name) {
            return Err(KernelError::Package(format!(
                "modules depend on each other in a circle: {}",
                path.join(" → ")
            )));
        }
        let (_, deps) = all
            .get(name)
            .ok_or_else(|| KernelError::Package(format!("the kernel has no module {name}")))?;
        path.push(name.to_owned());
        for d in deps {
            visit(d, all, order, path)?;
        }
        path.pop();
        order.push(name.to_owned());
        Ok(())
    }
    let mut order = Vec::new();
    for w in wanted {
        visit(w, all, &mut order, &mut Vec::new())?;
    }
    Ok(order)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depends_is_read_from_the_modinfo_strings() {
        let ko = b"\x7fELF...\0license=GPL\0depends=virtio,virtio_ring\0vermagic=6.1\0";
        assert_eq!(depends(ko), vec!["virtio", "virtio_ring"]);
        assert!(depends(b"\0depends=\0name=x\0").is_empty());
        assert!(depends(b"no modinfo").is_empty());
    }

    #[test]
    fn modules_load_after_their_dependencies_once_each() {
        let m = |deps: &[&str]| {
            (
                PathBuf::new(),
                deps.iter().map(|d| d.to_string()).collect::<Vec<_>>(),
            )
        };
        let all = BTreeMap::from([
            ("virtio_ring".to_owned(), m(&[])),
            ("virtio".to_owned(), m(&["virtio_ring"])),
            ("virtio_mmio".to_owned(), m(&["virtio", "virtio_ring"])),
            ("virtio_blk".to_owned(), m(&["virtio", "virtio_ring"])),
            ("overlay".to_owned(), m(&[])),
        ]);
        let order = load_order(&all, &["virtio_mmio", "virtio_blk", "overlay"]).unwrap();
        assert_eq!(
            order,
            [
                "virtio_ring",
                "virtio",
                "virtio_mmio",
                "virtio_blk",
                "overlay"
            ]
        );
        assert!(load_order(&all, &["nope"]).is_err());
        let circle = BTreeMap::from([("a".to_owned(), m(&["b"])), ("b".to_owned(), m(&["a"]))]);
        assert!(load_order(&circle, &["a"]).is_err());
    }
}
