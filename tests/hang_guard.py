"""A pytest plugin that ends a test process stuck where pytest-timeout's signal cannot reach, with every thread's stack.

pytest-timeout (pytest.ini's ``timeout``, a test's ``timeout`` mark) fails a test that runs too long by raising in its
main thread from a SIGALRM handler, which runs only when that thread next executes Python code. A test blocked inside
a library's C code, or a teardown that blocks in turn after that failure, would hold its process until something from
outside killed the whole run, and say nothing of where it stood. This plugin arms the interpreter's faulthandler
watchdog for each test (setup, call and teardown together) at the test's own timeout plus ``GRACE_S``: past it, every
thread's stack is written to the stderr the session started with and the process exits. Under xdist that is reported
as a crash of that test, with the stacks above it; a new worker takes the rest.

Loaded by tests/conftest.py (``pytest_plugins``); ``KARMAN_TEST_HANG_GRACE_S`` sets the grace (tests/test_hang_guard.py
uses a short one)."""

import faulthandler
import os
import sys

import pytest

GRACE_S = 300.0
_FD = pytest.StashKey[int]()
_GRACE = pytest.StashKey[float]()


def _grace() -> float:
    raw = os.environ.get("KARMAN_TEST_HANG_GRACE_S", str(GRACE_S))
    try:
        return float(raw)
    except ValueError:
        raise pytest.UsageError(f"KARMAN_TEST_HANG_GRACE_S={raw!r} is not a number of seconds") from None


def limit_s(item: pytest.Item) -> float | None:
    """The test's pytest-timeout limit (its ``timeout`` mark, else ``--timeout``, else the ini's ``timeout``, pytest-timeout's
    own order) plus the grace; None without one (0 turns pytest-timeout off, and this with it)."""
    marker = item.get_closest_marker("timeout")
    if marker is not None and (marker.args or "timeout" in marker.kwargs):
        timeout = marker.args[0] if marker.args else marker.kwargs["timeout"]
    elif getattr(item.config.option, "timeout", None) is not None:
        timeout = item.config.option.timeout
    else:
        try:
            timeout = item.config.getini("timeout")
        except ValueError:  # pytest-timeout not loaded: no limit to go beyond
            return None
    if timeout in (None, "") or float(timeout) <= 0:
        return None
    return float(timeout) + item.config.stash[_GRACE]


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_GRACE] = _grace()  # read once; a bad value is refused before any test runs
    try:
        fd = sys.stderr.fileno()
        if fd < 0:
            raise ValueError
    except (AttributeError, ValueError, OSError):  # xdist's workers replace sys.stderr with an object without a descriptor
        fd = sys.__stderr__.fileno()
    config.stash[_FD] = os.dup(fd)  # the session's stderr, before any test's capture replaces descriptor 2


def pytest_unconfigure(config: pytest.Config) -> None:
    faulthandler.cancel_dump_traceback_later()
    if _FD in config.stash:
        os.close(config.stash[_FD])
        del config.stash[_FD]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    limit = limit_s(item)
    if limit is None:
        return (yield)
    faulthandler.dump_traceback_later(limit, exit=True, file=item.config.stash[_FD])
    try:
        return (yield)
    finally:
        faulthandler.cancel_dump_traceback_later()
