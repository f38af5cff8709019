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
shown back; an unknown tier is refused at create; a memory snapshot (a
process keeps running, with its memory, in a sandbox created from it; the
parent runs on). On vm, `allow_internet_access` is honoured: the first
sandbox (default: allowed) has eth0 at its sandbox address, the snapshot's
parent (not allowed) has no network device at all. On gvisor with a
template of files (not `host`), a sandbox with internet access, which this
runsc cannot checkpoint, is snapshotted by its files. A volume (through
E2B's `Volume` and `volume_mounts`) mounts on both tiers; a vm guest has
it alone, and the host's content API refuses it after.

Prints one line per check and `N passed, 0 failed` at the end.
"""

import os
import time

from e2b import CommandExitException, Sandbox, SandboxException, Volume

from sdk_checks import check, raises, summary

template = os.environ.get("E2B_TEMPLATE", "base")
tier = os.environ.get("BRIG_ISOLATION", "gvisor")
sbx = Sandbox.create(template, metadata={"brig.isolation": tier}, timeout=120)
print(f"sandbox {sbx.sandbox_id}", flush=True)
try:
    host = open("/proc/version").read().strip()
    r = sbx.commands.run("cat /proc/version; dmesg | head -1; echo err >&2")
    check("runs under its tier's kernel, not the host's", host not in r.stdout, r.stdout)
    if tier == "vm":
        check("the guest's own Linux (Debian's cloud kernel)", "cloud-amd64" in r.stdout, r.stdout)
        n = sbx.commands.run("ls /sys/class/net; grep -c '10\\.88\\.' /proc/net/fib_trie; true")
        check("internet access allowed: eth0 at a sandbox address",
              "eth0" in n.stdout.split() and int(n.stdout.split()[-1]) > 0, n.stdout)
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


def state(sbx):
    """The token and count the loop last wrote, or None (it truncates the
    file before each write: a read may land between the two)."""
    try:
        fields = sbx.files.read("/tmp/state").split()
        return fields if len(fields) == 2 else None
    except Exception:
        return None


def until(probe, timeout=30):
    """probe()'s first truthy answer within `timeout` seconds (TCG is slow), or None."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = probe()
        if got:
            return got
        time.sleep(0.3)
    return None


if tier in ("gvisor", "vm"):
    # A memory snapshot: a process whose token lives only in its memory
    # runs on in a sandbox created from the snapshot.
    parent = Sandbox.create(
        template, metadata={"brig.isolation": tier}, allow_internet_access=False, timeout=120
    )
    try:
        loop = parent.commands.run(
            "exec bash -c 'tok=$$-$RANDOM$RANDOM; n=0; "
            "while :; do n=$((n+1)); echo \"$tok $n\" > /tmp/state; sleep 0.2; done'",
            background=True,
        )
        before = until(lambda: state(parent))
        if tier == "vm":
            links = parent.commands.run("ls /sys/class/net").stdout.split()
            check("internet access not allowed: no network device", links == ["lo"], links)
        snap = parent.create_snapshot()
        check(f"a snapshot of a {tier} sandbox", snap.snapshot_id.startswith("snap-"), snap)
        child = Sandbox.create(snap.snapshot_id, allow_internet_access=False, timeout=120)
        try:
            after = until(lambda: (s := state(child)) and int(s[1]) > int(before[1]) and s)
            check(
                "its process runs on from the snapshot, with its memory",
                after and after[0] == before[0],
                (before, after),
            )
        finally:
            child.kill()
        later = until(lambda: (s := state(parent)) and int(s[1]) > int(before[1]) and s)
        check("and the parent runs on", later and later[0] == before[0], (before, later))

        # fork(count=2): two copies of the running parent, memory included,
        # each on its own from then on.
        forks = parent.fork(count=2)
        try:
            check(f"fork(count=2) of a {tier} sandbox: two sandboxes", len(forks) == 2, forks)
            states = [
                until(lambda f=f: (s := state(f)) and int(s[1]) > int(later[1]) and s)
                for f in forks
            ]
            check(
                "each fork's process runs on with the parent's memory",
                all(s and s[0] == before[0] for s in states),
                (later, states),
            )
            forks[0].commands.run("echo only-in-fork-0 > /tmp/mine")
            others = [forks[1], parent]
            check(
                "a file written in one fork is in neither the other nor the parent",
                all(not o.files.exists("/tmp/mine") for o in others),
            )
            # The same pid in every copy (no pkill in a minbase template).
            forks[0].commands.run(f"kill {loop.pid}")
            a = until(lambda: state(forks[0]))
            time.sleep(1)
            stopped = state(forks[0]) == a
            moving = until(lambda: (s := state(forks[1])) and s != states[1])
            check("a process ended in one fork runs on in the other", stopped and moving,
                  (stopped, moving))
            names = {f.commands.run("hostname").stdout.strip() for f in forks}
            check("each fork has a host name of its own", len(names) == 2, names)
        finally:
            for f in forks:
                f.kill()
    finally:
        parent.kill()

# A volume: written through its content API, mounted in a sandbox of the
# tier (volume_mounts), written back. gvisor shares it with the host; a vm
# guest's kernel has it alone, and after it only vm sandboxes may use it:
# the host's content API refuses it.
vol = Volume.create(f"tier-{tier}-{os.getpid()}")
try:
    vol.write_file("/from-api.txt", "through the volume api")
    mounted = Sandbox.create(
        template, metadata={"brig.isolation": tier}, timeout=120, volume_mounts={"/mnt/data": vol}
    )
    try:
        r = mounted.commands.run("cat /mnt/data/from-api.txt; echo from-tier > /mnt/data/from-tier.txt")
        check(f"a volume mounted in a {tier} sandbox", r.stdout == "through the volume api", r.stdout)
    finally:
        mounted.kill()
    if tier == "vm":
        raises(
            "a volume a vm guest has had: the host's content api refuses it",
            Exception,
            lambda: vol.read_file("/from-tier.txt"),
        )
    else:
        got = vol.read_file("/from-tier.txt")
        check("what the sandbox wrote, through the content api", got == "from-tier\n", got)
finally:
    check("the volume destroyed", Volume.destroy(vol.volume_id) is True)

if tier == "gvisor" and template != "host":
    # With internet access (the default) this runsc cannot checkpoint a
    # sandbox: its snapshot keeps its files, and a sandbox starts on them.
    net = Sandbox.create(template, metadata={"brig.isolation": tier}, timeout=120)
    try:
        net.files.write("kept.txt", "files of a networked sandbox")
        snap = net.create_snapshot()
        copy = Sandbox.create(snap.snapshot_id, metadata={"brig.isolation": tier}, timeout=120)
        try:
            got = copy.files.read("kept.txt")
            check("a networked gvisor sandbox's snapshot keeps its files", got == "files of a networked sandbox", got)
        finally:
            copy.kill()
        check("its snapshot is deleted", Sandbox.delete_snapshot(snap.snapshot_id) is True)
    finally:
        net.kill()

raises(
    "an unknown tier is refused",
    (SandboxException, Exception),
    lambda: Sandbox.create(template, metadata={"brig.isolation": "firecracker"}, timeout=30),
)
summary()
