#!/usr/bin/python3
"""Volumes: a file-heavy workload on a brig volume against the same on the
sandbox's own writable layer, and against bubblewrap on a bind-mounted
directory of the same kind of storage, side by side in one run.

    bench/volumes.py                      # builds brig --release first
    bench/volumes.py --brig target/debug/brig --runs 5 --files 3000

The workload: unpack a tarball of --files small files (100 per directory,
a line of text each) with `tar -xf`, then `sync -f` the directory, timed
inside the sandbox (`date +%s%N` around it: no sandbox start, no API call
in the number). Before each run the previous copy is removed (not timed).

Rows:
  brig volume        a brig volume (ext4 image, loop-mounted on the host,
                     idmapped into the sandbox) at /mnt/vol
  bwrap ext4 bind    bwrap --bind of a directory on an ext4 image loop-
                     mounted on the host (the same kind of storage), same
                     rootfs
  brig layer         the sandbox's writable layer (overlay over tmpfs), /root
  bwrap tmpfs        bwrap --tmpfs /tmp (its writable place)
  brig gvisor volume the same brig volume in a gvisor sandbox (a bind mount
                     runsc's gofer serves), where runsc is installed
  runsc ext4 bind    a bare `runsc run` of the same rootfs with the peer's
                     ext4 directory bind-mounted, the platform brig uses

A `brig serve` on a fresh home runs sandboxes of the test rootfs
(BRIG_TEST_ROOTFS) as a `dir:` template, with no network. Medians in ms;
the ratio of each pair; summary in target/bench/volumes-<time>/summary.txt.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import spawn  # noqa: E402  (build_brig, log)
from snapshots import Daemon  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
log = spawn.log

GEN = ("mkdir -p /tmp/src && cd /tmp/src && for d in $(seq {dirs}); do mkdir -p $d; "
       "for f in $(seq 100); do echo \"file $d/$f\" > $d/$f; done; done && "
       "tar -cf /tmp/t.tar -C /tmp/src . && rm -rf /tmp/src")
RUN = ("rm -rf {dest}/x && mkdir -p {dest}/x && s=$(date +%s%N) && tar -xf /tmp/t.tar -C {dest}/x "
       "&& sync -f {dest}/x && e=$(date +%s%N) && echo $(( (e - s) / 1000 ))")


def brig_exec(brig, daemon, home, sid, script):
    p = subprocess.run([str(brig), "exec", sid, "--", "sh", "-c", script],
                       env={**os.environ, "BRIG_HOME": str(home),
                            "BRIG_URL": f"http://127.0.0.1:{daemon.port}"},
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit(f"volumes.py: {script!r} failed in the sandbox: {p.stderr}")
    return p.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--files", type=int, default=3000)
    ap.add_argument("--brig")
    ap.add_argument("--no-gvisor", action="store_true", help="skip the gvisor rows")
    args = ap.parse_args()
    runsc = None if args.no_gvisor else shutil.which("runsc")
    if not runsc and not args.no_gvisor:
        log("runsc is not installed (apt-get install runsc): no gvisor rows")
    rootfs = Path(os.environ.get("BRIG_TEST_ROOTFS",
                                 Path.home() / ".cache/brig-test/rootfs-bookworm-minbase"))
    if not (rootfs / "bin/sh").exists():
        sys.exit(f"volumes.py: no rootfs at {rootfs}: run tests/support/build-rootfs.sh")
    for tool in ["bwrap", "mkfs.ext4"]:
        if not shutil.which(tool):
            sys.exit(f"volumes.py: {tool} is missing (tests/support/install-deps.sh installs it)")
    brig = spawn.build_brig(args.brig)
    dirs = max(1, args.files // 100)
    gen = GEN.format(dirs=dirs)
    out_dir = REPO / "target/bench" / time.strftime("volumes-%Y%m%d-%H%M%S")
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="brig-bench-volumes-"))
    results = {"brig volume": [], "bwrap ext4 bind": [], "brig layer": [], "bwrap tmpfs": []}
    if runsc:
        results.update({"brig gvisor volume": [], "runsc ext4 bind": []})
    daemon = None
    mnt = work / "ext4"
    try:
        # The peer's storage: an ext4 image like a brig volume's, loop-mounted.
        img = work / "peer.img"
        subprocess.run(["fallocate", "-l", "1G", str(img)], check=True)
        subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", "-E", "nodiscard", str(img)], check=True)
        mnt.mkdir()
        subprocess.run(["mount", "-o", "loop,nosuid,nodev", str(img), str(mnt)], check=True)

        home = work / "home"
        home.mkdir()
        daemon = Daemon(brig, home, rootfs.parent)
        daemon.call("POST", "/v1/volumes", {"name": "bench", "size": "1GiB"})
        sb = daemon.call("POST", "/v1/sandboxes", {
            "template": f"dir:{rootfs}", "network": {"mode": "none"}, "disk": "2G",
            "memory": "1G", "timeout": "30m",
            "volumes": [{"volume": "bench", "path": "/mnt/vol"}]})
        sid = sb["id"]
        brig_exec(brig, daemon, home, sid, gen)
        gid = None
        if runsc:
            gid = daemon.call("POST", "/v1/sandboxes", {
                "template": f"dir:{rootfs}", "isolation": "gvisor", "network": {"mode": "none"},
                "disk": "2G", "memory": "1G", "timeout": "30m",
                "volumes": [{"volume": "bench", "path": "/mnt/vol"}]})["id"]
            brig_exec(brig, daemon, home, gid, gen)
            # The platform brig runs gvisor on, for the peer too.
            doctor = json.loads(subprocess.run(
                [str(brig), "doctor", "--json"], stdout=subprocess.PIPE, text=True).stdout or "{}")
            found = re.search(r"on the (\w+) platform", doctor.get("tiers", {}).get("gvisor_detail", ""))
            platform = found.group(1) if found else "ptrace"
            log(f"gvisor rows on the {platform} platform")

        def bwrap(dest_args, dest):
            p = subprocess.run(
                ["bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", str(rootfs), "/",
                 "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", *dest_args,
                 "sh", "-c", gen + " && " + RUN.format(dest=dest)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            if p.returncode != 0:
                sys.exit(f"volumes.py: bwrap failed: {p.stderr}")
            return int(p.stdout.split()[-1]) / 1000

        def runsc_bind(n):
            bundle = work / f"runsc{n}"
            bundle.mkdir()
            spec = {
                "ociVersion": "1.0.2",
                "process": {"user": {"uid": 0, "gid": 0}, "cwd": "/",
                            "args": ["sh", "-c", gen + " && " + RUN.format(dest="/mnt/vol/r")],
                            "env": ["PATH=/usr/bin:/bin"], "capabilities": {}},
                "root": {"path": str(rootfs), "readonly": True}, "hostname": "peer",
                "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"},
                           {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs"},
                           {"destination": "/mnt/vol", "type": "bind", "source": str(mnt),
                            "options": ["rbind", "rw"]}],
                "linux": {"namespaces": [{"type": "pid"}, {"type": "mount"}, {"type": "ipc"},
                                         {"type": "uts"}]},
            }
            (bundle / "config.json").write_text(json.dumps(spec))
            p = subprocess.run([runsc, f"--root={work}/runsc-root", f"--platform={platform}",
                                "--network=none", "run", f"--bundle={bundle}", f"peer{n}"],
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
            if p.returncode != 0:
                sys.exit(f"volumes.py: runsc failed: {p.stderr[-500:]}")
            return int(p.stdout.split()[-1]) / 1000

        for i in range(args.runs):
            log(f"run {i + 1}/{args.runs}")
            results["brig volume"].append(
                int(brig_exec(brig, daemon, home, sid, RUN.format(dest="/mnt/vol")).split()[-1]) / 1000)
            results["bwrap ext4 bind"].append(
                bwrap(["--tmpfs", "/mnt", "--bind", str(mnt), "/mnt/vol"], "/mnt/vol"))
            results["brig layer"].append(
                int(brig_exec(brig, daemon, home, sid, RUN.format(dest="/root")).split()[-1]) / 1000)
            results["bwrap tmpfs"].append(bwrap([], "/tmp"))
            if gid:
                results["brig gvisor volume"].append(
                    int(brig_exec(brig, daemon, home, gid, RUN.format(dest="/mnt/vol/g")).split()[-1])
                    / 1000)
                results["runsc ext4 bind"].append(runsc_bind(i))
        daemon.call("DELETE", f"/v1/sandboxes/{sid}")
        if gid:
            daemon.call("DELETE", f"/v1/sandboxes/{gid}")
        time.sleep(1.5)
        daemon.call("DELETE", "/v1/volumes/bench")
    finally:
        if daemon:
            daemon.stop()
        subprocess.run(["umount", str(mnt)], stderr=subprocess.DEVNULL)
        shutil.rmtree(work, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in results.items()}
    lines = [f"volumes.py: tar -xf of {dirs * 100} small files + sync -f; medians in ms "
             f"(runs: {args.runs})"]
    for k, v in med.items():
        lines.append(f"  {k:<18} {v:9.1f}")
    lines.append(f"  brig volume / bwrap ext4 bind: {med['brig volume'] / med['bwrap ext4 bind']:.2f}")
    lines.append(f"  brig layer / bwrap tmpfs:      {med['brig layer'] / med['bwrap tmpfs']:.2f}")
    lines.append(f"  brig volume / brig layer:      {med['brig volume'] / med['brig layer']:.2f}")
    if "runsc ext4 bind" in med:
        lines.append(f"  brig gvisor volume / runsc ext4 bind: "
                     f"{med['brig gvisor volume'] / med['runsc ext4 bind']:.2f}")
    text = "\n".join(lines)
    print(text)
    (out_dir / "summary.txt").write_text(text + "\n")
    (out_dir / "summary.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main()
