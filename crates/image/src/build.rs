//! Building an image from a Dockerfile: `FROM` (an image of the store, one
//! to pull, or `scratch`), `RUN`, `COPY`/`ADD` (local files), `ENV`,
//! `ARG`, `WORKDIR`, `USER`, `ENTRYPOINT`, `CMD` (`LABEL`, `EXPOSE`,
//! `MAINTAINER` are accepted and change nothing a sandbox sees).
//!
//! - **RUN** runs in a sandbox whose root is the image so far and whose
//!   writable layer is kept in a directory of the store (the caller's
//!   [`RunStep`] does the running: brig's jail, with its network); what it
//!   changed becomes the next layer (overlayfs already wrote deletions as
//!   0/0 whiteouts and replaced directories as opaque: they become the OCI
//!   `.wh.` entries of the layer's tar).
//! - **COPY** makes a layer straight from the context's files, owned by
//!   root or `--chown=UID:GID`, with no sandbox.
//! - **The others** change the image's config only.
//! - **Each step is cached by its inputs**: the image so far (a chain of
//!   the steps before), the instruction as written after `ARG`/`ENV`
//!   substitution, the environment a RUN sees, and for COPY the contents,
//!   modes and names of what it copies. An unchanged rebuild makes no
//!   sandbox and writes nothing; a change rebuilds from that step on.
//!   The cache is `images/build-cache/<key>` (the layer's diff id).
//! - A failed step fails the build with the Dockerfile's line number and
//!   registers nothing.
//!
//! Layers are kept as uncompressed tars (their digest is their diff id).
//! Extended attributes of built files (file capabilities) are not kept yet.

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

use crate::layer::Owners;
use crate::{ImageConfig, ImageError, ImageRecord, ImageStore};

/// One instruction, with its line.
#[derive(Debug, Clone, PartialEq)]
pub enum Instruction {
    From(String),
    Run(Vec<String>),
    Copy {
        sources: Vec<String>,
        dest: String,
        chown: Option<(u32, u32)>,
        /// Not from a Dockerfile: what E2B's `copy` adds (`None` for COPY).
        extra: Option<CopyExtra>,
    },
    /// A RUN as a named user (E2B's `run_cmd(..., user=)`), whatever USER says.
    RunAs(Vec<String>, String),
    Env(Vec<(String, String)>),
    Arg(String, Option<String>),
    Workdir(String),
    User(String),
    Entrypoint(Vec<String>),
    Cmd(Vec<String>),
    /// LABEL, EXPOSE, MAINTAINER, …: nothing a sandbox sees.
    Ignored,
}

impl std::fmt::Display for Instruction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let argv = |a: &[String]| match a {
            [sh, c, line] if sh == "/bin/sh" && c == "-c" => line.clone(),
            _ => serde_json::to_string(a).unwrap_or_default(),
        };
        match self {
            Instruction::From(i) => write!(f, "FROM {i}"),
            Instruction::Run(a) => write!(f, "RUN {}", argv(a)),
            Instruction::RunAs(a, u) => write!(f, "RUN (as {u}) {}", argv(a)),
            Instruction::Copy { sources, dest, .. } => {
                write!(f, "COPY {} {dest}", sources.join(" "))
            }
            Instruction::Env(pairs) => {
                let kv: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
                write!(f, "ENV {}", kv.join(" "))
            }
            Instruction::Arg(k, Some(v)) => write!(f, "ARG {k}={v}"),
            Instruction::Arg(k, None) => write!(f, "ARG {k}"),
            Instruction::Workdir(d) => write!(f, "WORKDIR {d}"),
            Instruction::User(u) => write!(f, "USER {u}"),
            Instruction::Entrypoint(a) => write!(f, "ENTRYPOINT {}", argv(a)),
            Instruction::Cmd(a) => write!(f, "CMD {}", argv(a)),
            Instruction::Ignored => write!(f, "(no effect on the image)"),
        }
    }
}

/// How an E2B `copy` differs from a Dockerfile's COPY: its sources are
/// relative to their own directory (the files the client uploaded for this
/// step), symlinks among them are copied as links, the owner may be a name
/// of the image's `/etc/passwd` (`user` or `user:group`), and a mode may be
/// set on everything copied.
#[derive(Debug, Clone, PartialEq)]
pub struct CopyExtra {
    pub context: PathBuf,
    pub owner: Option<String>,
    pub mode: Option<u32>,
}

/// One step of a build: an instruction, the line (or step number) errors
/// name, and whether to build it afresh even if it is cached (E2B's
/// `skip_cache`: this step and every later one).
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub line: usize,
    pub instruction: Instruction,
    pub force: bool,
}

/// A RUN for the caller to execute: `argv` in a sandbox whose root is
/// `lowers` (top first) and whose writable layer is kept in `upper_dir`
/// (holding `upper/` and `work/`), with `env`, `workdir` and `user`.
#[derive(Debug)]
pub struct RunStep<'a> {
    pub line: usize,
    pub argv: &'a [String],
    pub lowers: Vec<PathBuf>,
    pub upper_dir: &'a Path,
    pub env: &'a [String],
    pub workdir: Option<&'a str>,
    pub user: Option<&'a str>,
}

/// What a build needs from its caller.
pub struct Builder<'a> {
    pub store: &'a ImageStore,
    /// The directory COPY reads from.
    pub context: &'a Path,
    /// `--build-arg NAME=VALUE`s.
    pub build_args: HashMap<String, String>,
    /// The image a FROM names, pulled if the caller pulls.
    pub base: &'a mut dyn FnMut(&str) -> Result<ImageRecord, String>,
    /// Runs a RUN step; `Err` is why it failed (its exit status, …).
    pub run: &'a mut dyn FnMut(&RunStep<'_>) -> Result<(), String>,
    /// One line per step (`Step 2/5: RUN …`, `(cached)`).
    pub say: &'a mut dyn FnMut(&str),
}

impl std::fmt::Debug for Builder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builder")
            .field("context", &self.context)
            .finish_non_exhaustive()
    }
}

fn bad(line: usize, reason: impl Into<String>) -> ImageError {
    ImageError::Dockerfile {
        line,
        reason: reason.into(),
    }
}

/// The instructions of a Dockerfile, each with its (first) line number:
/// comments and blank lines skipped, `\` continuations joined.
pub fn parse(text: &str) -> Result<Vec<(usize, Instruction)>, ImageError> {
    let mut out = Vec::new();
    let mut pending = String::new();
    let mut start = 0;
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let trimmed = raw.trim();
        if pending.is_empty() && (trimmed.is_empty() || trimmed.starts_with('#')) {
            continue;
        }
        if pending.is_empty() {
            start = line;
        } else if trimmed.starts_with('#') {
            continue;
        }
        if let Some(body) = trimmed.strip_suffix('\\') {
            pending.push_str(body);
            pending.push(' ');
            continue;
        }
        pending.push_str(trimmed);
        out.push((start, instruction(start, &std::mem::take(&mut pending))?));
    }
    if !pending.is_empty() {
        return Err(bad(
            start,
            "the last instruction ends with a line continuation (\\)",
        ));
    }
    match out.first() {
        Some((_, Instruction::From(_) | Instruction::Arg(..))) => Ok(out),
        Some((line, _)) => Err(bad(
            *line,
            "a Dockerfile starts with FROM (ARG may come before it)",
        )),
        None => Err(bad(1, "the Dockerfile has no instructions")),
    }
}

fn instruction(line: usize, text: &str) -> Result<Instruction, ImageError> {
    let (word, rest) = text.split_once(char::is_whitespace).unwrap_or((text, ""));
    let rest = rest.trim();
    let need = |what: &str| {
        if rest.is_empty() {
            Err(bad(line, format!("{} needs {what}", word.to_uppercase())))
        } else {
            Ok(())
        }
    };
    Ok(match word.to_ascii_uppercase().as_str() {
        "FROM" => {
            need("an image (or scratch)")?;
            let mut parts = rest.split_whitespace();
            let image = parts.next().unwrap_or_default().to_string();
            if parts.next().is_some_and(|w| !w.eq_ignore_ascii_case("as")) {
                return Err(bad(line, "FROM takes IMAGE [AS NAME]"));
            }
            Instruction::From(image)
        }
        "RUN" => {
            need("a command")?;
            Instruction::Run(command(line, rest)?)
        }
        "CMD" => Instruction::Cmd(command(line, rest)?),
        "ENTRYPOINT" => Instruction::Entrypoint(command(line, rest)?),
        "COPY" | "ADD" => {
            need("sources and a destination")?;
            let mut words: Vec<String> = if rest.starts_with('[') {
                serde_json::from_str(rest).map_err(|e| bad(line, format!("bad JSON array: {e}")))?
            } else {
                rest.split_whitespace().map(str::to_string).collect()
            };
            let mut chown = None;
            while words.first().is_some_and(|w| w.starts_with("--")) {
                let flag = words.remove(0);
                if let Some(v) = flag.strip_prefix("--chown=") {
                    let (u, g) = v.split_once(':').unwrap_or((v, v));
                    let id = |s: &str| {
                        s.parse::<u32>().map_err(|_| {
                            bad(line, format!("--chown={v}: give numeric UID[:GID] (names are not resolved yet)"))
                        })
                    };
                    chown = Some((id(u)?, id(g)?));
                } else {
                    return Err(bad(
                        line,
                        format!("{word} does not take {flag} (only --chown=UID[:GID])"),
                    ));
                }
            }
            if words.len() < 2 {
                return Err(bad(
                    line,
                    format!("{word} needs at least one source and a destination"),
                ));
            }
            let dest = words.pop().unwrap_or_default();
            for s in &words {
                if s.contains("://") {
                    return Err(bad(
                        line,
                        format!("{word} {s}: URLs are not fetched; copy local files"),
                    ));
                }
            }
            Instruction::Copy {
                sources: words,
                dest,
                chown,
                extra: None,
            }
        }
        "ENV" => {
            need("NAME=VALUE")?;
            let pairs = if rest.contains('=') {
                words_of(rest)
                    .into_iter()
                    .map(|w| {
                        w.split_once('=')
                            .map(|(k, v)| (k.to_string(), v.to_string()))
                            .ok_or_else(|| bad(line, format!("ENV {w:?}: expected NAME=VALUE")))
                    })
                    .collect::<Result<Vec<_>, _>>()?
            } else {
                let (k, v) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
                vec![(k.to_string(), v.trim().to_string())]
            };
            Instruction::Env(pairs)
        }
        "ARG" => {
            need("a NAME")?;
            match rest.split_once('=') {
                Some((k, v)) => Instruction::Arg(k.trim().to_string(), Some(unquote(v.trim()))),
                None => Instruction::Arg(rest.to_string(), None),
            }
        }
        "WORKDIR" => {
            need("a directory")?;
            Instruction::Workdir(rest.to_string())
        }
        "USER" => {
            need("a user")?;
            Instruction::User(rest.to_string())
        }
        "LABEL" | "EXPOSE" | "MAINTAINER" | "STOPSIGNAL" | "HEALTHCHECK" | "VOLUME" | "SHELL"
        | "ONBUILD" => Instruction::Ignored,
        other => return Err(bad(line, format!("unknown instruction {other}"))),
    })
}

/// `["a", "b"]` (exec form) or a shell line (`/bin/sh -c LINE`).
fn command(line: usize, rest: &str) -> Result<Vec<String>, ImageError> {
    if rest.starts_with('[') {
        let argv: Vec<String> =
            serde_json::from_str(rest).map_err(|e| bad(line, format!("bad JSON array: {e}")))?;
        Ok(argv)
    } else if rest.is_empty() {
        Ok(Vec::new())
    } else {
        Ok(vec!["/bin/sh".into(), "-c".into(), rest.to_string()])
    }
}

/// Words split at blanks outside double quotes, quotes removed.
fn words_of(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for c in s.chars() {
        match c {
            '"' => quoted = !quoted,
            c if c.is_whitespace() && !quoted => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

fn unquote(s: &str) -> String {
    s.trim_matches('"').to_string()
}

/// `$NAME` and `${NAME}` replaced from `vars` (unknown ones: empty).
fn substitute(s: &str, vars: &HashMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (name, len) = if let Some(inner) = after.strip_prefix('{') {
            match inner.find('}') {
                Some(end) => (&inner[..end], end + 2),
                None => ("", 0),
            }
        } else {
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..end], end)
        };
        if name.is_empty() {
            out.push('$');
            rest = after;
            continue;
        }
        out.push_str(vars.get(name).map(String::as_str).unwrap_or(""));
        rest = &after[len..];
    }
    out.push_str(rest);
    out
}

fn sha(parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    hex::encode(h.finalize())
}

impl Builder<'_> {
    /// Build `dockerfile` (its text) as image `name`; `source` says where
    /// it came from (shown by `inspect`).
    pub fn build(
        &mut self,
        dockerfile: &str,
        name: &str,
        source: &str,
    ) -> Result<ImageRecord, ImageError> {
        let steps: Vec<Step> = parse(dockerfile)?
            .into_iter()
            .map(|(line, instruction)| Step {
                line,
                instruction,
                force: false,
            })
            .collect();
        self.build_steps(&steps, name, source)
    }

    /// Build `steps` (a parsed Dockerfile, or E2B's template steps) as
    /// image `name`. Nothing is registered unless every step succeeded.
    pub fn build_steps(
        &mut self,
        steps: &[Step],
        name: &str,
        source: &str,
    ) -> Result<ImageRecord, ImageError> {
        let total = steps.len();
        let mut forced = false;
        let mut layers: Vec<String> = Vec::new();
        // A directory below the layers, for an image made over a named
        // template's build (its `base`): RUN and COPY see it, the result
        // keeps it.
        let mut below: Option<PathBuf> = None;
        let mut config = ImageConfig::default();
        let mut chain = String::new();
        let mut args: HashMap<String, String> = HashMap::new();
        let mut from_seen = false;
        for (
            n,
            Step {
                line,
                instruction: step,
                force,
            },
        ) in steps.iter().enumerate()
        {
            let line = *line;
            forced |= *force;
            // What later instructions substitute: ARGs, then the image's ENV.
            let mut vars = args.clone();
            for kv in &config.env {
                if let Some((k, v)) = kv.split_once('=') {
                    vars.insert(k.to_string(), v.to_string());
                }
            }
            let shown = step.to_string();
            (self.say)(&format!("Step {}/{total} (line {line}): {}", n + 1, shown));
            match step {
                Instruction::Arg(k, default) => {
                    let v = self
                        .build_args
                        .get(k)
                        .cloned()
                        .or(default.clone())
                        .unwrap_or_default();
                    args.insert(k.clone(), v);
                }
                Instruction::From(image) => {
                    if from_seen {
                        return Err(bad(
                            line,
                            "only one FROM: multi-stage builds are not supported yet",
                        ));
                    }
                    from_seen = true;
                    let image = substitute(image, &vars);
                    if image != "scratch" {
                        let base = (self.base)(&image)
                            .map_err(|e| bad(line, format!("FROM {image}: {e}")))?;
                        layers = base.layers.clone();
                        below = base.base.clone();
                        config = base.config.clone();
                        chain = base.digest.clone();
                    } else {
                        chain = "scratch".into();
                    }
                }
                _ if !from_seen => return Err(bad(line, "FROM must come before this")),
                Instruction::Env(pairs) => {
                    for (k, v) in pairs {
                        let v = substitute(v, &vars);
                        config
                            .env
                            .retain(|e| e.split_once('=').map(|(ek, _)| ek) != Some(k.as_str()));
                        config.env.push(format!("{k}={v}"));
                        vars.insert(k.clone(), v);
                    }
                }
                Instruction::Workdir(d) => {
                    let d = substitute(d, &vars);
                    let d = if d.starts_with('/') {
                        d
                    } else {
                        format!(
                            "{}/{d}",
                            config
                                .working_dir
                                .as_deref()
                                .unwrap_or("")
                                .trim_end_matches('/')
                        )
                    };
                    // Made if the image lacks it (as docker does), owned by
                    // the USER so far: a layer of its own, cached.
                    let lowers = self.lowers(&layers, &below);
                    let missing = !lowers.is_empty()
                        && !lowers.iter().any(|l| {
                            l.join(d.trim_start_matches('/'))
                                .symlink_metadata()
                                .is_ok_and(|m| m.is_dir())
                        });
                    if missing {
                        let owner = match config.user.as_deref() {
                            Some(u) => owner_ids(&self.lowers(&layers, &below), u)
                                .map_err(|e| bad(line, e))?,
                            None => (0, 0),
                        };
                        let key = sha(&[
                            chain.as_bytes(),
                            b"WORKDIR",
                            d.as_bytes(),
                            format!("{owner:?}").as_bytes(),
                        ]);
                        let diff_id = match self.cached(&key).filter(|_| !forced) {
                            Some(id) => {
                                (self.say)("  (cached)");
                                id
                            }
                            None => {
                                let staged = tempfile::Builder::new()
                                    .prefix(".workdir-")
                                    .tempdir_in(self.store.root())
                                    .map_err(io_err("make a build directory", self.store.root()))?;
                                let dir = staged.path().join(d.trim_start_matches('/'));
                                fs::create_dir_all(&dir).map_err(io_err("create", &dir))?;
                                let id = layer_from_dir(
                                    self.store,
                                    staged.path(),
                                    Some(owner),
                                    &self.lowers(&layers, &below),
                                )?;
                                self.remember(&key, &id);
                                id
                            }
                        };
                        chain = sha(&[key.as_bytes(), diff_id.as_bytes()]);
                        layers.push(diff_id);
                    }
                    config.working_dir = Some(d);
                }
                Instruction::User(u) => config.user = Some(substitute(u, &vars)),
                Instruction::Entrypoint(argv) => config.entrypoint = argv.clone(),
                Instruction::Cmd(argv) => config.cmd = argv.clone(),
                Instruction::Ignored => {}
                Instruction::Run(_) | Instruction::RunAs(..) => {
                    let (argv, user) = match step {
                        Instruction::RunAs(argv, user) => (argv, Some(user.as_str())),
                        Instruction::Run(argv) => (argv, config.user.as_deref()),
                        _ => unreachable!("matched above"),
                    };
                    // The build args a RUN sees, as docker passes them.
                    let mut env = config.env.clone();
                    for (k, v) in &args {
                        if !env.iter().any(|e| e.starts_with(&format!("{k}="))) {
                            env.push(format!("{k}={v}"));
                        }
                    }
                    let key = sha(&[
                        chain.as_bytes(),
                        b"RUN",
                        serde_json::to_string(argv).unwrap_or_default().as_bytes(),
                        serde_json::to_string(&env).unwrap_or_default().as_bytes(),
                        config.working_dir.as_deref().unwrap_or("").as_bytes(),
                        user.unwrap_or("").as_bytes(),
                    ]);
                    let diff_id = match self.cached(&key).filter(|_| !forced) {
                        Some(d) => {
                            (self.say)("  (cached)");
                            d
                        }
                        None => {
                            let keep = tempfile::Builder::new()
                                .prefix(".build-")
                                .tempdir_in(self.store.root())
                                .map_err(io_err("make a build directory", self.store.root()))?;
                            fs::create_dir(keep.path().join("upper"))
                                .and_then(|_| fs::create_dir(keep.path().join("work")))
                                .map_err(io_err("make a build directory", keep.path()))?;
                            if layers.is_empty() && below.is_none() {
                                return Err(bad(line, "RUN needs an image with a shell: FROM scratch has nothing to run"));
                            }
                            let lowers = self.lowers(&layers, &below);
                            (self.run)(&RunStep {
                                line,
                                argv,
                                lowers,
                                upper_dir: keep.path(),
                                env: &env,
                                workdir: config.working_dir.as_deref(),
                                user,
                            })
                            .map_err(|e| bad(line, format!("RUN failed: {e}")))?;
                            let d = self.layer_from_dir(&keep.path().join("upper"), None, &[])?;
                            self.remember(&key, &d);
                            d
                        }
                    };
                    chain = sha(&[key.as_bytes(), diff_id.as_bytes()]);
                    layers.push(diff_id);
                }
                Instruction::Copy {
                    sources,
                    dest,
                    chown,
                    extra,
                } => {
                    let dest = substitute(dest, &vars);
                    let dest = if dest.starts_with('/') {
                        dest
                    } else {
                        format!("{}/{dest}", config.working_dir.as_deref().unwrap_or(""))
                    };
                    let staged = self.stage_copy(line, sources, &dest, &vars, extra.as_ref())?;
                    let chown = match extra.as_ref().and_then(|e| e.owner.as_deref()) {
                        Some(owner) => Some(
                            owner_ids(&self.lowers(&layers, &below), owner)
                                .map_err(|e| bad(line, e))?,
                        ),
                        None => *chown,
                    };
                    let content = tree_hash(staged.path())
                        .map_err(io_err("read the copied files", staged.path()))?;
                    let key = sha(&[
                        chain.as_bytes(),
                        b"COPY",
                        content.as_bytes(),
                        format!("{chown:?}").as_bytes(),
                    ]);
                    let diff_id = match self.cached(&key).filter(|_| !forced) {
                        Some(d) => {
                            (self.say)("  (cached)");
                            d
                        }
                        None => {
                            let d = self.layer_from_dir(
                                staged.path(),
                                Some(chown.unwrap_or((0, 0))),
                                &self.lowers(&layers, &below),
                            )?;
                            self.remember(&key, &d);
                            d
                        }
                    };
                    chain = sha(&[key.as_bytes(), diff_id.as_bytes()]);
                    layers.push(diff_id);
                }
            }
        }
        if !from_seen {
            return Err(bad(1, "the Dockerfile has no FROM"));
        }
        self.register(name, source, layers, config, below)
    }

    /// The lower directories of an image of `layers` over `below`, top
    /// first (as the store's `lowers`).
    fn lowers(&self, layers: &[String], below: &Option<PathBuf>) -> Vec<PathBuf> {
        let mut seen = std::collections::HashSet::new();
        layers
            .iter()
            .rev()
            .filter(|d| seen.insert(d.as_str()))
            .map(|d| self.store.layer_dir(d))
            .chain(below.clone())
            .collect()
    }

    fn cache_file(&self, key: &str) -> PathBuf {
        self.store.root().join("build-cache").join(key)
    }

    /// A step's layer, if it was built before and is still unpacked.
    fn cached(&self, key: &str) -> Option<String> {
        let d = fs::read_to_string(self.cache_file(key)).ok()?;
        let d = d.trim().to_string();
        (self.store.layer_dir(&d).is_dir() && self.store.has_blob(&d)).then_some(d)
    }

    fn remember(&self, key: &str, diff_id: &str) {
        let f = self.cache_file(key);
        let _ = fs::create_dir_all(f.parent().unwrap_or(Path::new(".")));
        let _ = fs::write(f, diff_id);
    }

    /// The files COPY adds, laid out under `dest` in a scratch directory.
    fn stage_copy(
        &self,
        line: usize,
        sources: &[String],
        dest: &str,
        vars: &HashMap<String, String>,
        extra: Option<&CopyExtra>,
    ) -> Result<tempfile::TempDir, ImageError> {
        let staged = tempfile::Builder::new()
            .prefix(".copy-")
            .tempdir_in(self.store.root())
            .map_err(io_err("make a build directory", self.store.root()))?;
        let from = extra.map_or(self.context, |e| e.context.as_path());
        let context = from
            .canonicalize()
            .map_err(io_err("open the build context", from))?;
        // E2B's copy keeps a symlink it names as a link; a Dockerfile's
        // COPY follows it (as docker does).
        let keep_links = extra.is_some();
        let is_link = |p: &Path| keep_links && p.symlink_metadata().is_ok_and(|m| m.is_symlink());
        let mut found = Vec::new();
        for s in sources {
            let s = substitute(s, vars);
            let matched = glob(&context, &s).map_err(|e| bad(line, e))?;
            if matched.is_empty() {
                return Err(bad(
                    line,
                    format!(
                        "COPY {s}: no such file in the build context {}",
                        context.display()
                    ),
                ));
            }
            found.extend(matched);
        }
        let into_dir = dest.ends_with('/')
            || found.len() > 1
            || found.iter().any(|p| !is_link(p) && p.is_dir());
        let target = staged.path().join(dest.trim_start_matches('/'));
        for src in found {
            // Nothing outside the context, whatever the path or its links
            // say (a link kept as a link is not followed: only where it is
            // counts).
            let real = if is_link(&src) {
                let parent = src.parent().unwrap_or(&context);
                parent
                    .canonicalize()
                    .map_err(io_err("read", parent))?
                    .join(src.file_name().unwrap_or_default())
            } else {
                src.canonicalize().map_err(io_err("read", &src))?
            };
            if !real.starts_with(&context) {
                return Err(bad(
                    line,
                    format!("COPY {}: outside the build context", src.display()),
                ));
            }
            let to = if !is_link(&real) && real.is_dir() {
                target.clone()
            } else if into_dir {
                target.join(real.file_name().unwrap_or_default())
            } else {
                target.clone()
            };
            copy_tree(&real, &to).map_err(io_err("copy", &real))?;
            if let Some(mode) = extra.and_then(|e| e.mode) {
                chmod_tree(&to, mode).map_err(io_err("set the mode of", &to))?;
            }
        }
        Ok(staged)
    }

    fn layer_from_dir(
        &self,
        dir: &Path,
        chown: Option<(u32, u32)>,
        existing: &[PathBuf],
    ) -> Result<String, ImageError> {
        layer_from_dir(self.store, dir, chown, existing)
    }

    fn register(
        &self,
        name: &str,
        source: &str,
        layers: Vec<String>,
        config: ImageConfig,
        below: Option<PathBuf>,
    ) -> Result<ImageRecord, ImageError> {
        self.store
            .register_local(name, source, layers, config, below)
    }
}

/// Register the tree at `dir` (a root filesystem) as a one-layer image
/// `name` with `config`: how a template built another way (a Debian
/// bootstrap) becomes an image builds can start FROM.
pub fn image_from_dir(
    store: &ImageStore,
    dir: &Path,
    name: &str,
    source: &str,
    config: ImageConfig,
) -> Result<ImageRecord, ImageError> {
    let layer = layer_from_dir(store, dir, None, &[])?;
    register(store, name, source, vec![layer], config)
}

/// A layer from a directory: an overlay upper (whiteouts and opaque
/// directories as overlayfs writes them) or staged COPY files (owned
/// by `chown`). A directory the image below already has (`existing`,
/// its layers top first) keeps that one's owner and mode, as with docker:
/// a COPY into `/home/user/` must not hand `/home/user` to root. Kept as
/// an uncompressed tar blob and unpacked.
fn layer_from_dir(
    store: &ImageStore,
    dir: &Path,
    chown: Option<(u32, u32)>,
    existing: &[PathBuf],
) -> Result<String, ImageError> {
    let owners = match chown {
        Some((uid, gid)) => Owners::All(uid, gid),
        None => Owners::AsStored,
    };
    store.add_layer_from_dir_over(dir, owners, existing)
}

fn register(
    store: &ImageStore,
    name: &str,
    source: &str,
    layers: Vec<String>,
    config: ImageConfig,
) -> Result<ImageRecord, ImageError> {
    store.register_local(name, source, layers, config, None)
}

fn io_err<'p>(op: &'static str, path: &'p Path) -> impl FnOnce(std::io::Error) -> ImageError + 'p {
    move |source| ImageError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// `pattern` (relative to the context; `*` and `?` in its last part) as
/// the paths it names, sorted.
fn glob(context: &Path, pattern: &str) -> Result<Vec<PathBuf>, String> {
    let rel = pattern.trim_start_matches("./").trim_start_matches('/');
    if rel.split('/').any(|c| c == "..") {
        return Err(format!("{pattern}: outside the build context"));
    }
    let (dir, last) = match rel.rsplit_once('/') {
        Some((d, l)) => (context.join(d), l),
        None => (context.to_path_buf(), rel),
    };
    if rel.is_empty() || rel == "." {
        return Ok(vec![context.to_path_buf()]);
    }
    if !last.contains(['*', '?']) {
        let p = dir.join(last);
        return Ok(if p.symlink_metadata().is_ok() {
            vec![p]
        } else {
            Vec::new()
        });
    }
    let mut out: Vec<PathBuf> = fs::read_dir(&dir)
        .map_err(|e| format!("{pattern}: {e}"))?
        .filter_map(Result::ok)
        .filter(|e| wildcard(last, &e.file_name().to_string_lossy()))
        .map(|e| e.path())
        .collect();
    out.sort();
    Ok(out)
}

fn wildcard(p: &str, s: &str) -> bool {
    let (p, s): (Vec<char>, Vec<char>) = (p.chars().collect(), s.chars().collect());
    fn go(p: &[char], s: &[char]) -> bool {
        match (p.first(), s.first()) {
            (None, None) => true,
            (Some('*'), _) => go(&p[1..], s) || (!s.is_empty() && go(p, &s[1..])),
            (Some('?'), Some(_)) => go(&p[1..], &s[1..]),
            (Some(a), Some(b)) if a == b => go(&p[1..], &s[1..]),
            _ => false,
        }
    }
    go(&p, &s)
}

/// Copy a file or a directory's contents to `to` (symlinks as symlinks).
fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    let meta = from.symlink_metadata()?;
    if meta.is_dir() {
        fs::create_dir_all(to)?;
        for e in fs::read_dir(from)? {
            let e = e?;
            copy_tree(&e.path(), &to.join(e.file_name()))?;
        }
        fs::set_permissions(to, meta.permissions())?;
    } else {
        if let Some(parent) = to.parent() {
            fs::create_dir_all(parent)?;
        }
        if meta.file_type().is_symlink() {
            std::os::unix::fs::symlink(fs::read_link(from)?, to)?;
        } else {
            fs::copy(from, to)?;
        }
    }
    Ok(())
}

/// `mode` on `path` and everything under it but symlinks.
fn chmod_tree(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let meta = path.symlink_metadata()?;
    if meta.is_symlink() {
        return Ok(());
    }
    if meta.is_dir() {
        for e in fs::read_dir(path)? {
            chmod_tree(&e?.path(), mode)?;
        }
    }
    fs::set_permissions(path, fs::Permissions::from_mode(mode & 0o7777))
}

/// `owner` (`USER[:GROUP]`, names or numbers) as ids, names looked up in
/// the image's `/etc/passwd` and `/etc/group` (the topmost layer that has
/// the file; `lowers` top first). A user alone gets its primary group.
fn owner_ids(lowers: &[PathBuf], owner: &str) -> Result<(u32, u32), String> {
    let read = |file: &str| -> String {
        lowers
            .iter()
            .map(|l| l.join(file))
            .find(|p| p.symlink_metadata().is_ok_and(|m| m.is_file()))
            .and_then(|p| fs::read_to_string(p).ok())
            .unwrap_or_default()
    };
    let (user, group) = match owner.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (owner, None),
    };
    let passwd = read("etc/passwd");
    let (uid, primary) = match user.parse::<u32>() {
        Ok(uid) => (uid, uid),
        Err(_) => passwd
            .lines()
            .map(|l| l.split(':').collect::<Vec<_>>())
            .find(|f| f.len() > 3 && f[0] == user)
            .and_then(|f| Some((f[2].parse().ok()?, f[3].parse().ok()?)))
            .ok_or_else(|| {
                format!("user {user:?} is not in the image's /etc/passwd: create it first (e.g. run_cmd(\"useradd -m {user}\", user=\"root\")) or give numeric ids")
            })?,
    };
    let gid = match group {
        None => primary,
        Some(g) => match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => read("etc/group")
                .lines()
                .map(|l| l.split(':').collect::<Vec<_>>())
                .find(|f| f.len() > 2 && f[0] == g)
                .and_then(|f| f[2].parse().ok())
                .ok_or_else(|| format!("group {g:?} is not in the image's /etc/group"))?,
        },
    };
    Ok((uid, gid))
}

/// A digest of a tree: names, kinds, modes, link targets and contents.
fn tree_hash(root: &Path) -> std::io::Result<String> {
    let mut h = Sha256::new();
    fn walk(h: &mut Sha256, root: &Path, rel: &Path) -> std::io::Result<()> {
        let path = root.join(rel);
        let meta = path.symlink_metadata()?;
        h.update(rel.as_os_str().as_encoded_bytes());
        h.update(meta.mode().to_le_bytes());
        if meta.is_dir() {
            let mut names: Vec<_> = fs::read_dir(&path)?
                .filter_map(Result::ok)
                .map(|e| e.file_name())
                .collect();
            names.sort();
            for n in names {
                walk(h, root, &rel.join(n))?;
            }
        } else if meta.file_type().is_symlink() {
            h.update(fs::read_link(&path)?.as_os_str().as_encoded_bytes());
        } else {
            h.update(fs::read(&path)?);
        }
        Ok(())
    }
    walk(&mut h, root, Path::new(""))?;
    Ok(hex::encode(h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dockerfiles_parse_with_line_numbers_and_say_what_is_wrong() {
        let text = "# a comment\nARG BASE=alpine\nFROM $BASE\n\nRUN apk add \\\n    curl\nENV A=1 B=\"two words\"\nENV C three\nCOPY --chown=1000:1000 a b /dst/\nWORKDIR /app\nUSER 1000\nCMD [\"python3\", \"app.py\"]\nEXPOSE 80\n";
        let steps = parse(text).unwrap();
        assert_eq!(
            steps[0],
            (2, Instruction::Arg("BASE".into(), Some("alpine".into())))
        );
        assert_eq!(steps[1], (3, Instruction::From("$BASE".into())));
        assert_eq!(
            steps[2],
            (
                5,
                Instruction::Run(vec!["/bin/sh".into(), "-c".into(), "apk add  curl".into()])
            )
        );
        assert_eq!(
            steps[3],
            (
                7,
                Instruction::Env(vec![
                    ("A".into(), "1".into()),
                    ("B".into(), "two words".into())
                ])
            )
        );
        assert_eq!(
            steps[4],
            (8, Instruction::Env(vec![("C".into(), "three".into())]))
        );
        assert_eq!(
            steps[5],
            (
                9,
                Instruction::Copy {
                    sources: vec!["a".into(), "b".into()],
                    dest: "/dst/".into(),
                    chown: Some((1000, 1000)),
                    extra: None
                }
            )
        );
        assert_eq!(
            steps[8],
            (
                12,
                Instruction::Cmd(vec!["python3".into(), "app.py".into()])
            )
        );
        for (bad_text, line, says) in [
            (
                "FROM alpine\nFROBNICATE x\n",
                2,
                "unknown instruction FROBNICATE",
            ),
            ("RUN true\n", 1, "starts with FROM"),
            ("FROM a\nRUN [\"x\"\n", 2, "bad JSON"),
            ("FROM a\nCOPY onlyone\n", 2, "at least one source"),
            ("FROM a\nCOPY --chown=bob x /y\n", 2, "numeric"),
            ("FROM a\nRUN x \\\n", 2, "continuation"),
            ("", 1, "no instructions"),
        ] {
            match parse(bad_text) {
                Err(ImageError::Dockerfile { line: l, reason }) => {
                    assert_eq!(l, line, "{bad_text:?}: {reason}");
                    assert!(reason.contains(says), "{bad_text:?}: {reason}");
                }
                other => panic!("{bad_text:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn substitution_and_wildcards() {
        let vars: HashMap<String, String> = [("A".to_string(), "x".to_string())].into();
        assert_eq!(substitute("/$A/${A}y/$B/$", &vars), "/x/xy//$");
        assert!(wildcard("*.py", "app.py"));
        assert!(wildcard("a?c", "abc"));
        assert!(!wildcard("*.py", "app.pyc"));
    }
}
