#!/usr/bin/python3
"""Memory snapshots on the vm tier: brig against a bare QEMU doing the same, side by side in one run.

    bench/vm_snapshot.py                       # 3 rounds per size, release build
    bench/vm_snapshot.py --rounds 3 --brig target/debug/brig --sizes 0,64,256 --forks 2

Guests run under TCG on hosts without hardware virtualization (these
machines): the numbers are an emulator's. For each memory size M (MiB a
guest holds: M MiB of random bytes written to its /dev/shm, a tmpfs in
its RAM, so no page of it is zero), each round, in an order that
alternates between rounds:

  brig   a vm sandbox (the test rootfs, 512 MiB, network none) holding M;
         `POST /v1/sandboxes/{id}/snapshots` = "snapshot" (QMP stop, the
         machine migrated to a file through a passed descriptor, the disk
         copied sparse, cont); `POST /v1/sandboxes` from it until its first
         exec ends = "restore" (the disk copied, QEMU -incoming, the state
         loaded, cont, the guest's identity renewed, the agent's
         handshake); `POST /v1/sandboxes/{id}/fork` count N = "fork xN".
  qemu   the peer: qemu-system-x86_64 started by hand with brig's machine
         (kernel, initramfs, template image, devices, 512 MiB), restored
         from a brig snapshot of a guest holding M (made once per size,
         untimed): its disk copied sparse, `-incoming defer`,
         `migrate-incoming` through a passed descriptor, `cont`, until the
         guest's agent answers a Hello = "restore"; then on that guest
         `stop`, `migrate` to a file through a descriptor, the disk copied,
         `cont` = "snapshot"; "fork xN" = a snapshot and N restores.

Prints medians per size and the ratios brig/qemu. Raw samples land in
--out (default target/bench/vm-snapshot-<time>/samples.json). Needs root,
QEMU and the test rootfs (BRIG_TEST_ROOTFS). See bench/README.md.
"""

import argparse
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vm import HELLO, READY, REPO, VM_HOME, Daemon, log, ms, packet, ready  # noqa: E402

MEMORY = "512M"


class Qmp:
    """A QMP session on a unix socket, capabilities negotiated."""

    def __init__(self, path, deadline=10):
        end = time.monotonic() + deadline
        while True:
            try:
                self.s = socket.socket(socket.AF_UNIX)
                self.s.connect(str(path))
                break
            except OSError:
                if time.monotonic() > end:
                    raise
                time.sleep(0.005)
        self.f = self.s.makefile("r")
        json.loads(self.f.readline())
        self.run("qmp_capabilities")

    def run(self, command, fd=None, **arguments):
        line = json.dumps({"execute": command, "arguments": arguments}).encode() + b"\n"
        if fd is None:
            self.s.sendall(line)
        else:
            socket.send_fds(self.s, [line], [fd])
        while True:
            answer = json.loads(self.f.readline())
            if "return" in answer:
                return answer["return"]
            if "error" in answer:
                raise SystemExit(f"QEMU refused {command}: {answer['error']}")

    def migrated(self):
        while True:
            r = self.run("query-migrate")
            if r.get("status") == "completed":
                return
            if r.get("status") in ("failed", "cancelled"):
                raise SystemExit(f"migration failed: {r}")
            time.sleep(0.005)

    def close(self):
        self.s.close()


def sparse_copy(src, dst):
    subprocess.run(["cp", "--sparse=always", str(src), str(dst)], check=True)


class Peer:
    """Bare QEMUs of brig's machine, restored from and saved to files."""

    def __init__(self, qemu, kernel, initramfs, image, scratch, accel):
        self.qemu, self.kernel, self.initramfs, self.image = qemu, kernel, initramfs, image
        self.scratch, self.accel = scratch, accel
        self.procs = []

    def restore(self, memory, disk):
        d = Path(tempfile.mkdtemp(dir=self.scratch))
        sparse_copy(disk, d / "disk.ext4")
        args = [self.qemu, "-nodefaults", "-no-user-config", "-nographic", "-machine", "q35",
                "-accel", "kvm" if self.accel == "kvm" else "tcg,tb-size=64",
                "-m", MEMORY, "-smp", "1",
                "-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
                "-kernel", str(self.kernel), "-initrd", str(self.initramfs),
                "-append", "console=ttyS0 quiet panic=-1 reboot=t brig.hostname=peer -- --vm-init",
                "-no-reboot", "-serial", f"file:{d / 'console.log'}",
                "-drive", f"if=none,id=root,format=raw,readonly=on,file={self.image}",
                "-device", "virtio-blk-pci,drive=root,serial=brig-root",
                "-drive", f"if=none,id=disk,format=raw,cache=unsafe,file={d / 'disk.ext4'}",
                "-device", "virtio-blk-pci,drive=disk,serial=brig-disk",
                "-device", "virtio-serial-pci,max_ports=2",
                "-chardev", f"socket,id=agent,path={d / 'agent.sock'},server=on,wait=off",
                "-device", "virtserialport,chardev=agent,name=org.brig.agent",
                "-qmp", f"unix:{d / 'qmp.sock'},server=on,wait=off",
                "-incoming", "defer", "-S"]
        if self.accel == "kvm":
            args[args.index("-m"):args.index("-m")] = ["-cpu", "host"]
        p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        self.procs.append(p)
        q = Qmp(d / "qmp.sock")
        with open(memory, "rb") as f:
            q.run("getfd", fd=f.fileno(), fdname="in")
        q.run("migrate-incoming", uri="fd:in")
        q.migrated()
        q.run("cont")
        s = socket.socket(socket.AF_UNIX)
        s.connect(str(d / "agent.sock"))
        nonce = random.getrandbits(64).to_bytes(8, "little")
        s.sendall(packet(HELLO, nonce))
        want, got = packet(READY, nonce)[1:], b""
        s.settimeout(120)
        while want not in got:
            chunk = s.recv(65536)
            if not chunk:
                raise SystemExit("the restored guest hung up before its Ready")
            got += chunk
        s.close()
        return q, d

    def snapshot(self, q, d):
        out = Path(tempfile.mkdtemp(dir=self.scratch))
        q.run("stop")
        q.run("migrate-set-parameters", **{"max-bandwidth": 1 << 40})
        with open(out / "memory", "wb") as f:
            q.run("getfd", fd=f.fileno(), fdname="out")
            q.run("migrate", uri="fd:out")
            q.migrated()
            os.fsync(f.fileno())
        sparse_copy(d / "disk.ext4", out / "disk.ext4")
        q.run("cont")
        return out

    def end(self):
        for p in self.procs:
            p.kill()
            p.wait()
        self.procs.clear()


def hold(d, sid, mib):
    if mib:
        d.call("POST", f"/v1/sandboxes/{sid}/exec", {
            "argv": ["/bin/sh", "-c", f"head -c {mib}M /dev/urandom > /dev/shm/held"]})


def brig_parent(d, template, mib):
    sb = json.loads(d.call("POST", "/v1/sandboxes", {
        "isolation": "vm", "template": template, "memory": MEMORY, "network": {"mode": "none"}}))
    d.exec_true(sb["id"])
    hold(d, sb["id"], mib)
    return sb["id"]


def brig_round(d, template, mib, forks):
    parent = brig_parent(d, template, mib)
    t0 = time.perf_counter()
    snap = json.loads(d.call("POST", f"/v1/sandboxes/{parent}/snapshots", {}))
    snapshot = time.perf_counter() - t0
    t0 = time.perf_counter()
    child = json.loads(d.call("POST", "/v1/sandboxes", {
        "template": snap["id"], "network": {"mode": "none"}}))
    d.exec_true(child["id"])
    restore = time.perf_counter() - t0
    d.call("DELETE", f"/v1/sandboxes/{child['id']}")
    t0 = time.perf_counter()
    made = json.loads(d.call("POST", f"/v1/sandboxes/{parent}/fork", {"count": forks}))
    fork = time.perf_counter() - t0
    ids = [f["sandbox"]["id"] for f in made if "sandbox" in f]
    if len(ids) != forks:
        raise SystemExit(f"fork made {len(ids)} of {forks}: {made}")
    for sid in ids + [parent]:
        d.call("DELETE", f"/v1/sandboxes/{sid}")
    d.call("DELETE", f"/v1/snapshots/{snap['id']}")
    return snapshot, restore, fork


def peer_round(peer, base, forks):
    t0 = time.perf_counter()
    q, d = peer.restore(base / "memory", base / "disk.ext4")
    restore = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = peer.snapshot(q, d)
    snapshot = time.perf_counter() - t0
    t0 = time.perf_counter()
    out2 = peer.snapshot(q, d)
    for _ in range(forks):
        peer.restore(out2 / "memory", out2 / "disk.ext4")[0].close()
    fork = time.perf_counter() - t0
    q.close()
    peer.end()
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(out2, ignore_errors=True)
    return snapshot, restore, fork


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", default="0,64,256", help="MiB each guest holds, comma-separated")
    ap.add_argument("--forks", type=int, default=2)
    ap.add_argument("--brig", help="a built brig (default: cargo build --release)")
    ap.add_argument("--out", help="where the samples go")
    args = ap.parse_args()
    qemu, rootfs, template, brig = ready("bench/vm_snapshot.py", args.brig)
    sizes = [int(s) for s in args.sizes.split(",")]
    out = Path(args.out or REPO / "target/bench" / time.strftime("vm-snapshot-%Y%m%d-%H%M%S"))
    out.mkdir(parents=True, exist_ok=True)

    home = tempfile.mkdtemp(prefix="brig-bench-vmsnap-")
    scratch = Path(tempfile.mkdtemp(prefix="qemu-bench-snap-"))
    d = Daemon(brig, home, str(Path(rootfs).parent))
    samples = {}
    try:
        info = json.loads(d.call("GET", "/v1/info"))
        vm = info["tiers"]["vm"]
        if "vm" not in info.get("offered", []):
            raise SystemExit(f"the daemon offers no vm tier: {info['tiers']}")
        accel = "kvm" if vm["accel"] == "kvm" else "tcg"
        log(f"vm tier: {vm['detail']}")
        version = (VM_HOME / "kernel/current").read_text().strip()
        for size in sizes:
            # A base snapshot per size for the peer (untimed): brig's own,
            # copied aside, so both restore the same guest.
            parent = brig_parent(d, template, size)
            snap = json.loads(d.call("POST", f"/v1/sandboxes/{parent}/snapshots", {}))
            base = scratch / f"base-{size}"
            shutil.copytree(Path(home, "checkpoints", snap["id"], "image"), base)
            d.call("DELETE", f"/v1/sandboxes/{parent}")
            d.call("DELETE", f"/v1/snapshots/{snap['id']}")
            machine = json.loads((base / "machine.json").read_text())
            kernel = VM_HOME / "kernel" / version / "vmlinuz"
            initramfs = max(VM_HOME.glob("initramfs-*.cpio"), key=lambda p: p.stat().st_mtime)
            peer = Peer(qemu, kernel, initramfs, VM_HOME / "images" / machine["image"], scratch,
                        accel)
            s = samples[size] = {k: [] for k in
                                 ("brig_snapshot", "brig_restore", "brig_fork",
                                  "qemu_snapshot", "qemu_restore", "qemu_fork")}
            s["stream_bytes"] = (base / "memory").stat().st_size
            for r in range(args.rounds):
                parts = ["brig", "qemu"] if r % 2 == 0 else ["qemu", "brig"]
                for part in parts:
                    if part == "brig":
                        got = brig_round(d, template, size, args.forks)
                    else:
                        got = peer_round(peer, base, args.forks)
                    for k, v in zip(("snapshot", "restore", "fork"), got):
                        s[f"{part}_{k}"].append(v)
                log(f"{size} MiB: round {r + 1}/{args.rounds}")
            shutil.rmtree(base, ignore_errors=True)
    finally:
        d.stop()
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)

    (out / "samples.json").write_text(json.dumps(samples, indent=1))
    lines = [f"vm snapshots: guests under {accel.upper()} ({vm['detail']}), {MEMORY} each; "
             f"kernel {version}; brig {brig}; {args.rounds} rounds, fork x{args.forks}",
             f"{'held MiB':>9} {'stream MiB':>10} {'':10}{'brig ms':>10}{'qemu ms':>10}{'ratio':>8}"]
    for size, s in samples.items():
        for k in ("snapshot", "restore", "fork"):
            b, q = ms(s[f"brig_{k}"]), ms(s[f"qemu_{k}"])
            label = k if k != "fork" else f"fork x{args.forks}"
            lines.append(f"{size:>9} {s['stream_bytes'] / 2**20:>10.0f} {label:10}"
                         f"{b:10.0f}{q:10.0f}{b / q:7.2f}x")
    (out / "summary.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
