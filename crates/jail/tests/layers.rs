//! An image's layers as the sandbox's root: several read-only lower layers
//! of one overlay (`TemplateRef::Layers`, top first), with OCI deletions
//! as overlay sees them — a whiteout (a 0/0 character device) hides a
//! file of a lower layer, a directory marked `user.overlay.opaque=y` hides
//! everything below it — and the layers' root-owned files the sandbox
//! root's. Writes go to the sandbox's own layer; the layers are never
//! written. Needs root and the test rootfs (`BRIG_TEST_ROOTFS`); skips
//! with a printed reason otherwise.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use brig_core::{SandboxSpec, TemplateRef};
use brig_jail::{Sandbox, SpawnOptions};
use brig_test_support::{root_or_skip, rootfs_or_skip};

fn write(root: &Path, rel: &str, contents: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, contents).unwrap();
}

/// A whiteout for `rel`: what an OCI `.wh.NAME` entry becomes on unpack.
fn whiteout(root: &Path, rel: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid path; a character device 0/0.
    let made = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR, 0) };
    assert_eq!(made, 0);
}

fn opaque(dir: &Path) {
    let c = CString::new(dir.as_os_str().as_bytes()).unwrap();
    // SAFETY: valid C strings and a 1-byte value.
    let r = unsafe {
        libc::setxattr(
            c.as_ptr(),
            c"user.overlay.opaque".as_ptr(),
            b"y".as_ptr().cast(),
            1,
            0,
        )
    };
    assert_eq!(r, 0, "setxattr: {}", std::io::Error::last_os_error());
}

#[test]
fn image_layers_stack_with_whiteouts_and_opaque_directories() {
    if !root_or_skip() {
        return;
    }
    let Some(rootfs) = rootfs_or_skip() else {
        return;
    };
    let middle = tempfile::tempdir().unwrap();
    let top = tempfile::tempdir().unwrap();
    write(middle.path(), "srv/d/a", "a from the middle\n");
    write(middle.path(), "srv/d/b", "b from the middle\n");
    write(middle.path(), "srv/kept", "kept\n");
    write(middle.path(), "srv/gone", "gone\n");
    write(top.path(), "srv/d/c", "c from the top\n");
    opaque(&top.path().join("srv/d"));
    whiteout(top.path(), "srv/gone");
    whiteout(top.path(), "etc/issue");
    write(top.path(), "srv/kept", "kept, from the top\n");
    let script = r#"
        [ "$(ls /srv/d)" = c ] || exit 10
        [ "$(cat /srv/kept)" = "kept, from the top" ] || exit 11
        [ ! -e /srv/gone ] || exit 12
        [ ! -e /etc/issue ] || exit 13
        [ -x /bin/sh ] || exit 14
        [ "$(stat -c %u /srv/kept)" = 0 ] || exit 15
        echo new > /srv/d/new && rm /srv/kept || exit 16
        exit 0
    "#;
    let mut spec = SandboxSpec::new(vec!["/bin/sh".into(), "-c".into(), script.into()]);
    spec.template = TemplateRef::Layers {
        image: "test/layers".into(),
        lowers: vec![top.path().into(), middle.path().into(), rootfs.clone()],
    };
    spec.validate().unwrap();
    let opts = SpawnOptions::prepare().unwrap();
    let code = Sandbox::spawn(&spec, &opts).unwrap().wait().unwrap().code;
    assert_eq!(code, 0, "the merged view is wrong (exit {code})");
    // The layers were not written.
    assert!(!top.path().join("srv/d/new").exists());
    assert!(middle.path().join("srv/kept").exists());
    assert_eq!(
        std::fs::read_to_string(top.path().join("srv/kept")).unwrap(),
        "kept, from the top\n"
    );
}

/// Many layers (each its own idmapped mount, all sent to the init at once)
/// stack as well as three: a file from every one is there.
#[test]
fn forty_layers_stack() {
    if !root_or_skip() {
        return;
    }
    let Some(rootfs) = rootfs_or_skip() else {
        return;
    };
    let layers: Vec<tempfile::TempDir> = (0..40).map(|_| tempfile::tempdir().unwrap()).collect();
    for (i, l) in layers.iter().enumerate() {
        write(l.path(), &format!("srv/l{i}"), "x");
    }
    let mut lowers: Vec<std::path::PathBuf> = layers.iter().map(|l| l.path().into()).collect();
    lowers.push(rootfs.clone());
    let mut spec = SandboxSpec::new(vec![
        "/bin/sh".into(),
        "-c".into(),
        "[ \"$(ls /srv | wc -l)\" = 40 ]".into(),
    ]);
    spec.template = TemplateRef::Layers {
        image: "test/many".into(),
        lowers,
    };
    spec.validate().unwrap();
    let opts = SpawnOptions::prepare().unwrap();
    let code = Sandbox::spawn(&spec, &opts).unwrap().wait().unwrap().code;
    assert_eq!(code, 0, "not every layer's file is there (exit {code})");
}

/// `SandboxSpec::upper_dir`: the writable layer kept in a host directory
/// (how an image build captures a RUN step): what the command wrote is
/// there afterwards, owned as inside (the sandbox's root is root on disk,
/// through the idmapping), a deletion is a 0/0 whiteout, and the template
/// is untouched.
#[test]
fn a_kept_writable_layer_holds_what_the_command_changed() {
    if !root_or_skip() {
        return;
    }
    let Some(rootfs) = rootfs_or_skip() else {
        return;
    };
    let keep = tempfile::tempdir().unwrap();
    std::fs::create_dir(keep.path().join("upper")).unwrap();
    std::fs::create_dir(keep.path().join("work")).unwrap();
    let mut spec = SandboxSpec::new(vec![
        "/bin/sh".into(),
        "-c".into(),
        "echo built > /built && rm /etc/issue && mkdir -p /home/u && chown 1000:1000 /home/u"
            .into(),
    ]);
    spec.template = TemplateRef::Dir(rootfs.clone());
    spec.upper_dir = Some(keep.path().to_path_buf());
    spec.validate().unwrap();
    let opts = SpawnOptions::prepare().unwrap();
    let code = Sandbox::spawn(&spec, &opts).unwrap().wait().unwrap().code;
    assert_eq!(code, 0);
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let upper = keep.path().join("upper");
    assert_eq!(
        std::fs::read_to_string(upper.join("built")).unwrap(),
        "built\n"
    );
    let built = std::fs::metadata(upper.join("built")).unwrap();
    assert_eq!((built.uid(), built.gid()), (0, 0));
    let home = std::fs::metadata(upper.join("home/u")).unwrap();
    assert_eq!((home.uid(), home.gid()), (1000, 1000));
    let gone = std::fs::symlink_metadata(upper.join("etc/issue")).unwrap();
    assert!(
        gone.file_type().is_char_device() && gone.rdev() == 0,
        "{gone:?}"
    );
    assert!(
        rootfs.join("etc/issue").exists(),
        "the template was written"
    );
}
