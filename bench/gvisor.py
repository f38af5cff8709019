#!/usr/bin/python3
"""The gvisor tier against a bare runsc and against the process tier, side by side in one run.

    bench/gvisor.py                  # 20 rounds, release build
    bench/gvisor.py --rounds 10 --brig target/debug/brig

What is timed, each round, the three in an order that alternates between
rounds (this VM is noisy: a slow minute is shared):

  gvisor   create a sandbox over the native API with isolation gvisor
           (template host) and wait for its first `exec /bin/true` to end:
           "create -> exec ready"; then 20 `exec /bin/true` in it: the exec
           round trip; then delete it.
  process  the same with isolation process (the daemon runs with
           --pool host=0, so each create makes a sandbox, as gvisor's do).
  runsc    `runsc --network=none --platform=P do true` (P: the platform brig
           chose, from GET /v1/info): gVisor's own start-to-exit of one
           command, the floor under a gvisor create.

Prints the medians and the ratios gvisor/runsc (create) and gvisor/process
(create, exec). Raw samples land in --out (default
target/bench/gvisor-<time>/samples.json). See bench/README.md. Needs root
and runsc (apt-get install runsc).
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def log(msg):
    print(msg, file=sys.stderr, flush=True)


class Daemon:
    def __init__(self, brig, home):
        self.home = home
        self.proc = subprocess.Popen(
            [brig, "serve", "--listen", "127.0.0.1:0", "--pool", "host=0", "--prepare", "none"],
            env={**os.environ, "BRIG_HOME": home},
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for line in self.proc.stderr:
            if line.startswith("brig: listening on "):
                self.url = line.split("brig: listening on ", 1)[1].strip()
                break
        else:
            raise SystemExit("brig serve exited before listening")
        # Keep reading its log so it never blocks on a full pipe.
        import threading
        threading.Thread(target=lambda: [None for _ in self.proc.stderr], daemon=True).start()
        self.key = Path(home, "local.key").read_text().strip()

    def call(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self.key}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            raw = r.read()
        return raw

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


def tier_round(d, isolation, execs):
    t0 = time.perf_counter()
    sb = json.loads(d.call("POST", "/v1/sandboxes", {"isolation": isolation, "template": "host"}))
    d.exec_true(sb["id"])
    ready = time.perf_counter() - t0
    rts = []
    for _ in range(execs):
        t = time.perf_counter()
        d.exec_true(sb["id"])
        rts.append(time.perf_counter() - t)
    d.call("DELETE", f"/v1/sandboxes/{sb['id']}")
    return ready, rts


def runsc_round(runsc, platform, root):
    t0 = time.perf_counter()
    p = subprocess.run([runsc, f"--root={root}", "--network=none", f"--platform={platform}",
                        "do", "true"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    took = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"runsc do true failed: {p.stderr.decode()[-500:]}")
    return took


def ms(xs):
    return statistics.median(xs) * 1000


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--execs", type=int, default=20, help="exec round trips per sandbox")
    ap.add_argument("--brig", help="a built brig (default: cargo build --release)")
    ap.add_argument("--out", help="where the samples go")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench/gvisor.py needs root (runsc and brig's tiers)")
    runsc = shutil.which("runsc")
    if not runsc:
        raise SystemExit("runsc is not installed: apt-get install runsc")
    brig = args.brig
    if not brig:
        log("building brig (release)")
        subprocess.run(["cargo", "build", "--release", "-p", "brig"], cwd=REPO, check=True)
        brig = str(REPO / "target/release/brig")
    out = Path(args.out or REPO / "target/bench" / time.strftime("gvisor-%Y%m%d-%H%M%S"))
    out.mkdir(parents=True, exist_ok=True)

    home = tempfile.mkdtemp(prefix="brig-bench-gvisor-")
    root = tempfile.mkdtemp(prefix="runsc-bench-")
    d = Daemon(brig, home)
    try:
        info = json.loads(d.call("GET", "/v1/info"))
        if "gvisor" not in info.get("offered", []):
            raise SystemExit(f"the daemon offers no gvisor tier: {info['tiers']}")
        detail = info["tiers"].get("gvisor_detail", "")
        platform = "ptrace" if "ptrace" in detail else ("systrap" if "systrap" in detail else "kvm")
        log(f"gvisor tier: {detail}")
        # One of each first, untimed: page cache, the agent's copy, runsc's.
        tier_round(d, "gvisor", 1)
        tier_round(d, "process", 1)
        runsc_round(runsc, platform, root)

        samples = {"gvisor_ready": [], "gvisor_exec": [], "process_ready": [],
                   "process_exec": [], "runsc_do": []}
        parts = ["gvisor", "process", "runsc"]
        for r in range(args.rounds):
            order = parts if r % 2 == 0 else parts[::-1]
            for part in order:
                if part == "runsc":
                    samples["runsc_do"].append(runsc_round(runsc, platform, root))
                else:
                    ready, rts = tier_round(d, part, args.execs)
                    samples[f"{part}_ready"].append(ready)
                    samples[f"{part}_exec"].extend(rts)
            log(f"round {r + 1}/{args.rounds}")
    finally:
        d.stop()
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)

    (out / "samples.json").write_text(json.dumps(samples, indent=1))
    g_ready, p_ready, do = ms(samples["gvisor_ready"]), ms(samples["process_ready"]), ms(samples["runsc_do"])
    g_exec, p_exec = ms(samples["gvisor_exec"]), ms(samples["process_exec"])
    lines = [
        f"gvisor tier: {detail}; brig {brig}; {args.rounds} rounds, {args.execs} execs each",
        f"{'':34}{'median ms':>10}",
        f"{'gvisor create -> exec ready':34}{g_ready:10.1f}",
        f"{'runsc do true (peer)':34}{do:10.1f}",
        f"{'process create -> exec ready':34}{p_ready:10.1f}",
        f"{'gvisor exec round trip':34}{g_exec:10.2f}",
        f"{'process exec round trip':34}{p_exec:10.2f}",
        f"ratio gvisor create / runsc do:        {g_ready / do:.2f}x",
        f"ratio gvisor create / process create:  {g_ready / p_ready:.1f}x",
        f"ratio gvisor exec / process exec:      {g_exec / p_exec:.1f}x",
    ]
    (out / "summary.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
