//! A vm sandbox's memory in use is what its guest's kernel says, not
//! which pages of the guest's RAM QEMU touched (after a restore from the
//! tier's boot snapshot, every one of them).

use std::time::{Duration, Instant};

use brig_agent_client::ExecRequest;
use brig_core::{Isolation, TemplateRef};
use brig_runtime::CreateConfig;
use brig_test_support::{root_or_skip, rootfs_or_skip, vm_manager_fixture};

#[test]
fn memory_in_use_on_vm_is_the_guests_own() {
    if !root_or_skip() {
        return;
    }
    let Some(rootfs) = rootfs_or_skip() else {
        return;
    };
    let Some(f) = vm_manager_fixture(|c| {
        c.template_roots = rootfs.parent().map(Into::into).into_iter().collect();
    }) else {
        return;
    };
    let m = &f.manager;
    let tenant = m.authenticate(&f.key).unwrap().tenant;
    let config = CreateConfig {
        template: TemplateRef::Dir(rootfs.clone()),
        isolation: Isolation::Vm,
        ..CreateConfig::default()
    };
    let id = m.create(&tenant, config).unwrap().id;
    // The guest's own count, from inside.
    let req = ExecRequest {
        argv: [
            "/bin/sh",
            "-c",
            "grep -E '^Mem(Total|Available):' /proc/meminfo",
        ]
        .map(String::from)
        .to_vec(),
        ..ExecRequest::default()
    };
    let guest = || -> u64 {
        let (out, _, status) = m
            .exec(&tenant, &id, &req)
            .unwrap()
            .wait_with_output()
            .unwrap();
        assert!(status.success());
        let kib: Vec<u64> = String::from_utf8_lossy(&out)
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        (kib[0] - kib[1]) << 10
    };
    // The first reading may still be the tier's (the guest's is read in
    // the background); within a few seconds it is the guest's.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let usage = m.usage(&tenant, &id).unwrap();
        let inside = guest();
        let near = usage.memory_bytes.abs_diff(inside) < 48 << 20;
        if near {
            assert!(
                usage.memory_bytes <= usage.memory_limit_bytes,
                "{usage:?} over its RAM"
            );
            eprintln!(
                "in use: {} MiB (the guest says {} MiB) of {} MiB",
                usage.memory_bytes >> 20,
                inside >> 20,
                usage.memory_limit_bytes >> 20
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "usage says {} MiB in use, the guest {} MiB",
            usage.memory_bytes >> 20,
            inside >> 20
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    m.delete(&tenant, &id).unwrap();
}
