"""The command's entry (flows/__main__.py): what it sets for the command and its jobs before anything else runs."""

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

# After ``python -m flows ARGS``, MLflow's own verdict on whether it may send usage reports from this process (its jobs
# inherit the environment). The child's environment holds no variable MLflow reads as a test or CI run.
PROBE = """
import runpy, sys

sys.argv = ["flows", *sys.argv[1:]]
try:
    runpy.run_module("flows", run_name="__main__")
except SystemExit as exc:
    assert exc.code in (0, None), exc.code
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
