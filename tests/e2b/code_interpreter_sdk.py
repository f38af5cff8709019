"""A `code-interpreter-v1` sandbox from the official e2b-code-interpreter
client: `run_code` works as soon as create returns (brig answers create
only once the in-sandbox server listens on 49999), with the create-time
env vars, as the template's `user`. Run by
crates/server/tests/e2b_control.rs with E2B_API_KEY, E2B_API_URL and
E2B_SANDBOX_URL set. Prints `N passed, 0 failed`.
"""

from e2b_code_interpreter import Sandbox

passed = 0


def check(name, cond, detail=""):
    global passed
    if not cond:
        raise AssertionError(f"{name}: {detail}")
    passed += 1
    print(f"ok {name}", flush=True)


sbx = Sandbox.create(envs={"A": "1"}, metadata={"ci": "yes"})
try:
    # No wait, no retry: the first call must find the server up.
    ex = sbx.run_code(
        "import os, getpass, pwd; x = 6 * 7; "
        "print(os.environ['A'], pwd.getpwuid(os.getuid()).pw_name, getpass.getuser(), os.getcwd()); x"
    )
    check("run_code right after create", ex.error is None, ex.error)
    check("envs and the default user", ex.logs.stdout == ["1 user user /home/user\n"], ex.logs)
    check("the result", ex.text == "42", ex.text)
    check("state kept", sbx.run_code("x + 1").text == "43")
finally:
    check("kill", sbx.kill() is True)
print(f"{passed} passed, 0 failed")
