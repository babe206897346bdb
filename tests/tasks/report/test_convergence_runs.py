"""The convergence check on real runs: a digits cell whose learning rate is ten times the one it records is flagged against the committed reference points; the unaltered cell beside it is not."""

import json
import shutil

import pytest

from tests.conftest import ROOT, run_cli, run_in_process

OPTIMISER = "self.opt = torch.optim.SGD(self.net.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM)"
ALTERED, UNALTERED = 64, 128  # the batch size whose runs the altered code trains at ten times the rate, and one it leaves as it is


def _code_with_a_tenfold_rate(folder):
    """A copy of the project's code whose digits torch trainer steps at ten times the workload's learning rate at batch ALTERED,
    and only there, while its record still says the workload's rate: the kind of bug a convergence check is for."""
    for part in ("flows", "tasks", "models"):
        shutil.copytree(ROOT / part, folder / part, ignore=shutil.ignore_patterns("__pycache__"))
    module = folder / "tasks" / "workloads" / "digits" / "torch.py"
    text = module.read_text()
    assert OPTIMISER in text
    module.write_text(text.replace(OPTIMISER, OPTIMISER.replace("lr=LEARNING_RATE", f"lr=LEARNING_RATE * (10 if batch_size == {ALTERED} else 1)")))
    return folder


@pytest.mark.full
def test_a_cell_at_ten_times_the_learning_rate_is_flagged_and_the_unaltered_cell_is_not(workdir, tmp_path_factory):
    done = run_in_process("generate", "--workload", "digits", "--dataset", "digits", "--json", cwd=workdir)
    assert done.returncode == 0, done.stderr[-3000:]
    changed = _code_with_a_tenfold_rate(tmp_path_factory.mktemp("altered"))
    # validating every epoch, as the references did, stopping at the target; 6 epochs: past any mean the references accept at batch
    # ALTERED for one run, and enough for UNALTERED's to reach the target
    done = run_cli("train", "--workload", "digits", "--dataset", "digits", "--batch-sizes", f"{ALTERED},{UNALTERED}", "--epochs", "6", "--validate-every", "1",
                   "--stop-at-target", "--json", cwd=workdir, env={"PYTHONPATH": str(changed)})
    assert done.returncode == 0, done.stderr[-3000:]
    out = run_in_process("aggregate", "--runs", "all", "--name", "rcp-check", "--json", cwd=workdir)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    verdicts = {v["batch_size"]: v for v in summary["convergence"]}
    assert set(verdicts) == {ALTERED, UNALTERED}, summary["convergence"]
    unaltered = verdicts[UNALTERED]
    assert unaltered["verdict"] == "within" and unaltered["low"] <= unaltered["epochs_mean"] <= unaltered["high"], unaltered
    flagged = verdicts[ALTERED]
    assert flagged["verdict"] == "slow" and flagged["why"].startswith("1 of 1 runs never reached the target"), flagged
    report = (workdir / "data" / "reports" / "rcp-check" / "report.md").read_text()
    assert "## Convergence against the reference points" in report and report.count("**too slow**") == 1
    assert f"Flagged: digits torch cpu x1 b{ALTERED} converged abnormally slow" in report
