//! Named templates: Debian root filesystems built from a [`Recipe`] with
//! mmdebstrap the first time they are asked for, then cached.
//!
//! Layout, under `$BRIG_HOME/templates/<name>/`:
//!
//! - `rootfs`: a symlink to the current build, `rootfs-<n>/`, used
//!   read-only as a sandbox's lower layer. Sandboxes are given the build's
//!   own directory ([`ensure`] resolves the link), so a rebuild, which
//!   makes `rootfs-<n+1>/` and swaps the link, never changes the files
//!   under a running sandbox (overlayfs must not see its lower layer
//!   change). Older builds are removed by [`prune`], when nothing uses
//!   them; brig of a version before this layout had `rootfs/` as a
//!   directory, which is used as it is until the next build;
//! - `recipe`: the stamp, `sha256=<hash of the recipe text>` followed by
//!   the text itself. `rootfs` counts only when this file matches the
//!   current recipe, so changing a recipe rebuilds it and a build that died
//!   half-way is never used;
//! - `.lock`: flock'ed while building, so concurrent callers (two creates
//!   in the daemon, a daemon and a `brig run`) build once and the others
//!   wait for that build;
//! - `.rootfs.tmp.*`: a build in progress, renamed to `rootfs-<n>/` only
//!   on success (the stamp is written after the link is swapped).
//!
//! A process that was handed a build ([`ensure`], [`ready`]) holds a
//! [`Lease`] on it until it exits: a shared flock on its directory, which
//! [`prune`] respects. A daemon prunes when it starts, so an old build goes
//! once no daemon or `brig run` that used it is alive.
//!
//! The same approach as `tests/support/build-rootfs.sh`, which builds the
//! test suite's rootfs.

use std::fmt::Write as _;
use std::fs::{self, File};
use std::io::{BufRead, BufReader, IsTerminal};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

pub mod recipes;
mod resolve;

pub use recipes::Recipe;
pub use resolve::{pull, resolve, Resolved};

/// Overrides the Debian mirror templates are built from.
pub const MIRROR_ENV: &str = "BRIG_TEMPLATE_MIRROR";
/// Overrides the mmdebstrap executable (tests use a fake one).
pub const MMDEBSTRAP_ENV: &str = "BRIG_MMDEBSTRAP";

/// Why a template could not be had.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("unknown template {name:?}: the named templates are {known} (or use `host` or `dir:/path/to/rootfs`)")]
    Unknown { name: String, known: String },
    #[error("building template {name} needs mmdebstrap, which is not installed: run `apt-get install mmdebstrap`")]
    NoMmdebstrap { name: String },
    #[error("building template {name} needs root (mmdebstrap --mode=root): run `sudo brig template build {name}` once")]
    NotRoot { name: String },
    #[error("could not download template {name}'s packages from {mirror}: the network or the mirror is unreachable ({detail}); check the connection, or set {MIRROR_ENV} to a reachable Debian mirror")]
    Network {
        name: String,
        mirror: String,
        detail: String,
    },
    #[error("mmdebstrap failed to build template {name} ({status}); its last lines:\n{tail}")]
    Build {
        name: String,
        status: ExitStatus,
        tail: String,
    },
    #[error(
        "no template or image named {name:?}: the named templates are {known}, and pulling it as \
         an image failed: {pulled}"
    )]
    NoSuchTemplate {
        name: String,
        known: String,
        pulled: String,
    },
    #[error(
        "{name:?} is neither a named template ({known}) nor an image in the store, and this daemon \
         does not pull images (brig serve --pull never): pull it on the daemon's host with `brig \
         template pull {name}`"
    )]
    NotPulled { name: String, known: String },
    #[error(transparent)]
    Image(#[from] brig_image::ImageError),
    #[error("template {name}: cannot {op} {path}")]
    Io {
        name: String,
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// How a build reports progress on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// A spinner with mmdebstrap's current step when stderr is a terminal,
    /// plain lines otherwise.
    Auto,
    /// One line per mmdebstrap step (`brig: template base: ...`).
    Lines,
    /// Nothing (errors still carry mmdebstrap's last lines).
    Quiet,
}

/// Whether a template is ready to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Never built (or a build never finished).
    Missing,
    /// Built from an older recipe: the next use rebuilds it.
    Stale,
    Ready,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Missing => "missing",
            State::Stale => "stale",
            State::Ready => "ready",
        }
    }
}

/// The recipe called `name`.
pub fn recipe(name: &str) -> Result<&'static Recipe, TemplateError> {
    recipes::ALL
        .iter()
        .find(|r| r.name == name)
        .ok_or_else(|| TemplateError::Unknown {
            name: name.to_string(),
            known: known_names(),
        })
}

/// `base, code-interpreter-v1`, for messages.
pub fn known_names() -> String {
    recipes::ALL
        .iter()
        .map(|r| r.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// `$home/templates`: where named templates live (and a daemon's default
/// `dir:` template root).
pub fn templates_dir(home: &Path) -> PathBuf {
    home.join("templates")
}

/// Where one template's files are.
#[derive(Debug, Clone)]
pub struct Paths {
    pub dir: PathBuf,
    pub rootfs: PathBuf,
    pub stamp: PathBuf,
    lock: PathBuf,
}

impl Paths {
    pub fn new(home: &Path, name: &str) -> Paths {
        let dir = templates_dir(home).join(name);
        Paths {
            rootfs: dir.join("rootfs"),
            stamp: dir.join("recipe"),
            lock: dir.join(".lock"),
            dir,
        }
    }
}

/// What a stamp must contain for `recipe`.
pub fn stamp_for(recipe: &Recipe) -> String {
    let text = recipe.text();
    let hash = Sha256::digest(text.as_bytes());
    let mut s = String::from("sha256=");
    for b in hash {
        let _ = write!(s, "{b:02x}");
    }
    s.push('\n');
    s.push_str(&text);
    s
}

/// Whether the template at `paths` was built from `recipe`.
pub fn state(paths: &Paths, recipe: &Recipe) -> State {
    if !paths.rootfs.is_dir() {
        return State::Missing;
    }
    match fs::read_to_string(&paths.stamp) {
        Ok(s) if s == stamp_for(recipe) => State::Ready,
        Ok(_) => State::Stale,
        Err(_) => State::Missing,
    }
}

/// The recipe template `name` as an image of the store (built first if
/// needed), for image builds to start FROM (E2B's `from_template("base")`
/// and `from_base_image()`) and for `brig template ls`/`inspect`. Every
/// build of a recipe registers it ([`build`], [`ensure`]); this finds it,
/// or registers it for a build made before images were.
pub fn recipe_image(
    home: &Path,
    name: &str,
    progress: Progress,
) -> Result<brig_image::ImageRecord, TemplateError> {
    let recipe = recipe(name)?;
    let store = brig_image::ImageStore::open(home)?;
    if let Some(found) = store.get(&recipe_image_name(recipe))? {
        return Ok(found);
    }
    let rootfs = ensure(home, name, progress)?;
    register_image(home, recipe, &rootfs)
}

/// `brig-recipe/NAME:HASH`, after the recipe: a changed recipe makes a new
/// image.
fn recipe_image_name(recipe: &Recipe) -> String {
    let stamp = stamp_for(recipe);
    let hash = stamp
        .strip_prefix("sha256=")
        .and_then(|s| s.get(..12))
        .unwrap_or("0");
    format!("brig-recipe/{}:{hash}", recipe.name)
}

/// Register the build `rootfs` of `recipe` as the image
/// [`recipe_image_name`]: no layer of its own, the build as its `base` (no
/// copy; [`prune`] keeps a build an image stands on). The image of the
/// recipe before is forgotten (images built over it keep their own hold on
/// its build).
fn register_image(
    home: &Path,
    recipe: &Recipe,
    rootfs: &Path,
) -> Result<brig_image::ImageRecord, TemplateError> {
    let name = recipe.name;
    let image = recipe_image_name(recipe);
    // One registration at a time per recipe (across processes too): a lock
    // of its own, so builds of the recipe are not held up meanwhile.
    let lock_path = Paths::new(home, name).dir.join(".image.lock");
    let lock = File::create(&lock_path).map_err(io_err(name, "create", &lock_path))?;
    // SAFETY: flock on a descriptor we own; blocks until the lock is ours,
    // released when `lock` is dropped (or the process dies).
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(io_err(name, "lock", &lock_path)(
            std::io::Error::last_os_error(),
        ));
    }
    let store = brig_image::ImageStore::open(home)?;
    if let Some(found) = store
        .get(&image)?
        .filter(|i| i.base.as_deref() == Some(rootfs))
    {
        return Ok(found);
    }
    let _write = store.write_lease()?;
    let prefix = format!("brig-recipe/{name}:");
    for old in store.list()?.iter().filter(|i| i.name.starts_with(&prefix)) {
        store.remove(&old.name)?;
    }
    Ok(store.register_local(
        &image,
        &format!("template {name} ({})", recipe.description),
        Vec::new(),
        brig_image::ImageConfig::default(),
        Some(rootfs.to_path_buf()),
    )?)
}

/// The template `name`'s root filesystem, built first if it is missing or
/// stale. Concurrent callers build it once: the others wait for that build.
/// The path is the current build's own directory, not the `rootfs` link:
/// a later rebuild does not change what it names.
pub fn ensure(home: &Path, name: &str, progress: Progress) -> Result<PathBuf, TemplateError> {
    let recipe = recipe(name)?;
    let paths = Paths::new(home, name);
    if state(&paths, recipe) == State::Ready {
        return current(&paths, name);
    }
    let rootfs = build_locked(recipe, &paths, false, progress)?;
    register_image(home, recipe, &rootfs)?;
    Ok(rootfs)
}

/// The template `name`'s current build if it is built from its current
/// recipe (reading its stamp; nothing is built), leased as [`ensure`]'s.
pub fn ready(home: &Path, name: &str) -> Option<PathBuf> {
    let recipe = recipe(name).ok()?;
    let paths = Paths::new(home, name);
    if state(&paths, recipe) != State::Ready {
        return None;
    }
    current(&paths, name).ok()
}

/// The build `rootfs` names now, leased for the rest of this process's
/// life: a process that was handed a build may run sandboxes on it until
/// it exits (a daemon does not track which of its sandboxes use which
/// build), so no [`prune`], in this process or another, removes it
/// meanwhile. One descriptor per build.
fn current(paths: &Paths, name: &str) -> Result<PathBuf, TemplateError> {
    let build = fs::canonicalize(&paths.rootfs).map_err(io_err(name, "resolve", &paths.rootfs))?;
    let mut held = held();
    if !held.iter().any(|(p, _)| p == &build) {
        let lease = lease(&build).map_err(io_err(name, "lease", &build))?;
        held.push((build.clone(), lease));
    }
    Ok(build)
}

/// The builds this process holds leases on.
fn held() -> std::sync::MutexGuard<'static, Vec<(PathBuf, Lease)>> {
    static HELD: std::sync::Mutex<Vec<(PathBuf, Lease)>> = std::sync::Mutex::new(Vec::new());
    HELD.lock().unwrap_or_else(|e| e.into_inner())
}

/// Give up this process's lease on `build` (a path [`ensure`] returned):
/// nothing here runs on it any more.
pub fn release(build: &Path) {
    held().retain(|(p, _)| p != build);
}

/// A shared claim on one build of a template: while it is held, [`prune`]
/// leaves that build alone. Dropping it releases it.
#[derive(Debug)]
pub struct Lease {
    _dir: File,
}

/// Hold a [`Lease`] on the build at `rootfs` (a path [`ensure`] returned).
pub fn lease(rootfs: &Path) -> std::io::Result<Lease> {
    let dir = File::open(rootfs)?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(dir.as_raw_fd(), libc::LOCK_SH) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(Lease { _dir: dir })
}

/// Remove every build of every template under `home` that is not current
/// and not leased, and the leftovers of killed builds; the bytes freed.
/// Builds this process was handed are leased too (flock conflicts between
/// two descriptors of one process as between processes).
pub fn prune(home: &Path) -> u64 {
    let Ok(templates) = fs::read_dir(templates_dir(home)) else {
        return 0;
    };
    // Builds an image stands on (a snapshot of a sandbox of a named
    // template) stay while the image does.
    let based: Vec<PathBuf> = brig_image::ImageStore::open(home)
        .and_then(|store| store.list())
        .map(|images| {
            images
                .into_iter()
                .filter_map(|i| i.base.and_then(|b| fs::canonicalize(b).ok()))
                .collect()
        })
        .unwrap_or_default();
    let mut freed = 0;
    for t in templates.flatten() {
        let dir = t.path();
        let Ok(lock) = File::open(dir.join(".lock")) else {
            continue;
        };
        // Not while it is being built.
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            continue;
        }
        let current = fs::canonicalize(dir.join("rootfs")).ok();
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let n = e.file_name();
            let n = n.to_string_lossy();
            let old = n.starts_with("rootfs-")
                || n.starts_with(".rootfs.tmp.")
                || n.starts_with(".rootfs.old.");
            let path = e.path();
            // Compared resolved: `home` or its templates dir may be reached
            // through a symlink.
            let resolved = fs::canonicalize(&path).ok();
            if !old
                || !path.is_dir()
                || resolved == current
                || resolved.as_ref().is_some_and(|r| based.contains(r))
            {
                continue;
            }
            let Ok(d) = File::open(&path) else { continue };
            // SAFETY: flock on a descriptor we own.
            if unsafe { libc::flock(d.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                continue; // leased
            }
            let size = tree_size(&path);
            if remove_tree(&path).is_ok() {
                freed += size;
            }
        }
    }
    freed
}

/// Build the template `name` (again, with `force`, even if it is current).
pub fn build(
    home: &Path,
    name: &str,
    force: bool,
    progress: Progress,
) -> Result<PathBuf, TemplateError> {
    let recipe = recipe(name)?;
    let rootfs = build_locked(recipe, &Paths::new(home, name), force, progress)?;
    register_image(home, recipe, &rootfs)?;
    Ok(rootfs)
}

/// One row of `brig template ls`.
#[derive(Debug, Clone)]
pub struct Info {
    pub recipe: &'static Recipe,
    pub state: State,
    pub rootfs: PathBuf,
    /// Bytes of files in the rootfs (apparent size); `None` unless built.
    pub size: Option<u64>,
}

/// Every named template and its state under `home`.
pub fn list(home: &Path) -> Vec<Info> {
    recipes::ALL
        .iter()
        .map(|r| {
            let paths = Paths::new(home, r.name);
            let state = state(&paths, r);
            let size = (state != State::Missing).then(|| tree_size(&paths.rootfs));
            Info {
                recipe: r,
                state,
                rootfs: paths.rootfs,
                size,
            }
        })
        .collect()
}

fn tree_size(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(m) = e.metadata() else { continue };
            if m.is_dir() {
                stack.push(e.path());
            } else {
                total += m.len();
            }
        }
    }
    total
}

fn io_err(
    name: &str,
    op: &'static str,
    path: &Path,
) -> impl FnOnce(std::io::Error) -> TemplateError {
    let (name, path) = (name.to_string(), path.to_path_buf());
    move |source| TemplateError::Io {
        name,
        op,
        path,
        source,
    }
}

fn build_locked(
    recipe: &Recipe,
    paths: &Paths,
    force: bool,
    progress: Progress,
) -> Result<PathBuf, TemplateError> {
    let name = recipe.name;
    fs::create_dir_all(&paths.dir).map_err(io_err(name, "create", &paths.dir))?;
    let lock = File::create(&paths.lock).map_err(io_err(name, "create", &paths.lock))?;
    // SAFETY: flock on a descriptor we own; blocks until the lock is ours.
    // The lock is released when `lock` is dropped (or the process dies).
    let r = unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) };
    if r != 0 {
        return Err(io_err(name, "lock", &paths.lock)(
            std::io::Error::last_os_error(),
        ));
    }
    // Someone else may have built it while we waited.
    if !force && state(paths, recipe) == State::Ready {
        return current(paths, name);
    }
    let mmdebstrap = which_mmdebstrap().ok_or_else(|| TemplateError::NoMmdebstrap {
        name: name.to_string(),
    })?;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(TemplateError::NotRoot {
            name: name.to_string(),
        });
    }
    // Leftovers of builds that were killed (we hold the lock: no build is
    // running), and the next build's number.
    let mut next = 1u64;
    if let Ok(entries) = fs::read_dir(&paths.dir) {
        for e in entries.flatten() {
            let n = e.file_name();
            let n = n.to_string_lossy();
            if n.starts_with(".rootfs.tmp.") {
                let _ = remove_tree(&e.path());
            }
            if let Some(v) = n
                .strip_prefix("rootfs-")
                .and_then(|v| v.parse::<u64>().ok())
            {
                next = next.max(v + 1);
            }
        }
    }
    let tmp = paths
        .dir
        .join(format!(".rootfs.tmp.{}", std::process::id()));
    fs::create_dir(&tmp).map_err(io_err(name, "create", &tmp))?;
    let built = run_mmdebstrap(&mmdebstrap, recipe, &tmp, progress);
    if let Err(e) = built {
        let _ = remove_tree(&tmp);
        return Err(e);
    }

    // Invalidate first, then swap: a crash below leaves no stamp, so the
    // next use rebuilds instead of trusting a half-swapped tree.
    let _ = fs::remove_file(&paths.stamp);
    let version = paths.dir.join(format!("rootfs-{next}"));
    fs::rename(&tmp, &version).map_err(io_err(name, "rename into place", &tmp))?;
    fs::set_permissions(&version, fs::Permissions::from_mode(0o755))
        .map_err(io_err(name, "chmod", &version))?;
    // The link is swapped with a rename, atomically. A `rootfs` directory
    // of the older layout becomes an old build, for prune.
    if paths.rootfs.is_dir() && !paths.rootfs.is_symlink() {
        let old = paths.dir.join("rootfs-0");
        fs::rename(&paths.rootfs, &old).map_err(io_err(name, "move aside", &paths.rootfs))?;
    }
    let link_tmp = paths.dir.join(".rootfs.link.tmp");
    let _ = fs::remove_file(&link_tmp);
    std::os::unix::fs::symlink(format!("rootfs-{next}"), &link_tmp)
        .map_err(io_err(name, "link", &link_tmp))?;
    fs::rename(&link_tmp, &paths.rootfs).map_err(io_err(name, "link", &paths.rootfs))?;
    let stamp_tmp = paths.dir.join(".recipe.tmp");
    fs::write(&stamp_tmp, stamp_for(recipe)).map_err(io_err(name, "write", &stamp_tmp))?;
    fs::rename(&stamp_tmp, &paths.stamp).map_err(io_err(name, "write", &paths.stamp))?;
    // Older builds stay: sandboxes may run on them (see `prune`).
    current(paths, name)
}

/// Remove a build's tree, unmounting first whatever is mounted below it: a
/// killed mmdebstrap leaves the host's /proc, /sys, /dev/pts and /dev/shm
/// mounted in its new root, and deleting through those would reach the
/// host's own files.
fn remove_tree(dir: &Path) -> std::io::Result<()> {
    let mut below: Vec<PathBuf> = fs::read_to_string("/proc/self/mountinfo")?
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape_mountinfo)
        .filter(|m| m.starts_with(dir))
        .collect();
    // Deepest first.
    below.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
    for m in &below {
        let c = std::ffi::CString::new(m.as_os_str().as_encoded_bytes())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        // SAFETY: umount2 with a NUL-terminated path.
        if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    fs::remove_dir_all(dir)
}

/// A mount point as /proc/self/mountinfo writes it (`\040` for a space…).
fn unescape_mountinfo(field: &str) -> PathBuf {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

fn which_mmdebstrap() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(MMDEBSTRAP_ENV).filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p)).filter(|p| p.is_file());
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| d.join("mmdebstrap"))
        .find(|p| p.is_file())
}

/// The Debian mirror: `$BRIG_TEMPLATE_MIRROR`, else the one this machine's
/// apt uses for the suite (so a proxy or local mirror keeps working), else
/// deb.debian.org.
pub fn mirror(suite: &str) -> String {
    if let Some(m) = std::env::var_os(MIRROR_ENV).filter(|m| !m.is_empty()) {
        return m.to_string_lossy().into_owned();
    }
    let mut files = vec![PathBuf::from("/etc/apt/sources.list")];
    if let Ok(d) = fs::read_dir("/etc/apt/sources.list.d") {
        let mut more: Vec<PathBuf> = d.flatten().map(|e| e.path()).collect();
        more.sort();
        files.extend(more);
    }
    for f in files {
        let Ok(text) = fs::read_to_string(&f) else {
            continue;
        };
        let found = if f.extension().is_some_and(|e| e == "sources") {
            deb822_uri(&text, suite)
        } else {
            one_line_uri(&text, suite)
        };
        if let Some(u) = found {
            return u;
        }
    }
    "http://deb.debian.org/debian".into()
}

fn deb822_uri(text: &str, suite: &str) -> Option<String> {
    for stanza in text.split("\n\n") {
        let mut uri = None;
        let mut has_suite = false;
        for line in stanza.lines() {
            let mut words = line.split_whitespace();
            match words.next().map(str::to_ascii_lowercase).as_deref() {
                Some("uris:") => uri = words.next().map(str::to_string),
                Some("suites:") => has_suite = words.any(|w| w == suite),
                _ => {}
            }
        }
        if has_suite && uri.is_some() {
            return uri;
        }
    }
    None
}

fn one_line_uri(text: &str, suite: &str) -> Option<String> {
    for line in text.lines() {
        let mut words = line.split_whitespace().peekable();
        if words.next() != Some("deb") {
            continue;
        }
        if words.peek().is_some_and(|w| w.starts_with('[')) {
            for w in words.by_ref() {
                if w.ends_with(']') {
                    break;
                }
            }
        }
        let (Some(uri), Some(s)) = (words.next(), words.next()) else {
            continue;
        };
        if s == suite {
            return Some(uri.to_string());
        }
    }
    None
}

/// Lines of mmdebstrap's output that mean the archive could not be reached.
const NETWORK_SIGNS: &[&str] = &[
    "Temporary failure resolving",
    "Could not resolve",
    "Failed to fetch",
    "Could not connect",
    "Unable to connect",
    "Connection timed out",
    "Network is unreachable",
    "No route to host",
];

/// Whether mmdebstrap's output says the network failed.
pub fn network_failure(lines: &[String]) -> Option<String> {
    lines
        .iter()
        .find(|l| NETWORK_SIGNS.iter().any(|s| l.contains(s)))
        .map(|l| l.trim().to_string())
}

/// The pre-exec hook of the build: the child and everything it starts end
/// when the thread that spawned it does, however that happens.
///
/// - A mount namespace of its own (private propagation): its mounts are
///   never the host's and go with its last process.
/// - A PID namespace of its own, whose first process (pid 1 there) is
///   what execs the builder: when that process dies the kernel kills
///   every process left in the namespace, so no apt or dpkg outlives it.
///   `unshare(CLONE_NEWPID)` places only later children in the new
///   namespace, so this process forks once more: the child (pid 1) goes on
///   to exec, this one (the waiter) waits for it and exits with its status,
///   which is what `Command` sees.
/// - Both get `PR_SET_PDEATHSIG(SIGKILL)`: the waiter dies with brig's
///   spawning thread, pid 1 with the waiter (the kernel delivers it to a
///   namespace's init from outside the namespace). A pipe only the waiter
///   holds open tells pid 1 whether the waiter died before its own
///   `prctl` (getppid says 0 across the namespace boundary).
/// - The waiter closes every other descriptor above stderr, among them
///   `Command`'s exec-error pipe: `spawn` returns once pid 1 has exec'd.
///
/// # Safety
///
/// Only for `pre_exec`: it forks, and the waiter never returns.
unsafe fn die_with_parent() -> std::io::Result<()> {
    // SAFETY: system calls on this process's own state and descriptors
    // it made, between fork and exec (the caller's contract).
    unsafe {
        let fail = || Err(std::io::Error::last_os_error());
        let mut alive = [0; 2];
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0
            || libc::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWPID) != 0
            || libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ) != 0
            || libc::pipe2(alive.as_mut_ptr(), libc::O_CLOEXEC) != 0
        {
            return fail();
        }
        let [alive_read, alive_write] = alive;
        match libc::fork() {
            -1 => fail(),
            0 => {
                // Pid 1 of the namespace: on to exec, unless the waiter is
                // already gone (its end of the pipe closed: POLLHUP).
                libc::close(alive_write);
                let mut waiter = libc::pollfd {
                    fd: alive_read,
                    events: libc::POLLIN,
                    revents: 0,
                };
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0
                    || libc::poll(&mut waiter, 1, 0) != 0
                {
                    libc::_exit(127);
                }
                Ok(())
            }
            init => {
                let last = libc::c_uint::MAX;
                let keep = alive_write as libc::c_uint;
                libc::syscall(libc::SYS_close_range, 3, keep - 1, 0);
                libc::syscall(libc::SYS_close_range, keep + 1, last, 0);
                let mut status = 0;
                while libc::waitpid(init, &mut status, 0) < 0 {
                    if *libc::__errno_location() != libc::EINTR {
                        libc::_exit(127);
                    }
                }
                if libc::WIFEXITED(status) {
                    libc::_exit(libc::WEXITSTATUS(status));
                }
                libc::_exit(128 + libc::WTERMSIG(status));
            }
        }
    }
}

fn run_mmdebstrap(
    mmdebstrap: &Path,
    recipe: &Recipe,
    target: &Path,
    progress: Progress,
) -> Result<(), TemplateError> {
    let name = recipe.name;
    let mirror = mirror(recipe.suite);
    let mut cmd = Command::new(mmdebstrap);
    cmd.arg("--mode=root")
        .arg(format!("--variant={}", recipe.variant))
        // Written to the template's /etc/apt/apt.conf.d/99mmdebstrap too:
        // `apt-get install` in a sandbox behaves the same.
        .arg(format!(
            "--aptopt=APT::Install-Recommends \"{}\"",
            recipe.recommends
        ))
        .arg(format!("--include={}", recipe.package_list().join(",")));
    for hook in recipe.customize.iter().flat_map(|g| g.iter()) {
        cmd.arg(format!("--customize-hook={hook}"));
    }
    cmd.arg(recipe.suite)
        .arg(target)
        .arg(&mirror)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // Its whole process tree dies with the thread that started it (a
    // daemon stopped or killed while it prepares a template left
    // mmdebstrap, apt and dpkg running), and the /proc, /sys and /dev
    // mounts it makes in the chroot go with it. The files it writes are on
    // the shared file system.
    // SAFETY: the hook runs in the forked child before exec, which is what
    // `die_with_parent` is for; it makes only async-signal-safe calls.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || die_with_parent());
    }
    let mut child = cmd.spawn().map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            TemplateError::NoMmdebstrap {
                name: name.to_string(),
            }
        } else {
            io_err(name, "run", Path::new("mmdebstrap"))(e)
        }
    })?;

    let bar = match progress {
        Progress::Auto if std::io::stderr().is_terminal() => {
            let bar = indicatif::ProgressBar::new_spinner();
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} building template {prefix} [{elapsed}] {msg}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
            );
            bar.set_prefix(name.to_string());
            bar.enable_steady_tick(Duration::from_millis(120));
            Some(bar)
        }
        _ => None,
    };
    let lines_out = progress == Progress::Lines || (progress == Progress::Auto && bar.is_none());
    let say = |msg: &str| {
        if let Some(bar) = &bar {
            bar.set_message(msg.to_string());
        } else if lines_out {
            eprintln!("brig: template {name}: {msg}");
        }
    };
    say(&format!(
        "building from {mirror} with mmdebstrap (a few minutes, once)"
    ));
    let start = Instant::now();
    let mut tail: Vec<String> = Vec::new();
    if let Some(err) = child.stderr.take() {
        for line in BufReader::new(err).lines() {
            let Ok(line) = line else { break };
            if let Some(step) = line.strip_prefix("I: ") {
                say(step);
            } else if line.starts_with("W: ") || line.starts_with("E: ") {
                if let Some(bar) = &bar {
                    bar.println(&line);
                } else if lines_out {
                    eprintln!("brig: template {name}: {line}");
                }
            }
            tail.push(line);
            if tail.len() > 40 {
                tail.remove(0);
            }
        }
    }
    let status = child
        .wait()
        .map_err(io_err(name, "wait for", Path::new("mmdebstrap")))?;
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    if !status.success() {
        if let Some(detail) = network_failure(&tail) {
            return Err(TemplateError::Network {
                name: name.to_string(),
                mirror,
                detail,
            });
        }
        return Err(TemplateError::Build {
            name: name.to_string(),
            status,
            tail: tail.join("\n"),
        });
    }
    if progress != Progress::Quiet {
        eprintln!(
            "brig: template {name}: built in {:.0} s",
            start.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_built(home: &Path, recipe: &Recipe) -> Paths {
        let p = Paths::new(home, recipe.name);
        fs::create_dir_all(p.rootfs.join("etc")).unwrap();
        fs::write(&p.stamp, stamp_for(recipe)).unwrap();
        p
    }

    #[test]
    fn a_template_is_ready_only_with_a_matching_stamp() {
        let home = tempfile::tempdir().unwrap();
        let r = recipes::BASE;
        let p = Paths::new(home.path(), r.name);
        assert_eq!(state(&p, &r), State::Missing);
        fake_built(home.path(), &r);
        assert_eq!(state(&p, &r), State::Ready);
        // ensure returns a ready template without building (no mmdebstrap,
        // no root needed).
        assert_eq!(
            ensure(home.path(), "base", Progress::Quiet).unwrap(),
            p.rootfs
        );

        // Any change to the recipe makes it stale.
        let mut changed = r;
        changed.packages = &[&["python3"]];
        assert_eq!(state(&p, &changed), State::Stale);
        let mut bumped = r;
        bumped.version += 1;
        assert_eq!(state(&p, &bumped), State::Stale);
        let mut hooked = r;
        hooked.customize = &[&["true"]];
        assert_eq!(state(&p, &hooked), State::Stale);
        let mut recommending = r;
        recommending.recommends = true;
        assert_eq!(state(&p, &recommending), State::Stale);

        // A rootfs without its stamp (a build that died after the rename)
        // is not used.
        fs::remove_file(&p.stamp).unwrap();
        assert_eq!(state(&p, &r), State::Missing);
        // Nor a stamp without a rootfs.
        fs::write(&p.stamp, stamp_for(&r)).unwrap();
        fs::remove_dir_all(&p.rootfs).unwrap();
        assert_eq!(state(&p, &r), State::Missing);
    }

    #[test]
    fn mount_points_are_unescaped() {
        assert_eq!(unescape_mountinfo(r"/a\040b\011c"), Path::new("/a b\tc"));
        assert_eq!(unescape_mountinfo(r"/x\y"), Path::new(r"/x\y"));
    }

    /// A killed build's tree with something mounted in it: removed without
    /// deleting through the mount.
    #[test]
    fn removing_a_tree_unmounts_what_is_below_it_first() {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            assert!(
                std::env::var("BRIG_TEST_STRICT").map_or(true, |v| v != "1"),
                "BRIG_TEST_STRICT=1 and mounting needs root"
            );
            eprintln!("skipping: mounting needs root");
            return;
        }
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("precious"), "x").unwrap();
        let tree = tempfile::tempdir().unwrap();
        let mnt = tree.path().join(".rootfs.tmp.1/proc");
        fs::create_dir_all(&mnt).unwrap();
        let bind = |src: &Path, dst: &Path| {
            let (s, d) = (
                std::ffi::CString::new(src.as_os_str().as_encoded_bytes()).unwrap(),
                std::ffi::CString::new(dst.as_os_str().as_encoded_bytes()).unwrap(),
            );
            // SAFETY: a bind mount of two NUL-terminated paths.
            let r = unsafe {
                libc::mount(
                    s.as_ptr(),
                    d.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND,
                    std::ptr::null(),
                )
            };
            assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
        };
        bind(outside.path(), &mnt);
        assert!(mnt.join("precious").exists());
        remove_tree(&tree.path().join(".rootfs.tmp.1")).unwrap();
        assert!(!tree.path().join(".rootfs.tmp.1").exists());
        assert!(
            outside.path().join("precious").exists(),
            "deleted through the mount"
        );
    }

    #[test]
    fn stamps_differ_per_recipe_and_carry_the_recipe() {
        let a = stamp_for(&recipes::BASE);
        let b = stamp_for(&recipes::CODE_INTERPRETER_V1);
        assert_ne!(a, b);
        assert!(a.starts_with("sha256="));
        assert!(a.contains("include=bash,"));
        assert!(b.contains("python3-ipykernel"));
        assert_eq!(a, stamp_for(&recipes::BASE));
    }

    #[test]
    fn code_interpreter_has_everything_base_has() {
        let base = recipes::BASE.package_list();
        let ci = recipes::CODE_INTERPRETER_V1.package_list();
        for p in &base {
            assert!(ci.contains(p), "code-interpreter-v1 lacks {p}");
        }
        for p in [
            "python3",
            "python3-pip",
            "nodejs",
            "git",
            "curl",
            "sudo",
            "ca-certificates",
        ] {
            assert!(base.contains(&p), "base lacks {p}");
        }
        for p in [
            "python3-ipykernel",
            "python3-numpy",
            "python3-pandas",
            "python3-matplotlib",
        ] {
            assert!(ci.contains(&p), "code-interpreter-v1 lacks {p}");
        }
    }

    #[test]
    fn unknown_names_list_the_known_ones() {
        let err = recipe("ubuntu").unwrap_err().to_string();
        assert!(err.contains("\"ubuntu\""), "{err}");
        assert!(err.contains("base, code-interpreter-v1"), "{err}");
        assert!(ensure(Path::new("/nonexistent"), "ubuntu", Progress::Quiet).is_err());
    }

    #[test]
    fn network_failures_are_recognised() {
        let lines = vec![
            "I: running apt-get update...".to_string(),
            "W: Failed to fetch http://deb.debian.org/debian/dists/bookworm/InRelease  Temporary failure resolving 'deb.debian.org'".to_string(),
            "E: apt-get update failed".to_string(),
        ];
        assert!(network_failure(&lines)
            .unwrap()
            .contains("Temporary failure resolving"));
        assert_eq!(network_failure(&lines[..1]), None);
    }

    #[test]
    fn mirrors_are_read_from_apt_sources() {
        let deb822 = "Types: deb\nURIs: http://m.example/debian\nSuites: bookworm bookworm-updates\n\nTypes: deb\nURIs: http://sec.example\nSuites: bookworm-security\n";
        assert_eq!(
            deb822_uri(deb822, "bookworm").as_deref(),
            Some("http://m.example/debian")
        );
        let line = "deb [arch=amd64 signed-by=/x] http://m2.example/debian bookworm main\n";
        assert_eq!(
            one_line_uri(line, "bookworm").as_deref(),
            Some("http://m2.example/debian")
        );
        assert_eq!(one_line_uri(line, "trixie"), None);
    }
}
