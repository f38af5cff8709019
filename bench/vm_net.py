#!/usr/bin/python3
"""A vm guest's network through brig against a bare QEMU on a plain tap, side by side in one run.

    bench/vm_net.py                       # 3 rounds, release build
    bench/vm_net.py --rounds 2 --brig target/debug/brig --conns 100 --bulk-mib 64

Both guests boot the same kernel, initramfs (brig-agent as init) and
template image, under the same accelerator (TCG on these machines), and
run the same Python client as net.py (`conn`: N sequential connections,
1 byte each way; `bulk`: one connection sending M MiB to a sink) against
the server net.py's world holds (203.0.113.10 in `brigb-world`):

  brig   `brig run --isolation vm --template base` in `brigb-host`, policy
         public: the guest's virtio-net on a tap bridged to its sandbox's
         eth0, the veth to brig's gateway, the BPF steering, the egress
         proxy's accept and dial, splice (crates/vm/src/net.rs).
  peer   qemu-system-x86_64 started by hand in `brigb-host` with the same
         machine, plus `-netdev tap` on a plain tap there (10.99.1.1, a /32
         route to the guest, forwarding on: no bridge, no proxy, no policy);
         the guest's agent configures its eth0 from the same kernel
         command line keys (brig.ip=, brig.gw=), and the client is run
         through the agent's own protocol over the virtio-serial line (this
         script speaks it: a serial Hello, a protocol Hello, one EXEC stream).

Prints medians and the ratios brig/peer. Needs root, QEMU, iproute2,
nsenter, and the `base` template built (scripts/test builds it: the
bench links the test template home's templates, BRIG_TEST_TEMPLATE_HOME,
into its own home). See bench/README.md.
"""

import argparse
import json
import os
import random
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import net  # noqa: E402  (the world, the client)
import vm  # noqa: E402  (serial packets, the machine)

REPO = Path(__file__).resolve().parent.parent
TEMPLATE_HOME = Path(os.environ.get("BRIG_TEST_TEMPLATE_HOME",
                                    Path.home() / ".cache/brig-test/home"))
PEER_ADDR, PEER_GW = "10.99.1.2", "10.99.1.1"
DATA, CLOSE = 3, 4
MAGIC = 0xB1
F_HELLO, F_OPEN, F_DATA, F_CREDIT, F_CLOSE = 1, 2, 3, 4, 5


class Line:
    """The agent's protocol over a guest's virtio-serial line (socket `sock`):
    serial packets (brig_protocol::serial) carrying frames
    (brig_protocol::frame)."""

    def __init__(self, sock):
        self.s = socket.socket(socket.AF_UNIX)
        self.s.connect(str(sock))
        self.s.settimeout(600)
        nonce = random.getrandbits(64).to_bytes(8, "little")
        self.s.sendall(vm.packet(vm.HELLO, nonce))
        self.raw = b""
        while True:
            kind, payload = self.packet()
            if kind == vm.READY and payload == nonce:
                break
        self.buf = b""
        self.stream = -1
        self.send(F_HELLO, 0, struct.pack("<HH", 1, 4))
        kind, _, _ = self.frame()
        assert kind == F_HELLO, kind

    def packet(self):
        """The next serial packet: (kind, payload), unstuffed."""
        while True:
            end = self.raw.find(bytes([vm.END]))
            if end < 0:
                chunk = self.s.recv(1 << 16)
                if not chunk:
                    raise SystemExit("the guest hung up its line")
                self.raw += chunk
                continue
            body, self.raw = self.raw[:end], self.raw[end + 1:]
            if not body:
                continue
            out = bytearray()
            it = iter(body)
            for b in it:
                if b == vm.ESC:
                    n = next(it)
                    out.append(vm.END if n == vm.ESC_END else vm.ESC)
                else:
                    out.append(b)
            return out[0], bytes(out[1:])

    def send(self, kind, stream, payload):
        frame = struct.pack("<BBHII", MAGIC, kind, 0, stream, len(payload)) + payload
        self.s.sendall(vm.packet(DATA, frame))

    def frame(self):
        while len(self.buf) < 12 or len(self.buf) < 12 + struct.unpack_from("<I", self.buf, 8)[0]:
            kind, payload = self.packet()
            if kind == DATA:
                self.buf += payload
            elif kind == CLOSE:
                raise SystemExit("the agent closed the connection")
        _, kind, _, stream, n = struct.unpack_from("<BBHII", self.buf)
        payload, self.buf = self.buf[12:12 + n], self.buf[12 + n:]
        return kind, stream, payload

    def run(self, argv):
        """argv in the guest: its stdout."""
        req = json.dumps({"argv": argv}).encode()
        self.stream += 2
        sid = self.stream
        self.send(F_OPEN, sid, struct.pack("<H", 1) + req)
        self.send(F_CLOSE, sid, b"")
        out, code = b"", None
        while True:
            kind, stream, payload = self.frame()
            if stream != sid:
                continue
            if kind == F_DATA and payload[:1] == b"\x01":
                out += payload[1:]
                self.send(F_CREDIT, sid, struct.pack("<I", len(payload)))
            elif kind == F_DATA and payload[:1] == b"\x00":
                event = json.loads(payload[1:])
                if event.get("type") == "exited":
                    code = event.get("code")
            elif kind in (F_CLOSE, 6):
                break
        if code != 0:
            raise SystemExit(f"{argv[:2]} in the peer guest: exit {code}: {out[-300:]!r}")
        return out.decode()


class Peer:
    """A bare QEMU in brigb-host, brig's machine plus a plain tap."""

    def __init__(self, qemu, kernel, initramfs, image, scratch, accel):
        net.ip(net.HOST_NS, f"tuntap add dev tapp mode tap vnet_hdr\n"
                            f"addr add {PEER_GW}/32 dev tapp\nlink set tapp up\n"
                            f"route add {PEER_ADDR}/32 dev tapp\n")
        # QEMU opens the tap by name (root, as a bare QEMU is run).
        args, sock = vm.bare_machine(qemu, kernel, initramfs, image, scratch, accel, 2 << 30,
                                     f" brig.ip={PEER_ADDR} brig.gw={PEER_GW}")
        args += ["-netdev", "tap,id=net0,ifname=tapp,script=no,downscript=no",
                 "-device", "virtio-net-pci,netdev=net0,mac=02:62:72:69:67:02"]
        self.p = subprocess.Popen(net.in_ns(net.HOST_NS, args), stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        while not sock.exists():
            if self.p.poll() is not None:
                raise SystemExit(f"qemu exited: {self.p.stderr.read().decode()[-500:]}")
            time.sleep(0.01)
        self.line = Line(sock)

    def client(self, mode, n):
        return json.loads(self.line.run(["/usr/bin/python3", "-c", net.CLIENT_CODE, mode, str(n)]))

    def close(self):
        self.p.kill()
        self.p.wait()
        net.ip(net.HOST_NS, "link del tapp\n")


def brig_client(brig, home, mode, n):
    p = subprocess.run(net.in_ns(net.HOST_NS, [
        str(brig), "run", "--isolation", "vm", "--template", "base", "--memory", "512M",
        "--dns-upstream", "203.0.113.53", "--", "python3", "-c", net.CLIENT_CODE, mode, str(n)]),
        capture_output=True, text=True,
        env={**os.environ, "BRIG_HOME": str(home), "BRIG_VM_HOME": str(vm.VM_HOME)})
    if p.returncode != 0:
        raise SystemExit(f"brig run --isolation vm: {p.stderr[-800:]}")
    return json.loads(p.stdout)


def row(name, xs, fmt):
    s = net.stats(xs)
    return f"  {name:22} {s['n']:5} {s['median']:{fmt}} {s['p10']:{fmt}} {s['p90']:{fmt}}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--conns", type=int, default=200, help="connections per round")
    ap.add_argument("--bulk-mib", type=int, default=128)
    ap.add_argument("--brig", help="a built brig (default: cargo build --release)")
    ap.add_argument("--out", help="where the samples go")
    args = ap.parse_args()
    qemu, _, _, brig = vm.ready("bench/vm_net.py", args.brig)
    out = Path(args.out or REPO / "target/bench" / time.strftime("vm-net-%Y%m%d-%H%M%S"))
    out.mkdir(parents=True, exist_ok=True)
    # The accelerator brig's tier chose (`brig doctor`: on these machines,
    # whose /dev/kvm is PVM, TCG); the peer uses the same.
    doctor = subprocess.run([brig, "doctor"], capture_output=True, text=True).stdout
    said = next((l for l in doctor.splitlines() if l.strip().startswith("vm:")), "")
    accel = "tcg" if "TCG" in said or not said else "kvm"

    home = Path(tempfile.mkdtemp(prefix="brig-bench-vmnet-"))
    (home / "templates").symlink_to(TEMPLATE_HOME / "templates")
    scratch = Path(tempfile.mkdtemp(prefix="qemu-bench-vmnet-"))
    server = net.build_world()
    peer = None
    samples = {"brig_conn": [], "peer_conn": [], "brig_bulk": [], "peer_bulk": []}
    try:
        # Warm: the template's image built, the page cache filled.
        brig_client(brig, home, "conn", 1)
        version = (vm.VM_HOME / "kernel/current").read_text().strip()
        kernel = vm.VM_HOME / "kernel" / version / "vmlinuz"
        initramfs = max(vm.VM_HOME.glob("initramfs-*.cpio"), key=lambda p: p.stat().st_mtime)
        image = max((vm.VM_HOME / "images").glob("*.ext4"), key=lambda p: p.stat().st_mtime)
        peer = Peer(qemu, kernel, initramfs, image, scratch, accel)
        peer.client("conn", 1)
        for r in range(args.rounds):
            order = ["brig", "peer"] if r % 2 == 0 else ["peer", "brig"]
            for who in order:
                for mode, n in (("conn", args.conns), ("bulk", args.bulk_mib)):
                    got = (brig_client(brig, home, mode, n) if who == "brig"
                           else peer.client(mode, n))
                    samples[f"{who}_{mode}"] += got
            vm.log(f"round {r + 1}/{args.rounds}")
    finally:
        if peer:
            peer.close()
        server.kill()
        net.teardown_world()
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)

    (out / "samples.json").write_text(json.dumps(samples, indent=1))
    bc, pc = net.stats(samples["brig_conn"]), net.stats(samples["peer_conn"])
    bb, pb = statistics.median(samples["brig_bulk"]), statistics.median(samples["peer_bulk"])
    lines = [
        f"vm guests under {accel.upper()}; kernel {version}; brig {brig}; {args.rounds} rounds",
        "connection set-up from the guest (ms)   n   median     p10     p90",
        row("brig vm (bridge+proxy)", samples["brig_conn"], "8.3f"),
        row("bare qemu, plain tap", samples["peer_conn"], "8.3f"),
        f"  added by brig: {bc['median'] - pc['median']:.3f} ms per connection; "
        f"brig / peer: {bc['median'] / pc['median']:.2f}",
        f"bulk throughput from the guest ({args.bulk_mib} MiB per run, MiB/s, median of "
        f"{len(samples['brig_bulk'])})",
        f"  brig vm (bridge+proxy) {bb:8.1f}",
        f"  bare qemu, plain tap   {pb:8.1f}",
        f"  brig / peer: {bb / pb:.2f}",
    ]
    vm.finish(out, lines)


if __name__ == "__main__":
    main()
