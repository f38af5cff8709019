#!/usr/bin/python3
"""brig serve --e2b driven by the official E2B Python clients, against real peers in the same run.

    bench/e2b.py                  # both parts, about 2 minutes after the build
    bench/e2b.py --quick          # fewer iterations
    bench/e2b.py --part cycle     # one part (cycle, run_code; repeatable)

Parts:

  cycle     `Sandbox.create()` + `commands.run("echo hi")` + `kill()` from the
            official Python client (e2b, the tests' venv), one after the other,
            timed per step; the daemon keeps its default pools (host=4 and, with
            --e2b, base+setuid=2), so creates of `base` come from the pool.
            Peers: `bwrap --unshare-all --die-with-parent --ro-bind / / sh -c
            'echo hi'` started and waited for (a fresh sandbox per cycle), and
            the same cycle over brig's native API (POST /v1/sandboxes on the
            pooled `host` template, exec `sh -c 'echo hi'`, DELETE; one
            keep-alive connection, Python's http.client) for reference. And
            "brig e2b raw": the E2B cycle's own requests sent with http.client
            (create, envd's Process/Start of `bash -l -c 'echo hi'`, kill), so
            what the SDK itself costs is the difference.
  run_code  `run_code("1+1")` in the warm default context of a
            `code-interpreter-v1` sandbox (e2b_code_interpreter). Peer: the bare
            Jupyter round trip, jupyter_client's `execute("1+1")` to an
            ipykernel on the host up to its `idle` status, with the versions the
            template has (ipykernel 6.17.0, jupyter_client 7.4.9, pyzmq 24.0.1)
            in the bench's own venv (--bench-venv, made on first use).

The daemon is the release build, on free ports, with a temp home whose
`templates` is a symlink to the already built templates (--templates, default
$BRIG_TEST_TEMPLATE_HOME/templates or ~/.cache/brig-test/home/templates): the
bench builds `base` and `code-interpreter-v1` there first if they are missing
or stale (minutes, once), and installs bwrap and the E2B client venv with
tests/support/install-deps.sh and install-python-deps.sh. Timed runs
are split into --rounds and the order of the tools rotates between rounds, as
in bench/daemon.py. Targets are reported as met or MISSED; the exit status is
non-zero only on errors. Raw samples, summary.json and summary.txt go to --out
(default target/bench/e2b-<time>/). See bench/README.md.
"""

import argparse
import http.client
import json
import os
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import spawn  # noqa: E402  (bench/spawn.py: REPO, loadavg)

REPO = spawn.REPO
CACHE = Path(os.environ.get("BRIG_TEST_CACHE", Path.home() / ".cache/brig-test"))
E2B_PYTHON = CACHE / "e2b-venv/bin/python"
BENCH_VENV = Path.home() / ".cache/brig-bench/venv"
JUPYTER_PINS = ["ipykernel==6.17.0", "jupyter_client==7.4.9", "pyzmq==24.0.1"]
BWRAP = ["bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "sh", "-c", "echo hi"]
PARTS = ("cycle", "run_code")
TARGET_CYCLE_P50_MS = 15.0
TARGET_RUN_CODE_P50_MS = 5.0


def log(msg):
    print(msg, file=sys.stderr, flush=True)


class BenchError(Exception):
    pass


def build(brig_override):
    if brig_override:
        brig = Path(brig_override).resolve()
    else:
        log("building brig and brig-agent (release)")
        argv = ["cargo", "build", "--release", "-p", "brig", "-p", "brig-agent", "--bins",
                "--message-format=json-render-diagnostics"]
        p = subprocess.run(argv, cwd=REPO, stdout=subprocess.PIPE, text=True)
        if p.returncode != 0:
            raise BenchError("cargo build failed (see above)")
        brig = None
        for line in p.stdout.splitlines():
            msg = json.loads(line)
            if msg.get("reason") == "compiler-artifact" and msg.get("executable") \
                    and msg["target"]["name"] == "brig":
                brig = Path(msg["executable"])
    if not (brig.parent / "brig-agent").exists() and "BRIG_AGENT" not in os.environ:
        raise BenchError(f"no brig-agent next to {brig} (set BRIG_AGENT)")
    return brig


def pct(samples, p):
    s = sorted(samples)
    return s[round((len(s) - 1) * p)]


def stats(samples):
    return {"n": len(samples), "p50_ms": pct(samples, 0.5), "p90_ms": pct(samples, 0.9),
            "p99_ms": pct(samples, 0.99), "min_ms": min(samples), "mean_ms": statistics.fmean(samples)}


class Daemon:
    """`brig serve --e2b` on free ports with a temp home; SIGTERM at the end."""

    def __init__(self, brig, home, templates):
        home.mkdir(parents=True)
        (home / "templates").symlink_to(templates)
        self.log_path = home.parent / "daemon.log"
        self.log_file = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [str(brig), "serve", "--e2b", "--home", str(home), "--listen", "127.0.0.1:0",
             "--e2b-api", "127.0.0.1:0", "--e2b-sandbox", "127.0.0.1:0"],
            stdin=subprocess.DEVNULL, stdout=self.log_file, stderr=self.log_file)
        want = {"brig: listening on ": "url", "brig: e2b api on ": "api", "brig: e2b sandboxes on ": "data"}
        found, deadline = {}, time.monotonic() + 30
        while len(found) < 3:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"brig serve did not start: {self.log_path.read_text()}")
            for line in self.log_path.read_text().splitlines():
                for prefix, name in want.items():
                    if line.startswith(prefix):
                        found[name] = line.split()[-1]
            time.sleep(0.05)
        self.url, self.api, self.data = found["url"], found["api"], found["data"]
        self.key = (home / "local.key").read_text().strip()

    def env(self):
        return {**os.environ, "E2B_API_KEY": self.key, "E2B_API_URL": self.api,
                "E2B_SANDBOX_URL": self.data}

    def get(self, path, raw=False):
        req = urllib.request.Request(self.url + path, headers={"Authorization": f"Bearer {self.key}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.read().decode() if raw else json.load(r)

    def pool_claims(self):
        for line in self.get("/metrics", raw=True).splitlines():
            if line.startswith("brig_pool_claims_total "):
                return int(float(line.split()[1]))
        return None

    def wait_pool(self, timeout=30):
        """Until every pool is full (a named template's once it is built)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pools = self.get("/v1/info").get("pool", [])
            if all(p["idle"] >= p["target"] for p in pools):
                return pools
            time.sleep(0.1)
        raise BenchError(f"the pools did not fill in {timeout} s: {self.get('/v1/info').get('pool')}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise BenchError("brig serve did not stop within 120 s of SIGTERM; killed")
        self.log_file.close()
        if self.proc.returncode != 0:
            raise BenchError(f"brig serve exited {self.proc.returncode}: {self.log_path.read_text()[-2000:]}")


# What runs in the E2B client's venv: warm-up, then timed iterations; JSON
# samples on stdout.
CYCLE_CLIENT = r'''
import json, sys, time
from e2b import Sandbox
n, warmup = int(sys.argv[1]), int(sys.argv[2])
out = {"create": [], "run": [], "kill": [], "cycle": []}
for i in range(warmup + n):
    t0 = time.perf_counter()
    sb = Sandbox.create()
    t1 = time.perf_counter()
    r = sb.commands.run("echo hi")
    t2 = time.perf_counter()
    ok = sb.kill()
    t3 = time.perf_counter()
    if r.stdout != "hi\n" or r.exit_code != 0 or ok is False:
        sys.exit(f"bad cycle: stdout {r.stdout!r} exit {r.exit_code} kill {ok}")
    if i >= warmup:
        for k, v in (("create", t1 - t0), ("run", t2 - t1), ("kill", t3 - t2), ("cycle", t3 - t0)):
            out[k].append(v * 1000)
print(json.dumps(out))
'''

RUN_CODE_CLIENT = r'''
import json, sys, time
from e2b_code_interpreter import Sandbox
n, warmup = int(sys.argv[1]), int(sys.argv[2])
t0 = time.perf_counter()
sb = Sandbox.create()
created = (time.perf_counter() - t0) * 1000
out = {"run_code": [], "create_ms": created}
try:
    for i in range(warmup + n):
        t0 = time.perf_counter()
        ex = sb.run_code("1+1")
        dt = (time.perf_counter() - t0) * 1000
        if ex.error or ex.text != "2":
            sys.exit(f"bad run_code: text {ex.text!r} error {ex.error}")
        if i >= warmup:
            out["run_code"].append(dt)
finally:
    sb.kill()
print(json.dumps(out))
'''

JUPYTER_CLIENT = r'''
import json, sys, time
from jupyter_client.manager import start_new_kernel
n, warmup = int(sys.argv[1]), int(sys.argv[2])
km, kc = start_new_kernel(kernel_name="python3")
out = {"run_code": []}
try:
    for i in range(warmup + n):
        t0 = time.perf_counter()
        msg_id = kc.execute("1+1")
        result = None
        while True:
            m = kc.get_iopub_msg(timeout=10)
            if m["parent_header"].get("msg_id") != msg_id:
                continue
            if m["msg_type"] == "execute_result":
                result = m["content"]["data"]["text/plain"]
            if m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
                break
        dt = (time.perf_counter() - t0) * 1000
        reply = kc.get_shell_msg(timeout=10)
        if result != "2" or reply["content"]["status"] != "ok":
            sys.exit(f"bad execute: {result!r} {reply['content']}")
        if i >= warmup:
            out["run_code"].append(dt)
finally:
    kc.stop_channels()
    km.shutdown_kernel(now=True)
print(json.dumps(out))
'''


def run_client(python, script, args, env, out_file, timeout=600):
    p = subprocess.run([str(python), "-c", script, *map(str, args)], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=timeout)
    if p.returncode != 0:
        raise BenchError(f"{python} failed: {p.stderr.strip()[-2000:]}")
    out_file.write_text(p.stdout)
    return json.loads(p.stdout)


def bwrap_cycles(n, warmup):
    out = []
    for i in range(warmup + n):
        t0 = time.perf_counter()
        p = subprocess.run(BWRAP, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        dt = (time.perf_counter() - t0) * 1000
        if p.returncode != 0 or p.stdout != b"hi\n":
            raise BenchError(f"bwrap: exit {p.returncode}, stdout {p.stdout!r}")
        if i >= warmup:
            out.append(dt)
    return {"cycle": out}


def native_cycles(daemon, n, warmup):
    """create (host, pooled) -> exec sh -c 'echo hi' -> delete over one
    keep-alive connection."""
    host, port = daemon.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port))
    auth = {"Authorization": f"Bearer {daemon.key}", "Content-Type": "application/json"}

    def req(method, path, body=None):
        conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=auth)
        r = conn.getresponse()
        data = r.read()
        if r.status >= 300:
            raise BenchError(f"native {method} {path}: {r.status} {data[:300]!r}")
        return data

    out = {"create": [], "run": [], "kill": [], "cycle": []}
    try:
        for i in range(warmup + n):
            t0 = time.perf_counter()
            sid = json.loads(req("POST", "/v1/sandboxes", {"template": "host"}))["id"]
            t1 = time.perf_counter()
            lines = req("POST", f"/v1/sandboxes/{sid}/exec", {"argv": ["sh", "-c", "echo hi"]})
            t2 = time.perf_counter()
            req("DELETE", f"/v1/sandboxes/{sid}")
            t3 = time.perf_counter()
            last = json.loads(lines.decode().splitlines()[-1])
            if last.get("type") != "exited" or last.get("code") != 0:
                raise BenchError(f"native exec: {lines[-300:]!r}")
            if i >= warmup:
                for k, v in (("create", t1 - t0), ("run", t2 - t1), ("kill", t3 - t2), ("cycle", t3 - t0)):
                    out[k].append(v * 1000)
    finally:
        conn.close()
    return out


def e2b_raw_cycles(daemon, n, warmup):
    """The E2B cycle's requests without the SDK, over two keep-alive
    connections (http.client): POST /v2/sandboxes {"templateID": "base"},
    envd's process.Process/Start of `/bin/bash -l -c 'echo hi'` as `user`
    (what commands.run sends; Connect's JSON envelope), DELETE
    /sandboxes/{id}. What the SDK adds is the difference to "brig e2b"."""
    def conn(url):
        host, port = url.removeprefix("http://").split(":")
        return http.client.HTTPConnection(host, int(port))

    api, data = conn(daemon.api), conn(daemon.data)
    key = {"X-API-KEY": daemon.key}
    body = json.dumps({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo hi"], "envs": {}},
                       "stdin": False}).encode()
    start = struct.pack(">BI", 0, len(body)) + body

    def req(c, method, path, body, headers, want):
        c.request(method, path, body=body, headers=headers)
        r = c.getresponse()
        got = r.read()
        if r.status != want:
            raise BenchError(f"e2b raw {method} {path}: {r.status} {got[:300]!r}")
        return got

    out = {"create": [], "run": [], "kill": [], "cycle": []}
    try:
        for i in range(warmup + n):
            t0 = time.perf_counter()
            sb = json.loads(req(api, "POST", "/v2/sandboxes", json.dumps({"templateID": "base"}),
                                {**key, "Content-Type": "application/json"}, 201))
            t1 = time.perf_counter()
            events = req(data, "POST", "/process.Process/Start", start, {
                "E2b-Sandbox-Id": sb["sandboxID"], "E2b-Sandbox-Port": "49983",
                "X-Access-Token": sb.get("envdAccessToken") or "",
                "Content-Type": "application/connect+json", "Connect-Protocol-Version": "1",
                "Authorization": "Basic dXNlcjo="}, 200)
            t2 = time.perf_counter()
            req(api, "DELETE", f"/sandboxes/{sb['sandboxID']}", None, key, 204)
            t3 = time.perf_counter()
            if b'"stdout":"aGkK"' not in events or b'"exitCode":0' not in events.replace(b" ", b""):
                raise BenchError(f"e2b raw: unexpected events {events[-300:]!r}")
            if i >= warmup:
                for k, v in (("create", t1 - t0), ("run", t2 - t1), ("kill", t3 - t2), ("cycle", t3 - t0)):
                    out[k].append(v * 1000)
    finally:
        api.close()
        data.close()
    return out


def part_cycle(daemon, args, out):
    runs = {"brig e2b": [], "brig e2b raw": [], "brig native": [], "bwrap": []}
    claims = [0, 0]
    tools = list(runs)
    per = max(1, args.cycles // args.rounds)
    warmup = max(3, per // 10)
    for r in range(args.rounds):
        order = tools[r % len(tools):] + tools[:r % len(tools)]
        for who in order:
            log(f"cycle round {r + 1}/{args.rounds}: {who}, {per} cycles after {warmup} warm-up")
            daemon.wait_pool()
            if who == "brig e2b":
                before = daemon.pool_claims()
                runs[who].append(run_client(E2B_PYTHON, CYCLE_CLIENT, [per, warmup], daemon.env(),
                                            out / f"cycle-e2b-r{r}.json"))
                claims[0] += daemon.pool_claims() - before
                claims[1] += per + warmup
            elif who == "brig e2b raw":
                runs[who].append(e2b_raw_cycles(daemon, per, warmup))
            elif who == "brig native":
                runs[who].append(native_cycles(daemon, per, warmup))
            else:
                runs[who].append(bwrap_cycles(per, warmup))
    res = {}
    for who, rs in runs.items():
        res[who] = {k: stats([s for run in rs for s in run[k]]) for k in rs[0]}
        (out / f"cycle-{who.replace(' ', '-')}.json").write_text(json.dumps(rs))
    res["brig e2b"]["from_pool"] = claims[0] / claims[1] if claims[1] else None
    return res


def ensure_bench_venv(venv):
    py = venv / "bin/python"
    check = "import ipykernel, jupyter_client, zmq; print(ipykernel.__version__, jupyter_client.__version__, zmq.__version__)"
    want = " ".join(p.split("==")[1] for p in JUPYTER_PINS)
    if py.exists():
        p = subprocess.run([str(py), "-c", check], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        if p.returncode == 0 and p.stdout.strip() == want:
            return py
    log(f"making the bench venv {venv} ({', '.join(JUPYTER_PINS)})")
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run(["python3", "-m", "venv", str(venv)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "--quiet", *JUPYTER_PINS], check=True)
    return py


def part_run_code(daemon, args, out):
    jpy = ensure_bench_venv(args.bench_venv)
    runs = {"brig e2b": [], "jupyter_client": []}
    creates = []
    per = max(1, args.runs // args.rounds)
    warmup = max(5, per // 10)
    for r in range(args.rounds):
        order = ["brig e2b", "jupyter_client"] if r % 2 == 0 else ["jupyter_client", "brig e2b"]
        for who in order:
            log(f"run_code round {r + 1}/{args.rounds}: {who}, {per} runs after {warmup} warm-up")
            if who == "brig e2b":
                res = run_client(E2B_PYTHON, RUN_CODE_CLIENT, [per, warmup], daemon.env(),
                                 out / f"run_code-e2b-r{r}.json")
                creates.append(res["create_ms"])
            else:
                res = run_client(jpy, JUPYTER_CLIENT, [per, warmup], os.environ,
                                 out / f"run_code-jupyter-r{r}.json")
            runs[who].append(res)
    res = {who: stats([s for run in rs for s in run["run_code"]]) for who, rs in runs.items()}
    res["create_ms"] = creates
    return res


def met(ok):
    return "met" if ok else "MISSED"


def render(res, meta):
    L = [f"e2b: brig serve --e2b and the official Python clients against bwrap and jupyter_client "
         f"({meta['date']}, {meta['cpus']} cpus, kernel {meta['kernel']}; load before "
         f"{meta['load_before']}, after {meta['load_after']})",
         "times in ms; ratio = brig / peer (below 1: brig is faster)", ""]
    c = res.get("cycle")
    if c:
        L.append('(a) Sandbox.create() + commands.run("echo hi") + kill(), one after the other '
                 f"(e2b {meta['e2b_version']}); pool: E2B creates served from the pool")
        L.append(f"{'tool':<12} {'n':>4} {'p50':>7} {'p90':>7} {'p99':>7} {'min':>7} | "
                 f"{'create':>6} {'run':>6} {'kill':>6} (p50)  pool")
        for who in ("brig e2b", "brig e2b raw", "brig native", "bwrap"):
            s = c[who]
            cy = s["cycle"]
            steps = (f"{s['create']['p50_ms']:>6.2f} {s['run']['p50_ms']:>6.2f} {s['kill']['p50_ms']:>6.2f}"
                     if "create" in s else f"{'':>20}")
            pool = f"{100 * s['from_pool']:.0f}%" if s.get("from_pool") is not None else ""
            L.append(f"{who:<12} {cy['n']:>4} {cy['p50_ms']:>7.2f} {cy['p90_ms']:>7.2f} {cy['p99_ms']:>7.2f} "
                     f"{cy['min_ms']:>7.2f} | {steps}       {pool}")
        e, n, b = c["brig e2b"]["cycle"], c["brig native"]["cycle"], c["bwrap"]["cycle"]
        L.append(f"ratio p50 brig-e2b/bwrap {e['p50_ms'] / b['p50_ms']:.2f}, "
                 f"brig-e2b/brig-native {e['p50_ms'] / n['p50_ms']:.2f}, "
                 f"brig-e2b/brig-e2b-raw {e['p50_ms'] / c['brig e2b raw']['cycle']['p50_ms']:.2f}")
        L.append(f"target: create+run+kill p50 <= {TARGET_CYCLE_P50_MS:g} ms: "
                 f"{met(e['p50_ms'] <= TARGET_CYCLE_P50_MS)}")
        L.append("")
    r = res.get("run_code")
    if r:
        L.append(f'(b) run_code("1+1") in a warm context of a code-interpreter-v1 sandbox '
                 f"(e2b-code-interpreter {meta['ci_version']}); peer: jupyter_client execute to a host ipykernel")
        L.append(f"{'tool':<15} {'n':>4} {'p50':>7} {'p90':>7} {'p99':>7} {'min':>7}")
        for who in ("brig e2b", "jupyter_client"):
            s = r[who]
            L.append(f"{who:<15} {s['n']:>4} {s['p50_ms']:>7.2f} {s['p90_ms']:>7.2f} {s['p99_ms']:>7.2f} "
                     f"{s['min_ms']:>7.2f}")
        L.append(f"ratio p50 brig-e2b/jupyter_client {r['brig e2b']['p50_ms'] / r['jupyter_client']['p50_ms']:.2f}; "
                 f"code-interpreter-v1 create (kernel start included): "
                 + ", ".join(f"{x:.0f}" for x in r["create_ms"]))
        L.append(f"target: warm run_code p50 <= {TARGET_RUN_CODE_P50_MS:g} ms: "
                 f"{met(r['brig e2b']['p50_ms'] <= TARGET_RUN_CODE_P50_MS)}")
        L.append("")
    for part, err in res.get("errors", {}).items():
        L.append(f"{part}: FAILED: {err}")
    return "\n".join(L)


def pip_version(python, dist):
    p = subprocess.run([str(python), "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"],
                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return p.stdout.strip() or "?"


def main():
    default_templates = Path(os.environ.get("BRIG_TEST_TEMPLATE_HOME", CACHE / "home")) / "templates"
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", action="append", choices=PARTS, help="only these parts (repeatable)")
    ap.add_argument("--cycles", type=int, default=100, help="timed cycles per tool, over all rounds")
    ap.add_argument("--runs", type=int, default=200, help="timed run_code calls per tool, over all rounds")
    ap.add_argument("--rounds", type=int, default=2, help="split the work into rounds")
    ap.add_argument("--quick", action="store_true", help="50 cycles, 100 run_code calls")
    ap.add_argument("--brig", help="use this brig binary (brig-agent next to it)")
    ap.add_argument("--templates", type=Path, default=default_templates,
                    help="built templates to link into the temp home")
    ap.add_argument("--bench-venv", type=Path, default=BENCH_VENV,
                    help="the bench's venv for ipykernel/jupyter_client (made if missing)")
    ap.add_argument("--out", type=Path, help="raw JSON goes here (default target/bench/e2b-<time>)")
    args = ap.parse_args()
    if args.quick:
        args.cycles, args.runs = 50, 100
    if os.geteuid() != 0:
        sys.exit("e2b.py: run as root (brig serve)")
    # What the bench needs, installed as the test suite installs it (fast
    # when present).
    for script in ("install-deps.sh", "install-python-deps.sh"):
        if subprocess.run([str(REPO / "tests/support" / script)]).returncode != 0:
            sys.exit(f"e2b.py: tests/support/{script} failed (see above)")
    if not shutil.which("bwrap") or not E2B_PYTHON.exists():
        sys.exit(f"e2b.py: bwrap or {E2B_PYTHON} still missing after the install scripts")
    parts = args.part or list(PARTS)
    out = args.out or REPO / "target/bench" / time.strftime("e2b-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    try:
        brig = build(args.brig)
    except BenchError as e:
        sys.exit(f"e2b.py: {e}")
    # The templates, built there first if missing or stale (minutes, once;
    # brig shows the progress), so no timed run pays for a build.
    home = {**os.environ, "BRIG_HOME": str(args.templates.parent)}
    ls = subprocess.run([str(brig), "template", "ls", "--json"], stdout=subprocess.PIPE, text=True,
                        env=home)
    states = {t["name"]: t["state"] for t in json.loads(ls.stdout or "[]")}
    need = ["base"] + (["code-interpreter-v1"] if "run_code" in parts else [])
    for name in (n for n in need if states.get(n) != "ready"):
        print(f"e2b.py: template {name} is {states.get(name, 'missing')} in {args.templates}: "
              "building it (minutes, once)", flush=True)
        if subprocess.run([str(brig), "template", "build", name], env=home,
                          stdout=subprocess.DEVNULL).returncode != 0:
            sys.exit(f"e2b.py: building template {name} failed (see above)")

    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpus": os.cpu_count(),
            "kernel": os.uname().release, "load_before": spawn.loadavg(), "brig": str(brig),
            "e2b_version": pip_version(E2B_PYTHON, "e2b"),
            "ci_version": pip_version(E2B_PYTHON, "e2b-code-interpreter"),
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}
    res = {"errors": {}}
    work = Path(tempfile.mkdtemp(prefix="brig-bench-e2b-"))
    started = time.monotonic()
    try:
        daemon = Daemon(brig, work / "home", args.templates.resolve())
        try:
            meta["pools"] = daemon.wait_pool()
            for part in PARTS:
                if part not in parts:
                    continue
                try:
                    res[part] = part_cycle(daemon, args, out) if part == "cycle" \
                        else part_run_code(daemon, args, out)
                except (BenchError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
                    res["errors"][part] = str(e)
                    log(f"e2b.py: {part} failed: {e}")
            left = daemon.get("/v1/sandboxes?state=running&limit=100")["items"]
            if left:
                res["errors"]["leak"] = f"{len(left)} sandboxes still running after the bench"
        finally:
            try:
                daemon.stop()
            except BenchError as e:
                res["errors"]["daemon"] = str(e)
            shutil.copy(work / "daemon.log", out / "daemon.log")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    meta["load_after"] = spawn.loadavg()
    meta["seconds"] = round(time.monotonic() - started)
    (out / "summary.json").write_text(json.dumps({"meta": meta, "results": res}, indent=1))
    table = render(res, meta)
    (out / "summary.txt").write_text(table + "\n")
    print(table)
    log(f"raw results in {out} ({meta['seconds']} s)")
    sys.exit(1 if res["errors"] else 0)


if __name__ == "__main__":
    main()
