"""validate-solver and bench-solver from the command line, as a user runs them."""

import json
import subprocess
import sys

import pytest

from mlflow.tracking import MlflowClient

from tasks.common.measures.ceiling import cpu_name
from tests.conftest import ROOT, run_cli, run_in_process, strict_json
from tests.flows.test_cli import assert_refused


def test_validate_solver_prints_the_figures_and_logs_the_convergence_table(workdir):
    proc = run_cli("validate-solver", "--case", "2D-1", "--cells-per-diameter", "20", "--convergence", "10", "--json", cwd=workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = strict_json(proc.stdout.strip().splitlines()[-1])
    assert set(out) == {"case", "cd", "cl", "dp", "cells_per_diameter", "wall_s", "mlups"}
    assert out["case"] == "2D-1" and out["cells_per_diameter"] == 20 and out["mlups"] > 0
    assert 5.4 < out["cd"] < 5.8
    client = MlflowClient(tracking_uri=f"sqlite:///{workdir / 'mlflow.db'}")
    run = client.search_runs([client.get_experiment_by_name("test").experiment_id], "tags.`karman.stage` = 'validate'")[0]
    assert run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "cd")] == [10, 20]
    assert [m.value for m in client.get_metric_history(run.info.run_id, "lattice_u_mean")] == [0.02, 0.02]  # 2D-1's own
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"convergence.md", "convergence.json", "drag_lift.png", "history.npz", "reference_check.json"} <= artifacts
    table = (workdir / "data" / "runs" / run.info.run_id / "convergence.md").read_text()
    assert "| 10 |" in table and "| 20 |" in table and "5.57 – 5.59" in table


def test_validate_solver_refuses_a_resolution_off_the_benchmark_grid(workdir):
    assert_refused(run_in_process("validate-solver", "--cells-per-diameter", "25", cwd=workdir), "cells per diameter 25", "multiple of 10")
    assert_refused(run_in_process("validate-solver", "--case", "3D-1", cwd=workdir), "--case", "3D-1")
    assert_refused(run_in_process("validate-solver", "--lattice-velocity", "0.2", cwd=workdir), "lattice velocity 0.2 must be above 0 and at most 0.1")


def test_bench_solver_reports_throughput(workdir):
    proc = run_cli("bench-solver", "--nx", "128", "--ny", "64", "--steps", "5", "--repeats", "2", "--json", cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    out = strict_json(proc.stdout.strip().splitlines()[-1])
    assert {"mlups", "backend", "dtype", "bytes_per_update"} <= set(out)
    assert out["backend"] == "numba" and out["dtype"] == "float32" and out["bytes_per_update"] == 72 and out["mlups"] > 0
    # the roofline: a parallel copy of a population buffer before each timed run and after the last, on the solver's threads
    assert out["copy_bytes"] == 9 * 128 * 64 * 4 and len(out["copy_gbs_runs"]) == 3 * 10 and out["copy_gbs"] > 0
    assert out["bytes_per_cell"] == 72 and out["roofline_mlups"] == pytest.approx(out["copy_gbs"] * 1e3 / 72)
    assert out["roofline_fraction"] == pytest.approx(out["mlups"] / out["roofline_mlups"])
    assert len(out["roofline_fraction_runs"]) == 2 and all(f > 0 for f in out["roofline_fraction_runs"])
    assert out["cpu"] == cpu_name() and out["threads"] >= 1


def test_bench_solver_loads_no_orchestration_stack():
    code = (
        "import runpy, sys\n"
        "sys.argv = ['flows', 'bench-solver', '--nx', '64', '--ny', '32', '--steps', '2', '--repeats', '1', '--backend', 'numpy']\n"
        "try:\n    runpy.run_module('flows', run_name='__main__')\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
        "print([m for m in ('prefect', 'mlflow', 'zarr') if m in sys.modules])\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_bench_solver_bad_input(workdir):
    assert_refused(run_in_process("bench-solver", "--nx", "0", cwd=workdir), "--nx", "positive")
    assert_refused(run_in_process("bench-solver", "--nx", "16", "--ny", "4", "--steps", "1", cwd=workdir), "grid 16x4 is too small")
    assert_refused(run_in_process("bench-solver", "--backend", "cuda", cwd=workdir), "--backend", "cuda")
    assert_refused(run_in_process("bench-solver", "--backend", "triton", cwd=workdir), "device 'cpu' is not offered by the triton backend")
    assert_refused(run_in_process("bench-solver", "--backend", "triton", "--device", "cuda", cwd=workdir), "no CUDA GPU is visible")
    assert_refused(run_in_process("bench-solver", "--batch", "16", cwd=workdir), "batch 16", "triton backend only")
    assert_refused(run_in_process("bench-solver", "--dtype", "float16s", cwd=workdir), "--dtype", "'float16s'", "'float32', 'float64'")
    assert_refused(run_in_process("bench-solver", "--device", "cuda", cwd=workdir), "the numba backend runs on the cpu")


def test_bench_train_compares_with_the_plain_step_in_one_run(workdir):
    proc = run_cli("bench-train", "--size", "32", "--batch-size", "2", "--steps", "1", "--repeats", "2", "--json", cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    out = strict_json(proc.stdout.strip().splitlines()[-1])
    assert {"samples_per_s", "in_channels", "out_channels", "generator_params", "discriminator_params", "compile_s"} <= set(out)
    assert (out["in_channels"], out["out_channels"]) == (4, 3)
    assert out["samples_per_s"] > 0 and out["baseline_samples_per_s"] > 0
    assert out["speedup"] == pytest.approx(out["samples_per_s"] / out["baseline_samples_per_s"])
    assert len(out["samples_per_s_runs"]) == len(out["baseline_samples_per_s_runs"]) == 2
    # On CPU the plain step also runs in a separate, untuned process; the code-only ratio is kept apart.
    assert out["baseline_process"] == "separate" and out["options"]["keep_freed_memory"] is True
    assert out["options"]["winograd"] is True
    assert out["speedup_same_process"] == pytest.approx(out["samples_per_s"] / out["same_process_baseline_samples_per_s"])
    assert len(out["same_process_baseline_samples_per_s_runs"]) == 2
    assert out["flops_per_sample"] > 0 and out["mfu"] is None  # no known peak for a CPU


def test_bench_train_refuses_an_image_the_unet_cannot_take(workdir):
    proc = run_in_process("bench-train", "--size", "48", cwd=workdir)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("python -m flows bench-train: error: image size 48x48 does not fit")


def test_bench_infer_times_mapreduce_against_full_frame_and_the_solver_in_one_run(workdir):
    proc = run_cli("bench-infer", "--mode", "mapreduce", "--workers", "2", "--size", "32", "--width", "128", "--train-size", "32",
                   "--ngf", "8", "--tile", "32,64", "--halo", "8", "--frames", "2", "--repeats", "2", "--json", cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    out = strict_json(proc.stdout.strip().splitlines()[-1])
    assert {"frames_per_s", "workers", "mode", "seam_rel_error", "compile_s", "solver_frames_per_s"} <= set(out)
    assert (out["mode"], out["workers"], out["tiles"], out["tile"]) == ("mapreduce", 2, 3, [32, 64])
    assert out["frames_per_s"] > 0 and out["full_1_frames_per_s"] > 0 and out["mapreduce_1_frames_per_s"] > 0
    assert out["mapreduce_1_over_full_1"] == pytest.approx(out["full_1_frames_per_s"] / out["mapreduce_1_frames_per_s"])
    assert 0 < out["seam_rel_error"] < 0.05  # random weights, halo 8: tiles agree with the full frame closely
    assert out["solver_steps_per_frame"] == 25 and out["solver_frames_per_s"] > 0  # 50 steps per 64 cells, scaled
    assert set(out["latency_split_s"]) == {"split", "transfer", "compute", "merge"}


def test_bench_infer_full_frame_has_no_seam(workdir):
    proc = run_cli("bench-infer", "--mode", "full", "--size", "32", "--train-size", "32", "--ngf", "8", "--frames", "1",
                   "--repeats", "1", "--no-compare", "--json", cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    out = strict_json(proc.stdout.strip().splitlines()[-1])
    assert out["seam_rel_error"] == 0.0 and out["tiles"] == 1 and "mapreduce_1_frames_per_s" not in out


@pytest.mark.parametrize("args, message", [
    (("--tile", "48"), "tile height 48 is not a positive multiple of 64"),
    (("--tile", "512"), "tile height 512 is larger than the frame's height 256"),
    (("--halo", "-1"), "--halo: -1 is negative; use 0 or more"),
    (("--workers", "4096"), "4096 workers requested but this host has"),
    (("--mode", "full", "--workers", "2"), "full-frame runs on one worker"),
    (("--tile", "64x"), "--tile: '64x' is not a tile size"),
    (("--tile", "64x128"), "--tile: '64x128' is not a tile size; write S or H,W"),
])
def test_bench_infer_refuses_bad_input_with_one_line(workdir, args, message):
    proc = run_in_process("bench-infer", "--ngf", "8", *args, cwd=workdir)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
