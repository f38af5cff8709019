"""The E2B control plane driven by the official Python SDK, unmodified.

Run by crates/e2b/tests/e2b_control.rs with E2B_API_KEY (a brig key),
E2B_API_URL and E2B_SANDBOX_URL set, E2B_TEMPLATE (a brig template the
test daemon accepts) and E2B_DEFAULT_USER (the user it should run
commands as). Exercises the control plane: create, list (metadata and
state filters, pagination), get_info, set_timeout (and expiry),
get_metrics, connect (running, and resuming a paused sandbox: files and
processes kept), pause, kill (also by id), and a wrong key; and of the
data plane only what shows the control plane's part in it (create-time
env vars and the default user in a command, is_running). Prints one line
per check and `N passed, 0 failed` at the end; the first failed check
raises.

    python3 control_sdk.py current   # e2b >= 2.51: POST /v2/sandboxes
    python3 control_sdk.py v1        # e2b 2.48: POST /sandboxes
"""

import datetime
import importlib.metadata
import os
import sys
import threading
import time
import uuid

from e2b import (
    AuthenticationException,
    Sandbox,
    SandboxNotFoundException,
    SandboxQuery,
    SandboxState,
)

TEMPLATE = os.environ["E2B_TEMPLATE"]
generation = sys.argv[1] if len(sys.argv) > 1 else "current"
from sdk_checks import check, summary


def listed(query=None, limit=None):
    """Every sandbox the query selects, page by page; the pages' sizes."""
    pager = Sandbox.list(query=query, limit=limit)
    items, sizes = [], []
    while pager.has_next:
        page = pager.next_items()
        sizes.append(len(page))
        items.extend(page)
    return items, sizes


run = uuid.uuid4().hex[:8]
sbx = Sandbox.create(
    template=TEMPLATE,
    timeout=120,
    envs={"A": "1"},
    metadata={"run": run, "who": "first", "odd key": "a&b=c"},
)
check("create: an id of [a-z0-9]", sbx.sandbox_id.isalnum() and sbx.sandbox_id.islower(), sbx.sandbox_id)
check("create: envd access token", bool(getattr(sbx, "_envd_access_token", None)))

# Through the data plane: create-time env vars reach commands, which run
# as the default user (`user` if the template has it, else root).
out = sbx.commands.run("echo $A; id -un")
want_user = os.environ.get("E2B_DEFAULT_USER", "root")
check("envs reach commands", out.stdout.split() == ["1", want_user], out.stdout)
check("is_running", sbx.is_running() is True)

info = sbx.get_info()
check("get_info: id", info.sandbox_id == sbx.sandbox_id, info)
check("get_info: template", info.template_id == TEMPLATE, info)
check("get_info: metadata", info.metadata == {"run": run, "who": "first", "odd key": "a&b=c"}, info.metadata)
check("get_info: running", info.state == SandboxState.RUNNING, info.state)
life = (info.end_at - info.started_at).total_seconds()
check("get_info: end = start + timeout", 115 <= life <= 125, life)
check("get_info: resources", info.cpu_count >= 1 and info.memory_mb > 0, info)

sbx.set_timeout(30)
info = sbx.get_info()
left = (info.end_at - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
check("set_timeout: shortens", 20 <= left <= 31, left)

# connect to a running sandbox only extends.
again = Sandbox.connect(sbx.sandbox_id, timeout=10)
check("connect: same sandbox", again.sandbox_id == sbx.sandbox_id)
check("connect: the data plane works through it", again.commands.run("echo $A").stdout == "1\n")
info = sbx.get_info()
left = (info.end_at - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
check("connect: does not shorten", left > 15, left)
Sandbox.connect(sbx.sandbox_id, timeout=200)
left = (sbx.get_info().end_at - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
check("connect: extends", 190 <= left <= 201, left)

metrics = sbx.get_metrics()
check("get_metrics: one sample", len(metrics) >= 1, metrics)
m = metrics[0]
check("get_metrics: memory", m.mem_total > 0 and 0 < m.mem_used <= m.mem_total, m)
check("get_metrics: cpu", m.cpu_count >= 1 and m.cpu_used_pct >= 0, m)
check("get_metrics: disk", m.disk_total > 0 and 0 <= m.disk_used <= m.disk_total, m)
age = (datetime.datetime.now(datetime.timezone.utc) - m.timestamp).total_seconds()
check("get_metrics: taken now", -5 < age < 30, m.timestamp)
static = Sandbox.get_metrics(sbx.sandbox_id)
check("get_metrics: by id", len(static) >= 1 and static[0].mem_total == m.mem_total, static)
# The series: a sample every BRIG_METRICS_INTERVAL seconds (the daemon's
# interval; E2B's is 5) while the sandbox runs, oldest first.
interval = float(os.environ.get("BRIG_METRICS_INTERVAL", "5"))
time.sleep(3.5 * interval)
series = sbx.get_metrics()
stamps = [s.timestamp for s in series]
gaps = [(b - a).total_seconds() for a, b in zip(stamps, stamps[1:])]
check(
    "get_metrics: a series at the interval",
    len(series) >= 4 and all(0.5 * interval <= g <= 2.5 * interval for g in gaps),
    gaps,
)
# start/end (whole seconds, both included) select exactly the samples in
# that range.
lo, hi = series[1].timestamp, series[-2].timestamp
want = [t for t in stamps if int(lo.timestamp()) <= int(t.timestamp()) <= int(hi.timestamp())]
got = [s.timestamp for s in sbx.get_metrics(start=lo, end=hi)]
check("get_metrics(start, end): exactly the samples in the range", got == want and len(want) >= 2, (got, want))
Sandbox.set_timeout(sbx.sandbox_id, 150)
left = (Sandbox.get_info(sbx.sandbox_id).end_at - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
check("set_timeout and get_info: by id", 140 <= left <= 151, left)

others = [
    Sandbox.create(template=TEMPLATE, timeout=120, metadata={"run": run, "who": f"n{i}"})
    for i in range(3)
]
mine = {s.sandbox_id for s in [sbx, *others]}

items, sizes = listed(SandboxQuery(metadata={"run": run}), limit=2)
ids = [s.sandbox_id for s in items]
check("list: metadata filter, every page", set(ids) == mine and len(ids) == 4, ids)
check("list: pages of 2", sizes == [2, 2], sizes)
items, _ = listed(SandboxQuery(metadata={"run": run, "odd key": "a&b=c"}))
check("list: encoded metadata", [s.sandbox_id for s in items] == [sbx.sandbox_id], items)
started = [s.started_at for s in listed(SandboxQuery(metadata={"run": run}))[0]]
check("list: newest first", started == sorted(started, reverse=True), started)

# What a pause must keep: files, and running processes.
sbx.commands.run("echo kept > /tmp/before-pause")
sleeper = sbx.commands.run("sleep 600", background=True, timeout=0)
check("pause", sbx.pause() is True)
check("pause twice: False", sbx.pause() is False)
check("get_info: paused", sbx.get_info().state == SandboxState.PAUSED)
paused, _ = listed(SandboxQuery(metadata={"run": run}, state=[SandboxState.PAUSED]))
check("list: state=paused", [s.sandbox_id for s in paused] == [sbx.sandbox_id], paused)
running, _ = listed(SandboxQuery(metadata={"run": run}, state=[SandboxState.RUNNING]))
check("list: state=running", {s.sandbox_id for s in running} == mine - {sbx.sandbox_id}, running)
# Paused without auto-resume, the data plane answers as E2B's proxy does
# (502 "not found"): not running, and a command raises the clients'
# not-running error (>= 2.5x: SandboxNotRunningException; older:
# TimeoutException), which says how to get it back (connect).
check("paused: is_running is False", sbx.is_running() is False)
try:
    sbx.commands.run("true")
    check("paused: a command raises the not-running error", False, "no exception")
except Exception as e:
    want = "SandboxNotRunningException" if generation == "current" else "TimeoutException"
    check("paused: a command raises the not-running error", type(e).__name__ == want, repr(e))

resumed = Sandbox.connect(sbx.sandbox_id)
check("connect: resumes", resumed.get_info().state == SandboxState.RUNNING)
check("resumed: is_running", resumed.is_running() is True)
check("resumed: files kept", resumed.commands.run("cat /tmp/before-pause").stdout == "kept\n")
check("resumed: processes kept", sleeper.pid in {p.pid for p in resumed.commands.list()})
check("resumed: commands run", resumed.commands.run("echo $A").stdout == "1\n")

check("kill", sbx.kill() is True)
check("is_running after kill: False", sbx.is_running() is False)
check("kill twice: False", sbx.kill() is False)
try:
    Sandbox.get_info(sbx.sandbox_id)
    check("get_info after kill: not found", False, "no exception")
except SandboxNotFoundException:
    check("get_info after kill: not found", True)
try:
    Sandbox.connect(sbx.sandbox_id)
    check("connect after kill: not found", False, "no exception")
except SandboxNotFoundException:
    check("connect after kill: not found", True)
# The timeout ends a sandbox: set_timeout(2) on one, and it is gone.
short = others.pop()
short.set_timeout(2)
deadline = time.monotonic() + 10
while short.is_running() and time.monotonic() < deadline:
    time.sleep(0.25)
check("timeout: expired sandbox not running", short.is_running() is False)
try:
    Sandbox.get_info(short.sandbox_id)
    check("timeout: expired sandbox not found", False, "no exception")
except SandboxNotFoundException:
    check("timeout: expired sandbox not found", True)
# Killed while a command streams: the client raises its killed-sandbox
# error, as on E2B (>= 2.5x: SandboxNotRunningException, after its /health
# probe answers 502 "was not found"; older: TimeoutException), never a
# CommandExitException with exit code -1.
victim = Sandbox.create(template=TEMPLATE, timeout=60)
killer = threading.Timer(1.5, lambda: Sandbox.kill(victim.sandbox_id))
killer.start()
try:
    r = victim.commands.run("sleep 30")
    check("killed mid-command: the killed-sandbox error", False, r)
except Exception as e:
    want = "SandboxNotRunningException" if generation == "current" else "TimeoutException"
    check("killed mid-command: the killed-sandbox error", type(e).__name__ == want, repr(e))
killer.join()
check("kill by id", Sandbox.kill(others[0].sandbox_id) is True)
check("kill by id: twice is False", Sandbox.kill(others[0].sandbox_id) is False)
for s in others[1:]:
    s.kill()
items, _ = listed(SandboxQuery(metadata={"run": run}))
check("list: empty once killed", items == [], items)

try:
    Sandbox.create(template=TEMPLATE, api_key="e2b_" + "0" * 40)
    check("wrong key: AuthenticationException", False, "no exception")
except AuthenticationException:
    check("wrong key: AuthenticationException", True)

print(f"e2b {importlib.metadata.version('e2b')} ({generation})")
summary()
