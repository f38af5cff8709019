"""Pause, resume and the lifecycle options through the official Python
client (e2b 2.63.0): pause on timeout and auto-resume on traffic, a
filesystem-only pause, a resume that reboots. Run by
crates/e2b/tests/e2b_control.rs (`python_sdk_lifecycle`) with
E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL and E2B_TEMPLATE set, against a
daemon whose sweeper runs every 100 ms. Prints `N passed, 0 failed`.
"""

import os
import sys
import time

from e2b import Sandbox, SandboxQuery, SandboxState

TEMPLATE = os.environ.get("E2B_TEMPLATE", "base")
MARK = "echo kept > /tmp/mark"
# Processes named sleep, and the file.
PROBE = "cat /tmp/mark; ps -eo comm= | grep -c '^sleep$' || true"

from sdk_checks import check, summary


def wait_state(sbx, want):
    deadline = time.monotonic() + 15
    while True:
        info = sbx.get_info()
        if info.state.value == want:
            return info
        if time.monotonic() > deadline:
            raise AssertionError(f"never {want}: {info}")
        time.sleep(0.05)


def leave_a_sleeper(sbx):
    sbx.commands.run(MARK)
    sbx.commands.run("sleep 1000", background=True)


# Pause on timeout, resumed by the next command.
sbx = Sandbox.create(
    TEMPLATE, timeout=2, lifecycle={"on_timeout": "pause", "auto_resume": True}
)
try:
    leave_a_sleeper(sbx)
    info = wait_state(sbx, "paused")
    check("paused when its timeout passed", info.state.value == "paused", info)
    check(
        "lifecycle in get_info",
        info.lifecycle == {"on_timeout": "pause", "auto_resume": True},
        info.lifecycle,
    )
    r = sbx.commands.run(PROBE)
    check("traffic resumes it, memory kept", r.stdout == "kept\n1\n", r.stdout)
    check("running again", sbx.get_info().state.value == "running")
finally:
    sbx.kill()

# Explicit pauses.
sbx = Sandbox.create(TEMPLATE, timeout=60)
try:
    sid = sbx.sandbox_id
    leave_a_sleeper(sbx)
    check("pause (full)", sbx.pause() is True)
    check("pause again is False", sbx.pause() is False)
    check("listed as paused", any(
        s.sandbox_id == sid for s in Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED])).next_items()
    ))
    again = Sandbox.connect(sid)
    check("connect resumes", again.get_info().state.value == "running")
    r = again.commands.run(PROBE)
    check("a full pause keeps processes", r.stdout == "kept\n1\n", r.stdout)

    check("pause (filesystem)", again.pause(mode="filesystem") is True)
    again = Sandbox.connect(sid)
    r = again.commands.run(PROBE)
    check("a filesystem pause keeps files only", r.stdout == "kept\n0\n", r.stdout)

    leave_a_sleeper(again)
    check("pause (full) for a reboot", again.pause() is True)
    again = Sandbox.connect(sid, on_resume="reboot")
    r = again.commands.run(PROBE)
    check("on_resume=reboot ends processes", r.stdout == "kept\n0\n", r.stdout)
finally:
    check("kill", sbx.kill() is True)
summary()
# The client's HTTP stack (pyqwest) sometimes aborts in its own threads
# while Python tears down, after every check passed (see envd_sdk.py).
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
