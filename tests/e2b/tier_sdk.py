"""The official E2B Python SDK on brig's gvisor and vm tiers (driven by
crates/cli/tests/gvisor.rs and vm.rs).

    BRIG_ISOLATION=gvisor python tier_sdk.py

E2B has no isolation setting: brig reads the metadata key `brig.isolation`
(docs/e2b.md). E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL point at the
daemon; E2B_TEMPLATE names the template; BRIG_ISOLATION the tier (`gvisor`,
the default, or `vm`). Covers: a sandbox created with metadata
{"brig.isolation": TIER} runs under its tier's kernel (gVisor's, or the vm
guest's own Linux), not the host's; commands.run (stdout, stderr, exit
codes, a background command); files.write / read / list; the metadata is
shown back; an unknown tier is refused at create. A vm sandbox is created
without internet access: the tier has no network yet.

Prints one line per check and `N passed, 0 failed` at the end.
"""

import os

from e2b import CommandExitException, Sandbox, SandboxException

from sdk_checks import check, raises, summary

template = os.environ.get("E2B_TEMPLATE", "base")
tier = os.environ.get("BRIG_ISOLATION", "gvisor")
extra = {"allow_internet_access": False} if tier == "vm" else {}
sbx = Sandbox.create(template, metadata={"brig.isolation": tier}, timeout=120, **extra)
print(f"sandbox {sbx.sandbox_id}", flush=True)
try:
    host = open("/proc/version").read().strip()
    r = sbx.commands.run("cat /proc/version; dmesg | head -1; echo err >&2")
    check("runs under its tier's kernel, not the host's", host not in r.stdout, r.stdout)
    if tier == "vm":
        check("the guest's own Linux (Debian's cloud kernel)", "cloud-amd64" in r.stdout, r.stdout)
    else:
        check("gVisor's boot messages", "gVisor" in r.stdout, r.stdout)
    check("stderr apart", r.stderr == "err\n", r.stderr)
    e = raises("a failing command", CommandExitException, lambda: sbx.commands.run("exit 3"))
    check("its exit code", e.exit_code == 3, e.exit_code)

    sbx.files.write("/tmp/hello.txt", "hi from e2b")
    check("files.read", sbx.files.read("/tmp/hello.txt") == "hi from e2b")
    data = bytes(range(256)) * 1000
    sbx.files.write("/tmp/blob.bin", data)
    check("bytes round trip", sbx.files.read("/tmp/blob.bin", format="bytes") == data)
    names = [e.name for e in sbx.files.list("/tmp")]
    check("files.list", "hello.txt" in names and "blob.bin" in names, names)
    r = sbx.commands.run("wc -c < /tmp/blob.bin")
    check("a command sees the written file", r.stdout.strip() == str(len(data)), r.stdout)

    bg = sbx.commands.run("sleep 30", background=True)
    check("a background command is listed", bg.pid in [p.pid for p in sbx.commands.list()])
    check("and killed", sbx.commands.kill(bg.pid))

    info = sbx.get_info()
    check("the metadata is shown back", info.metadata.get("brig.isolation") == tier,
          info.metadata)
finally:
    sbx.kill()

raises(
    "an unknown tier is refused",
    (SandboxException, Exception),
    lambda: Sandbox.create(template, metadata={"brig.isolation": "firecracker"}, timeout=30),
)
summary()
