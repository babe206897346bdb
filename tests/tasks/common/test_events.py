"""The parent reads a child's progress and verdict from structured events, whatever its log lines say; of a job's several ranks, the one that failed."""

import json
import logging

import pytest

from tasks.common.process import events
from tasks.common.config.errors import RunFailed, RunStopped
from tasks.common.process.launch import ChildFailed, _raise_verdict, run_child


def test_progress_and_the_verdict_come_from_events_not_from_log_text(workdir):
    seen: list[float] = []
    with pytest.raises(RunFailed, match="^the real reason$"):
        run_child("train", "tests.tasks.common.job_bodies:chatty_failure", {"reason": "the real reason"}, logging.getLogger("t"),
                  on_event=lambda e: seen.append(e["fraction"]))
    assert seen == [0.25, 0.5]  # not the 90 % a log line claimed


def test_a_child_whose_words_sound_like_failure_succeeds_and_its_result_is_strict_json(workdir):
    seen: list[dict] = []
    result = run_child("rollout", "tests.tasks.common.job_bodies:chatty_success", {}, logging.getLogger("t"), on_event=seen.append)
    assert result == {"answer": 42, "missing": None} and [e[events.KEY] for e in seen] == [events.PROGRESS]


def test_an_event_line_is_strict_json_and_other_lines_are_not_events(capsys):
    events.emit(events.PROGRESS, fraction=float("nan"), nested={"x": [1.0, float("inf")]})
    line = capsys.readouterr().out.strip()
    json.loads(line, parse_constant=lambda name: pytest.fail(f"{name} in an event line"))
    assert events.parse(line) == {events.KEY: "progress", "fraction": None, "nested": {"x": [1.0, None]}}
    for text in ("epoch 1: 3.0 s; 50% done", '{"no": "event key"}', '{"karman_event": 3}', "{broken"):
        assert events.parse(text) is None


def test_of_several_ranks_the_one_that_failed_gives_the_jobs_verdict_not_rank_0s_stop(tmp_path):
    from collections import deque

    result, tail = tmp_path / "result.json", deque(["a line"])
    stopped = {"kind": "stopped", "message": "train stopped by SIGTERM"}
    gave_up = {"kind": "failed", "message": "the loss diverged", "rank": 1}

    def verdict(verdicts, rc=5, failed_rank=None, rank0=None):
        if rank0 is not None:
            result.write_text(json.dumps({"error": rank0}))
        else:
            result.unlink(missing_ok=True)
        with pytest.raises(Exception) as raised:
            _raise_verdict("train", rc, tail, verdicts, result, failed_rank)
        return type(raised.value), str(raised.value)

    # rank 0 was stopped because rank 1 failed: rank 1's failure, whether rank 0 wrote its stop or was killed first
    assert verdict([stopped, gave_up], rank0=stopped) == (RunFailed, "rank 1: the loss diverged")
    assert verdict([gave_up], rc=-9) == (RunFailed, "rank 1: the loss diverged")
    # rank 1 ended without a word (killed, crashed in C): its code
    assert verdict([stopped], rc=-9, failed_rank=1, rank0=stopped) == (ChildFailed, "train child rank 1 killed by SIGKILL (by the kernel's "
                                                                         "out-of-memory killer, if nothing else sent it); the other ranks were stopped")
    # every rank stopped by a signal sent to the job: rank 0's stop, whichever rank ended first
    assert verdict([{**stopped, "rank": 1}, stopped], failed_rank=1, rank0=stopped) == (RunStopped, "train stopped by SIGTERM")
    assert verdict([{**stopped, "rank": 1}], failed_rank=1) == (RunStopped, "rank 1: train stopped by SIGTERM")
    assert verdict([], rc=1) == (ChildFailed, "train child exited with code 1: a line")  # one process, no verdict
