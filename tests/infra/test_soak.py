"""The soak test: several benchmarks at once against one tracking server that is restarted under them, nothing reported lost.

Runs ``python -m infra.soak`` as a user would (real Prefect and MLflow servers on 127.0.0.1, real
benchmark commands, a real restart of the tracking server) and checks its verdict; its bad input
is refused in one line."""

import json
import subprocess
import sys

import pytest

from infra.soak import _most_at_once, benchmark_spec
from tasks.common.specs import BenchmarkSpec
from tests.conftest import ROOT


def soak(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "infra.soak", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_each_benchmark_of_the_soak_is_one_training_and_one_rollout_cell_of_its_own():
    specs = [BenchmarkSpec.model_validate(benchmark_spec(i, 2)) for i in range(3)]
    assert [s.train.seed for s in specs] == [0, 1, 2] and len({s.aggregate.name for s in specs}) == 3
    assert all(s.infer_cells() == [("cpu", "full", 1)] and s.batch_sizes == [4] for s in specs)
    assert _most_at_once([(0, 10), (5, 15), (9, 20), (16, 30)]) == 3 and _most_at_once([(0, 5), (5, 9)]) == 1


def test_bad_input_is_refused_in_one_line(tmp_path):
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("")
    for args, line in ((["--benchmarks", "0"], "--benchmarks 0 is outside 1..32"),
                       (["--folder", str(tmp_path / "used")], f"--folder '{tmp_path / 'used'}' is not empty; give a new or empty folder")):
        proc = soak(*args, timeout=60)
        assert (proc.returncode, proc.stderr.strip().splitlines()) == (2, [f"python -m infra.soak: error: {line}"])


@pytest.mark.full
@pytest.mark.timeout(1200)
def test_two_benchmarks_at_once_survive_a_tracking_server_restart_and_lose_nothing(tmp_path):
    proc = soak("--benchmarks", "2", "--epochs", "1", "--folder", str(tmp_path / "soak"), "--json")
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print("soak:", json.dumps(result))  # the figures (pytest -s shows them)
    assert result["lost"] == [] and result["left_running"] == []
    assert result["cells"] == 4 and result["benchmarks_running_at_restart"] == 2 and result["cells_at_once"] >= 2
    assert result["restart_downtime_s"] > 0 and result["metric_values"] > 0 and result["artifacts"] >= 4
