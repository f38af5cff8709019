"""Snapshots and fork through the official Python client: create_snapshot
(with and without a name), list_snapshots (all, per sandbox, by name,
paged), Sandbox.create from a snapshot id, fork, delete_snapshot. A
snapshot keeps the files, not the processes; sandboxes made from it and
forks are independent of each other and of the parent. Run by
crates/e2b/tests/e2b_control.rs (`python_sdk_snapshots_and_fork`) with
E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL and E2B_TEMPLATE (a named
template: `host` has no files of its own) set. Prints `N passed, 0 failed`.
"""

import os

from e2b import Sandbox
from sdk_checks import check, raises, summary

TEMPLATE = os.environ.get("E2B_TEMPLATE", "base")
PROBE = (
    "cat ~/a.txt; cat ~/d/f; test -e /etc/debian_version && echo present || echo deleted; "
    "ps -eo comm= | grep -c '^sleep$' || true"
)

made = []


def run(sbx, cmd):
    return sbx.commands.run(cmd).stdout


parent = Sandbox.create(TEMPLATE)
made.append(parent)
run(parent, "echo one > ~/a.txt && mkdir -p ~/d && echo x > ~/d/f && sudo rm /etc/debian_version")
parent.commands.run("sleep 1000", background=True)

snap = parent.create_snapshot()
check("create_snapshot: an id", snap.snapshot_id.startswith("snap-"), snap)
check("create_snapshot: no names", snap.names == [], snap)
named = parent.create_snapshot(name="My-Env")
check("create_snapshot(name): named", named.names == ["my-env"], named)
run(parent, "echo two > ~/a.txt")

mine = parent.list_snapshots().next_items()
check(
    "list_snapshots (this sandbox): both, newest first",
    [s.snapshot_id for s in mine] == [named.snapshot_id, snap.snapshot_id],
    mine,
)
by_name = Sandbox.list_snapshots(name="my-env").next_items()
check("list_snapshots(name)", [s.snapshot_id for s in by_name] == [named.snapshot_id], by_name)
pager = Sandbox.list_snapshots(limit=1)
first = pager.next_items()
second = pager.next_items() if pager.has_next else []
check(
    "list_snapshots(limit=1): paged",
    len(first) == 1 and len(second) == 1 and first[0].snapshot_id != second[0].snapshot_id,
    (first, second),
)

child = Sandbox.create(snap.snapshot_id)
made.append(child)
check(
    "Sandbox.create(snapshot): its files, not its processes",
    run(child, PROBE) == "one\nx\ndeleted\n0\n",
    run(child, PROBE),
)
run(child, "echo mine > ~/b.txt")
check(
    "a sandbox from a snapshot is its own",
    run(parent, "cat ~/a.txt; test -e ~/b.txt && echo leaked || echo alone") == "two\nalone\n",
)

forks = parent.fork(count=2)
check("fork(count=2): two sandboxes", len(forks) == 2 and all(isinstance(f, Sandbox) for f in forks), forks)
for i, f in enumerate(forks):
    if isinstance(f, Sandbox):
        made.append(f)
        run(f, f"echo {i} > ~/fork")
check(
    "forks: the parent's files as they are now, each its own",
    [run(f, "cat ~/a.txt ~/fork") for f in forks] == ["two\n0\n", "two\n1\n"],
)
check("the parent runs on", parent.is_running() and run(parent, "cat ~/fork 2>/dev/null || echo none") == "none\n")
raises("fork(count=0) is refused", (Exception,), lambda: parent.fork(count=0))

check("delete_snapshot: True", Sandbox.delete_snapshot(snap.snapshot_id) is True)
check("delete_snapshot again: False", Sandbox.delete_snapshot(snap.snapshot_id) is False)
check("delete_snapshot(name): True", Sandbox.delete_snapshot("my-env") is True)
check("none left", Sandbox.list_snapshots().next_items() == [])
gone = raises("create from a deleted snapshot fails", (Exception,), lambda: Sandbox.create(snap.snapshot_id))
check("... naming it", snap.snapshot_id in str(gone), gone)
check("a sandbox from it runs on", run(child, "cat ~/a.txt") == "one\n")

for s in made:
    s.kill()
summary()
