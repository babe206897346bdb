"""The parent reads a child's progress and verdict from structured events, whatever its log lines say."""

import json
import logging

import pytest

from tasks.common import events
from tasks.common.errors import RunFailed
from tasks.common.launch import run_child


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
