//! The rules for volume names and for where a volume may be mounted in a
//! sandbox, shared by the runtime and the front-ends.

/// The longest volume name.
pub const MAX_NAME: usize = 64;
/// The longest mount path, in bytes.
pub const MAX_PATH: usize = 1024;
/// The most volumes one sandbox mounts.
pub const MAX_MOUNTS: usize = 16;

/// Directories a volume must not cover or go under: what the sandbox's
/// system and brig's agent need (the kernel's views, the programs and
/// their libraries, the configuration).
const SYSTEM: &[&str] = &[
    "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/run",
    "/sbin", "/sys", "/usr",
];
/// Directories a volume may go under but not replace.
const NOT_OVER: &[&str] = &["/home", "/mnt", "/opt", "/root", "/srv", "/tmp", "/var"];

/// Why a volume name or mount path is refused; the message says what is
/// allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VolumeRuleError {
    #[error("invalid volume name {0:?}: use 1 to {MAX_NAME} letters, digits, '_' or '-'")]
    Name(String),
    #[error("mount path {path:?} {reason}")]
    Path { path: String, reason: String },
}

/// A volume name: 1 to [`MAX_NAME`] of `a-z A-Z 0-9 _ -` (E2B's rule).
pub fn check_name(name: &str) -> Result<(), VolumeRuleError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(VolumeRuleError::Name(name.to_string()))
    }
}

/// A mount path: absolute, clean (no `.`, `..`, empty component or
/// trailing `/`), at most [`MAX_PATH`] bytes, not `/`, not a system
/// directory or under one, and not one of the directories that hold a
/// sandbox's other files (`/home`, `/tmp`, ...; a path under them is fine).
pub fn check_path(path: &str) -> Result<(), VolumeRuleError> {
    let bad = |reason: &str| {
        Err(VolumeRuleError::Path {
            path: path.to_string(),
            reason: reason.to_string(),
        })
    };
    if path.len() > MAX_PATH {
        return bad(&format!("is longer than {MAX_PATH} bytes"));
    }
    if !path.starts_with('/') {
        return bad("must be absolute (start with /)");
    }
    if path == "/" {
        return bad("is the sandbox's root: mount a volume on a directory such as /mnt/data");
    }
    if path.contains('\0') {
        return bad("contains a NUL byte");
    }
    if path[1..]
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return bad("must be clean: no empty, '.' or '..' components and no trailing /");
    }
    let under = |dir: &&&str| path == **dir || path.starts_with(&format!("{dir}/"));
    if let Some(dir) = SYSTEM.iter().find(under) {
        return bad(&format!(
            "is {dir} or under it, which the sandbox's system needs: use a directory such as \
             /mnt/data or /home/user/data"
        ));
    }
    if NOT_OVER.contains(&path) {
        return bad("would hide a system directory: mount the volume on a directory under it");
    }
    Ok(())
}

/// The paths of one sandbox's mounts: each valid, none twice, none inside
/// another, at most [`MAX_MOUNTS`].
pub fn check_paths<'a>(paths: impl IntoIterator<Item = &'a str>) -> Result<(), VolumeRuleError> {
    let paths: Vec<&str> = paths.into_iter().collect();
    if paths.len() > MAX_MOUNTS {
        return Err(VolumeRuleError::Path {
            path: paths[MAX_MOUNTS].to_string(),
            reason: format!("is one mount too many: a sandbox mounts at most {MAX_MOUNTS} volumes"),
        });
    }
    for (i, p) in paths.iter().enumerate() {
        check_path(p)?;
        for q in &paths[..i] {
            let nested = |a: &str, b: &str| a == b || a.starts_with(&format!("{b}/"));
            if nested(p, q) || nested(q, p) {
                return Err(VolumeRuleError::Path {
                    path: p.to_string(),
                    reason: format!(
                        "overlaps the mount at {q:?}: mount paths must be unique and not nested"
                    ),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_e2b_rule_and_length_limit() {
        for ok in ["data", "a", "A-b_9", &"x".repeat(MAX_NAME)] {
            check_name(ok).unwrap();
        }
        for bad in ["", "a b", "a.b", "ü", "a/b", &"x".repeat(MAX_NAME + 1)] {
            let err = check_name(bad).unwrap_err();
            assert!(err.to_string().contains("letters, digits"), "{err}");
        }
    }

    #[test]
    fn paths_must_be_absolute_clean_and_not_system() {
        for ok in [
            "/mnt/data",
            "/home/user/data",
            "/data",
            "/tmp/x",
            "/var/lib/app",
        ] {
            check_path(ok).unwrap();
        }
        let long_ok = format!("/{}", "x".repeat(MAX_PATH - 1));
        check_path(&long_ok).unwrap();
        let long_bad = format!("/{}", "x".repeat(MAX_PATH));
        for (bad, why) in [
            ("mnt/data", "absolute"),
            ("/", "root"),
            ("/mnt/../etc", "clean"),
            ("/mnt//data", "clean"),
            ("/mnt/data/", "clean"),
            ("/mnt/./data", "clean"),
            ("/proc", "system"),
            ("/dev/shm", "system"),
            ("/usr/local/x", "system"),
            ("/etc", "system"),
            ("/home", "hide"),
            ("/tmp", "hide"),
            (long_bad.as_str(), "longer"),
        ] {
            let err = check_path(bad).unwrap_err().to_string();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn paths_are_unique_and_not_nested() {
        check_paths(["/mnt/a", "/mnt/b", "/mnt/ab"]).unwrap();
        for bad in [
            ["/mnt/a", "/mnt/a"],
            ["/mnt/a", "/mnt/a/b"],
            ["/mnt/a/b", "/mnt/a"],
        ] {
            let err = check_paths(bad).unwrap_err().to_string();
            assert!(err.contains("overlaps"), "{err}");
        }
        let many: Vec<String> = (0..=MAX_MOUNTS).map(|i| format!("/mnt/{i}")).collect();
        check_paths(many[..MAX_MOUNTS].iter().map(String::as_str)).unwrap();
        let err = check_paths(many.iter().map(String::as_str))
            .unwrap_err()
            .to_string();
        assert!(err.contains("at most"), "{err}");
    }
}
