"""The process audit's hook records a Python process's CPU at its exit, and its report sums the records by kind and by test."""

import json
import os
import subprocess
import sys

from tests.process_audit import ENV, HOOK, kind, main, report


def test_the_hook_records_a_process_at_its_exit_and_nothing_without_its_variable(tmp_path):
    # -S: no site-packages, so a hook installed there (a test run being measured) does not record the child a second time
    body = HOOK + "\nimport gc\nsum(i * i for i in range(2_000_000))\ncycles = [[] for _ in range(200_000)]\nfor c in cycles: c.append(c)\ndel cycles\ngc.collect()\n"
    for folder, env in ((tmp_path / "on", {ENV: str(tmp_path / "on"), "PYTEST_CURRENT_TEST": "tests/x.py::t (call)"}), (tmp_path / "off", {})):
        folder.mkdir()
        base = {k: v for k, v in os.environ.items() if k not in (ENV, "PYTEST_CURRENT_TEST")}
        subprocess.run([sys.executable, "-S", "-c", body, "a", "b"], env={**base, **env}, check=True)
    (record,) = [json.loads(p.read_text()) for p in (tmp_path / "on").iterdir()]
    assert record["argv"] == ["-c", "a", "b"] and record["test"] == "tests/x.py::t (call)"
    assert 0 < record["cpu_s"] < 60 and record["wall_s"] >= record["cpu_s"] * 0.5 and record["libraries"] == []
    assert 0 < record["gc_s"] < record["cpu_s"]  # 200,000 cycles collected
    assert not list((tmp_path / "off").iterdir())


def test_the_report_sums_by_kind_and_by_test_module(tmp_path, capsys):
    rows = [(["/v/lib/flows/__main__.py", "train", "--x"], 5.0, "tests/a.py::t1 (call)"),
            (["-c", "train", "job-folder/job.json"], 7.0, "tests/a.py::t2 (call)"),
            (["-c"], 100.0, "")]
    for i, (argv, cpu, test) in enumerate(rows):
        gc_s = {"gc_s": cpu / 10} if i else {}  # the first as an older hook wrote it
        (tmp_path / f"{i}.json").write_text(json.dumps({"argv": argv, "cpu_s": cpu, "wall_s": cpu, "test": test, "libraries": [], **gc_s}))
    text = report(tmp_path)
    assert text.startswith("3 processes, 112 s of CPU recorded, 11 s of it in the cycle collector (9.6%)")
    assert "        1      5    0.0  python -m flows train" in text and "        1      7    0.7  forked job: train" in text
    assert "        2     12    0.7  tests/a.py" in text and "        1    100   10.0  (outside any test)" in text
    assert kind([]) == "?" and main(["report"]) == 2 and "usage" in capsys.readouterr().err
