#!/usr/bin/python3
"""Snapshots and forks: brig against the tools a person would use instead,
side by side in one run.

    bench/snapshots.py              # everything (a minute or two after the build)
    bench/snapshots.py --runs 3 --mib 50

A `brig serve` on a fresh home runs sandboxes of the test rootfs
(BRIG_TEST_ROOTFS, tests/support/build-rootfs.sh) as a `dir:` template,
with no network.

Parts:

  snapshot  a sandbox that wrote --mib MiB (one file of random bytes plus a
            thousand small ones): POST /v1/sandboxes/{id}/snapshots, total
            time and how long the sandbox was frozen (`frozen_ms`), against
            `tar -cf` of the same files on the host (what `docker commit`
            does with a container's upper directory).
  create    POST /v1/sandboxes from that snapshot against from its template
            (both made from scratch: no pool), and `bwrap /bin/true` on the
            rootfs as the floor.
  fork      POST /v1/sandboxes/{id}/fork with count 10 (one snapshot, ten
            creates) against ten creates from the template one after the
            other.

Medians in milliseconds; summary in target/bench/snapshots-<time>/summary.txt.
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
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import spawn  # noqa: E402  (build_brig, log)
from images import free_port, table  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
log = spawn.log


class Daemon:
    def __init__(self, brig, home, root):
        self.port = free_port()
        self.proc = subprocess.Popen(
            [str(brig), "serve", "--home", str(home), "--listen", f"127.0.0.1:{self.port}",
             "--template-root", str(root)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.key = None
        for _ in range(400):
            if (home / "local.key").exists():
                self.key = (home / "local.key").read_text().strip()
            try:
                socket.create_connection(("127.0.0.1", self.port)).close()
                if self.key:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        sys.exit("snapshots.py: brig serve did not start")

    def call(self, method, path, body=None):
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            raw = r.read()
        return json.loads(raw) if raw else None

    def timed(self, method, path, body=None):
        t = time.perf_counter()
        out = self.call(method, path, body)
        return (time.perf_counter() - t) * 1000, out

    def create(self, template):
        return self.timed("POST", "/v1/sandboxes",
                          {"template": template, "network": {"mode": "none"}})

    def sh(self, sid, script):
        """Run `script` to its end (the answer is NDJSON events; the last says how)."""
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/v1/sandboxes/{sid}/exec", method="POST",
            data=json.dumps({"argv": ["sh", "-c", script]}).encode(),
            headers={"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            events = [json.loads(line) for line in r.read().splitlines() if line.strip()]
        end = events[-1] if events else {}
        if end.get("exit_code") not in (0, None):
            sys.exit(f"snapshots.py: {script!r} failed in the sandbox: {end}")

    def kill(self, sid):
        self.call("DELETE", f"/v1/sandboxes/{sid}")

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


WRITE = ("head -c {mib}M /dev/urandom > /root/big && mkdir -p /root/small && "
         "for i in $(seq 1000); do echo $i > /root/small/$i; done")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--mib", type=int, default=100)
    ap.add_argument("--brig")
    args = ap.parse_args()
    rootfs = Path(os.environ.get("BRIG_TEST_ROOTFS",
                                 Path.home() / ".cache/brig-test/rootfs-bookworm-minbase"))
    if not (rootfs / "bin/sh").exists():
        sys.exit(f"snapshots.py: no rootfs at {rootfs}: run tests/support/build-rootfs.sh")
    if not shutil.which("bwrap"):
        sys.exit("snapshots.py: bwrap is missing (tests/support/install-deps.sh installs it)")
    brig = spawn.build_brig(args.brig)
    work = Path(tempfile.mkdtemp(prefix="brig-bench-snapshots-"))
    out_dir = REPO / "target/bench" / time.strftime("snapshots-%Y%m%d-%H%M%S")
    out_dir.mkdir(parents=True)
    template = f"dir:{rootfs}"
    results = {}
    frozen = []
    daemon = Daemon(brig, work / "home", rootfs.parent)
    try:
        log(f"snapshot of a sandbox that wrote {args.mib} MiB")
        snaps = {"brig snapshot": [], "tar -cf of the same files": []}
        last_snapshot = None
        for _ in range(args.runs):
            _, sb = daemon.create(template)
            daemon.sh(sb["id"], WRITE.format(mib=args.mib))
            ms, snap = daemon.timed("POST", f"/v1/sandboxes/{sb['id']}/snapshots", {})
            snaps["brig snapshot"].append(ms)
            frozen.append(snap["frozen_ms"])
            if last_snapshot:
                daemon.call("DELETE", f"/v1/snapshots/{last_snapshot}")
            last_snapshot = snap["id"]
            daemon.kill(sb["id"])
            files = work / "peer"
            files.mkdir()
            subprocess.run(["sh", "-c", WRITE.format(mib=args.mib).replace("/root", str(files))],
                           check=True)
            t = time.perf_counter()
            subprocess.run(["tar", "-cf", str(work / "peer.tar"), "-C", str(files), "."], check=True)
            snaps["tar -cf of the same files"].append((time.perf_counter() - t) * 1000)
            shutil.rmtree(files)
            (work / "peer.tar").unlink()
        results["snapshot"] = snaps

        log("create from the snapshot and from the template")
        creates = {"create from the snapshot": [], "create from the template": []}
        for _ in range(args.runs * 4):
            for name, t in [("create from the snapshot", last_snapshot),
                            ("create from the template", template)]:
                ms, sb = daemon.create(t)
                creates[name].append(ms)
                daemon.kill(sb["id"])
        creates["bwrap /bin/true on the rootfs"] = []
        for _ in range(args.runs * 4):
            t = time.perf_counter()
            subprocess.run(["bwrap", "--unshare-all", "--ro-bind", str(rootfs), "/", "--dev", "/dev",
                            "--proc", "/proc", "/bin/true"], check=True)
            creates["bwrap /bin/true on the rootfs"].append((time.perf_counter() - t) * 1000)
        results["create"] = creates

        log("fork x10")
        forks = {"fork count=10": [], "10 creates from the template": []}
        for _ in range(args.runs):
            _, sb = daemon.create(template)
            daemon.sh(sb["id"], "echo state > /root/state")
            ms, made = daemon.timed("POST", f"/v1/sandboxes/{sb['id']}/fork", {"count": 10})
            forks["fork count=10"].append(ms)
            for r in made:
                daemon.kill(r["sandbox"]["id"])
            t = time.perf_counter()
            ids = [daemon.call("POST", "/v1/sandboxes",
                               {"template": template, "network": {"mode": "none"}})["id"]
                   for _ in range(10)]
            forks["10 creates from the template"].append((time.perf_counter() - t) * 1000)
            for i in ids + [sb["id"]]:
                daemon.kill(i)
        results["fork"] = forks
    finally:
        daemon.stop()
        subprocess.run(["rm", "-rf", str(work)])

    text = table(f"snapshots.py: {args.mib} MiB written; medians in ms (runs: {args.runs}); "
                 f"sandbox frozen for the snapshot: median {statistics.median(frozen):.1f} ms",
                 results, 34)
    print(text)
    (out_dir / "summary.txt").write_text(text + "\n")
    (out_dir / "summary.json").write_text(json.dumps({"results": results, "frozen_ms": frozen}))


if __name__ == "__main__":
    main()
