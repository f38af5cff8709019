//! `brig doctor` run as a real binary: the JSON report parses and names
//! every feature, the table has a row per feature, and helper programs are
//! found on PATH and asked for their version.

mod support;

use std::path::Path;
use std::process::{Command, Output};

use brig_test_support::is_root;
use serde_json::Value;

/// Every feature the report must carry. Clients read these names from
/// `brig doctor --json` (and later `GET /v1/info`), so renaming one is an
/// API change and should fail here.
const FEATURES: &[&str] = &[
    "root",
    "user_namespace",
    "mount_namespace",
    "pid_namespace",
    "net_namespace",
    "ipc_namespace",
    "uts_namespace",
    "cgroup_namespace",
    "overlayfs",
    "overlayfs_in_userns",
    "open_tree",
    "idmapped_mounts",
    "seccomp",
    "no_new_privs",
    "pidfd_open",
    "cgroups",
    "cgroup_memory",
    "cgroup_pids",
    "cgroup_cpu",
    "cgroup_freezer",
    "memory_swap_accounting",
    "tmpfs",
    "devpts",
    "kvm",
    "runsc",
    "qemu",
    "mmdebstrap",
    "bubblewrap",
    "crun",
    // The host limits that cap how many sandboxes run at once.
    "pid_max",
    "threads_max",
    "namespaces_max",
    "nr_open",
    "cgroup_favordynmods",
    // Whether `brig serve --e2b-domain brig.localhost`'s names resolve.
    "localhost-names",
];

fn doctor(args: &[&str], path: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_brig"));
    cmd.arg("doctor").args(args);
    if let Some(path) = path {
        cmd.env("PATH", path);
    }
    cmd.output().expect("run brig doctor")
}

fn json_report(path: Option<&str>) -> (Value, Option<i32>) {
    let out = doctor(&["--json"], path);
    let text = String::from_utf8(out.stdout).expect("utf-8 output");
    let report = serde_json::from_str(&text)
        .unwrap_or_else(|err| panic!("brig doctor --json is not JSON ({err}):\n{text}"));
    (report, out.status.code())
}

fn feature<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["features"]
        .as_array()
        .expect("features is an array")
        .iter()
        .find(|f| f["name"] == name)
        .unwrap_or_else(|| panic!("no feature {name} in {report:#}"))
}

#[test]
fn json_report_names_every_feature() {
    let (report, code) = json_report(None);
    let features = report["features"].as_array().expect("features is an array");
    assert_eq!(
        features.len(),
        FEATURES.len(),
        "unexpected feature count: {report:#}"
    );
    for name in FEATURES {
        let f = feature(&report, name);
        let status = f["status"].as_str().expect("status is a string");
        assert!(
            ["ok", "missing", "degraded"].contains(&status),
            "{name}: {status}"
        );
        assert!(f["detail"].is_string(), "{name} has no detail");
        assert!(f["required"].is_boolean(), "{name} has no required flag");
        // Anything not ok must say what to do.
        if status != "ok" {
            assert!(f["fix"].is_string(), "{name} is {status} without a fix");
        }
    }
    let process = report["tiers"]["process"].as_bool().expect("tiers.process");
    assert!(report["tiers"]["gvisor"].is_boolean());
    let accel = report["tiers"]["vm"]["accel"].as_str().expect("vm.accel");
    assert!(
        [
            "kvm",
            "pvm-kvm (cannot boot stock guests; TCG used)",
            "tcg",
            "none"
        ]
        .contains(&accel),
        "{accel}"
    );
    // The exit code says whether the process tier is usable, in both modes.
    assert_eq!(code, Some(if process { 0 } else { 1 }));
}

#[test]
fn process_tier_is_available_as_root() {
    if !is_root() {
        support::skip("process_tier_is_available_as_root needs root (brig's process tier does)");
        return;
    }
    let (report, code) = json_report(None);
    let blockers: Vec<&Value> = report["features"]
        .as_array()
        .expect("features is an array")
        .iter()
        .filter(|f| f["required"] == true && f["status"] == "missing")
        .collect();
    assert!(
        blockers.is_empty(),
        "required features missing: {blockers:#?}"
    );
    assert_eq!(report["tiers"]["process"], true);
    assert_eq!(code, Some(0));
}

#[test]
fn table_has_a_row_per_feature_and_a_line_per_tier() {
    let out = doctor(&[], None);
    let text = String::from_utf8(out.stdout).expect("utf-8 output");
    let rows: Vec<Vec<&str>> = text
        .lines()
        .map(|line| line.trim_start_matches('*').split_whitespace().collect())
        .collect();
    for name in FEATURES {
        let row = rows
            .iter()
            .find(|words| words.first() == Some(name))
            .unwrap_or_else(|| panic!("no row for {name}:\n{text}"));
        assert!(
            matches!(row.get(1), Some(&("ok" | "missing" | "degraded"))),
            "row for {name} has no status:\n{text}"
        );
    }
    // Every non-ok row is followed by its fix.
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let words: Vec<&str> = line.trim_start_matches('*').split_whitespace().collect();
        if FEATURES.contains(&words.first().copied().unwrap_or_default())
            && matches!(words.get(1), Some(&("missing" | "degraded")))
        {
            let next = lines.get(i + 1).map(|l| l.trim_start()).unwrap_or_default();
            assert!(next.starts_with("fix: "), "no fix under {line:?}:\n{text}");
        }
    }
    for tier in ["process:", "gvisor:", "vm:"] {
        assert!(
            lines.iter().any(|l| l.trim_start().starts_with(tier)),
            "no {tier} line:\n{text}"
        );
    }
}

/// Stand-ins for runsc and QEMU that only answer `--version`, so the
/// lookup-and-ask path is tested on hosts without either installed.
fn fake_tool(dir: &Path, name: &str, version: &str) {
    use std::os::unix::fs::PermissionsExt as _;
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\necho '{version}'\n")).expect("write fake tool");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

#[test]
fn helper_programs_are_found_on_path_and_asked_for_their_version() {
    let dir = tempfile::tempdir().expect("tempdir");
    fake_tool(dir.path(), "runsc", "runsc version release-20221219.0");
    // `runsc help platforms` lists what it was built with (Debian 12's:
    // no systrap).
    {
        let path = dir.path().join("runsc");
        std::fs::write(
            &path,
            "#!/bin/sh
if [ \"$1\" = help ]; then printf 'kvm\\nptrace\\n'; \
             else echo 'runsc version release-20221219.0'; fi\n",
        )
        .expect("write fake runsc");
    }
    fake_tool(
        dir.path(),
        "qemu-system-x86_64",
        "QEMU emulator version 7.2.19 (Debian 1:7.2+dfsg-7+deb12u18)",
    );
    let path = format!(
        "{}:{}",
        dir.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let (report, _) = json_report(Some(&path));

    let runsc = feature(&report, "runsc");
    assert_eq!(runsc["status"], "ok", "{runsc:#}");
    assert!(runsc["detail"]
        .as_str()
        .is_some_and(|d| d.starts_with("runsc version release-20221219.0 at ")));
    // Debian 12's own QEMU: the vm tier, without copy-on-write forks or
    // boot snapshots, and how to get them.
    let qemu = feature(&report, "qemu");
    assert_eq!(qemu["status"], "degraded", "{qemu:#}");
    assert!(qemu["detail"]
        .as_str()
        .is_some_and(|d| d.contains("QEMU emulator version 7.2.19")));
    assert!(
        qemu["fix"]
            .as_str()
            .is_some_and(|f| f.contains("bookworm-backports")),
        "{qemu:#}"
    );

    // With QEMU present the vm tier exists, at whatever acceleration.
    assert_eq!(report["tiers"]["vm"]["available"], true);
    assert_ne!(report["tiers"]["vm"]["accel"], "none");
    assert_eq!(report["tiers"]["vm"]["copy_on_write_forks"], false);

    fake_tool(
        dir.path(),
        "qemu-system-x86_64",
        "QEMU emulator version 10.0.2 (Debian 1:10.0.2+ds-2+deb13u1~bpo12+1)",
    );
    let (report, _) = json_report(Some(&path));
    let qemu = feature(&report, "qemu");
    assert_eq!(qemu["status"], "ok", "{qemu:#}");
    assert_eq!(report["tiers"]["vm"]["available"], true);
    assert_eq!(report["tiers"]["vm"]["copy_on_write_forks"], true);
    // runsc needs root, and so does the gvisor tier; it runs on the best
    // platform this runsc has.
    assert_eq!(report["tiers"]["gvisor"], is_root());
    let detail = report["tiers"]["gvisor_detail"].as_str().unwrap();
    if is_root() {
        assert!(detail.contains("the ptrace platform"), "{detail}");
    } else {
        assert!(detail.contains("needs root"), "{detail}");
    }
}

#[test]
fn missing_helper_programs_name_their_package() {
    // An empty PATH hides every helper program.
    let dir = tempfile::tempdir().expect("tempdir");
    let (report, _) = json_report(Some(&dir.path().display().to_string()));
    assert_eq!(feature(&report, "runsc")["fix"], "apt-get install runsc");
    assert_eq!(
        feature(&report, "qemu")["fix"],
        "apt-get install qemu-system-x86"
    );
    assert_eq!(
        feature(&report, "mmdebstrap")["fix"],
        "apt-get install mmdebstrap"
    );
    assert_eq!(report["tiers"]["gvisor"], false);
    assert_eq!(report["tiers"]["vm"]["available"], false);
    assert_eq!(report["tiers"]["vm"]["accel"], "none");
}
