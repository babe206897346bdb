"""The command's entry (flows/__main__.py): what it sets for the command and its jobs before anything else runs."""

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

# After ``python -m flows ARGS``, MLflow's own verdict on whether it may send usage reports from this process (its jobs
# inherit the environment), and how many objects the command left frozen for the interpreter's end. The child's
# environment holds no variable MLflow reads as a test or CI run.
PROBE = """
import gc, runpy, sys

sys.argv = ["flows", *sys.argv[1:]]
try:
    runpy.run_module("flows", run_name="__main__")
except SystemExit as exc:
    assert exc.code in (0, None), exc.code
print("frozen:", gc.get_freeze_count())
from mlflow.telemetry.utils import is_telemetry_disabled

print("telemetry disabled:", is_telemetry_disabled())
"""


@pytest.mark.parametrize("chosen,disabled", [(None, True), ("false", False), ("true", True)])
def test_mlflow_usage_reports_are_off_unless_the_user_turns_them_on(tmp_path, chosen, disabled):
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    if chosen is not None:
        env["MLFLOW_DISABLE_TELEMETRY"] = chosen
    proc = subprocess.run([sys.executable, "-c", PROBE, "--help"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == f"telemetry disabled: {disabled}"


def test_what_a_command_loaded_is_frozen_for_the_interpreters_end(tmp_path):
    """The interpreter's end walks every live object with the cycle collector a few times (about 2 s of CPU after a training
    command's last line): the command freezes them as it returns, even when it ends by SystemExit (here argparse's)."""
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", PROBE, "--help"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    frozen = int(proc.stdout.split("frozen:")[1].split()[0])
    assert frozen > 10_000  # the CLI's modules (about 40,000 objects); none without the freeze
