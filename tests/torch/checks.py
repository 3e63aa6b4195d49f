"""What the test scripts under tests/torch share: expectations gathered
as they fail, and the last line that says how the script ended
("<NAME> OK", or each failure and exit 1), which tests/torch_worker_test
reads."""
import sys

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


def expect_raises(kind, needle, fn):
    """fn() must raise `kind` with `needle` in its message."""
    try:
        fn()
    except kind as e:  # pylint: disable=broad-except
        if needle not in str(e):
            failures.append(f"{kind.__name__} without {needle!r}: {e}")
        else:
            print(f"refused as expected: {type(e).__name__}: {e}", flush=True)
        return
    except Exception as e:  # pylint: disable=broad-except
        failures.append(f"expected {kind.__name__} ({needle}), got {type(e).__name__}: {e}")
        return
    failures.append(f"expected {kind.__name__} ({needle}), nothing raised")


def finish(name):
    if failures:
        print(f"{name} FAILED:\n  " + "\n  ".join(failures), flush=True)
        sys.exit(1)
    print(f"{name} OK", flush=True)
