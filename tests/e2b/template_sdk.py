"""E2B's template builder through the official Python client (e2b 2.63.0)
against brig: a template built from E2B's base image (brig's `base`) with
copies (a file, a directory, a symlink), run_cmd, envs, workdir, user and
start/ready commands, then a sandbox made from it; a rebuild served from
the cache; `build_in_background` with `get_build_status` polling; a build
from a Dockerfile; a build from an image in a local registry (when
E2B_REGISTRY_IMAGE names one); and the errors (a failing step, an unknown
base). Run by crates/e2b/tests/e2b_templates.rs with E2B_API_KEY,
E2B_API_URL and E2B_SANDBOX_URL set; prints `N passed, 0 failed`.

E2B_TEMPLATE_PREFIX makes the names unique to the run (the templates land
in the shared test home, where the next run finds them and the cache).
"""

import atexit
import os
import shutil
import tempfile
import time

from e2b import Sandbox, Template, wait_for_file, wait_for_port
from e2b.exceptions import BuildException

from sdk_checks import check, raises, summary

PREFIX = os.environ.get("E2B_TEMPLATE_PREFIX", "brigtest")
REGISTRY_IMAGE = os.environ.get("E2B_REGISTRY_IMAGE")
AUTH_IMAGE = os.environ.get("E2B_AUTH_REGISTRY_IMAGE")
AUTH_USER, _, AUTH_PASS = os.environ.get("E2B_AUTH_REGISTRY_CREDS", "").partition(":")
OTHER_KEY = os.environ.get("E2B_OTHER_KEY")
# What this run writes into its first build, so that build cannot be
# served from an earlier run's cache.
NONCE = str(time.time_ns())


def context():
    """A build context: a file, a directory with a subdirectory, a symlink."""
    d = tempfile.mkdtemp(prefix="brig-e2b-ctx-")
    with open(os.path.join(d, "hello.txt"), "w") as f:
        f.write("hello from the context\n")
    os.makedirs(os.path.join(d, "app", "sub"))
    with open(os.path.join(d, "app", "main.py"), "w") as f:
        f.write("print('main')\n")
    with open(os.path.join(d, "app", "sub", "data.txt"), "w") as f:
        f.write("nested\n")
    os.symlink("hello.txt", os.path.join(d, "link"))
    with open(os.path.join(d, "run.sh"), "w") as f:
        f.write("#!/bin/sh\necho script ran\n")
    return d


CTX = context()
atexit.register(shutil.rmtree, CTX, True)


def full_template(nonce):
    return (
        Template(file_context_path=CTX)
        .from_base_image()
        .copy("hello.txt", "/home/user/hello.txt")
        .copy("app", "/opt/app/")
        .copy("link", "/opt/link")
        .copy("run.sh", "/opt/run.sh", mode=0o755, user="user")
        .run_cmd(f"echo {nonce} > /opt/nonce && id -un > /opt/built-by && echo build-output-marker")
        .set_envs({"GREETING": "hi there", "MODE": "test"})
        .run_cmd('echo "$GREETING" > /opt/env.txt')
        .make_dir("/opt/made")
        .make_symlink("/opt/nonce", "/opt/nonce-link")
        .set_user("user")
        .run_cmd("id -un > /home/user/as.txt")
        .run_cmd("id -un > /opt/as-root.txt", user="root")
        .set_workdir("/home/user/work")
        .set_start_cmd(
            "sleep 0.3; echo started > /tmp/started; sleep 1000",
            wait_for_file("/tmp/started"),
        )
    )


def sh(sbx, cmd, **kw):
    return sbx.commands.run(cmd, **kw).stdout


ALIAS = f"{PREFIX}-full"
logs = []
t0 = time.monotonic()
info = Template.build(
    full_template(NONCE), ALIAS, skip_cache=True, cpu_count=1, memory_mb=1024, on_build_logs=logs.append
)
first = time.monotonic() - t0
messages = [str(e.message) for e in logs]
check("build: returns the template's ids", info.template_id == ALIAS and info.build_id, info)
check(
    "build: a RUN's output is in the build's logs",
    any("build-output-marker" in m for m in messages),
    messages,
)
check("build: logs name each step", any("[5/" in m and "RUN" in m for m in messages), messages)
check("exists: the built template", Template.exists(ALIAS))
check("exists: an unknown one is not", not Template.exists(f"{PREFIX}-never-built"))

sbx = Sandbox.create(template=ALIAS)
try:
    check("create: the copied file", sh(sbx, "cat /home/user/hello.txt") == "hello from the context\n")
    check(
        "create: the copied directory, nested",
        sh(sbx, "cat /opt/app/main.py /opt/app/sub/data.txt") == "print('main')\nnested\n",
    )
    check("create: the symlink stays a link", sh(sbx, "readlink /opt/link") == "hello.txt\n")
    check(
        "create: copy's mode and user",
        sh(sbx, "stat -c '%a %U' /opt/run.sh; /opt/run.sh") == "755 user\nscript ran\n",
    )
    check("create: run_cmd's result", sh(sbx, "cat /opt/nonce") == f"{NONCE}\n")
    check("create: steps ran as root before set_user", sh(sbx, "cat /opt/built-by") == "root\n")
    check("create: set_envs reached a later step", sh(sbx, "cat /opt/env.txt") == "hi there\n")
    check("create: set_envs are the sandbox's env", sh(sbx, "echo $GREETING-$MODE") == "hi there-test\n")
    check("create: make_dir and make_symlink", sh(sbx, "test -d /opt/made && readlink /opt/nonce-link") == "/opt/nonce\n")
    check("create: steps after set_user ran as it", sh(sbx, "cat /home/user/as.txt") == "user\n")
    check("create: run_cmd(user=root)", sh(sbx, "cat /opt/as-root.txt") == "root\n")
    check("create: the template's user is the default", sh(sbx, "id -un") == "user\n")
    check("create: the template's workdir is the default cwd", sh(sbx, "pwd") == "/home/user/work\n")
    check("create: the start command ran before create answered", sh(sbx, "cat /tmp/started") == "started\n")
    got = sbx.get_info()
    check(
        "create: the template's cpu_count and memory_mb",
        (got.cpu_count, got.memory_mb) == (1, 1024),
        (got.cpu_count, got.memory_mb),
    )
    check(
        "create: the start command runs on",
        "sleep 1000" in sh(sbx, "ps -eo args"),
    )
finally:
    sbx.kill()

# The same template again: every step from the cache, the same image.
logs2 = []
t0 = time.monotonic()
Template.build(full_template(NONCE), ALIAS, cpu_count=1, memory_mb=1024, on_build_logs=logs2.append)
second = time.monotonic() - t0
m2 = [str(e.message) for e in logs2]
cached = sum(1 for m in m2 if m.strip() == "(cached)")
check("rebuild: every step that makes a layer is cached", cached == 11, f"{cached} cached: {m2}")
def image_of(ms):
    ready = [m for m in ms if "is ready (image " in m]
    return ready[-1].split("(image ")[-1] if ready else None


check(
    "rebuild: the same image",
    image_of(messages) is not None and image_of(messages) == image_of(m2),
    (image_of(messages), image_of(m2)),
)
check("rebuild: uploads are skipped (the files are present)", any("Skipping upload" in m for m in m2), m2)
print(f"timing: first build {first:.2f} s, cached rebuild {second:.2f} s", flush=True)

# force_upload sends the files again although brig has them; the build is
# still all cached (the same files).
logs3 = []
Template.build(
    Template(file_context_path=CTX).from_template(ALIAS).copy("hello.txt", "/tmp/again.txt", force_upload=True),
    f"{PREFIX}-forced",
    on_build_logs=logs3.append,
)
m3 = [str(e.message) for e in logs3]
check("force_upload: uploaded again", any("Uploaded 'hello.txt'" in m for m in m3), m3)


# In the background, polled with the logs' offset.
# Its step leaves a process behind, holding the step's terminal: the step
# still ends when its command does.
bg = Template().from_template(ALIAS).run_cmd(
    "echo background-step && echo bg > /home/user/bg.txt && (sleep 600 &)"
)
binfo = Template.build_in_background(bg, f"{PREFIX}-bg", skip_cache=True)
offset, seen, status = 0, [], None
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    st = Template.get_build_status(binfo, logs_offset=offset)
    offset += len(st.log_entries)
    seen.extend(str(e.message) for e in st.log_entries)
    status = st.status.value
    if status in ("ready", "error"):
        break
    time.sleep(0.2)
check("background: ready", status == "ready", (status, seen))
check("background: its logs, once each", seen.count("background-step") == 1, seen)
sbx = Sandbox.create(template=f"{PREFIX}-bg")
try:
    check(
        "background: built on the first template",
        sh(sbx, "cat /home/user/bg.txt /home/user/hello.txt") == "bg\nhello from the context\n",
    )
    check(
        "background: the step ran as the base template's user",
        sh(sbx, "stat -c %U /home/user/bg.txt") == "user\n",
    )
finally:
    sbx.kill()

# A server as the start command, waited for with wait_for_port (ss).
server = (
    Template()
    .from_template(ALIAS)
    .set_start_cmd("cd /tmp && python3 -m http.server 8123", wait_for_port(8123))
)
Template.build(server, f"{PREFIX}-server")
sbx = Sandbox.create(template=f"{PREFIX}-server")
try:
    check(
        "wait_for_port: the server answers when create returns",
        sh(sbx, "curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8123/") == "200",
    )
finally:
    sbx.kill()

# A Dockerfile, parsed by the client into steps.
df = Template(file_context_path=CTX).from_dockerfile(
    "FROM e2bdev/base\n"
    "ENV DF_VAR=from-dockerfile\n"
    "WORKDIR /srv\n"
    "COPY hello.txt /srv/hello.txt\n"
    "RUN echo $DF_VAR > /srv/df.txt\n"
    "USER root\n"
)
Template.build(df, f"{PREFIX}-dockerfile")
sbx = Sandbox.create(template=f"{PREFIX}-dockerfile")
try:
    check(
        "dockerfile: ENV, WORKDIR, COPY and RUN",
        sh(sbx, "cat df.txt hello.txt; pwd") == "from-dockerfile\nhello from the context\n/srv\n",
    )
    check("dockerfile: USER root is the default user", sh(sbx, "id -un") == "root\n")
finally:
    sbx.kill()

# From an image in a registry (pulled by the build).
if REGISTRY_IMAGE:
    ri = Template().from_image(REGISTRY_IMAGE).run_cmd("echo from-registry > /data/built.txt")
    Template.build(ri, f"{PREFIX}-registry", skip_cache=True)
    sbx = Sandbox.create(template=f"{PREFIX}-registry")
    try:
        check(
            "registry: the image's files and the step's",
            sh(sbx, "cat /data/built.txt /data/file") == "from-registry\nfrom the top layer\n",
        )
        check("registry: the image's env", sh(sbx, "echo $GREETING") == "hello from the image\n")
    finally:
        sbx.kill()
    missing = REGISTRY_IMAGE.split("/")[0] + "/e2b/no-such-image:1"
    e = raises(
        "unknown image: BuildException",
        BuildException,
        lambda: Template.build(Template().from_image(missing).run_cmd("true"), f"{PREFIX}-noimage"),
    )
    check("unknown image: says it cannot be pulled", "cannot pull" in str(e) and "no-such-image" in str(e), str(e))
    check("unknown image: nothing registered", not Template.exists(f"{PREFIX}-noimage"))

# From a registry that wants credentials.
if AUTH_IMAGE:
    e = raises(
        "private registry: a wrong password fails the build",
        BuildException,
        lambda: Template.build(
            Template().from_image(AUTH_IMAGE, username=AUTH_USER, password="wrong").run_cmd("true"),
            f"{PREFIX}-private-bad",
        ),
    )
    check("private registry: says it cannot pull", "cannot pull" in str(e), str(e))
    Template.build(
        Template()
        .from_image(AUTH_IMAGE, username=AUTH_USER, password=AUTH_PASS)
        .run_cmd("echo authed > /data/authed.txt"),
        f"{PREFIX}-private",
    )
    sbx = Sandbox.create(template=f"{PREFIX}-private")
    try:
        check(
            "private registry: built from the image",
            sh(sbx, "cat /data/authed.txt /data/file") == "authed\nfrom the top layer\n",
        )
    finally:
        sbx.kill()
    e = raises(
        "private registry: no credentials, no image",
        BuildException,
        lambda: Template.build(Template().from_image(AUTH_IMAGE).run_cmd("true"), f"{PREFIX}-private-none"),
    )

# Another team's key: the template exists for it, but is not its own.
if OTHER_KEY:
    check("other team: exists says so", Template.exists(ALIAS, api_key=OTHER_KEY))
    e = raises(
        "other team: cannot build over it",
        BuildException,
        lambda: Template.build(Template().from_base_image(), ALIAS, api_key=OTHER_KEY),
    )
    check("other team: says whose it is", "another team" in str(e), str(e))
    raises(
        "other team: cannot start a sandbox of it",
        Exception,
        lambda: Sandbox.create(template=ALIAS, api_key=OTHER_KEY),
    )

# A failing step: its output and exit code, nothing registered.
failing = (
    Template()
    .from_template(ALIAS)
    .run_cmd("echo fine")
    .run_cmd("echo about-to-fail; echo on-stderr >&2; exit 3")
)
flogs = []
e = raises(
    "failing step: BuildException",
    BuildException,
    lambda: Template.build(failing, f"{PREFIX}-failing", on_build_logs=flogs.append),
)
msg = str(e)
check("failing step: the exit code", "exited with 3" in msg, msg)
check("failing step: its output in the error", "about-to-fail" in msg and "on-stderr" in msg, msg)
check("failing step: which step", "step 2" in msg, msg)
check(
    "failing step: the output is in the logs too",
    any("about-to-fail" in str(x.message) for x in flogs),
    [str(x.message) for x in flogs],
)
check("failing step: nothing registered", not Template.exists(f"{PREFIX}-failing"))
raises(
    "failing step: no sandbox of it",
    Exception,
    lambda: Sandbox.create(template=f"{PREFIX}-failing"),
)

e = raises(
    "unknown base: BuildException",
    BuildException,
    lambda: Template.build(Template().from_template(f"{PREFIX}-no-such-base").run_cmd("true"), f"{PREFIX}-orphan"),
)
check("unknown base: says so", "there is no template" in str(e), str(e))
check("unknown base: nothing registered", not Template.exists(f"{PREFIX}-orphan"))

# Tags: assigned to a build, a sandbox from one, listed, removed.
tagged = Template.assign_tags(ALIAS, ["prod", "stable"])
check("assign_tags: the tags", sorted(tagged.tags) == ["prod", "stable"], tagged)
check("assign_tags: the build", bool(tagged.build_id), tagged)
tsbx = Sandbox.create(template=f"{ALIAS}:prod")
check("a sandbox of a tag: the template's files", sh(tsbx, "cat /home/user/hello.txt") == "hello from the context\n")
tsbx.kill()
tags = Template.get_tags(ALIAS)
check(
    "get_tags: both, of that build",
    sorted(t.tag for t in tags) == ["prod", "stable"]
    and all(str(t.build_id) == str(tagged.build_id) for t in tags),
    tags,
)
Template.remove_tags(ALIAS, "stable")
check("remove_tags: one left", [t.tag for t in Template.get_tags(ALIAS)] == ["prod"])
raises("remove_tags of a tag it lacks", Exception, lambda: Template.remove_tags(ALIAS, "nope"))
if OTHER_KEY:
    raises("other team: no tags of it", Exception, lambda: Template.get_tags(ALIAS, api_key=OTHER_KEY))

e = raises(
    "a taken name: BuildException",
    BuildException,
    lambda: Template.build(Template().from_base_image().run_cmd("true"), "base"),
)
check("a taken name: says why", "named templates" in str(e), str(e))

summary()
