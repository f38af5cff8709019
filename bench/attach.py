#!/usr/bin/python3
"""The cgroup v1 attach floor: what `favordynmods` changes, for brig and bwrap.

    bench/attach.py [--runs 40] [--gap-ms 60]

On cgroup v1 (this machine) moving a task into a group takes the kernel-wide
cgroup_threadgroup_rwsem for writing, which waits for an RCU grace period
unless the lock was already in its slow mode (a writer less than a grace
period ago) or the kernel is in `favordynmods` mode. A lone `brig run` (or a
daemon create after a quiet moment) pays it; back-to-back runs mostly do
not. bwrap makes no cgroup and never pays it.

Parts, each with runs spaced --gap-ms apart so that every run starts
"cold", as a user's occasional command does:

  attach   one write of a fresh child's pid to a new memory cgroup's
           cgroup.procs (the syscall alone)
  run      `brig run -- /bin/true` and `bwrap --unshare-all ... /bin/true`,
           wall time per run

each measured twice: as the host is, then with the kernel in favordynmods
mode. The second state is made by mounting a controller-less named v1
hierarchy with `favordynmods` in a temporary directory (v1 mounts cannot
change the option on remount; the lock is kernel-wide, so one mount is
enough), and undone at the end by unmounting it. `brig doctor` names the
permanent settings (cgroup2 remount or the cgroup_favordynmods=true boot
parameter). Skipped if the host is already in favordynmods mode.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BWRAP = ["bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "/bin/true"]


def favordynmods_on():
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split(" - ")
            if len(fields) == 2 and fields[1].split()[0] in ("cgroup", "cgroup2"):
                if "favordynmods" in fields[1].split()[2].split(","):
                    return True
    return False


def attach_ms(runs, gap):
    base = Path(f"/sys/fs/cgroup/memory/brig-bench-attach-{os.getpid()}")
    base.mkdir()
    out = []
    try:
        for i in range(runs):
            d = base / f"c{i}"
            d.mkdir()
            pid = os.fork()
            if pid == 0:
                time.sleep(5)
                os._exit(0)
            time.sleep(gap)
            t = time.perf_counter()
            (d / "cgroup.procs").write_text(str(pid))
            out.append((time.perf_counter() - t) * 1000)
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            d.rmdir()
    finally:
        base.rmdir()
    return out


def run_ms(argv, runs, gap):
    out = []
    for _ in range(runs):
        time.sleep(gap)
        t = time.perf_counter()
        subprocess.run(argv, check=True)
        out.append((time.perf_counter() - t) * 1000)
    return out


def summary(xs):
    xs = sorted(xs)
    return f"median {statistics.median(xs):6.2f}  p90 {xs[int(len(xs) * 0.9)]:6.2f}  max {xs[-1]:6.2f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--gap-ms", type=float, default=60)
    ap.add_argument("--brig", default=str(REPO / "target/release/brig"))
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("attach.py: needs root (cgroups, brig run)")
    if not Path("/sys/fs/cgroup/memory/cgroup.procs").exists():
        print("attach.py: skipped: no cgroup v1 memory hierarchy (the floor is a v1 one)")
        return
    if favordynmods_on():
        print("attach.py: skipped: the host is already in favordynmods mode (nothing to compare)")
        return
    if not Path(args.brig).exists():
        subprocess.run(["cargo", "build", "--release", "-p", "brig", "-p", "brig-agent"], cwd=REPO, check=True)
    if not shutil.which("bwrap"):
        sys.exit("attach.py: bwrap is missing (apt-get install bubblewrap)")
    gap = args.gap_ms / 1000
    brig = [args.brig, "run", "--", "/bin/true"]
    res = {}
    for state in ("as the host is", "favordynmods"):
        mnt = None
        if state == "favordynmods":
            mnt = tempfile.mkdtemp(prefix="brig-favordynmods-")
            subprocess.run(["mount", "-t", "cgroup", "-o", "none,name=brig-bench,favordynmods", "cgroup", mnt], check=True)
        try:
            res[state] = {
                "attach": attach_ms(args.runs, gap),
                "brig run": run_ms(brig, args.runs, gap),
                "bwrap": run_ms(BWRAP, args.runs, gap),
            }
        finally:
            if mnt:
                subprocess.run(["umount", mnt], check=True)
                os.rmdir(mnt)
    print(f"cgroup attach floor, ms ({args.runs} runs each, {args.gap_ms:g} ms apart; {time.strftime('%Y-%m-%d')})")
    for state, parts in res.items():
        print(f"\n{state}:")
        for name, xs in parts.items():
            print(f"  {name:<9} {summary(xs)}")
        print(f"  ratio brig run/bwrap (median) {statistics.median(parts['brig run']) / statistics.median(parts['bwrap']):.2f}")


if __name__ == "__main__":
    main()
