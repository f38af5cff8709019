//! Paths clients give the file APIs: envd's path rule (`~`, relative to
//! the user's home, normalised), the native API's absolute-path check, a
//! multipart part's file name, a tar entry's name below the directory it
//! is unpacked in, and the name an archive download is rooted at.
//!
//! Properties: a normalised path is absolute, has no empty, `.` or `..`
//! component and normalises to itself; a relative envd path without `..`
//! stays under the home; an accepted file name or tar entry, joined to
//! its directory, never leaves it; an archive's root name is one plain
//! component (or `.`).
#![no_main]

use std::path::Path;

use brig_api::files::archive::{relative, root_name};
use brig_api::files::{checked, file_name};
use brig_e2b::envd::{normalize, User};
use libfuzzer_sys::fuzz_target;

fn assert_normal(p: &str) {
    assert!(p.starts_with('/'), "{p:?} is not absolute");
    assert!(
        p == "/" || p[1..].split('/').all(|c| !matches!(c, "" | "." | "..")),
        "{p:?} is not normalised"
    );
    assert_eq!(normalize(p), p, "normalising {p:?} again changed it");
}

fn under(p: &str, dir: &str) -> bool {
    p.strip_prefix(dir)
        .is_some_and(|r| r.is_empty() || r.starts_with('/'))
}

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let n = normalize(s);
    assert_normal(&n);

    let user = User {
        name: "user".into(),
        uid: 1000,
        gid: 1000,
        home: "/home/user".into(),
    };
    let r = user.resolve(s);
    assert_normal(&r);
    let climbs = s.split('/').any(|c| c == "..");
    if !s.starts_with('/') && !climbs {
        assert!(
            under(&r, "/home/user"),
            "{s:?} resolved to {r:?}, outside the home"
        );
    }

    if let Ok(p) = checked(s.to_string()) {
        assert!(p.starts_with('/') && !p.contains('\0'));
    }

    if let Ok(name) = file_name(Some(s)) {
        let joined = format!("/srv/up/{name}");
        assert_eq!(
            normalize(&joined),
            joined,
            "{name:?} is not one plain component"
        );
        assert!(!name.contains('\0'));
    }

    match relative(s, Path::new(s)) {
        Ok(Some(rel)) => {
            assert!(!rel.starts_with('/'));
            let joined = format!("/srv/up/{rel}");
            assert_eq!(normalize(&joined), joined, "entry {s:?} became {rel:?}");
            assert!(under(&joined, "/srv/up"));
        }
        Ok(None) => assert!(
            Path::new(s)
                .components()
                .all(|c| c == std::path::Component::CurDir),
            "{s:?} taken as the directory itself"
        ),
        Err(_) => {}
    }

    if let Ok(root) = root_name(s) {
        assert!(
            root == "." || (!root.is_empty() && !root.contains('/') && root != ".."),
            "{s:?} is rooted at {root:?}"
        );
    }
});
