"""The checks the SDK scripts in tests/e2b count, shared by them.

`check` prints `ok NAME` or stops the script at the first failure (the
traceback says where); `raises` expects an exception and returns it;
`summary` prints `N passed, 0 failed`, the line the Rust runners look for
with the exact count they expect. The scripts run as `python SCRIPT`, so
this directory is on `sys.path`.
"""

passed = 0


def check(name, cond, detail=""):
    global passed
    if not cond:
        raise AssertionError(f"{name}: {detail}")
    passed += 1
    print(f"ok {name}", flush=True)


def raises(name, exc_types, fn):
    """`fn()` raises one of `exc_types`; returns the exception."""
    try:
        fn()
    except exc_types as e:
        check(name, True)
        return e
    except Exception as e:  # the wrong kind: say which
        check(name, False, f"raised {type(e).__name__}: {e}")
    check(name, False, "no exception")


def summary():
    print(f"{passed} passed, 0 failed", flush=True)
