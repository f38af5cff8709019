"""Volumes through the official Python client: Volume.create, list,
get_info, connect and destroy; the content API without a sandbox
(write_file, read_file, make_dir, list, get_info, exists,
update_metadata, remove); Sandbox.create(volume_mounts=...) with the
mounts echoed by get_info; two sandboxes sharing a volume; the quota
(ENOSPC inside, an error through the content API); bad mounts refused
with E2B's "invalid mounts"; another team sees nothing. Run by
crates/e2b/tests/e2b_volumes.rs with E2B_API_KEY, E2B_API_URL,
E2B_VOLUME_API_URL (= E2B_API_URL), E2B_SANDBOX_URL, E2B_TEMPLATE and
E2B_OTHER_API_KEY (another tenant's key) set, on a daemon whose volumes
are 32 MiB. Prints `N passed, 0 failed`.
"""

import os

from e2b import Sandbox, Volume
from e2b.exceptions import (
    NotFoundException,
    VolumeException,
    VolumeNotFoundException,
    VolumePathNotFoundException,
)
from sdk_checks import check, raises, summary

TEMPLATE = os.environ.get("E2B_TEMPLATE", "base")
OTHER = os.environ["E2B_OTHER_API_KEY"]
made = []


def run(sbx, cmd):
    return sbx.commands.run(cmd).stdout


vol = Volume.create("data")
check("create: an id", vol.volume_id.startswith("vol-"), vol.volume_id)
check("create: the name", vol.name == "data", vol.name)
check("create: a token", bool(vol.token), vol.token)
e = raises("create: a taken name", Exception, lambda: Volume.create("data"))
check("create: a taken name says so", "exists" in str(e), e)
e = raises("create: a bad name", Exception, lambda: Volume.create("a b"))
check("create: a bad name says the rule", "letters, digits" in str(e), e)
longest = Volume.create("n" * 64)
check("create: a 64-character name", longest.name == "n" * 64, longest.name)
raises("create: a 65-character name", Exception, lambda: Volume.create("n" * 65))

listed = Volume.list()
check(
    "list: both, by id and name",
    {(v.volume_id, v.name) for v in listed} == {(vol.volume_id, "data"), (longest.volume_id, "n" * 64)},
    listed,
)
info = Volume.get_info(vol.volume_id)
check("get_info: name and token", info.name == "data" and info.token == vol.token, info)
again = Volume.connect(vol.volume_id)
check("connect: same volume", again.volume_id == vol.volume_id and again.name == "data", again)
raises("get_info: unknown", VolumeNotFoundException, lambda: Volume.get_info("vol-nosuchvolume0000000"))

# Content, no sandbox.
st = vol.write_file("/hello.txt", "hi")
check("write_file: a file of 2 bytes", st.type.value == "file" and st.size == 2 and st.path == "/hello.txt", st)
check("read_file", again.read_file("/hello.txt") == "hi")
e = raises("write_file: exists, no force", VolumeException, lambda: vol.write_file("/hello.txt", "x"))
check("write_file: 409 says force", "force" in str(e), e)
vol.write_file("/hello.txt", "hello", force=True)
check("write_file(force): replaced", vol.read_file("/hello.txt") == "hello")
raises(
    "make_dir: missing parent is the path-not-found error",
    VolumePathNotFoundException,
    lambda: vol.make_dir("/a/b/c"),
)
d = vol.make_dir("/a/b/c", force=True)
check("make_dir(force): parents made", d.type.value == "directory" and d.path == "/a/b/c", d)
raises("make_dir: exists", VolumeException, lambda: vol.make_dir("/a/b/c"))
top = sorted(x.name for x in vol.list("/"))
check("list /", top == ["a", "hello.txt"], top)
deep = sorted(x.path for x in vol.list("/a", depth=3))
check("list depth 3", deep == ["/a/b", "/a/b/c"], deep)
raises("get_info: missing path", VolumePathNotFoundException, lambda: vol.get_info("/nope"))
check("exists: no", vol.exists("/nope") is False)
check("exists: yes", vol.exists("/hello.txt") is True)
m = vol.update_metadata("/hello.txt", uid=1000, gid=1000, mode=0o640)
check("update_metadata", (m.uid, m.gid, m.mode) == (1000, 1000, 0o640), m)
raises("update_metadata: a uid past 65535", VolumeException, lambda: vol.update_metadata("/hello.txt", uid=70000))
vol.write_file("/a/b/c/f", "x")
vol.remove("/a")
check("remove: a directory with what is in it", not vol.exists("/a"))
raises("remove: missing", VolumePathNotFoundException, lambda: vol.remove("/a"))
raises("read_file: escape through .. stays inside", VolumePathNotFoundException, lambda: vol.read_file("/../../etc/hostname"))
wrong = Volume(vol.volume_id, "data", token="brigvol_wrong")
raises("a wrong token is refused", Exception, lambda: wrong.read_file("/hello.txt"))

# Mounted.
sbx = Sandbox.create(TEMPLATE, volume_mounts={"/mnt/data": vol})
made.append(sbx)
check("mounted: content API's file seen", run(sbx, "cat /mnt/data/hello.txt") == "hello")
uid = run(sbx, "id -u").strip()
run(sbx, "echo from-sbx > /mnt/data/s.txt")
check("written inside, read without a sandbox", vol.read_file("/s.txt") == "from-sbx\n")
check("its owner is the sandbox's user as it sees it", str(vol.get_info("/s.txt").uid) == uid, uid)
shown = Sandbox.get_info(sbx.sandbox_id).volume_mounts
check("get_info echoes the mounts", shown == [{"name": "data", "path": "/mnt/data"}], shown)
second = Sandbox.create(TEMPLATE, volume_mounts={"/home/data": "data"})
made.append(second)
check("shared: a second sandbox sees the first's file", run(second, "cat /home/data/s.txt") == "from-sbx\n")
run(second, "echo back > /home/data/t.txt")
check("shared: and the first sees the second's", run(sbx, "cat /mnt/data/t.txt") == "back\n")
e = raises("destroy while mounted", VolumeException, lambda: Volume.destroy(vol.volume_id))
check("destroy while mounted says by whom", sbx.sandbox_id in str(e), e)

# The quota: 32 MiB, enforced by the kernel.
r = sbx.commands.run(
    "head -c 64M /dev/zero > /mnt/data/big; echo rc=$?; rm -f /mnt/data/big", on_stderr=lambda _: None
)
check("quota: ENOSPC inside", "No space left on device" in r.stderr and "rc=1" in r.stdout, r)
fits = run(
    sbx,
    "A=$(df -B1 --output=avail /mnt/data | tail -1); head -c $((A - 65536)) /dev/zero > /mnt/data/edge && echo fits; "
    "head -c 131072 /dev/zero >> /mnt/data/edge 2>/dev/null || echo full; rm -f /mnt/data/edge",
)
check("quota: a file to just under the edge fits, past it fails", fits == "fits\nfull\n", fits)
raises("quota: through the content API", VolumeException, lambda: vol.write_file("/big", b"\0" * (40 << 20)))
check("quota: no half file left", not vol.exists("/big"))

# Bad mounts.
for name, mounts in [
    ("relative path", {"mnt/x": vol}),
    ("unknown volume", {"/mnt/x": "nosuch"}),
    ("system directory", {"/proc": vol}),
    ("root", {"/": vol}),
    ("unclean path", {"/mnt/../x": vol}),
]:
    e = raises(f"mount refused: {name}", Exception, lambda: Sandbox.create(TEMPLATE, volume_mounts=mounts))
    check(f"mount refused: {name}: E2B's message", "invalid mounts" in str(e) and "volume mount #0" in str(e), e)

# Another team.
check("other team: lists none", Volume.list(api_key=OTHER) == [])
raises("other team: not found", VolumeNotFoundException, lambda: Volume.get_info(vol.volume_id, api_key=OTHER))
e = raises(
    "other team: cannot mount it",
    Exception,
    lambda: Sandbox.create(TEMPLATE, volume_mounts={"/mnt/d": "data"}, api_key=OTHER),
)
check("other team: as an unknown volume", "not found" in str(e), e)
check("other team: cannot destroy it", Volume.destroy(vol.volume_id, api_key=OTHER) is False)

for s in made:
    s.kill()
check("destroy: once unmounted", Volume.destroy(vol.volume_id) is True)
check("destroy: again is False", Volume.destroy(vol.volume_id) is False)
check("destroy: the other", Volume.destroy(longest.volume_id) is True)
raises("get_info: destroyed", (VolumeNotFoundException, NotFoundException), lambda: Volume.get_info(vol.volume_id))
summary()
