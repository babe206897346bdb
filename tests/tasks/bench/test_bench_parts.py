"""bench-train and bench-infer reach a workload's own part through the workload table; a workload without one is refused in one line."""

import pytest

from flows.bench import main
from tasks.bench.specs import BenchInferSpec, BenchTrainSpec
from tasks.common.specs import DEFAULT_WORKLOAD
from tasks.workloads import get_workload, table


@pytest.mark.parametrize("command, part", [("bench-train", "bench_train"), ("bench-infer", "bench_infer")])
def test_a_workload_without_the_part_is_refused_in_one_line_naming_those_with_one(command, part, capsys):
    having = [name for name in table() if getattr(get_workload(name), part)]
    without = [name for name in table() if not getattr(get_workload(name), part)]
    assert having and without
    assert main([command, "--workload", without[0]]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"python -m flows {command}: error: workload {without[0]} has no {command}; "
                     f"{' and '.join(having)} {'has' if len(having) == 1 else 'have'} one"]


def test_an_unknown_workload_is_refused_with_the_valid_names(capsys):
    assert main(["bench-train", "--workload", "nope"]) == 2
    assert "unknown workload 'nope'; choose one of " in capsys.readouterr().err


def test_the_commands_default_to_the_tables_default_workload_whose_parts_run(monkeypatch):
    import tasks.bench.parts as parts

    assert BenchTrainSpec().workload == BenchInferSpec().workload == DEFAULT_WORKLOAD
    seen = []
    fake = type("W", (), {"name": "w", "bench_train": lambda self, spec, seed: seen.append((spec, seed)) or {"ok": 1}})()
    monkeypatch.setattr(parts, "get_workload", lambda name: fake)
    assert parts.bench_train(BenchTrainSpec(), 3) == {"ok": 1} and seen == [(BenchTrainSpec(), 3)]
