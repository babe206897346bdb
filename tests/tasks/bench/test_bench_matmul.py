"""bench-matmul from the command line: per-framework children, MLflow runs of stage ceiling, the ceiling cache, the report's section, refusals."""

import json
import os
import subprocess
import sys

import pytest

from tasks.common.measures.ceiling import BENCH, host_key
from tasks.common.tracking.names import Tag
from tasks.common.config.settings import CEILINGS_ENV, CEILINGS_FILE, Settings
from tasks.common.tracking.runs import client_for
from tests.conftest import ROOT, strict_json
from tests.flows.test_cli import assert_refused


def bench(*args: str, cwd) -> subprocess.CompletedProcess:
    """``python -m flows bench-matmul ...`` as a user types it (the bench commands start no Prefect), its ceilings cached in
    its data root (<data root>/ceilings.json), not the session's shared cache: the other tests' runs are measured against quick
    ceilings of a training run."""
    env = {k: v for k, v in os.environ.items() if k != CEILINGS_ENV}
    return subprocess.run([sys.executable, "-m", "flows", "bench-matmul", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env={**env, "PYTHONPATH": str(ROOT)})


@pytest.fixture(scope="module")
def measured(module_workdir):
    proc = bench("--device", "cpu", "--frameworks", "torch,jax", "--sizes", "256", "--repeats", "2", "--json", cwd=module_workdir)
    assert proc.returncode == 0, proc.stderr
    return strict_json(proc.stdout.strip().splitlines()[-1])


def test_each_framework_and_dtype_is_timed_against_the_derived_peak(measured):
    assert [(r["framework"], r["dtype"]) for r in measured["results"]] == [("torch", "fp32"), ("torch", "bf16"), ("jax", "fp32"), ("jax", "bf16")]
    assert measured["host_key"] == host_key() and set(measured["versions"]) == {"torch", "jax"}
    for row in measured["results"]:
        (size,) = row["sizes"]
        assert size["n"] == 256 and len(size["warm_runs_s"]) == 2
        assert size["warm_tflops"] == pytest.approx(2 * 256**3 / size["warm_s"] / 1e12)
        assert row["best_warm_tflops"] == size["warm_tflops"]
        assert row["peak_source"].startswith("derived: ")
        assert row["warm_fraction_of_peak"] == pytest.approx(row["best_warm_tflops"] / row["peak_tflops"])


def test_every_result_is_an_mlflow_run_and_a_cached_ceiling(measured, module_workdir):
    settings = Settings.from_env()
    client = client_for(settings)
    exp = client.get_experiment_by_name(settings.experiment)
    runs = {r.info.run_id: r for r in client.search_runs([exp.experiment_id], f"tags.`{Tag.STAGE}` = 'ceiling'")}
    assert set(runs) == {row["run_id"] for row in measured["results"]}
    for row in measured["results"]:
        run = runs[row["run_id"]]
        assert run.info.status == "FINISHED" and run.data.tags[Tag.FRAMEWORK] == row["framework"]
        assert (run.data.params["dtype"], run.data.params["sizes"], run.data.params["cpu_name"]) == (row["dtype"], "256", measured["cpu_name"])
        assert run.data.metrics["warm_tflops_n256"] == pytest.approx(row["best_warm_tflops"])
        assert run.data.metrics["warm_fraction_of_peak"] == pytest.approx(row["warm_fraction_of_peak"])
    assert measured["ceilings_file"] == str(settings.data_root / CEILINGS_FILE)
    cached = json.loads((settings.data_root / CEILINGS_FILE).read_text())["ceilings"]
    assert set(cached) == {f"{host_key()}|cpu|{r['framework']}|{r['dtype']}" for r in measured["results"]}
    for row in measured["results"]:
        entry = cached[f"{host_key()}|cpu|{row['framework']}|{row['dtype']}"]
        assert (entry["tflops"], entry["n"], entry["source"]) == (pytest.approx(row["best_warm_tflops"]), 256, BENCH)


def test_the_report_section_has_a_row_per_run(measured, module_workdir):
    from tasks.report.ceiling import ceiling_section

    settings = Settings.from_env()
    client = client_for(settings)
    text = ceiling_section(client, client.get_experiment_by_name(settings.experiment).experiment_id)
    rows = [line for line in text.splitlines() if line.startswith("| ") and "framework" not in line]
    assert len(rows) == 4
    for row in measured["results"]:
        line = next(l for l in rows if f"| {row['framework']} |" in l and f"| {row['dtype']} |" in l)
        assert f"{row['best_warm_tflops']:.3g}" in line and f"{row['warm_fraction_of_peak']:.0%}" in line and row["run_id"][:8] in line


@pytest.mark.parametrize("args, fragments", [
    (("--frameworks", "mxnet"), ("--frameworks", "mxnet")),
    (("--dtypes", "tf32"), ("'tf32'", "torch on cpu", "fp32, bf16")),
    (("--frameworks", "tensorflow", "--dtypes", "fp16"), ("'fp16'", "tensorflow on cpu")),
    (("--sizes", "0"), ("--sizes", "positive")),
    (("--sizes", "1000000"), ("--sizes 1000000", "GiB")),
])
def test_bad_input_is_refused_in_one_line_and_writes_nothing(workdir, args, fragments):
    before = {p.name: p.read_bytes() for p in workdir.iterdir()}  # the folder's new, empty tracking store
    assert_refused(bench(*args, cwd=workdir), *fragments)
    assert {p.name: p.read_bytes() for p in workdir.iterdir()} == before


def test_each_torch_timer_multiplies_under_its_own_tf32_switch_whichever_opened_last(monkeypatch):
    """TF32 is one switch for a whole torch process, and bench-matmul opens every dtype's timer before any measures:
    each product must run under its own dtype's setting (tf32 on, fp32 off), not the last opened timer's. The GPU
    is stood in for (CUDA hardware cannot run here); the products run on the CPU."""
    import torch

    from tasks.common.measures import matmul

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda dev=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda dev=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda dev=None: None)
    before = torch.backends.cuda.matmul.fp32_precision
    try:
        timers = {}
        for dtype in ("tf32", "fp32", "bf16"):  # all open first, as the bench opens them
            timer = object.__new__(matmul.Timer)  # the Timer without its first product on the (absent) GPU
            timer.backend = matmul._torch("cuda", dtype)
            timers[dtype] = timer
        seen = []
        for dtype in ("tf32", "fp32", "tf32"):
            backend = timers[dtype].backend
            product = backend.matmul
            backend.matmul = lambda x, y, product=product: (seen.append(torch.backends.cuda.matmul.fp32_precision), product(x, y))[1]
            timers[dtype]._timed(torch.ones(4, 4), torch.ones(4, 4))
            backend.matmul = product
        assert seen == ["tf32", "ieee", "tf32"]
    finally:
        torch.backends.cuda.matmul.fp32_precision = before
