"""An E2B sandbox through a restart of the daemon (driven by crates/cli/tests/live_restore.rs).

    python live_restore_sdk.py before STATE_FILE
    python live_restore_sdk.py after STATE_FILE

`before` creates a sandbox with the official SDK, starts a background
command that prints a counter every 50 ms and a PTY running a shell, and
writes what `after` needs (sandbox id, pids) to STATE_FILE. The test then
kills the daemon with SIGKILL and starts a new one on the same home.
`after` connects to the same sandbox, re-attaches to the command and to the
PTY, and checks that both go on streaming: the counter kept counting while
no daemon ran (no gap in the file it also writes), the PTY still answers
input. Then it kills the sandbox.

E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL point at the daemon;
E2B_ISOLATION (optional) picks brig's tier (crates/cli/tests/gvisor.rs runs
it on gvisor). Prints
one line per check and `N passed, 0 failed` at the end.
"""

import json
import os
import sys
import time

from e2b import Sandbox, PtySize

from sdk_checks import check, summary

phase, state_file = sys.argv[1], sys.argv[2]

COUNTER = "i=0; while :; do echo $i >> /tmp/counter; echo tick-$i; i=$((i+1)); sleep 0.05; done"

if phase == "before":
    # E2B_ISOLATION: brig's tier, through its metadata key (docs/e2b.md).
    isolation = os.environ.get("E2B_ISOLATION")
    metadata = {"brig.isolation": isolation} if isolation else None
    sbx = Sandbox.create(os.environ.get("E2B_TEMPLATE", "base"), timeout=300, metadata=metadata)
    cmd = sbx.commands.run(COUNTER, background=True, timeout=0)
    pty = sbx.pty.create(PtySize(rows=24, cols=80), timeout=0)
    sbx.pty.send_stdin(pty.pid, b"echo pty-be''fore\n")
    seen = bytearray()
    deadline = time.time() + 20
    for _, _, chunk in pty:
        seen.extend(chunk or b"")
        if b"pty-before" in seen or time.time() > deadline:
            break
    check("before: the pty answers", b"pty-before" in seen, seen)
    time.sleep(0.3)
    lines = sbx.files.read("/tmp/counter").split()
    check("before: the counter runs", len(lines) >= 3, lines)
    with open(state_file, "w") as f:
        json.dump({"id": sbx.sandbox_id, "cmd": cmd.pid, "pty": pty.pid}, f)
    # Leave without killing: the daemon dies next.
    summary()
    sys.exit(0)

state = json.load(open(state_file))
sbx = Sandbox.connect(state["id"])
check("after: the sandbox is running", sbx.is_running())
procs = {p.pid for p in sbx.commands.list()}
check("after: the command and the pty are listed", {state["cmd"], state["pty"]} <= procs, procs)

# The counter never stopped: its file has every number in order.
numbers = [int(x) for x in sbx.files.read("/tmp/counter").split()]
check("after: no gap in the counter", numbers == list(range(len(numbers))), numbers[-5:])
check("after: it counted while no daemon ran", len(numbers) >= 20, len(numbers))

# Re-attach to the command: its output goes on.
handle = sbx.commands.connect(state["cmd"])
ticks = []
for stdout, _, _ in handle:
    if stdout:
        ticks.append(stdout)
    if sum(s.count("tick-") for s in ticks) >= 5:
        break
text = "".join(ticks)
check("after: the re-attached command streams", text.count("tick-") >= 5, text[-200:])
later = int(text.strip().split("tick-")[-1].split()[0])
check("after: it streams live, past the restart", later > numbers[-1] - 5, (later, numbers[-1]))

# Re-attach to the PTY and drive it.
pty = sbx.pty.connect(state["pty"])
sbx.pty.send_stdin(state["pty"], b"echo pty-af''ter; exit 3\n")
seen = bytearray()
try:
    pty.wait(on_pty=lambda d: seen.extend(d))
    code = 0
except Exception as e:  # CommandExitException carries the code
    code = getattr(e, "exit_code", None)
check("after: the pty answers input", b"pty-after" in seen, seen[-200:])
check("after: the pty's exit code", code == 3, code)

sbx.kill()
check("after: killed", not sbx.is_running())
summary()
