"""python -m flows history: each cell's results across code versions from the experiment's runs; a slowdown injected into the training loop of one cell is flagged, an unchanged cell is not, and the report shows the flagged cell's trend."""

import json
import shutil

from tests.conftest import ROOT, run_cli, run_in_process

STEP = '''                values, (over, stop, train_s) = trainer.step(batch, [over, float(signalled or 0), elapsed], fraction)
'''


def _code_with_a_slower_step(folder):
    """A copy of the project's code (outside a git checkout: its version is its sources' digest) whose training loop sleeps 0.5 s
    after every step at batch 32, and only there: 55 s more an epoch, beyond what a loaded host's drift does (an epoch there
    took 1-6 s; an unchanged cell once took 3.1 times as long on a host losing CPU to its hypervisor)."""
    for part in ("flows", "tasks", "models"):
        shutil.copytree(ROOT / part, folder / part, ignore=shutil.ignore_patterns("__pycache__"))
    loop = folder / "tasks" / "common" / "runtimes" / "loop.py"
    text = loop.read_text()
    assert STEP in text
    loop.write_text(text.replace(STEP, STEP + "                time.sleep(0.5 if batch_size == 32 else 0.0)\n"))
    return folder


def _train(cwd, env=None, command=run_in_process):
    done = command("train", "--workload", "digits", "--dataset", "mnist", "--batch-sizes", "32,128", "--epochs", "1", "--validate-every", "0",
                   "--json", cwd=cwd, env=env)
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_slower_step_after_a_code_change_is_flagged_and_an_unchanged_cell_is_not(workdir, tmp_path_factory):
    done = run_in_process("generate", "--workload", "digits", "--dataset", "mnist", "--json", cwd=workdir)
    assert done.returncode == 0, done.stderr[-3000:]
    _train(workdir)  # this checkout's code: a run of each cell
    changed = _code_with_a_slower_step(tmp_path_factory.mktemp("changed"))
    _train(changed, env={"PYTHONPATH": str(changed)}, command=run_cli)  # its own process: the changed code imported afresh
    # one run a version: the bound is --min-change alone, 400 %, which a loaded host's drift stays under and the sleep passes
    out = run_in_process("history", "--min-change", "4.0", "--json", cwd=workdir)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    cells = {c["cell"].rsplit("| batch ", 1)[1]: c for c in result["cells"]}
    assert set(cells) == {"32", "128"}
    for cell in cells.values():  # both versions of each cell, in the order they ran
        assert [v["runs"] for v in cell["versions"]] == [1, 1]
        assert cell["versions"][0]["version"].startswith("git:") and cell["versions"][1]["version"].startswith("src:")
    assert len(cells["32"]["flags"]) == 1, out.stderr[-3000:]
    (flag,) = cells["32"]["flags"]
    assert flag["change"] > 4.0 and flag["to"].startswith("src:")
    assert cells["128"]["flags"] == [] and [c["cell"] for c in result["flagged"]] == [cells["32"]["cell"]]
    assert "FLAGGED" in out.stderr and out.stderr.count("FLAGGED") == 1
    # the report shows each cell's trend over both versions and flags the slower one's step with the versions on both sides
    # (at the report's 10 %, which a loaded host's drift may pass at batch 128 too: only the injected step is asserted)
    done = run_in_process("aggregate", "--runs", "all", "--name", "history", "--json", cwd=workdir)
    assert done.returncode == 0, done.stderr[-3000:]
    report = (workdir / "data" / "reports" / "history" / "report.md").read_text()
    section = report.split("## History of these cells", 1)[1].split("\n## ", 1)[0]
    (row,) = [line for line in section.splitlines() if line.startswith("| ") and line.split(" | ")[0].endswith("batch 32")]
    assert f"{flag['from']} (1) → {flag['to']} (1)" in row and "▁█" in row
    assert f"**{flag['change']:+.0%}** ({flag['from']} → {flag['to']}, beyond" in row
    assert any(line.split(" | ")[0].endswith("batch 128") for line in section.splitlines() if line.startswith("| "))
