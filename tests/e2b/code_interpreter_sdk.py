"""A `code-interpreter-v1` sandbox driven by the official e2b-code-interpreter
client (2.11.5), unmodified: the whole `run_code` surface.

- create: `run_code` works as soon as create returns (brig answers create
  only once the in-sandbox server listens on 49999), with the create-time
  env vars, as the template's `user`;
- state across calls and `execution_count`;
- errors: name, value, traceback, output before the error, and the context
  still working (with its state) afterwards;
- results: the main result, str reprs, a matplotlib PNG (decoded, PNG
  magic checked), `display()` of several objects (in order, not main),
  rich formats (html, markdown, svg, json, latex, javascript), a pandas
  DataFrame;
- streaming: on_stdout/on_stderr/on_result/on_error called in the order
  the code produced them, and while the cell is still running;
- contexts: create (cwd, language), list, state isolated between contexts,
  a kernel that dies (an error, then a fresh kernel), restart (state
  gone, cwd kept), remove;
- languages: bash (state, user, envs), javascript (Deno's kernel: state);
- per-run envs (set for the run, gone after it, create-time ones kept);
- timeout: a run over its timeout raises TimeoutException, the kernel is
  interrupted, the context and its state still work;
- the AsyncSandbox client for a few calls;
- a second sandbox: its own create-time env vars and its own random numbers.

Run by crates/e2b/tests/e2b_control.rs with E2B_API_KEY, E2B_API_URL
and E2B_SANDBOX_URL set. Prints one line per check, then
`N passed, 0 failed`; the first failed check raises.
"""

import asyncio
import base64
import os
import re
import sys
import time

from e2b_code_interpreter import (
    AsyncSandbox,
    NotFoundException,
    Sandbox,
    SandboxException,
    TimeoutException,
)

from sdk_checks import check, raises, summary


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def plain(text):
    """Without ANSI colours (IPython colours its tracebacks, as upstream's do)."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)

# BRIG_ISOLATION: the same suite on another tier (brig's metadata key).
tier = {"brig.isolation": os.environ["BRIG_ISOLATION"]} if os.environ.get("BRIG_ISOLATION") else {}
# A vm guest under TCG restarts a kernel in a minute or more (a spare is
# taken, another started): more than the default 5 minutes for the suite.
life = {"timeout": 1200} if os.environ.get("BRIG_ISOLATION") == "vm" else {}
sbx = Sandbox.create(envs={"A": "1"}, metadata={"ci": "yes", **tier}, **life)
try:
    # ---- create: ready at once, env vars, user ----
    # No wait, no retry: the first call must find the server up.
    ex = sbx.run_code(
        "import os, getpass, pwd; x = 6 * 7; "
        "print(os.environ['A'], pwd.getpwuid(os.getuid()).pw_name, getpass.getuser(), os.getcwd()); x"
    )
    check("run_code right after create", ex.error is None, ex.error)
    check("envs and the default user", ex.logs.stdout == ["1 user user /home/user\n"], ex.logs)
    check("the result", ex.text == "42", ex.text)
    check("one main result", len(ex.results) == 1 and ex.results[0].is_main_result, ex.results)

    # ---- state and execution_count ----
    first = sbx.run_code("x + 1")
    check("state kept", first.text == "43", first.text)
    second = sbx.run_code("y = x * 2")
    check(
        "execution_count counts up",
        isinstance(first.execution_count, int)
        and second.execution_count == first.execution_count + 1,
        (first.execution_count, second.execution_count),
    )
    check("language=python is the default context", sbx.run_code("x", language="python").text == "42")
    check("an assignment has no result", second.results == [] and second.text is None, second.results)
    check("state: functions and imports", sbx.run_code("def f(a):\n    return a + y\nf(1)").text == "85")
    check("str result: quotes stripped", sbx.run_code("'abc'").text == "abc")

    # ---- errors ----
    ex = sbx.run_code("print('before')\n1 / 0")
    check("error: name", ex.error is not None and ex.error.name == "ZeroDivisionError", ex.error)
    check("error: value", ex.error.value == "division by zero", ex.error.value)
    tb = plain(ex.error.traceback)
    check("error: traceback", "ZeroDivisionError: division by zero" in tb and "----> 2 1 / 0" in tb, tb)
    check("error: output before it kept", ex.logs.stdout == ["before\n"] and ex.results == [], ex)
    ex = sbx.run_code("undefined_name")
    check("error: NameError", ex.error is not None and ex.error.name == "NameError"
          and "undefined_name" in ex.error.value, ex.error)
    ex = sbx.run_code("raise ValueError('custom message')")
    check("error: raised exception", (ex.error.name, ex.error.value) == ("ValueError", "custom message"),
          ex.error)
    ex = sbx.run_code("def broken(:\n    pass")
    check("error: SyntaxError", ex.error is not None and ex.error.name == "SyntaxError", ex.error)
    ex = sbx.run_code("x")
    check("after errors: state and results still work", ex.error is None and ex.text == "42", ex)

    # ---- results ----
    ex = sbx.run_code(
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3], [4, 1, 9])\n"
        "plt.title('brig')\n"
        "plt.show()"
    )
    pngs = [r for r in ex.results if r.png]
    check("matplotlib: one PNG result", ex.error is None and len(pngs) == 1, ex)
    png = base64.b64decode(pngs[0].png)
    check("matplotlib: a real PNG", png.startswith(PNG_MAGIC) and len(png) > 1000, png[:16])
    check("matplotlib: display data, not main", pngs[0].is_main_result is False)
    check("matplotlib: text repr", (pngs[0].text or "").startswith("<Figure"), pngs[0].text)

    ex = sbx.run_code(
        "from IPython.display import display, HTML, Markdown\n"
        "display(HTML('<b>one</b>'))\n"
        "display(Markdown('# two'))\n"
        "display(3)\n"
        "'main'"
    )
    check("display_data: every result, in order",
          [(r.html, r.markdown, r.text) for r in ex.results]
          == [("<b>one</b>", None, "<IPython.core.display.HTML object>"),
              (None, "# two", "<IPython.core.display.Markdown object>"),
              (None, None, "3"),
              (None, None, "main")],
          [(r.html, r.markdown, r.text) for r in ex.results])
    check("display_data: only the last is main",
          [r.is_main_result for r in ex.results] == [False, False, False, True],
          [r.is_main_result for r in ex.results])
    check("display_data: execution.text is the main result", ex.text == "main", ex.text)

    ex = sbx.run_code(
        "from IPython.display import display, SVG, JSON, Latex, Javascript\n"
        "display(SVG('<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"4\" height=\"4\"/>'))\n"
        "display(JSON({'a': [1, 2], 'b': 'c'}))\n"
        "display(Latex(r'$\\alpha^2$'))\n"
        "display(Javascript('console.log(1)'))\n"
        "class Rich:\n"
        "    def _repr_html_(self): return '<i>rich</i>'\n"
        "    def _repr_markdown_(self): return '*rich*'\n"
        "    def __repr__(self): return 'Rich()'\n"
        "Rich()"
    )
    svg, js_on, latex, javascript, rich = (ex.results + [None] * 5)[:5]
    check("rich: svg", svg is not None and svg.svg.startswith("<svg") and "svg" in svg.formats(), svg)
    check("rich: json", js_on is not None and js_on.json == {"a": [1, 2], "b": "c"}, js_on)
    check("rich: latex", latex is not None and latex.latex == "$\\alpha^2$", latex)
    check("rich: javascript", javascript is not None and javascript.javascript == "console.log(1)", javascript)
    check("rich: a custom object's formats, main",
          rich is not None and rich.is_main_result and (rich.html, rich.markdown, rich.text)
          == ("<i>rich</i>", "*rich*", "Rich()") and set(rich.formats()) == {"text", "html", "markdown"},
          rich)

    ex = sbx.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})")
    df = ex.results[0] if ex.results else None
    check("pandas DataFrame: html table and text",
          df is not None and "<table" in (df.html or "") and "a  b" in (df.text or ""), ex)

    # ---- streaming callbacks ----
    events = []
    ex = sbx.run_code(
        "import sys\n"
        "from IPython.display import display\n"
        "print('out1')\n"
        "print('err1', file=sys.stderr)\n"
        "display('shown')\n"
        "print('out2')\n"
        "raise RuntimeError('stop')",
        on_stdout=lambda m: events.append(("stdout", m.line)),
        on_stderr=lambda m: events.append(("stderr", m.line)),
        on_result=lambda r: events.append(("result", r.text)),
        on_error=lambda e: events.append(("error", e.name)),
    )
    check("callbacks: each kind, in order",
          events == [("stdout", "out1\n"), ("stderr", "err1\n"), ("result", "shown"),
                     ("stdout", "out2\n"), ("error", "RuntimeError")], events)
    check("callbacks: the execution has the same",
          ex.logs.stdout == ["out1\n", "out2\n"] and ex.logs.stderr == ["err1\n"]
          and ex.error.name == "RuntimeError", ex)

    got = []
    t0 = time.monotonic()
    ex = sbx.run_code(
        "import time\nprint('early', flush=True)\ntime.sleep(1.5)\nprint('late')",
        on_stdout=lambda m: got.append((time.monotonic() - t0, m.line, m.timestamp, m.error)),
    )
    total = time.monotonic() - t0
    check("streaming: stdout arrives while the cell runs",
          [g[1] for g in got] == ["early\n", "late\n"] and got[0][0] < total - 1.0,
          (got, total))
    check("streaming: messages carry a timestamp and error=False",
          all(g[2] and g[3] is False for g in got), got)

    # ---- per-run envs ----
    ex = sbx.run_code("import os\nos.environ.get('RUN_VAR'), os.environ.get('A')", envs={"RUN_VAR": "run"})
    check("envs: set for the run, create-time ones kept", ex.text == "('run', '1')", ex.text)
    ex = sbx.run_code("os.environ.get('RUN_VAR', 'unset')")
    check("envs: gone after the run", ex.text == "unset", ex.text)
    ex = sbx.run_code("os.environ.get('A')", envs={"A": "override"})
    check("envs: a run's value wins", ex.text == "override", ex.text)
    check("envs: the create-time value is back", sbx.run_code("os.environ.get('A')").text == "1")

    # ---- contexts ----
    ctx = sbx.create_code_context(cwd="/tmp", language="python")
    check("create_code_context: cwd and language", (ctx.cwd, ctx.language) == ("/tmp", "python") and ctx.id,
          ctx)
    ex = sbx.run_code("import os\nos.getcwd()", context=ctx)
    check("context: runs in its cwd", ex.text == "/tmp", ex.text)
    ex = sbx.run_code("x", context=ctx)
    check("context: isolated from the default one", ex.error is not None and ex.error.name == "NameError",
          ex.error)
    sbx.run_code("z = 'ctx'", context=ctx)
    check("context: its own state", sbx.run_code("z", context=ctx).text == "ctx")
    ex = sbx.run_code("z")
    check("context: the default one does not see it", ex.error is not None and ex.error.name == "NameError",
          ex.error)
    bash_ctx = sbx.create_code_context(language="bash")
    check("create_code_context: bash, default cwd",
          (bash_ctx.language, bash_ctx.cwd) == ("bash", "/home/user"), bash_ctx)
    listed = {c.id: c for c in sbx.list_code_contexts()}
    check("list_code_contexts: both new ones", ctx.id in listed and bash_ctx.id in listed, listed)
    check("list_code_contexts: their fields",
          (listed[ctx.id].cwd, listed[ctx.id].language) == ("/tmp", "python"), listed[ctx.id])
    check("list_code_contexts: the default python one",
          any(c.language == "python" and c.cwd == "/home/user" for c in listed.values()), listed)
    ex = sbx.run_code("import os\nos._exit(1)", context=ctx)
    check("context: a kernel that dies is an error", ex.error is not None, ex)
    ex = sbx.run_code("import os\nos.getcwd(), 'z' in globals()", context=ctx)
    check("context: comes back afresh after its kernel died", ex.text == "('/tmp', False)", ex)
    sbx.run_code("z = 'again'", context=ctx)
    sbx.restart_code_context(ctx)
    ex = sbx.run_code("z", context=ctx)
    check("restart_code_context: state gone", ex.error is not None and ex.error.name == "NameError", ex.error)
    check("restart_code_context: cwd kept", sbx.run_code("import os\nos.getcwd()", context=ctx).text == "/tmp")
    sbx.remove_code_context(ctx)
    check("remove_code_context: not listed", ctx.id not in {c.id for c in sbx.list_code_contexts()})
    raises("remove_code_context: running in it is NotFound", (NotFoundException,),
           lambda: sbx.run_code("1", context=ctx))
    raises("create_code_context: a cwd that does not exist", (SandboxException,),
           lambda: sbx.create_code_context(cwd="/no/such/dir"))
    check("default context untouched by all that", sbx.run_code("x").text == "42")

    # ---- bash ----
    ex = sbx.run_code("echo $((6 * 7)); B=kept; whoami; pwd", language="bash")
    check("bash: runs", ex.error is None and ex.logs.stdout and "".join(ex.logs.stdout) == "42\nuser\n/home/user\n",
          ex.logs)
    check("bash: state across calls", "".join(sbx.run_code("echo $B", language="bash").logs.stdout) == "kept\n")
    ex = sbx.run_code("echo $RUN_VAR $A", language="bash", envs={"RUN_VAR": "bashrun"})
    check("bash: per-run and create-time envs", "".join(ex.logs.stdout) == "bashrun 1\n", ex.logs)
    ex = sbx.run_code("echo ${RUN_VAR:-unset}", language="bash")
    check("bash: per-run envs gone after", "".join(ex.logs.stdout) == "unset\n", ex.logs)
    ex = sbx.run_code("echo in-ctx; pwd", context=bash_ctx)
    check("bash: its own context", "".join(ex.logs.stdout) == "in-ctx\n/home/user\n", ex.logs)
    ex = sbx.run_code("echo $B", context=bash_ctx)
    check("bash: contexts isolated", "".join(ex.logs.stdout) == "\n", ex.logs)
    sbx.remove_code_context(bash_ctx)

    # ---- javascript: Deno's kernel, which code-interpreter-v1 installs ----
    specs = sbx.commands.run(
        "python3 -c 'from jupyter_client.kernelspec import KernelSpecManager as M; "
        "print(*M().find_kernel_specs())'"
    ).stdout.split()
    check("javascript: the template has Deno's kernel", "deno" in specs, specs)
    ex = sbx.run_code("const n = 6 * 7; n", language="javascript")
    check("javascript: runs", ex.text == "42", ex)
    ex = sbx.run_code("n + 1", language="js")
    check("javascript: state across calls", ex.text == "43", ex)
    e = raises("a language without a kernel is refused", (SandboxException,),
               lambda: sbx.run_code("1", language="cobol"))
    check("the refusal says why", "no kernel for language 'cobol'" in str(e), e)

    # ---- timeout ----
    t0 = time.monotonic()
    raises("timeout: a run over it raises TimeoutException", (TimeoutException,),
           lambda: sbx.run_code("import time\nx_before = x\ntime.sleep(60)\nx = 0", timeout=2))
    # The Python client's transport (pyqwest) makes `timeout=2` a 4 s
    # deadline (read + write; docs/e2b.md); the JS client's is exact.
    check("timeout: raised on time", 1.9 < time.monotonic() - t0 < 6, time.monotonic() - t0)
    t0 = time.monotonic()
    ex = sbx.run_code("x, x_before")
    # The interrupt left the kernel (and `x`) alone; the sleep never finished.
    check("timeout: the context still works, state kept", ex.error is None and ex.text == "(42, 42)", ex)
    check("timeout: the kernel was interrupted at once", time.monotonic() - t0 < 10, time.monotonic() - t0)

    # ---- the async client ----
    async def async_calls():
        asbx = await AsyncSandbox.connect(sbx.sandbox_id)
        ex = await asbx.run_code("x * 2")
        check("async: run_code shares the default context", ex.text == "84", ex.text)
        lines = []

        async def on_stdout(m):
            lines.append(m.line)

        ex = await asbx.run_code("print('a'); print('b')", on_stdout=on_stdout)
        # ipykernel batches stdout: one or two messages.
        check("async: awaited callbacks", "".join(lines) == "a\nb\n", lines)
        actx = await asbx.create_code_context(cwd="/tmp")
        ex = await asbx.run_code("import os\nos.getcwd()", context=actx)
        check("async: contexts", ex.text == "/tmp", ex.text)
        await asbx.remove_code_context(actx)
        ex = await asbx.run_code("1 / 0")
        check("async: errors", ex.error is not None and ex.error.name == "ZeroDivisionError", ex.error)

    asyncio.run(async_calls())

    # ---- a second sandbox: its own env vars and its own random numbers ----
    # (on the vm tier both are restored from one warm start: the same
    # kernel, checkpointed once it was ready.)
    sbx2 = Sandbox.create(envs={"B": "2"}, metadata={"ci": "yes", **tier})
    try:
        draw = "import os, random; (os.environ.get('A'), os.environ.get('B'), random.random())"
        one, two = sbx.run_code(draw), sbx2.run_code(draw)
        check("second sandbox: its own env vars", one.error is None and two.error is None
              and one.text.startswith("('1', None,") and two.text.startswith("(None, '2',"),
              (one, two))
        check("second sandbox: its own random numbers", one.text != two.text, (one.text, two.text))
    finally:
        sbx2.kill()
finally:
    check("kill", sbx.kill() is True)
summary()
# Skip the interpreter's shutdown: the client's native HTTP extension
# (pyqwest, loaded for the async client) aborts now and then in a thread of
# its own while Python tears down (see envd_sdk.py). Its crash says nothing
# about brig.
sys.stderr.flush()
os._exit(0)
