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
         RAM copied from the guest's memory file with its zero pages left
         as holes, the devices' state migrated to a file through a passed
         descriptor (`x-ignore-shared`), the disk copied sparse, cont);
         `POST /v1/sandboxes` from it until its first exec ends = "restore"
         (the disk copied, QEMU -incoming with the snapshot's RAM mapped
         private, the state loaded, cont, the guest's identity renewed,
         the agent's handshake); `POST /v1/sandboxes/{id}/fork` count N =
         "fork xN"; then an exec in each fork and the mean PSS of the
         forks' QEMUs = "fork PSS" (what a fork costs in memory, its share
         of the pages the forks map together counted once among them).
  qemu   the peer: qemu-system-x86_64 started by hand with brig's machine
         (kernel, initramfs, template image, devices, 512 MiB) doing the
         same, from a brig snapshot of a guest holding M (made once per
         size, untimed): its disk copied sparse, the RAM file mapped
         private (`memory-backend-file,readonly=on,rom=off`), `-incoming
         defer`, `migrate-incoming` of the state through a descriptor,
         `cont`, until the guest's agent answers a Hello = "restore"; on a
         guest restored with its RAM copied into a memfd of its own
         (untimed), `stop`, its RAM copied (`cp --sparse=always`), the state
         migrated to a file, the disk copied, `cont` = "snapshot"; "fork
         xN" = a snapshot and N restores; "fork PSS" as for brig (the peer
         runs no exec: its forks touch less).

Needs QEMU 8.2 or later (the RAM mapped private from a read-only file).
Prints medians per size and the ratios brig/qemu. Raw samples land in
--out (default target/bench/vm-snapshot-<time>/samples.json). Needs root,
QEMU and the test rootfs (BRIG_TEST_ROOTFS). See bench/README.md.
"""

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vm import REPO, VM_HOME, Daemon, agent_ready, log, ms, ready  # noqa: E402

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


def pss_mib(pid):
    """The proportional set size of process `pid`, in MiB: its private
    pages, and its share of those it maps with others."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Peer:
    """Bare QEMUs of brig's machine doing what brig's snapshots do: the
    RAM in a file of its own, apart from the devices' state
    (`x-ignore-shared`); a restore maps the RAM file private
    (`readonly=on,rom=off`) and loads the state; a snapshot copies a
    guest's RAM from its memory file (a memfd, mapped shared) and saves
    the state."""

    def __init__(self, qemu, kernel, initramfs, image, scratch, accel):
        self.qemu, self.kernel, self.initramfs, self.image = qemu, kernel, initramfs, image
        self.scratch, self.accel = scratch, accel
        self.procs = []

    def restore(self, base, shared=False):
        """A guest from the snapshot in `base`: its RAM mapped private, or
        (`shared`) copied into a memfd of its own that a snapshot can copy
        from. Returns its QMP session, directory and process."""
        d = Path(tempfile.mkdtemp(dir=self.scratch))
        sparse_copy(base / "disk.ext4", d / "disk.ext4")
        mib = int(MEMORY.rstrip("M"))
        if shared:
            ram = os.memfd_create("peer-ram")
            with open(base / "ram", "rb") as f:
                while chunk := f.read(1 << 20):
                    if chunk.count(0) == len(chunk):
                        os.lseek(ram, len(chunk), os.SEEK_CUR)
                    else:
                        os.write(ram, chunk)
            os.ftruncate(ram, mib << 20)
            backend = "share=on"
        else:
            ram = os.open(base / "ram", os.O_RDONLY)
            backend = "share=off,readonly=on,rom=off"
        args = [self.qemu, "-nodefaults", "-no-user-config", "-nographic",
                "-machine", "q35,memory-backend=brig-ram",
                "-accel", "kvm" if self.accel == "kvm" else "tcg,tb-size=64",
                "-object", f"memory-backend-file,id=brig-ram,size={mib}M,"
                           f"mem-path=/proc/self/fd/{ram},{backend}",
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
                             stderr=subprocess.DEVNULL, pass_fds=[ram])
        os.close(ram)
        self.procs.append(p)
        q = Qmp(d / "qmp.sock")
        q.run("migrate-set-capabilities",
              capabilities=[{"capability": "x-ignore-shared", "state": True}])
        with open(base / "memory", "rb") as f:
            q.run("getfd", fd=f.fileno(), fdname="in")
        q.run("migrate-incoming", uri="fd:in")
        q.migrated()
        q.run("cont")
        agent_ready(d / "agent.sock", "the restored guest")
        return q, d, p

    def snapshot(self, q, d, p):
        """Of a guest restored `shared`: stopped, its RAM copied from its
        memfd (zero pages left as holes), the state saved, the disk copied."""
        out = Path(tempfile.mkdtemp(dir=self.scratch))
        q.run("stop")
        q.run("migrate-set-parameters", **{"max-bandwidth": 1 << 40})
        ram = next(f"/proc/{p.pid}/fd/{fd}" for fd in os.listdir(f"/proc/{p.pid}/fd")
                   if os.readlink(f"/proc/{p.pid}/fd/{fd}").startswith("/memfd:peer-ram"))
        sparse_copy(ram, out / "ram")
        with open(out / "ram", "rb+") as f:
            os.fsync(f.fileno())
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
    for sid in ids:
        d.exec_true(sid)
    pss = sum(pss_mib(qemu_pid(sid)) for sid in ids) / forks
    for sid in ids + [parent]:
        d.call("DELETE", f"/v1/sandboxes/{sid}")
    d.call("DELETE", f"/v1/snapshots/{snap['id']}")
    return snapshot, restore, fork, pss


def qemu_pid(sid):
    """The QEMU of brig's vm sandbox `sid` (its state file's second line)."""
    state = Path("/run/brig/vm", sid, "state").read_text().splitlines()
    return int(state[1].split()[0])


def peer_round(peer, base, forks):
    t0 = time.perf_counter()
    q, d, p = peer.restore(base)
    restore = time.perf_counter() - t0
    q.close()
    # A guest whose RAM a snapshot can copy (untimed: made as brig's
    # parent is booted).
    q, d, p = peer.restore(base, shared=True)
    t0 = time.perf_counter()
    out = peer.snapshot(q, d, p)
    snapshot = time.perf_counter() - t0
    t0 = time.perf_counter()
    out2 = peer.snapshot(q, d, p)
    copies = [peer.restore(out2) for _ in range(forks)]
    fork = time.perf_counter() - t0
    pss = sum(pss_mib(c[2].pid) for c in copies) / forks
    for c in copies:
        c[0].close()
    q.close()
    peer.end()
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(out2, ignore_errors=True)
    return snapshot, restore, fork, pss


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
        if not vm.get("copy_on_write_forks"):
            raise SystemExit("this QEMU is older than 8.2: its forks load copies of the RAM, and "
                             "the peer cannot map it private (install QEMU 8.2 or later)")
        accel = "kvm" if vm["accel"] == "kvm" else "tcg"
        log(f"vm tier: {vm['detail']}")
        version = (VM_HOME / "kernel/current").read_text().strip()
        for size in sizes:
            # A base snapshot per size for the peer (untimed): brig's own,
            # copied aside, so both restore the same guest.
            parent = brig_parent(d, template, size)
            snap = json.loads(d.call("POST", f"/v1/sandboxes/{parent}/snapshots", {}))
            base = scratch / f"base-{size}"
            subprocess.run(["cp", "-r", "--sparse=always",
                            str(Path(home, "checkpoints", snap["id"], "image")), str(base)],
                           check=True)
            d.call("DELETE", f"/v1/sandboxes/{parent}")
            d.call("DELETE", f"/v1/snapshots/{snap['id']}")
            machine = json.loads((base / "machine.json").read_text())
            kernel = VM_HOME / "kernel" / version / "vmlinuz"
            initramfs = max(VM_HOME.glob("initramfs-*.cpio"), key=lambda p: p.stat().st_mtime)
            peer = Peer(qemu, kernel, initramfs, VM_HOME / "images" / machine["image"], scratch,
                        accel)
            s = samples[size] = {k: [] for k in
                                 ("brig_snapshot", "brig_restore", "brig_fork", "brig_pss",
                                  "qemu_snapshot", "qemu_restore", "qemu_fork", "qemu_pss")}
            s["stream_bytes"] = (base / "memory").stat().st_size
            s["ram_bytes"] = (base / "ram").stat().st_blocks * 512
            for r in range(args.rounds):
                parts = ["brig", "qemu"] if r % 2 == 0 else ["qemu", "brig"]
                for part in parts:
                    if part == "brig":
                        got = brig_round(d, template, size, args.forks)
                    else:
                        got = peer_round(peer, base, args.forks)
                    for k, v in zip(("snapshot", "restore", "fork", "pss"), got):
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
             f"{'held MiB':>9} {'RAM MiB':>8} {'state KiB':>9} {'':10}{'brig':>10}{'qemu':>10}"
             f"{'ratio':>8}"]
    for size, s in samples.items():
        for k in ("snapshot", "restore", "fork", "pss"):
            if k == "pss":
                b, q = statistics.median(s["brig_pss"]), statistics.median(s["qemu_pss"])
                label, unit = "fork PSS", "MiB"
            else:
                b, q = ms(s[f"brig_{k}"]), ms(s[f"qemu_{k}"])
                label, unit = (k if k != "fork" else f"fork x{args.forks}"), "ms"
            lines.append(f"{size:>9} {s['ram_bytes'] / 2**20:>8.0f} {s['stream_bytes'] / 1024:>9.0f}"
                         f" {label:10}{b:7.0f} {unit}{q:7.0f} {unit}{b / q:7.2f}x")
    (out / "summary.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
