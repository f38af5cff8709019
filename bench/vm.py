#!/usr/bin/python3
"""The vm tier against a bare QEMU and against the process tier, side by side in one run.

    bench/vm.py                      # 8 rounds, release build
    bench/vm.py --rounds 5 --brig target/debug/brig

What is timed, each round, the three in an order that alternates between
rounds (this VM is noisy: a slow minute is shared):

  vm       create a sandbox over the native API with isolation vm (the test
           rootfs as its template, network none) and wait for its first
           `exec /bin/true` to end: "create -> exec ready"; then N
           `exec /bin/true` in it: the exec round trip; then delete it.
  qemu     the peer: qemu-system-x86_64 started by hand with the same
           machine, kernel, initramfs, template image and devices as brig
           starts (its writable disk made before the clock starts), timed
           until the guest's agent answers a Hello on its virtio-serial line
           (the marker: the kernel booted, loaded its modules, mounted the
           root, and brig-agent listens). Then killed.
  restore  the like-for-like peer of a vm create since brig restores every
           launch from its machine's boot snapshot (QEMU 8.2+): a bare
           qemu-system-x86_64 of the same machine restored from that
           snapshot as brig does it (its disk copied sparse, -incoming
           defer, the saved state and RAM loaded through a descriptor,
           cont), timed until the agent answers a Hello. The `qemu` row
           stays: it is what a launch costs without boot snapshots.
  process  create -> exec ready and the exec round trip on the process tier
           (the daemon runs with --pool host=0, so each create makes one).

Prints the medians and the ratios vm/qemu (create: what brig adds to a
boot) and vm/process (create, exec), and whether the guests ran under KVM
or TCG. Raw samples land in --out (default target/bench/vm-<time>/). See
bench/README.md. Needs root, QEMU (apt-get install qemu-system-x86) and the
test rootfs (BRIG_TEST_ROOTFS, tests/support/build-rootfs.sh).
"""

import argparse
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VM_HOME = Path(os.environ.get("BRIG_TEST_CACHE", Path.home() / ".cache/brig-test")) / "vm"

END, ESC, ESC_END, ESC_ESC = 0xC0, 0xDB, 0xDC, 0xDD
HELLO, READY = 1, 2


def log(msg):
    print(msg, file=sys.stderr, flush=True)


class Daemon:
    def __init__(self, brig, home, template_root):
        self.proc = subprocess.Popen(
            [brig, "serve", "--listen", "127.0.0.1:0", "--pool", "host=0", "--prepare", "none",
             "--template-root", template_root],
            env={**os.environ, "BRIG_HOME": home, "BRIG_VM_HOME": str(VM_HOME)},
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for line in self.proc.stderr:
            if line.startswith("brig: listening on "):
                self.url = line.split("brig: listening on ", 1)[1].strip()
                break
        else:
            raise SystemExit("brig serve exited before listening")
        threading.Thread(target=lambda: [None for _ in self.proc.stderr], daemon=True).start()
        self.key = Path(home, "local.key").read_text().strip()

    def call(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self.key}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.read()

    def exec_true(self, sid):
        out = self.call("POST", f"/v1/sandboxes/{sid}/exec", {"argv": ["/bin/true"]})
        if b'"exited"' not in out:
            raise SystemExit(f"exec in {sid} did not exit: {out[:200]!r}")

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def tier_round(d, isolation, template, execs):
    body = {"isolation": isolation, "template": template, "memory": "512M"}
    if isolation == "vm":
        body["network"] = {"mode": "none"}
    t0 = time.perf_counter()
    sb = json.loads(d.call("POST", "/v1/sandboxes", body))
    d.exec_true(sb["id"])
    ready = time.perf_counter() - t0
    rts = []
    for _ in range(execs):
        t = time.perf_counter()
        d.exec_true(sb["id"])
        rts.append(time.perf_counter() - t)
    d.call("DELETE", f"/v1/sandboxes/{sb['id']}")
    return ready, rts


def packet(kind, payload):
    out = bytearray([END])
    for b in bytes([kind]) + payload:
        out += bytes([ESC, ESC_END]) if b == END else bytes([ESC, ESC_ESC]) if b == ESC else bytes([b])
    out.append(END)
    return bytes(out)


def bare_machine(qemu, kernel, initramfs, image, scratch, accel, disk_size=1 << 30, append=""):
    """brig's machine started by hand: the command line, with a fresh
    writable disk in `scratch` (made here) and the agent's socket there.
    `append`: more kernel command line keys."""
    disk = scratch / "disk.ext4"
    sock = scratch / "agent.sock"
    for p in (disk, sock):
        p.unlink(missing_ok=True)
    with open(disk, "wb") as f:
        f.truncate(disk_size)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-O", "^has_journal", "-b", "4096", "-m", "0",
                    "-E", "root_owner=0:0,lazy_itable_init=1,nodiscard", str(disk)], check=True)
    args = [qemu, "-nodefaults", "-no-user-config", "-nographic", "-machine", "q35",
            "-accel", "kvm" if accel == "kvm" else "tcg,tb-size=64",
            "-m", "512M", "-smp", "1",
            "-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
            "-kernel", str(kernel), "-initrd", str(initramfs),
            "-append", f"console=ttyS0 quiet panic=-1 reboot=t brig.hostname=peer{append} -- --vm-init",
            "-no-reboot", "-serial", f"file:{scratch / 'console.log'}",
            "-drive", f"if=none,id=root,format=raw,readonly=on,file={image}",
            "-device", "virtio-blk-pci,drive=root,serial=brig-root",
            "-drive", f"if=none,id=disk,format=raw,cache=unsafe,file={disk}",
            "-device", "virtio-blk-pci,drive=disk,serial=brig-disk",
            "-device", "virtio-serial-pci,max_ports=2",
            "-chardev", f"socket,id=agent,path={sock},server=on,wait=off",
            "-device", "virtserialport,chardev=agent,name=org.brig.agent"]
    if accel == "kvm":
        args[args.index("-m"):args.index("-m")] = ["-cpu", "host"]
    return args, sock


def finish(out, lines):
    """The summary: into `out`/summary.txt and on stdout."""
    (out / "summary.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def agent_ready(sock, what="the guest"):
    """Say Hello on the agent's line at `sock` and wait for its Ready."""
    s = socket.socket(socket.AF_UNIX)
    s.connect(str(sock))
    nonce = random.getrandbits(64).to_bytes(8, "little")
    s.sendall(packet(HELLO, nonce))
    want = packet(READY, nonce)[1:]
    got = b""
    s.settimeout(120)
    while want not in got:
        chunk = s.recv(65536)
        if not chunk:
            raise SystemExit(f"{what} hung up before its Ready")
        got += chunk
    s.close()


def qemu_round(qemu, kernel, initramfs, image, scratch, accel):
    """A bare QEMU with brig's machine, until the agent's Ready."""
    args, sock = bare_machine(qemu, kernel, initramfs, image, scratch, accel)
    t0 = time.perf_counter()
    p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE)
    try:
        while not sock.exists():
            if p.poll() is not None:
                raise SystemExit(f"qemu exited: {p.stderr.read().decode()[-500:]}")
            time.sleep(0.002)
        agent_ready(sock)
        took = time.perf_counter() - t0
    finally:
        p.kill()
        p.wait()
    return took


def boot_snapshot(memory_mib=512):
    """brig's boot snapshot of the bench's machine (512 MiB, no network
    device): the most recently used in VM_HOME/boots."""
    found = []
    for d in (VM_HOME / "boots").glob("[!.]*"):
        try:
            m = json.loads((d / "machine.json").read_text())
        except (OSError, ValueError):
            continue
        if m.get("memory_mib") == memory_mib and not m.get("nic") and m.get("ram") == "in-stream":
            found.append(((d / "machine.json").stat().st_mtime, d))
    if not found:
        raise SystemExit("no boot snapshot of a 512 MiB guest without a network in "
                         f"{VM_HOME / 'boots'} (brig makes one at its first such launch)")
    return max(found)[1]


def qemu_restore_round(qemu, kernel, initramfs, image, boot, scratch, accel):
    """A bare QEMU with brig's machine restored from brig's boot snapshot
    `boot` as brig restores it: its disk copied sparse, `-incoming defer`,
    the saved state and RAM loaded through a descriptor, `cont`, until the
    agent's Ready."""
    args, sock = bare_machine(qemu, kernel, initramfs, image, scratch, accel)
    disk = scratch / "disk.ext4"
    qmp = scratch / "qmp.sock"
    qmp.unlink(missing_ok=True)
    args[args.index("q35")] = "q35,memory-backend=brig-ram"
    args += ["-object", "memory-backend-ram,id=brig-ram,size=512M",
             "-qmp", f"unix:{qmp},server=on,wait=off", "-incoming", "defer", "-S"]
    t0 = time.perf_counter()
    disk.unlink()
    subprocess.run(["cp", "--sparse=always", str(boot / "disk.ext4"), str(disk)], check=True)
    p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE)
    try:
        while not qmp.exists():
            if p.poll() is not None:
                raise SystemExit(f"qemu exited: {p.stderr.read().decode()[-500:]}")
            time.sleep(0.002)
        q = socket.socket(socket.AF_UNIX)
        q.connect(str(qmp))
        f = q.makefile("r")

        def run(command, fd=None, **arguments):
            line = json.dumps({"execute": command, "arguments": arguments}).encode() + b"\n"
            if fd is None:
                q.sendall(line)
            else:
                socket.send_fds(q, [line], [fd])
            while True:
                answer = json.loads(f.readline())
                if "return" in answer:
                    return answer["return"]
                if "error" in answer:
                    raise SystemExit(f"QEMU refused {command}: {answer['error']}")

        json.loads(f.readline())
        run("qmp_capabilities")
        with open(boot / "memory", "rb") as m:
            run("getfd", fd=m.fileno(), fdname="in")
        run("migrate-incoming", uri="fd:in")
        while run("query-migrate").get("status") != "completed":
            time.sleep(0.005)
        run("cont")
        agent_ready(sock, "the restored guest")
        took = time.perf_counter() - t0
        q.close()
    finally:
        p.kill()
        p.wait()
    return took


def ms(xs):
    return statistics.median(xs) * 1000


def ready(script, brig):
    """What a vm bench needs, or exit saying what is missing: QEMU, the
    test rootfs and its `dir:` template, a built brig (release unless
    given)."""
    if os.geteuid() != 0:
        raise SystemExit(f"{script} needs root (QEMU as its own uid, cgroups)")
    qemu = shutil.which("qemu-system-x86_64")
    if not qemu:
        raise SystemExit("QEMU is not installed: apt-get install qemu-system-x86")
    rootfs = os.environ.get("BRIG_TEST_ROOTFS")
    if not rootfs or not Path(rootfs, "bin/sh").exists():
        raise SystemExit("BRIG_TEST_ROOTFS is not set (tests/support/build-rootfs.sh builds it)")
    if not brig:
        log("building brig (release)")
        subprocess.run(["cargo", "build", "--release", "-p", "brig"], cwd=REPO, check=True)
        brig = str(REPO / "target/release/brig")
    return qemu, rootfs, f"dir:{rootfs}", brig


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--execs", type=int, default=20, help="exec round trips per sandbox")
    ap.add_argument("--brig", help="a built brig (default: cargo build --release)")
    ap.add_argument("--out", help="where the samples go")
    args = ap.parse_args()
    qemu, rootfs, template, brig = ready("bench/vm.py", args.brig)
    out = Path(args.out or REPO / "target/bench" / time.strftime("vm-%Y%m%d-%H%M%S"))
    out.mkdir(parents=True, exist_ok=True)

    home = tempfile.mkdtemp(prefix="brig-bench-vm-")
    scratch = Path(tempfile.mkdtemp(prefix="qemu-bench-"))
    d = Daemon(brig, home, str(Path(rootfs).parent))
    try:
        info = json.loads(d.call("GET", "/v1/info"))
        if "vm" not in info.get("offered", []):
            raise SystemExit(f"the daemon offers no vm tier: {info['tiers']}")
        vm = info["tiers"]["vm"]
        accel = "kvm" if vm["accel"] == "kvm" else "tcg"
        log(f"vm tier: {vm['detail']}")
        # One of each first, untimed: the template's image is built, the
        # page cache warmed.
        tier_round(d, "vm", template, 1)
        tier_round(d, "process", template, 1)
        version = (VM_HOME / "kernel/current").read_text().strip()
        kernel = VM_HOME / "kernel" / version / "vmlinuz"
        initramfs = max(VM_HOME.glob("initramfs-*.cpio"), key=lambda p: p.stat().st_mtime)
        image = max((VM_HOME / "images").glob("*.ext4"), key=lambda p: p.stat().st_mtime)
        qemu_round(qemu, kernel, initramfs, image, scratch, accel)
        boot = boot_snapshot() if vm.get("copy_on_write_forks") else None
        if boot:
            qemu_restore_round(qemu, kernel, initramfs, image, boot, scratch, accel)

        samples = {"vm_ready": [], "vm_exec": [], "process_ready": [], "process_exec": [],
                   "qemu_boot": [], "qemu_restore": []}
        parts = ["vm", "qemu", "process"] + (["restore"] if boot else [])
        for r in range(args.rounds):
            order = parts if r % 2 == 0 else parts[::-1]
            for part in order:
                if part == "qemu":
                    samples["qemu_boot"].append(
                        qemu_round(qemu, kernel, initramfs, image, scratch, accel))
                elif part == "restore":
                    samples["qemu_restore"].append(qemu_restore_round(
                        qemu, kernel, initramfs, image, boot, scratch, accel))
                else:
                    took, rts = tier_round(d, part, template, args.execs)
                    samples[f"{part}_ready"].append(took)
                    samples[f"{part}_exec"].extend(rts)
            log(f"round {r + 1}/{args.rounds}")
    finally:
        d.stop()
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)

    (out / "samples.json").write_text(json.dumps(samples, indent=1))
    v_ready, p_ready, boot = ms(samples["vm_ready"]), ms(samples["process_ready"]), ms(samples["qemu_boot"])
    v_exec, p_exec = ms(samples["vm_exec"]), ms(samples["process_exec"])
    lines = [
        f"vm tier: guests under {accel.upper()} ({vm['detail']}); kernel {version}; "
        f"brig {brig}; {args.rounds} rounds, {args.execs} execs each",
        f"{'':36}{'median ms':>10}",
        f"{'vm create -> exec ready':36}{v_ready:10.1f}",
        f"{'bare qemu boot -> agent ready (peer)':36}{boot:10.1f}",
    ]
    if samples["qemu_restore"]:
        restore = ms(samples["qemu_restore"])
        lines.append(f"{'bare qemu restore of brig boot snap':36}{restore:10.1f}")
    lines += [
        f"{'process create -> exec ready':36}{p_ready:10.1f}",
        f"{'vm exec round trip':36}{v_exec:10.2f}",
        f"{'process exec round trip':36}{p_exec:10.2f}",
        f"ratio vm create / bare qemu boot:     {v_ready / boot:.2f}x",
    ]
    if samples["qemu_restore"]:
        lines.append(f"ratio vm create / bare qemu restore:  {v_ready / restore:.2f}x")
    lines += [
        f"ratio vm create / process create:     {v_ready / p_ready:.0f}x",
        f"ratio vm exec / process exec:         {v_exec / p_exec:.1f}x",
    ]
    finish(out, lines)


if __name__ == "__main__":
    main()
