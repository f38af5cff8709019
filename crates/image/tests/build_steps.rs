//! `Builder::build_steps` with the step kinds E2B's template builder adds
//! (brig-e2b's control/templates.rs), on a base made with `image_from_dir`
//! and a fake RUN runner that writes into the step's upper directory (no
//! sandbox): COPY from its own context with links kept, an owner by name
//! and a mode; directories the image has keep their attributes; a missing
//! WORKDIR becomes a layer owned by the USER so far; RUN as a named user;
//! `force` rebuilds that step and every later one. Needs root (unpacking
//! sets ownership).

mod support;

use std::collections::HashMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use brig_image::build::{image_from_dir, Builder, CopyExtra, Instruction, RunStep, Step};
use brig_image::{ImageConfig, ImageRecord, ImageStore};
use support::{root_or_skip, store};

/// A tiny root filesystem: /etc/passwd with `user` (1000), its home owned
/// by it with mode 0700.
fn rootfs(dir: &Path) {
    std::fs::create_dir_all(dir.join("etc")).unwrap();
    std::fs::write(
        dir.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("etc/group"),
        "root:x:0:\nuser:x:1000:\nstaff:x:50:\n",
    )
    .unwrap();
    let home = dir.join("home/user");
    std::fs::create_dir_all(&home).unwrap();
    std::os::unix::fs::chown(&home, Some(1000), Some(1000)).unwrap();
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700)).unwrap();
}

/// What the fake runner saw of each RUN: (argv's last word, user, workdir).
type Seen = Vec<(String, Option<String>, Option<String>)>;

fn build(
    store: &ImageStore,
    base: &ImageRecord,
    steps: &[Step],
    name: &str,
    seen: &mut Seen,
    said: &mut Vec<String>,
) -> ImageRecord {
    let empty = tempfile::tempdir().unwrap();
    let mut base_fn = |_: &str| -> Result<ImageRecord, String> { Ok(base.clone()) };
    let mut run = |step: &RunStep<'_>| -> Result<(), String> {
        let last = step.argv.last().cloned().unwrap_or_default();
        seen.push((
            last.clone(),
            step.user.map(str::to_string),
            step.workdir.map(str::to_string),
        ));
        // "What the command did": a file named after it.
        let upper = step.upper_dir.join("upper/ran");
        std::fs::create_dir_all(&upper).unwrap();
        std::fs::write(upper.join(last.replace(' ', "_")), "x").unwrap();
        Ok(())
    };
    let mut say = |l: &str| said.push(l.trim().to_string());
    let mut all = vec![Step {
        line: 0,
        instruction: Instruction::From(base.name.clone()),
        force: false,
    }];
    all.extend(steps.iter().cloned());
    Builder {
        store,
        context: empty.path(),
        build_args: HashMap::new(),
        base: &mut base_fn,
        run: &mut run,
        say: &mut say,
    }
    .build_steps(&all, name, "test")
    .unwrap()
}

fn step(line: usize, instruction: Instruction) -> Step {
    Step {
        line,
        instruction,
        force: false,
    }
}

/// The file at `path` in the image: the topmost layer that has it.
fn find(store: &ImageStore, image: &ImageRecord, path: &str) -> Option<PathBuf> {
    store
        .lowers(image)
        .into_iter()
        .map(|l| l.join(path))
        .find(|p| p.symlink_metadata().is_ok())
}

#[test]
fn e2b_steps_build_cached_layers() {
    if !root_or_skip() {
        return;
    }
    let (_home, store) = store();
    let root = tempfile::tempdir().unwrap();
    rootfs(root.path());
    let base = image_from_dir(
        &store,
        root.path(),
        "base-test",
        "test",
        ImageConfig::default(),
    )
    .unwrap();
    assert_eq!(base.layers.len(), 1);

    // What a client uploaded for one copy: a file, a link to it.
    let ctx = tempfile::tempdir().unwrap();
    std::fs::write(ctx.path().join("tool.sh"), "#!/bin/sh\n").unwrap();
    std::os::unix::fs::symlink("tool.sh", ctx.path().join("link")).unwrap();
    let extra = |owner: Option<&str>, mode: Option<u32>| {
        Some(CopyExtra {
            context: ctx.path().to_path_buf(),
            owner: owner.map(str::to_string),
            mode,
        })
    };
    let sh = |c: &str| vec!["/bin/sh".to_string(), "-c".to_string(), c.to_string()];
    let steps = vec![
        step(
            1,
            Instruction::Copy {
                sources: vec!["tool.sh".into()],
                dest: "/home/user/bin/tool.sh".into(),
                chown: None,
                extra: extra(Some("user:staff"), Some(0o750)),
            },
        ),
        step(
            2,
            Instruction::Copy {
                sources: vec!["link".into()],
                dest: "/home/user/link".into(),
                chown: None,
                extra: extra(None, None),
            },
        ),
        step(3, Instruction::User("user".into())),
        step(4, Instruction::Workdir("/home/user/work".into())),
        step(5, Instruction::Run(sh("as user"))),
        step(6, Instruction::RunAs(sh("as root"), "root".into())),
    ];
    let (mut seen, mut said) = (Seen::new(), Vec::new());
    let image = build(&store, &base, &steps, "t1", &mut seen, &mut said);

    // Owner by name, the mode, and the link kept as a link.
    let tool = find(&store, &image, "home/user/bin/tool.sh").unwrap();
    let m = tool.metadata().unwrap();
    assert_eq!((m.uid(), m.gid(), m.mode() & 0o7777), (1000, 50, 0o750));
    let link = find(&store, &image, "home/user/link").unwrap();
    assert_eq!(std::fs::read_link(&link).unwrap(), Path::new("tool.sh"));
    // /home/user was in the image: the copies' layers keep its owner and
    // mode (the topmost layer's copy of it is what a sandbox sees).
    let home = find(&store, &image, "home/user").unwrap();
    let m = home.metadata().unwrap();
    assert_eq!((m.uid(), m.mode() & 0o7777), (1000, 0o700), "{home:?}");
    // WORKDIR made, owned by the USER so far.
    let work = find(&store, &image, "home/user/work").unwrap();
    assert_eq!(work.metadata().unwrap().uid(), 1000);
    assert_eq!(image.config.working_dir.as_deref(), Some("/home/user/work"));
    // RUN as USER, RunAs as its own.
    assert_eq!(
        seen,
        vec![
            (
                "as user".into(),
                Some("user".into()),
                Some("/home/user/work".into())
            ),
            (
                "as root".into(),
                Some("root".into()),
                Some("/home/user/work".into())
            ),
        ]
    );
    // copy, copy, workdir, run, run: five layers on the base.
    assert_eq!(image.layers.len(), 6);

    // Again: every layer from the cache, nothing run, the same image.
    let (mut seen2, mut said2) = (Seen::new(), Vec::new());
    let again = build(&store, &base, &steps, "t1", &mut seen2, &mut said2);
    assert!(seen2.is_empty(), "{seen2:?}");
    assert_eq!(
        said2.iter().filter(|l| *l == "(cached)").count(),
        5,
        "{said2:?}"
    );
    assert_eq!(again.digest, image.digest);

    // `force` on step 5: it and step 6 run again; 1-4 stay cached.
    let mut forced = steps.clone();
    forced[4].force = true;
    let (mut seen3, mut said3) = (Seen::new(), Vec::new());
    build(&store, &base, &forced, "t1", &mut seen3, &mut said3);
    assert_eq!(seen3.len(), 2, "{seen3:?}");
    assert_eq!(
        said3.iter().filter(|l| *l == "(cached)").count(),
        3,
        "{said3:?}"
    );

    // An owner the image does not have: the step's error says so.
    let bad = vec![step(
        1,
        Instruction::Copy {
            sources: vec!["tool.sh".into()],
            dest: "/x".into(),
            chown: None,
            extra: extra(Some("ghost"), None),
        },
    )];
    let empty = tempfile::tempdir().unwrap();
    let mut base_fn = |_: &str| -> Result<ImageRecord, String> { Ok(base.clone()) };
    let mut run = |_: &RunStep<'_>| -> Result<(), String> { Ok(()) };
    let mut say = |_: &str| {};
    let mut all = vec![step(0, Instruction::From("base-test".into()))];
    all.extend(bad);
    let err = Builder {
        store: &store,
        context: empty.path(),
        build_args: HashMap::new(),
        base: &mut base_fn,
        run: &mut run,
        say: &mut say,
    }
    .build_steps(&all, "t2", "test")
    .unwrap_err()
    .to_string();
    assert!(err.contains("line 1") && err.contains("ghost"), "{err}");
    assert!(store.get("t2").unwrap().is_none());
}
