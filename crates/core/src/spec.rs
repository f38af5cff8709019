//! What a caller asks for when it creates a sandbox, and its validation.
//!
//! A [`SandboxSpec`] is built from untrusted input (CLI flags now, JSON over
//! HTTP later); [`SandboxSpec::validate`] is the one gate that turns it into
//! something the jail may act on. Every rejection names the field and says
//! what would be accepted.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use crate::units::ByteSize;

/// Why a spec was rejected.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpecError {
    #[error("unknown template {name:?}: use `host`, `dir:/path/to/rootfs` or a template name (lowercase letters, digits, `.`, `_`, `-`, such as `base`)")]
    UnknownTemplate { name: String },
    #[error("template {name:?} is a named template: resolve it to its rootfs (`dir:`) first (brig run and brig serve do)")]
    UnresolvedTemplate { name: String },
    #[error("template directory {path:?} is not usable: {reason}")]
    TemplateDir { path: PathBuf, reason: String },
    #[error("--{field} {value} is out of range: {hint}")]
    OutOfRange {
        field: &'static str,
        value: String,
        hint: &'static str,
    },
    #[error(
        "invalid cpus {asked}: this host has only {host} CPUs; use a number of cores between \
         0.01 and {host}"
    )]
    TooManyCpus { asked: String, host: usize },
    #[error("invalid environment variable {input:?}: expected KEY=VALUE with KEY made of letters, digits and _ (not starting with a digit)")]
    Env { input: String },
    #[error("invalid --workdir {path:?}: it must be an absolute path inside the sandbox")]
    Workdir { path: String },
    #[error(
        "invalid --user {input:?}: expected a user name or a numeric uid (optionally uid:gid)"
    )]
    User { input: String },
    #[error("no command given: put the command after `--`, for example `brig run -- python3 -c 'print(42)'`")]
    NoCommand,
    #[error("invalid command argument: {reason}")]
    Command { reason: &'static str },
    #[error("invalid file for the sandbox's /run {path:?}: {reason}")]
    RunFile { path: String, reason: String },
}

/// A sandbox's identity: 12 lowercase hex digits. It is also the hostname
/// inside the sandbox and part of every host-side resource name, so the
/// format is strict.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct SandboxId(String);

impl SandboxId {
    pub const LEN: usize = 12;

    /// Build an id from 48 random bits.
    pub fn from_random(bits: u64) -> Self {
        SandboxId(format!("{:012x}", bits & 0xffff_ffff_ffff))
    }

    /// Accept an id from outside (a cgroup name, an API path) only if it has
    /// exactly the shape brig generates.
    pub fn parse(s: &str) -> Option<Self> {
        (s.len() == Self::LEN
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
        .then(|| SandboxId(s.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SandboxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The most layers an image may have (overlayfs takes up to 500 lower
/// layers; its mount options must fit a page).
pub const MAX_LAYERS: usize = 128;

/// Which root filesystem a sandbox starts from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "path")]
pub enum TemplateRef {
    /// The embedded default: a read-only view of the host's /usr, /bin,
    /// /sbin, /lib*, /etc and nothing else from the host.
    Host,
    /// Any unpacked root filesystem on the host (e.g. mmdebstrap output),
    /// used read-only as the lower layer of an overlay.
    Dir(PathBuf),
    /// A named template (`base`, `code-interpreter-v1`) that brig builds
    /// from a recipe (crate brig-template), or an image of brig's image
    /// store by its name (`alpine`, or a name given at import). The jail
    /// refuses it: the CLI and the daemon resolve it (to its built rootfs, a
    /// [`TemplateRef::Dir`], or its layers, [`TemplateRef::Layers`]).
    Named(String),
    /// An image reference (`python:3.12-slim`, `ghcr.io/o/i@sha256:…`,
    /// `127.0.0.1:5000/team/tool:1`): found in the image store, else pulled.
    /// Resolved like [`TemplateRef::Named`].
    Image(String),
    /// An image resolved to its unpacked layers, **top first** (overlay's
    /// `lowerdir` order), each used read-only as a lower layer of the
    /// sandbox's overlay. `image` is what the user named, shown back.
    Layers { image: String, lowers: Vec<PathBuf> },
}

impl TemplateRef {
    /// Parse `host`, `dir:PATH` or a template name (`[a-z0-9][a-z0-9._-]*`,
    /// at most 64 bytes). Whether the directory is usable is checked by
    /// [`SandboxSpec::validate`], which touches the filesystem; whether a
    /// name is known, by whoever resolves it.
    pub fn parse(s: &str) -> Result<Self, SpecError> {
        match s {
            "host" => Ok(TemplateRef::Host),
            _ => match s.strip_prefix("dir:") {
                Some(p) if !p.is_empty() => Ok(TemplateRef::Dir(PathBuf::from(p))),
                None if Self::valid_name(s) => Ok(TemplateRef::Named(s.to_string())),
                None if Self::valid_image_ref(s) => Ok(TemplateRef::Image(s.to_string())),
                _ => Err(SpecError::UnknownTemplate {
                    name: s.to_string(),
                }),
            },
        }
    }

    /// Whether `s` has the shape of an image reference: `[HOST[:PORT]/]PATH
    /// [:TAG][@DIGEST]`, lowercase path components (tags may have
    /// uppercase), at most 255 bytes. Whether it exists is the puller's to
    /// say.
    pub fn valid_image_ref(s: &str) -> bool {
        let (name, digest) = match s.split_once('@') {
            Some((n, d)) => (n, Some(d)),
            None => (s, None),
        };
        let digest_ok = digest.is_none_or(|d| {
            d.split_once(':').is_some_and(|(alg, hex)| {
                !alg.is_empty()
                    && alg
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
                    && hex.len() >= 32
                    && hex.bytes().all(|b| b.is_ascii_hexdigit())
            })
        });
        // A tag is after the last ':' that follows the last '/'.
        let slash = name.rfind('/').map_or(0, |i| i + 1);
        let (path, tag) = match name[slash..].rfind(':') {
            Some(i) => (&name[..slash + i], Some(&name[slash + i + 1..])),
            None => (name, None),
        };
        let tag_ok = tag.is_none_or(|t| {
            !t.is_empty()
                && t.len() <= 128
                && !t.starts_with(['.', '-'])
                && t.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        });
        let mut parts = path.split('/').peekable();
        let mut first = true;
        let mut path_ok = !path.is_empty();
        while let Some(part) = parts.next() {
            let is_host = first
                && parts.peek().is_some()
                && (part.contains(['.', ':']) || part == "localhost");
            let ok = if is_host {
                !part.is_empty()
                    && part
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b".-:".contains(&b))
            } else {
                !part.is_empty()
                    && part.as_bytes()[0].is_ascii_alphanumeric()
                    && part.bytes().all(|b| {
                        b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b)
                    })
            };
            path_ok &= ok;
            first = false;
        }
        s.len() <= 255 && path_ok && tag_ok && digest_ok
    }

    /// Whether `s` has the shape of a template name.
    pub fn valid_name(s: &str) -> bool {
        let b = s.as_bytes();
        !b.is_empty()
            && b.len() <= 64
            && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
            && b.iter()
                .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"._-".contains(&c))
    }
}

impl fmt::Display for TemplateRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TemplateRef::Host => f.write_str("host"),
            TemplateRef::Dir(p) => write!(f, "dir:{}", p.display()),
            TemplateRef::Named(n) | TemplateRef::Image(n) => f.write_str(n),
            TemplateRef::Layers { image, .. } => f.write_str(image),
        }
    }
}

/// Resource bounds. Defaults are what `brig run` uses when a flag is absent.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Limits {
    /// Memory (RAM, and with it the tmpfs-backed writable layer and /tmp).
    /// Going over kills the sandbox.
    pub memory: ByteSize,
    /// Maximum number of tasks (processes and threads) alive at once.
    pub pids: u32,
    /// CPU quota in cores (1.5 = one and a half cores); `None` is unlimited.
    pub cpus: Option<f64>,
    /// Size of the writable layer, and separately of /tmp.
    pub disk: ByteSize,
    /// Wall-clock limit; `None` runs until the command exits.
    pub timeout: Option<Duration>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory: ByteSize::mib(512),
            pids: 256,
            cpus: None,
            disk: ByteSize::mib(1024),
            timeout: None,
        }
    }
}

impl Limits {
    /// Limits from a request's fields (sizes as `512M`, `1G`), the defaults
    /// for what is absent; a size that does not parse is `Err` with the
    /// field's name and why. Every front-end's create reads them this way.
    pub fn from_request(
        memory: Option<&str>,
        disk: Option<&str>,
        pids: Option<u32>,
        cpus: Option<f64>,
    ) -> Result<Limits, (&'static str, String)> {
        let size = |field, s: &str| crate::units::parse_size(s).map_err(|e| (field, e.to_string()));
        let mut limits = Limits::default();
        if let Some(m) = memory {
            limits.memory = size("memory", m)?;
        }
        if let Some(d) = disk {
            limits.disk = size("disk", d)?;
        }
        if let Some(p) = pids {
            limits.pids = p;
        }
        limits.cpus = cpus;
        Ok(limits)
    }

    /// The limits' own rule, the same wherever they come from (a spec, a
    /// daemon's defaults).
    pub fn validate(&self) -> Result<(), SpecError> {
        let l = self;
        if l.memory.bytes() < 16 * ByteSize::MIB {
            return Err(SpecError::OutOfRange {
                field: "memory",
                value: l.memory.to_string(),
                hint: "the minimum is 16M",
            });
        }
        if l.pids < 4 || l.pids > 1 << 22 {
            return Err(SpecError::OutOfRange {
                field: "pids",
                value: l.pids.to_string(),
                hint: "use a number between 4 and 4194304",
            });
        }
        if let Some(c) = l.cpus {
            if !(c.is_finite() && (0.01..=1024.0).contains(&c)) {
                return Err(SpecError::OutOfRange {
                    field: "cpus",
                    value: c.to_string(),
                    hint: "use a number of cores between 0.01 and 1024, for example 0.5 or 2",
                });
            }
            // A quota above the host's CPUs limits nothing: refused, as
            // docker does, rather than silently meaningless.
            let host = crate::host_cpus();
            if c > host as f64 {
                return Err(SpecError::TooManyCpus {
                    asked: c.to_string(),
                    host,
                });
            }
        }
        if l.disk.bytes() < ByteSize::MIB {
            return Err(SpecError::OutOfRange {
                field: "disk",
                value: l.disk.to_string(),
                hint: "the minimum is 1M",
            });
        }
        if l.timeout.is_some_and(|t| t.is_zero()) {
            return Err(SpecError::OutOfRange {
                field: "timeout",
                value: "0s".into(),
                hint: "use a positive duration such as 30s, or leave it out for no limit",
            });
        }
        Ok(())
    }
}

/// An environment variable for the sandboxed command.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EnvVar {
    pub key: String,
    pub value: String,
}

impl EnvVar {
    /// Variables from a request's `{"NAME": "value"}` map.
    pub fn from_map(
        vars: &std::collections::BTreeMap<String, String>,
    ) -> Result<Vec<EnvVar>, SpecError> {
        vars.iter()
            .map(|(k, v)| EnvVar::parse(&format!("{k}={v}")))
            .collect()
    }

    pub fn parse(s: &str) -> Result<Self, SpecError> {
        let err = || SpecError::Env {
            input: s.to_string(),
        };
        let (key, value) = s.split_once('=').ok_or_else(err)?;
        let valid_key = !key.is_empty()
            && !key.starts_with(|c: char| c.is_ascii_digit())
            && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !valid_key || value.contains('\0') {
            return Err(err());
        }
        Ok(EnvVar {
            key: key.to_string(),
            value: value.to_string(),
        })
    }
}

/// Who the command runs as inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum UserSpec {
    /// Looked up in the template's /etc/passwd.
    Name(String),
    /// A numeric uid, with an explicit gid or (if absent) gid = uid.
    Id { uid: u32, gid: Option<u32> },
}

impl UserSpec {
    pub fn parse(s: &str) -> Result<Self, SpecError> {
        let err = || SpecError::User {
            input: s.to_string(),
        };
        let (u, g) = match s.split_once(':') {
            Some((u, g)) => (u, Some(g)),
            None => (s, None),
        };
        if let Ok(uid) = u.parse::<u32>() {
            let gid = g.map(|g| g.parse::<u32>().map_err(|_| err())).transpose()?;
            if uid >= 65536 || gid.is_some_and(|g| g >= 65536) {
                return Err(err());
            }
            return Ok(UserSpec::Id { uid, gid });
        }
        let valid_name = !u.is_empty()
            && g.is_none()
            && u.len() <= 32
            && u.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
        if valid_name {
            Ok(UserSpec::Name(u.to_string()))
        } else {
            Err(err())
        }
    }
}

/// Everything needed to start one sandboxed command.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SandboxSpec {
    pub template: TemplateRef,
    pub limits: Limits,
    pub env: Vec<EnvVar>,
    /// Absolute path inside the sandbox; created if missing.
    pub workdir: Option<String>,
    pub user: Option<UserSpec>,
    /// argv; `argv[0]` is looked up on the sandbox's PATH.
    pub command: Vec<String>,
    /// Give the command a pseudo-terminal.
    pub tty: bool,
    /// Pass the caller's stdin through (otherwise /dev/null).
    pub stdin: bool,
    /// Let setuid/setgid binaries of the template work (e.g. `sudo` for a
    /// non-root user): no_new_privs is not set and the template's overlay
    /// is not nosuid. They can only become the sandbox's own root, which is
    /// no one on the host (see docs/threat-model.md). Off by default.
    #[serde(default)]
    pub allow_setuid: bool,
    /// Files put in the sandbox's own `/run` before the command starts
    /// (`brig run` gives a sandbox that injects headers the CA it trusts
    /// this way). At most [`RunFile::MAX_COUNT`], [`RunFile::MAX_TOTAL`]
    /// bytes in all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub run_files: Vec<RunFile>,
    /// Keep the sandbox's writable layer in this host directory (which
    /// holds `upper/` and `work/`, owned as inside the sandbox: it is
    /// idmapped like the template) instead of on the sandbox's own tmpfs,
    /// so that what the command changed outlives it: how an image build
    /// turns a RUN step into a layer. For the host's own callers only:
    /// nothing a client sends sets it. Needs an overlay template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upper_dir: Option<PathBuf>,
}

/// A file of the sandbox's `/run`, written before its command starts.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RunFile {
    /// A plain file name (letters, digits, `.`, `_`, `-`): `/run/{name}`.
    pub name: String,
    pub contents: Vec<u8>,
    /// Permission bits, e.g. `0o644`.
    pub mode: u32,
}

impl RunFile {
    pub const MAX_COUNT: usize = 16;
    pub const MAX_TOTAL: usize = 4 << 20;

    /// Its path inside the sandbox.
    pub fn path(&self) -> String {
        format!("/run/{}", self.name)
    }

    fn check(&self) -> Result<(), SpecError> {
        let bad = |reason: &str| SpecError::RunFile {
            path: self.path(),
            reason: reason.into(),
        };
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 64
            && !self.name.starts_with('.')
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if !name_ok {
            return Err(bad(
                "a name is 1 to 64 letters, digits, '.', '_' or '-', not starting with '.'",
            ));
        }
        if self.mode & !0o777 != 0 {
            return Err(bad(
                "the mode may hold permission bits only (at most 0o777)",
            ));
        }
        Ok(())
    }
}

impl SandboxSpec {
    pub fn new(command: Vec<String>) -> Self {
        SandboxSpec {
            template: TemplateRef::Host,
            limits: Limits::default(),
            env: Vec::new(),
            workdir: None,
            user: None,
            command,
            tty: false,
            stdin: false,
            allow_setuid: false,
            run_files: Vec::new(),
            upper_dir: None,
        }
    }

    /// The one gate between untrusted input and the jail.
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.command.is_empty() || self.command[0].is_empty() {
            return Err(SpecError::NoCommand);
        }
        if self.command.iter().any(|a| a.contains('\0')) {
            return Err(SpecError::Command {
                reason: "arguments may not contain NUL bytes",
            });
        }
        self.limits.validate()?;
        for f in &self.run_files {
            f.check()?;
        }
        let total: usize = self.run_files.iter().map(|f| f.contents.len()).sum();
        if self.run_files.len() > RunFile::MAX_COUNT || total > RunFile::MAX_TOTAL {
            return Err(SpecError::RunFile {
                path: "/run".into(),
                reason: format!(
                    "at most {} files of {} bytes in all ({} files, {total} bytes given)",
                    RunFile::MAX_COUNT,
                    RunFile::MAX_TOTAL,
                    self.run_files.len()
                ),
            });
        }
        if let Some(upper) = &self.upper_dir {
            let overlay = matches!(
                self.template,
                TemplateRef::Dir(_) | TemplateRef::Layers { .. }
            );
            if !overlay
                || !upper.is_absolute()
                || !upper.join("upper").is_dir()
                || !upper.join("work").is_dir()
            {
                return Err(SpecError::TemplateDir {
                    path: upper.clone(),
                    reason: "a kept writable layer needs an overlay template and an absolute \
                             directory holding upper/ and work/"
                        .into(),
                });
            }
        }
        if let Some(w) = &self.workdir {
            if !w.starts_with('/') || w.contains('\0') {
                return Err(SpecError::Workdir { path: w.clone() });
            }
        }
        if let TemplateRef::Named(name) | TemplateRef::Image(name) = &self.template {
            return Err(SpecError::UnresolvedTemplate { name: name.clone() });
        }
        if let TemplateRef::Layers { image, lowers } = &self.template {
            // Any image: one without a shell (distroless) runs its command.
            let bad = lowers.iter().find(|l| !l.is_absolute() || !l.is_dir());
            if lowers.is_empty() || lowers.len() > MAX_LAYERS || bad.is_some() {
                return Err(SpecError::TemplateDir {
                    path: bad.cloned().unwrap_or_default(),
                    reason: format!(
                        "image {image}: its {} layers must be 1 to {MAX_LAYERS} unpacked \
                         directories (`brig template pull {image}` again)",
                        lowers.len()
                    ),
                });
            }
        }
        if let TemplateRef::Dir(p) = &self.template {
            let reason = match std::fs::metadata(p) {
                Err(e) => Some(format!("{e}")),
                Ok(m) if !m.is_dir() => Some("not a directory".to_string()),
                Ok(_) if !p.is_absolute() => Some("use an absolute path".to_string()),
                Ok(_) if std::fs::symlink_metadata(p.join("bin/sh")).is_err() => Some(
                    "it has no bin/sh; point at the root of an unpacked filesystem".to_string(),
                ),
                Ok(_) => None,
            };
            if let Some(reason) = reason {
                return Err(SpecError::TemplateDir {
                    path: p.clone(),
                    reason,
                });
            }
        }
        Ok(())
    }
}

/// `TERM` for a command given a terminal (`-t`) whose spec names none: the
/// caller's, or `xterm` (what docker gives), on every tier alike.
pub fn terminal_type() -> String {
    std::env::var("TERM")
        .ok()
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| "xterm".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_files_are_plain_names_in_run_and_bounded() {
        let file = |name: &str, len: usize| RunFile {
            name: name.into(),
            contents: vec![b'x'; len],
            mode: 0o644,
        };
        let with = |files: Vec<RunFile>| {
            let mut spec = SandboxSpec::new(vec!["true".into()]);
            spec.run_files = files;
            spec.validate()
        };
        assert!(with(vec![file("brig-ca.crt", 10)]).is_ok());
        for bad in ["", ".hidden", "a/b", "..", "x y", &"n".repeat(65)] {
            let err = with(vec![file(bad, 1)]).unwrap_err();
            assert!(matches!(err, SpecError::RunFile { .. }), "{bad:?}: {err}");
        }
        let mut odd = file("f", 1);
        odd.mode = 0o4755;
        assert!(with(vec![odd]).is_err());
        // At the limits and past them.
        let each = RunFile::MAX_TOTAL / RunFile::MAX_COUNT;
        let full: Vec<_> = (0..RunFile::MAX_COUNT)
            .map(|i| file(&format!("f{i}"), each))
            .collect();
        assert!(with(full.clone()).is_ok());
        let mut too_many = full.clone();
        too_many.push(file("one-more", 0));
        assert!(with(too_many).is_err());
        let mut too_big = full;
        too_big[0].contents.push(b'x');
        assert!(with(too_big)
            .unwrap_err()
            .to_string()
            .contains("bytes in all"));
    }

    #[test]
    fn templates_parse() {
        assert_eq!(TemplateRef::parse("host").unwrap(), TemplateRef::Host);
        assert_eq!(
            TemplateRef::parse("dir:/x").unwrap(),
            TemplateRef::Dir("/x".into())
        );
        assert_eq!(
            TemplateRef::parse("code-interpreter-v1").unwrap(),
            TemplateRef::Named("code-interpreter-v1".into())
        );
        assert_eq!(TemplateRef::parse("base").unwrap().to_string(), "base");
        for good in [
            "python:3.12-slim",
            "library/python",
            "127.0.0.1:5000/team/tool:v1.2",
            "localhost/x",
            "ghcr.io/o/i@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "x:y",
            "a/b",
        ] {
            assert!(
                matches!(TemplateRef::parse(good), Ok(TemplateRef::Image(_))),
                "{good:?} is an image reference"
            );
        }
        for bad in [
            "Ubuntu",
            "-x",
            ".x",
            "a b",
            "",
            "dir:",
            "A/b",
            "x:",
            "x@sha256:zz",
            "a//b",
            "/a",
        ] {
            assert!(
                matches!(
                    TemplateRef::parse(bad),
                    Err(SpecError::UnknownTemplate { .. })
                ),
                "{bad:?}"
            );
        }
        // Longer than a template name: an image reference, up to its own
        // limit.
        assert!(matches!(
            TemplateRef::parse(&"a".repeat(65)),
            Ok(TemplateRef::Image(_))
        ));
        assert!(TemplateRef::parse(&"a".repeat(255)).is_ok());
        assert!(TemplateRef::parse(&"a".repeat(256)).is_err());
        // The jail never sees a name: it must be resolved to `dir:` first.
        let mut spec = SandboxSpec::new(vec!["true".into()]);
        spec.template = TemplateRef::Named("base".into());
        assert!(matches!(
            spec.validate(),
            Err(SpecError::UnresolvedTemplate { .. })
        ));
    }

    #[test]
    fn env_vars_need_a_valid_key() {
        assert_eq!(
            EnvVar::parse("A_1=x=y").unwrap(),
            EnvVar {
                key: "A_1".into(),
                value: "x=y".into()
            }
        );
        assert_eq!(EnvVar::parse("E=").unwrap().value, "");
        for bad in ["NOEQUALS", "=v", "1A=v", "A-B=v", "A B=v"] {
            assert!(EnvVar::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn users_parse_as_names_or_ids() {
        assert_eq!(
            UserSpec::parse("nobody").unwrap(),
            UserSpec::Name("nobody".into())
        );
        assert_eq!(
            UserSpec::parse("1000").unwrap(),
            UserSpec::Id {
                uid: 1000,
                gid: None
            }
        );
        assert_eq!(
            UserSpec::parse("1000:100").unwrap(),
            UserSpec::Id {
                uid: 1000,
                gid: Some(100)
            }
        );
        for bad in ["", "70000", "1000:x", "a:b", "x/y", "root\n"] {
            assert!(UserSpec::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn validation_rejects_each_bad_field() {
        let ok = SandboxSpec::new(vec!["true".into()]);
        ok.validate().unwrap();

        // More cores than the host has: refused, naming the host's count.
        let host = std::thread::available_parallelism().unwrap().get();
        let mut s = ok.clone();
        s.limits.cpus = Some(host as f64 + 1.0);
        let err = s.validate().unwrap_err();
        assert!(
            matches!(err, SpecError::TooManyCpus { host: h, .. } if h == host),
            "{err}"
        );
        assert!(
            err.to_string().contains(&format!("only {host} CPUs")),
            "{err}"
        );
        s.limits.cpus = Some(host as f64);
        s.validate().unwrap();

        let mut s = ok.clone();
        s.command.clear();
        assert_eq!(s.validate(), Err(SpecError::NoCommand));

        let mut s = ok.clone();
        s.limits.memory = ByteSize(1000);
        assert!(matches!(
            s.validate(),
            Err(SpecError::OutOfRange {
                field: "memory",
                ..
            })
        ));

        let mut s = ok.clone();
        s.limits.cpus = Some(f64::NAN);
        assert!(matches!(
            s.validate(),
            Err(SpecError::OutOfRange { field: "cpus", .. })
        ));

        let mut s = ok.clone();
        s.limits.timeout = Some(Duration::ZERO);
        assert!(matches!(
            s.validate(),
            Err(SpecError::OutOfRange {
                field: "timeout",
                ..
            })
        ));

        let mut s = ok.clone();
        s.workdir = Some("relative/dir".into());
        assert!(matches!(s.validate(), Err(SpecError::Workdir { .. })));

        let mut s = ok.clone();
        s.template = TemplateRef::Dir("/definitely/not/here".into());
        assert!(matches!(s.validate(), Err(SpecError::TemplateDir { .. })));
    }

    #[test]
    fn ids_round_trip_and_reject_foreign_shapes() {
        let id = SandboxId::from_random(0xdead_beef_cafe_f00d);
        assert_eq!(id.as_str().len(), SandboxId::LEN);
        assert_eq!(SandboxId::parse(id.as_str()), Some(id));
        assert_eq!(SandboxId::parse("../etc/passw"), None);
        assert_eq!(SandboxId::parse("ABCDEF012345"), None);
    }
}
