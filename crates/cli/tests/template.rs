//! `brig run --template NAME` and `brig template`: named templates resolved
//! to their built rootfs. The templates are built (minutes, once) into the
//! shared test cache, `$BRIG_TEST_TEMPLATE_HOME` or
//! `${BRIG_TEST_CACHE:-$HOME/.cache/brig-test}/home` (scripts/test builds
//! them before the tests). Need root; without it each test says so.

mod support;

use support::*;

#[test]
fn run_on_the_base_template() {
    require_root!();
    let o = brig()
        .env("BRIG_HOME", template_home())
        .args([
            "run",
            "--template",
            "base",
            "--",
            "python3",
            "-c",
            "print(1)",
        ])
        .output()
        .unwrap();
    assert_eq!(
        (o.status.code(), stdout(&o).as_str()),
        (Some(0), "1\n"),
        "{}",
        stderr(&o)
    );
    // As `user`, in its home, with node and git there.
    let o = brig()
        .env("BRIG_HOME", template_home())
        .args(["run", "--template", "base", "--user", "user", "--"])
        .args([
            "sh",
            "-c",
            "echo $HOME $(id -u); node -e 'console.log(6*7)'",
        ])
        .output()
        .unwrap();
    assert_eq!(stdout(&o), "/home/user 1000\n42\n", "{}", stderr(&o));
}

#[test]
fn unknown_and_malformed_template_names_say_what_exists() {
    let home = tempfile::tempdir().unwrap();
    let o = brig()
        .env("BRIG_HOME", home.path())
        .args(["run", "--template", "ubuntu", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(125), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("\"ubuntu\"") && err.contains("base, code-interpreter-v1"),
        "{err}"
    );
    // Nothing was built for a name that does not exist.
    assert!(!home.path().join("templates/ubuntu").exists());

    let o = brig()
        .args(["run", "--template", "Not/A-Name", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(125));
    assert!(stderr(&o).contains("unknown template"), "{}", stderr(&o));
}

#[test]
fn template_ls_shows_each_template_and_its_state() {
    let home = tempfile::tempdir().unwrap();
    let o = brig()
        .env("BRIG_HOME", home.path())
        .args(["template", "ls", "--json"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let names: Vec<_> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["name"].as_str().unwrap(), t["state"].as_str().unwrap()))
        .collect();
    assert_eq!(
        names,
        [("base", "missing"), ("code-interpreter-v1", "missing")]
    );

    // A built one (from the shared cache) is ready, with its size.
    require_root!();
    let o = brig()
        .env("BRIG_HOME", template_home())
        .args(["template", "build", "base"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = brig()
        .env("BRIG_HOME", template_home())
        .args(["template", "ls", "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v[0]["state"], "ready", "{v}");
    assert!(v[0]["size_bytes"].as_u64().unwrap() > 100 << 20, "{v}");
    // And an image of the store, standing on that build (no copy).
    let image = v
        .as_array()
        .unwrap()
        .iter()
        .find(|t| {
            t["kind"] == "image"
                && t["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("brig-recipe/base:"))
        })
        .unwrap_or_else(|| panic!("no image of base: {v}"));
    let shown = brig()
        .env("BRIG_HOME", template_home())
        .args([
            "template",
            "inspect",
            "--json",
            image["name"].as_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(shown.status.code(), Some(0), "{}", stderr(&shown));
}
