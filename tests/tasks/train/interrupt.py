"""Helpers for the resume tests of every workload and framework: a training stopped after a validated epoch, and resumed.

A run stops the ways users' trainings stop: SIGTERM to the command (a scheduler's or a user's stop: the run stops at the
next step, keeps the epoch's checkpoint, ends KILLED and says how to resume) or SIGKILL to its whole process group (a
pre-empted node: nothing runs on, the run stays open). The checkpoints they resume from hold that epoch's validation.
The SIGTERM goes to a command run in the test process (its handler installed as in a command of its own); the kill, to a
command started as a process of its own; tests/flows/test_lifetime.py signals commands of their own both ways."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import _command_env, run_in_process

EPOCH_LINE = re.compile(r"\] epoch (\d+): [\d.]+ s,")  # a run's line at an epoch's end, after its validation and checkpoint


def _ended_epoch(text: str) -> int:
    return max((int(n) for n in EPOCH_LINE.findall(text)), default=0)


def _epoch_lines(proc: subprocess.Popen, lines: list[str], ended: dict[str, int]) -> None:
    for line in proc.stderr:
        lines.append(line)
        ended["epoch"] = max(ended.get("epoch", 0), _ended_epoch(line))


def stop_after_epoch(workdir: Path, args: tuple[str, ...], epoch: int, sig: int, env: dict | None = None, timeout: float = 600) -> str:
    """Run ``python -m flows train *args`` and send ``sig`` once its log says epoch ``epoch`` ended (that epoch validated
    and checkpointed), then wait for its end: SIGTERM to the command, which stops its child, closes the run and says how
    to resume (the command in this test process, ``run_in_process``: its job forked from this process's warm servers
    instead of a new command's), SIGKILL to the whole process group of a command started as a process of its own. The
    stopped run's id; the run did not finish."""
    runs = workdir / "data" / "runs"
    before = {p.name for p in runs.iterdir()} if runs.exists() else set()
    assert sig in (signal.SIGTERM, signal.SIGKILL), sig
    lines = _stopped_in_process(workdir, args, epoch, env) if sig == signal.SIGTERM else _killed_group(workdir, args, epoch, env, timeout)
    started = sorted({p.name for p in runs.iterdir()} - before)
    run_id = args[args.index("--resume") + 1] if "--resume" in args else started[-1]
    assert not (runs / run_id / "model").exists(), "the run finished before it could be stopped"
    if sig == signal.SIGTERM:  # the command's verdict: where it stopped, what is kept, how to go on
        verdict = lines[-1].strip()
        assert f"stopped by {signal.Signals(sig).name} at epoch " in verdict, "".join(lines[-30:])
        assert f"resume with python -m flows train --resume {run_id}" in verdict, verdict
    return run_id


def _stopped_in_process(workdir: Path, args: tuple[str, ...], epoch: int, env: dict | None) -> list[str]:
    proc = run_in_process("train", *args, cwd=workdir, env=env, sigterm_when=lambda text: _ended_epoch(text) >= epoch)
    lines = proc.stderr.splitlines(keepends=True)
    assert _ended_epoch(proc.stderr) >= epoch, f"training ended before epoch {epoch}:\n" + "".join(lines[-30:])
    assert proc.returncode == 128 + signal.SIGTERM, "".join(lines[-30:])
    return lines


def _killed_group(workdir: Path, args: tuple[str, ...], epoch: int, env: dict | None, timeout: float) -> list[str]:
    proc = subprocess.Popen([sys.executable, "-m", "flows", "train", *args], cwd=workdir, env={**os.environ, **_command_env(env)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines: list[str] = []
    ended: dict[str, int] = {}
    reader = threading.Thread(target=_epoch_lines, args=(proc, lines, ended), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + timeout
        while ended.get("epoch", 0) < epoch:
            assert proc.poll() is None, f"training ended before epoch {epoch}:\n" + "".join(lines[-30:])
            assert time.monotonic() < deadline, f"no epoch {epoch} within {timeout} s:\n" + "".join(lines[-30:])
            time.sleep(0.005)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=120)
        reader.join(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == -signal.SIGKILL, "".join(lines[-30:])
    return lines


def trained(workdir: Path, *args: str, env: dict | None = None) -> dict:
    """``python -m flows train *args --json`` in this process; its summary."""
    proc = run_in_process("train", *args, "--json", cwd=workdir, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def stopped_and_resumed(workdir: Path, args: tuple[str, ...], epochs: int, kill_after: int | None = None, env: dict | None = None) -> dict:
    """The run ``args`` (validating every epoch, ``epochs`` of them) stopped by SIGTERM after epoch 2 and resumed to its
    end; with ``kill_after``, the resumed run is first killed outright after that epoch and resumed again. The last
    resume's summary."""
    assert "--validate-every" in args and epochs > max(2, kill_after or 0)
    run_id = stop_after_epoch(workdir, args, 2, signal.SIGTERM, env)
    if kill_after:
        stop_after_epoch(workdir, ("--resume", run_id), kill_after, signal.SIGKILL, env)
    out = trained(workdir, "--resume", run_id, env=env)
    assert out["run_id"] == run_id and out["epochs"] == epochs
    return out


# What a run computes, as opposed to how fast: every step's and epoch's losses, the learning rate, every validation, the
# final and test scores. A resumed run logs each of them at the same steps with the same values as an uninterrupted one.
COMPUTED = ("step_loss_", "epoch_loss_", "learning_rate", "val_", "final_", "test_")


def assert_same_result(resumed_id: str, whole_id: str, rel: float = 0.0) -> None:
    """Every computed metric of the resumed run (COMPUTED) has the uninterrupted run's history: the same steps, and at
    each the same value within ``rel`` (a step the killed process logged and the resumed one logged again holds it twice)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
    names = {k for k in client.get_run(whole_id).data.metrics if k.startswith(COMPUTED)}
    assert any(k.startswith("val_") for k in names) and any(k.startswith("step_loss_") for k in names), names
    assert names == {k for k in client.get_run(resumed_id).data.metrics if k.startswith(COMPUTED)}
    for name in sorted(names):
        whole = {m.step: m.value for m in client.get_metric_history(whole_id, name)}
        resumed: dict[int, list[float]] = {}
        for m in client.get_metric_history(resumed_id, name):
            resumed.setdefault(m.step, []).append(m.value)
        assert sorted(resumed) == sorted(whole), f"{name}: logged at other steps"
        for step, values in resumed.items():
            assert values == pytest.approx([whole[step]] * len(values), rel=rel, abs=0 if rel == 0 else 1e-12, nan_ok=True), f"{name} at step {step}"


def resumes_to_its_end(workdir: Path, args: tuple[str, ...], epochs: int, compare: bool = False, rel: float = 0.0,
                       kill_after: int | None = None, env: dict | None = None) -> dict:
    """The run ``args`` of ``epochs`` epochs, each validated, stopped (``stopped_and_resumed``) and resumed, ends
    FINISHED with every epoch logged and validated; with ``compare``, also with the results of the same run
    uninterrupted (``assert_same_result``, within ``rel``). The resumed run's summary."""
    from mlflow.tracking import MlflowClient

    full = (*args, "--epochs", str(epochs), "--validate-every", "1")
    whole = trained(workdir, *full, env=env) if compare else None
    resumed = stopped_and_resumed(workdir, full, epochs, kill_after, env)
    client = MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
    assert client.get_run(resumed["run_id"]).info.status == "FINISHED"
    every = list(range(1, epochs + 1))
    assert sorted({m.step for m in client.get_metric_history(resumed["run_id"], "epoch_time_s")}) == every
    validated = [k for k in client.get_run(resumed["run_id"]).data.metrics if k.startswith("val_")]
    assert validated and sorted({m.step for m in client.get_metric_history(resumed["run_id"], validated[0])}) == every
    if whole is not None:
        assert (resumed["epochs"], resumed["steps"], resumed["samples_seen"]) == (whole["epochs"], whole["steps"], whole["samples_seen"])
        assert_same_result(resumed["run_id"], whole["run_id"], rel)
    _marked_as_resumed(client, resumed["run_id"])
    return resumed


def _marked_as_resumed(client, run_id: str) -> None:
    """A resumed run keeps its record and is no time-to-train: tagged, its MLPerf log refused (two run_starts), and the report's
    tables leave its time to target out with a line naming it."""
    from tasks.report.ranking import resumed_line
    from tasks.report.reading import training_records
    from tasks.report.tables import quality_table, train_rows

    run = client.get_run(run_id)
    assert run.data.tags["karman.time_to_train"].startswith("excluded: resumed") and "rule(s) broken" in run.data.tags["karman.mlperf"]
    entries, _ = training_records(client, [run])
    assert entries[0].record.summary.resumes >= 1
    rows = train_rows(entries)
    assert rows[0]["time_to_target_s"] != rows[0]["time_to_target_s"] and run_id in resumed_line(rows)
    assert [q["reached"] for q in quality_table(entries)] == [0] and "(resumed)" in quality_table(entries)[0]["not_reached"]
