"""A test stuck where pytest-timeout's signal cannot reach ends in a reported crash with its stack (tests/hang_guard.py)."""

import subprocess
import sys
import textwrap
import time

import pytest

from tests.conftest import ROOT
from tests.hang_guard import GRACE_S


def _pytest(folder, *args: str, grace: str | None = None) -> subprocess.CompletedProcess:
    """pytest with the guard in ``folder``, in a bare environment (the project on its path), the grace given or the guard's own."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), **({"KARMAN_TEST_HANG_GRACE_S": grace} if grace is not None else {})}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.hang_guard", "-p", "no:cacheprovider", *args], cwd=folder,
                          env=env, capture_output=True, text=True, timeout=120)


def test_a_test_blocked_past_its_own_timeout_is_ended_with_its_stack_and_the_others_still_run(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\ntimeout = 100\n")  # the stuck test's own mark (1 s) is the one that counts
    (tmp_path / "test_stuck.py").write_text(textwrap.dedent("""\
        import signal, time
        import pytest

        @pytest.mark.timeout(1)
        def test_stuck_where_no_signal_reaches():
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})  # as a C call that never returns to Python
            time.sleep(60)
        """))
    (tmp_path / "test_fine.py").write_text("def test_fine():\n    assert True\n")
    started = time.monotonic()
    proc = _pytest(tmp_path, "-n", "2", "--dist", "loadfile", "--max-worker-restart", "1", "-rA", grace="2")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert time.monotonic() - started < 60, out  # ended at 1 + 2 s (twice: xdist gives it one new worker), not at 60 s
    assert "Timeout (0:00:03)!" in out and "in test_stuck_where_no_signal_reaches" in out, out  # the stack, where it stood
    assert "crashed while running 'test_stuck.py::test_stuck_where_no_signal_reaches'" in out, out
    assert "PASSED test_fine.py::test_fine" in out, out


def test_a_bad_grace_is_refused_before_any_test_runs(tmp_path):
    (tmp_path / "test_fine.py").write_text("def test_fine():\n    assert True\n")
    proc = _pytest(tmp_path, grace="soon")
    assert proc.returncode == 4, proc.stdout + proc.stderr  # pytest's usage error
    assert "KARMAN_TEST_HANG_GRACE_S='soon' is not a number of seconds" in proc.stderr, proc.stderr
    assert GRACE_S >= 60  # the suite's own grace leaves a slow teardown time to end by itself


def test_the_limit_is_pytest_timeouts_own_mark_then_option_then_ini_plus_the_grace(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\ntimeout = 50\n")
    (tmp_path / "conftest.py").write_text("from tests.hang_guard import limit_s\n\n"
                                          "def pytest_runtest_setup(item):\n    print('LIMIT', item.name, limit_s(item))\n")
    (tmp_path / "test_x.py").write_text("import pytest\n\n@pytest.mark.timeout(3)\ndef test_marked():\n    pass\n\n"
                                        "def test_plain():\n    pass\n")
    limits = {}
    for extra in ([], ["--timeout", "7"], ["--timeout", "0"]):
        proc = _pytest(tmp_path, "-s", "-q", *extra)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        printed = [line.split("LIMIT ", 1)[1].split() for line in proc.stdout.splitlines() if "LIMIT " in line]  # after a progress dot
        limits[" ".join(extra)] = {name: limit for name, limit in printed}
    assert limits[""] == {"test_marked": str(3 + GRACE_S), "test_plain": str(50 + GRACE_S)}
    assert limits["--timeout 7"] == {"test_marked": str(3 + GRACE_S), "test_plain": str(7 + GRACE_S)}
    assert limits["--timeout 0"] == {"test_marked": str(3 + GRACE_S), "test_plain": "None"}
