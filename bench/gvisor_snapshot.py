#!/usr/bin/python3
"""Memory snapshots on the gvisor tier: brig against a bare runsc, side by side in one run.

    bench/gvisor_snapshot.py                       # 5 rounds per size, release build
    bench/gvisor_snapshot.py --rounds 3 --brig target/debug/brig --sizes 0,64,256 --forks 4

For each memory size M (MiB held by a process in the sandbox: a Python
bytearray with every page written), each round, in an order that
alternates between rounds:

  brig   a gvisor sandbox (template host, network none) running the holder;
         `POST /v1/sandboxes/{id}/snapshots` (checkpoint: the agent lets go
         of its socket, runsc checkpoint, the files copied, the sandbox
         restored from its own image and its agent reconnected) = "snapshot";
         `POST /v1/sandboxes` from it until its first exec ends = "restore";
         `POST /v1/sandboxes/{id}/fork` with --forks N = "fork xN".
  runsc  the same holder in a bare runsc container (host root read-only,
         --network=none, the platform brig uses): `runsc checkpoint` (which
         stops it) = "checkpoint", `runsc restore --detach` of the image =
         "restore".

Prints medians per size and the ratios brig/runsc. brig's snapshot also
brings the parent back (a restore), which a bare `runsc checkpoint` does
not: compare it with runsc checkpoint + restore too. Raw samples land in
--out (default target/bench/gvisor-snapshot-<time>/samples.json). Needs
root and runsc. See bench/README.md.
"""

import argparse
import json
import re
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gvisor import Daemon, REPO, log, ms  # noqa: E402

HOLDER = ("import time,sys\n"
          "b=bytearray({mib}<<20)\n"
          "for i in range(0,len(b),4096): b[i]=1\n"
          "open('/tmp/held','w').write('ok')\n"
          "time.sleep(1e6)\n")


def wait_held(d, sid):
    for _ in range(600):
        out = d.call("POST", f"/v1/sandboxes/{sid}/exec", {"argv": ["test", "-e", "/tmp/held"]})
        if re.search(rb'"code":\s*0\b', out):
            return
        time.sleep(0.05)
    raise SystemExit(f"the holder in {sid} did not start")


def call(d, method, path, body=None):
    """The daemon's answer, or exit with its error."""
    try:
        return json.loads(d.call(method, path, body))
    except urllib.error.HTTPError as e:
        raise SystemExit(f"{method} {path}: {e.code} {e.read().decode()[:500]}")


def brig_round(d, mib, forks):
    sb = json.loads(d.call("POST", "/v1/sandboxes", {
        "isolation": "gvisor", "template": "host", "network": {"mode": "none"}}))
    sid = sb["id"]
    d.call("POST", f"/v1/sandboxes/{sid}/processes",
           {"argv": ["python3", "-c", HOLDER.format(mib=mib)]})
    wait_held(d, sid)
    t = time.perf_counter()
    snap = call(d, "POST", f"/v1/sandboxes/{sid}/snapshots", {})
    snapshot = time.perf_counter() - t
    t = time.perf_counter()
    child = call(d, "POST", "/v1/sandboxes", {"template": snap["id"]})
    d.exec_true(child["id"])
    restore = time.perf_counter() - t
    t = time.perf_counter()
    made = call(d, "POST", f"/v1/sandboxes/{sid}/fork", {"count": forks})
    fork = time.perf_counter() - t
    ids = [sid, child["id"]] + [f["sandbox"]["id"] for f in made if "sandbox" in f]
    if len(ids) != forks + 2:
        raise SystemExit(f"a fork failed: {made}")
    for i in ids:
        d.call("DELETE", f"/v1/sandboxes/{i}")
    d.call("DELETE", f"/v1/snapshots/{snap['id']}")
    return snapshot, restore, fork, snap["size_bytes"]


def runsc_round(runsc, platform, work, mib, n):
    bundle = Path(work, f"b{n}")
    bundle.mkdir()
    spec = {
        "ociVersion": "1.0.2",
        "process": {"user": {"uid": 0, "gid": 0}, "cwd": "/",
                    "args": ["/usr/bin/python3", "-c", HOLDER.format(mib=mib).replace("/tmp/held", f"{work}/held{n}")],
                    "env": ["PATH=/usr/bin:/bin"], "capabilities": {}},
        "root": {"path": "/", "readonly": True}, "hostname": "peer",
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"},
                   {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs"},
                   {"destination": work, "type": "bind", "source": work, "options": ["rbind", "rw"]}],
        "linux": {"namespaces": [{"type": "pid"}, {"type": "mount"}, {"type": "ipc"}, {"type": "uts"}]},
    }
    (bundle / "config.json").write_text(json.dumps(spec))
    base = [runsc, f"--root={work}/root", f"--platform={platform}", "--network=none"]
    cid, rid = f"peer{n}", f"peerr{n}"
    subprocess.run(base + ["run", "--detach", f"--bundle={bundle}", cid], check=True,
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    held = Path(work, f"held{n}")
    for _ in range(600):
        if held.exists():
            break
        time.sleep(0.05)
    image = Path(work, f"img{n}")
    t = time.perf_counter()
    subprocess.run(base + ["checkpoint", f"--image-path={image}", cid], check=True)
    checkpoint = time.perf_counter() - t
    t = time.perf_counter()
    subprocess.run(base + ["restore", "--detach", f"--bundle={bundle}", f"--image-path={image}", rid],
                   check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.run(base + ["exec", rid, "/bin/true"], check=True)
    restore = time.perf_counter() - t
    for c in (cid, rid):
        subprocess.run(base + ["delete", "--force", c], stderr=subprocess.DEVNULL)
    shutil.rmtree(image, ignore_errors=True)
    return checkpoint, restore


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sizes", default="0,64,256", help="MiB held in memory, comma-separated")
    ap.add_argument("--forks", type=int, default=4)
    ap.add_argument("--brig", help="a built brig (default: cargo build --release)")
    ap.add_argument("--out", help="where the samples go")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench/gvisor_snapshot.py needs root")
    runsc = shutil.which("runsc")
    if not runsc:
        raise SystemExit("runsc is not installed: apt-get install runsc")
    brig = args.brig
    if not brig:
        log("building brig (release)")
        subprocess.run(["cargo", "build", "--release", "-p", "brig"], cwd=REPO, check=True)
        brig = str(REPO / "target/release/brig")
    sizes = [int(s) for s in args.sizes.split(",")]
    out = Path(args.out or REPO / "target/bench" / time.strftime("gvisor-snapshot-%Y%m%d-%H%M%S"))
    out.mkdir(parents=True, exist_ok=True)

    home = tempfile.mkdtemp(prefix="brig-bench-gvsnap-")
    work = tempfile.mkdtemp(prefix="runsc-bench-snap-")
    d = Daemon(brig, home)
    samples = {}
    try:
        info = json.loads(d.call("GET", "/v1/info"))
        if "gvisor" not in info.get("offered", []):
            raise SystemExit(f"the daemon offers no gvisor tier: {info['tiers']}")
        detail = info["tiers"].get("gvisor_detail", "")
        platform = "ptrace" if "ptrace" in detail else ("systrap" if "systrap" in detail else "kvm")
        log(f"gvisor tier: {detail}")
        n = 0
        for mib in sizes:
            s = samples[mib] = {"brig_snapshot": [], "brig_restore": [], "brig_fork": [],
                                "size": [], "runsc_checkpoint": [], "runsc_restore": []}
            for r in range(args.rounds):
                order = ["brig", "runsc"] if r % 2 == 0 else ["runsc", "brig"]
                for part in order:
                    if part == "brig":
                        snap, rest, fork, size = brig_round(d, mib, args.forks)
                        s["brig_snapshot"].append(snap)
                        s["brig_restore"].append(rest)
                        s["brig_fork"].append(fork)
                        s["size"].append(size)
                    else:
                        n += 1
                        cp, rest = runsc_round(runsc, platform, work, mib, n)
                        s["runsc_checkpoint"].append(cp)
                        s["runsc_restore"].append(rest)
                log(f"{mib} MiB: round {r + 1}/{args.rounds}")
    finally:
        d.stop()
        shutil.rmtree(home, ignore_errors=True)
        subprocess.run(["umount", "-R", work], stderr=subprocess.DEVNULL)
        shutil.rmtree(work, ignore_errors=True)

    (out / "samples.json").write_text(json.dumps(samples, indent=1))
    lines = [f"gvisor tier: {detail}; brig {brig}; {args.rounds} rounds per size; fork x{args.forks}",
             f"{'held MiB':>8} {'brig snap':>10} {'runsc cp':>9} {'ratio':>6} {'brig rest':>10} "
             f"{'runsc rest':>11} {'ratio':>6} {'fork x' + str(args.forks):>9} {'cp MiB':>7}"]
    for mib, s in samples.items():
        bs, rc, br, rr = ms(s["brig_snapshot"]), ms(s["runsc_checkpoint"]), ms(s["brig_restore"]), ms(s["runsc_restore"])
        lines.append(f"{mib:>8} {bs:>10.0f} {rc:>9.0f} {bs / rc:>5.1f}x {br:>10.0f} {rr:>11.0f} "
                     f"{br / rr:>5.1f}x {ms(s['brig_fork']):>9.0f} {statistics.median(s['size']) / 2**20:>7.0f}")
    lines.append("(median ms; brig snap = checkpoint + the parent restored + reconnected; "
                 "runsc cp = checkpoint only, the container stops)")
    (out / "summary.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
