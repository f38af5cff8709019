//! E2B's volumes through the official Python client (tests/e2b/volumes_sdk.py;
//! the current release and the older generation) against both planes in
//! process, on the process tier, with 32 MiB volumes under a home of the
//! test's own; and after it, nothing of them left on the host: no mount,
//! no loop device, no image.

mod support;

use support::{planes_with, root_or_skip};

/// The current client (e2b 2.63).
#[test]
fn python_sdk_volumes() {
    volumes_with("e2b-venv");
}

/// The older generation (e2b 2.48): the same 63 checks.
#[test]
fn python_sdk_volumes_2_48() {
    volumes_with("e2b-venv-2.48");
}

/// tests/e2b/volumes_sdk.py with the client of `venv`.
fn volumes_with(venv: &str) {
    if !root_or_skip() {
        return;
    }
    let Some(python) = support::venv_or_skip(venv) else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let dir = home.path().to_path_buf();
    let p = planes_with(|c| {
        c.home = Some(dir.clone());
        c.volume_size = 32 << 20;
    });
    let other = p.f.other_key.clone();
    let out = p.run_sdk_script_with(
        &python,
        "volumes_sdk.py",
        Some("host"),
        &[("E2B_OTHER_API_KEY", &other)],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("63 passed, 0 failed"), "{stdout}");
    // The script destroyed its volumes once its sandboxes were gone.
    let leftovers = brig_test_support::volume_leftovers(&dir);
    assert!(leftovers.is_empty(), "{leftovers:?}");
    let left = brig_test_support::volume_files_left(&dir.join("volumes"));
    assert!(left.is_empty(), "{left:?}");
}
