//! Warm starts (`warm.rs`) on the real vm tier: a ready guest kept under a
//! key, restored by each create given the key with its processes running
//! and an identity of its own; a newer one of the family replaces it; a
//! forgotten one is a clear error. (The code interpreter's use of them,
//! end to end through E2B's client: `crates/e2b/tests/e2b_control.rs`.)

use brig_agent_client::ExecRequest;
use brig_core::{Isolation, SandboxId, TemplateRef};
use brig_runtime::{CreateConfig, ManagerError, SandboxManager, TenantId, WarmKey};
use brig_test_support::{root_or_skip, rootfs_or_skip, vm_manager_fixture};

/// Lists the guest's `sleep` processes (no procps in the test rootfs).
const SLEEPING: &str = "grep -lx sleep /proc/[0-9]*/comm";

/// `script` run by sh in sandbox `id` to its end: its stdout (it must exit 0).
fn sh(m: &SandboxManager, tenant: &TenantId, id: &SandboxId, script: &str) -> String {
    let req = ExecRequest {
        argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
        ..ExecRequest::default()
    };
    let (out, err, status) = m
        .exec(tenant, id, &req)
        .unwrap()
        .wait_with_output()
        .unwrap();
    assert!(
        status.success(),
        "{script}: {status:?} {}",
        String::from_utf8_lossy(&err)
    );
    String::from_utf8_lossy(&out).trim().to_string()
}

#[test]
fn a_warm_start_restores_a_ready_guest_for_every_create() {
    if !root_or_skip() {
        return;
    }
    let Some(rootfs) = rootfs_or_skip() else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let Some(f) = vm_manager_fixture(|c| {
        c.home = Some(home.path().to_path_buf());
        c.template_roots = rootfs.parent().map(Into::into).into_iter().collect();
    }) else {
        return;
    };
    let m = &f.manager;
    let tenant = m.authenticate(&f.key).unwrap().tenant;
    assert!(m.warms(Isolation::Vm), "the vm tier keeps warm starts");
    assert!(!m.warms(Isolation::Process), "the process tier does not");
    let config = |warm: Option<WarmKey>| CreateConfig {
        template: TemplateRef::Dir(rootfs.clone()),
        isolation: Isolation::Vm,
        warm,
        ..CreateConfig::default()
    };

    // Made ready: a process it started, a file it wrote.
    let maker = m.create(&tenant, config(None)).unwrap().id;
    let bg = ExecRequest {
        argv: [
            "/bin/sh",
            "-c",
            "echo ready > /tmp/state; exec sleep 100000",
        ]
        .map(String::from)
        .to_vec(),
        background: true,
        ..ExecRequest::default()
    };
    drop(m.exec(&tenant, &maker, &bg).unwrap());
    sh(
        m,
        &tenant,
        &maker,
        &format!("while ! {SLEEPING} >/dev/null; do sleep 0.1; done"),
    );

    let key = WarmKey::new("warm test of vm", &["one"]);
    assert!(!m.warm_kept(&key));
    m.keep_warm(&tenant, &maker, &key).unwrap();
    assert!(m.warm_kept(&key));
    assert_eq!(
        sh(m, &tenant, &maker, "cat /tmp/state"),
        "ready",
        "the guest it was taken of runs on"
    );

    let copies: Vec<SandboxId> = (0..2)
        .map(|_| m.create(&tenant, config(Some(key.clone()))).unwrap().id)
        .collect();
    for id in &copies {
        assert_eq!(sh(m, &tenant, id, "cat /tmp/state"), "ready", "{id}");
        assert!(
            !sh(m, &tenant, id, SLEEPING).is_empty(),
            "{id}: the process started before the checkpoint runs"
        );
        assert_eq!(
            sh(m, &tenant, id, "hostname"),
            id.as_str(),
            "its own identity"
        );
    }
    sh(m, &tenant, &copies[0], "echo mine > /tmp/state");
    assert_eq!(sh(m, &tenant, &copies[1], "cat /tmp/state"), "ready");

    // A newer one of the family replaces it.
    let newer = WarmKey::new("warm test of vm", &["two"]);
    m.keep_warm(&tenant, &maker, &newer).unwrap();
    assert!(m.warm_kept(&newer));
    assert!(!m.warm_kept(&key), "replaced by the newer one");
    let err = m.create(&tenant, config(Some(key.clone()))).unwrap_err();
    assert!(
        matches!(&err, ManagerError::BadRequest { reason } if reason.contains("is not kept")),
        "{err}"
    );
    // Sandboxes restored from the replaced one run on.
    assert_eq!(sh(m, &tenant, &copies[1], "cat /tmp/state"), "ready");
    // And a process-tier sandbox cannot be kept.
    let plain = m.create(&tenant, CreateConfig::default()).unwrap().id;
    let err = m.keep_warm(&tenant, &plain, &key).unwrap_err();
    assert!(err.to_string().contains("cannot restore"), "{err}");

    for id in copies.iter().chain([&maker, &plain]) {
        m.delete(&tenant, id).unwrap();
    }
    m.forget_warm(&newer);
    assert!(!m.warm_kept(&newer));
    let left: Vec<_> = std::fs::read_dir(home.path().join("warm"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "left in the warm directory: {left:?}");
}
