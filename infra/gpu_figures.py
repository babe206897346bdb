"""Measure the GPU solver's figures in one pass on a CUDA host: bench-solver, Schäfer–Turek, a batched demo sweep against numba, bench-infer.

Usage: ``python infra/gpu_figures.py OUT_DIR [STEP ...]``. Each step runs in its own child process under a
time limit, so a failure or a hang costs that step only; every step's JSON goes to ``OUT_DIR/figures.json``
and its output to ``OUT_DIR/log.txt``, and a short table is printed last. Needs torch with CUDA, Triton,
numba, pydantic, xarray and zarr; no Prefect or MLflow (the demo sweep and Schäfer–Turek call the jobs that
``generate --device cuda`` and ``validate-solver`` run in their child processes).
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLOWS = [sys.executable, "-m", "flows"]

# name -> (command, seconds allowed)
STEPS: dict[str, tuple[list[str], int]] = {
    "solver_batch16_128x64": (FLOWS + ["bench-solver", "--backend", "triton", "--device", "cuda", "--nx", "128", "--ny", "64", "--batch", "16", "--steps", "2400", "--json"], 60),
    "validate_2D-1_fp32": ([sys.executable, __file__, "--validate", "2D-1", "float32", "40"], 90),
    "validate_2D-2_fp32": ([sys.executable, __file__, "--validate", "2D-2", "float32", "60"], 120),
    "validate_2D-2_fp32_70": ([sys.executable, __file__, "--validate", "2D-2", "float32", "70"], 120),
    "validate_2D-2_fp32_80": ([sys.executable, __file__, "--validate", "2D-2", "float32", "80"], 120),
    "validate_2D-2_fp32_90": ([sys.executable, __file__, "--validate", "2D-2", "float32", "90"], 120),
    "solver_4096x1024_fp32": (FLOWS + ["bench-solver", "--backend", "triton", "--device", "cuda", "--nx", "4096", "--ny", "1024", "--steps", "500", "--json"], 120),
    "solver_1024x256_fp32": (FLOWS + ["bench-solver", "--backend", "triton", "--device", "cuda", "--nx", "1024", "--ny", "256", "--steps", "2000", "--json"], 60),
    "demo_sweep": ([sys.executable, __file__, "--sweep"], 180),
    "infer_128x64": (FLOWS + ["bench-infer", "--device", "cuda", "--mode", "full", "--size", "64", "--width", "128", "--json"], 90),
    "infer_1024x256": (FLOWS + ["bench-infer", "--device", "cuda", "--mode", "full", "--size", "256", "--json"], 120),
    "validate_2D-1_fp32_80": ([sys.executable, __file__, "--validate", "2D-1", "float32", "80"], 90),
    "validate_2D-2_fp32_80_u0.07": ([sys.executable, __file__, "--validate", "2D-2", "float32", "80", "0.07"], 120),
    "solver_torch_1024x256": (FLOWS + ["bench-solver", "--backend", "torch", "--device", "cuda", "--nx", "1024", "--ny", "256", "--steps", "200", "--json"], 60),
}


def validate(case: str, dtype: str, cells: str, velocity: str | None = None) -> dict:
    """The Schäfer–Turek case at ``cells`` nodes per diameter (and lattice velocity, None: the case's own) on the
    fused kernel, with the intervals' verdict."""
    from models.karman.solver.benchmark import REFERENCE, within
    from tasks.workloads.karman.validate.job import validate_job

    with tempfile.TemporaryDirectory() as folder:
        out = validate_job({"case": case, "cells_per_diameter": int(cells), "backend": "triton", "dtype": dtype, "max_time": None,
                            "lattice_velocity": float(velocity) if velocity else None,
                            "device": "cuda", "history": str(Path(folder) / "history.npz")})
    verdict = {k: within(v, REFERENCE[case][k]) for k, v in out["quantities"].items() if k in REFERENCE[case]}
    return {**out, "within": verdict, "passes": all(verdict.values())}


def sweep(work: Path) -> dict:
    """The demo sweep batched on the GPU (the job ``generate --device cuda`` runs) and simulated one by one with
    numba on this host's cores, both written as datasets under ``work`` (empty), then compare-datasets on them."""
    import numba

    from tasks.common.specs import GenerateSpec
    from tasks.common.stores.store import Manifest
    from tasks.workloads.karman.simulate import expand, run_simulation, simulate_batch_job

    times = {}
    for name, device in (("gpu", "cuda"), ("cpu", "cpu")):
        spec = GenerateSpec(dataset=f"demo-{name}", device=device)
        sims = expand(spec)
        folder = work / "datasets" / f"demo-{name}"
        manifest = Manifest(folder, {"sweep": "demo"})
        t0 = time.perf_counter()
        if device == "cuda":
            records = simulate_batch_job({"sims": [s.model_dump() for s in sims], "dataset_dir": str(folder), "device": "cuda"})["records"]
        else:
            sims = [s.model_copy(update={"threads": numba.config.NUMBA_NUM_THREADS}) for s in sims]
            records = [run_simulation(str(folder), s) for s in sims]
        times[f"{name}_s"] = time.perf_counter() - t0
        for r in records:
            manifest.add(r["sim_id"], {k: r[k] for k in ("digest", "frames", "wall_s", "mlups", "steps", "spec")})
    env = {**os.environ, "KARMAN_DATA_ROOT": str(work)}
    compare = subprocess.run(FLOWS + ["compare-datasets", "--first", "demo-gpu", "--second", "demo-cpu", "--json"],
                             cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    return {**times, "cpu_threads": numba.config.NUMBA_NUM_THREADS, "simulations": len(records),
            "compare": json.loads(compare.stdout.strip().splitlines()[-1])}


def main(argv: list[str]) -> int:
    if argv[:1] == ["--validate"]:
        print(json.dumps(validate(*argv[1:5])))
        return 0
    if argv[:1] == ["--sweep"]:
        with tempfile.TemporaryDirectory() as work:
            print(json.dumps(sweep(Path(work))))
        return 0
    return run_steps(Path(argv[0]), STEPS, argv[1:], summary)


def run_steps(out: Path, steps: dict[str, tuple[list[str], int]], names: list[str], summarise, env: dict | None = None) -> int:
    """Run the named steps (all of ``steps`` if none) each in its own child under its time limit; JSON results to
    ``out/figures.json``, output to ``out/log.txt``, a line per step printed by ``summarise``. 2 for an unknown name."""
    unknown = [n for n in names if n not in steps]
    if unknown:
        print(f"unknown step {unknown[0]!r}; the steps are {', '.join(steps)}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    names = names or list(steps)
    results: dict[str, dict] = {}
    log = (out / "log.txt").open("a")
    for name in names:
        command, limit = steps[name]
        t0 = time.perf_counter()
        try:
            done = _run_group(command, limit, env)
            lines = done.stdout.strip().splitlines()
            try:
                result = json.loads(lines[-1]) if done.returncode == 0 and lines else {"error": done.stderr.strip()[-2000:], "rc": done.returncode}
            except json.JSONDecodeError:
                result = {"error": "no JSON line", "stdout": done.stdout[-2000:]}
            log.write(f"== {name} rc={done.returncode}\n{done.stdout}\n{done.stderr}\n")
        except subprocess.TimeoutExpired as exc:
            result = {"error": f"timed out after {limit} s"}
            log.write(f"== {name} timed out\n{exc.stdout}\n{exc.stderr}\n")
        result["step_s"] = round(time.perf_counter() - t0, 1)
        results[name] = result
        log.flush()
        (out / "figures.json").write_text(json.dumps(results, indent=1))
        print(f"{name}: {summarise(result)}", flush=True)
    return 0


def _run_group(command: list[str], limit: int, env: dict | None) -> subprocess.CompletedProcess:
    """``command`` in a process group of its own, the whole group killed past ``limit`` seconds (a flow's servers and
    training children too); TimeoutExpired then, with what it printed."""
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        raise subprocess.TimeoutExpired(command, limit, stdout, stderr) from None
    return subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)


def summary(r: dict) -> str:
    """One line per step for the table printed at the end."""
    if "error" in r:
        return f"ERROR {str(r['error'])[-600:]}"
    keys = ("device_name", "gpu", "mlups", "steps_per_second", "copy_gbs", "roofline_mlups", "roofline_fraction", "datasheet_gbs",
            "frames_per_s", "solver_frames_per_s", "surrogate_vs_solver", "passes", "within", "quantities", "gpu_s", "cpu_s", "step_s")
    parts = [f"{k}={r[k]}" for k in keys if k in r]
    if "compare" in r:
        parts.append("fields=" + json.dumps(r["compare"]["fields"]))
    if "stats" in r:
        parts.append(f"wall_s={r['stats']['wall_s']:.1f} mlups={r['stats']['mlups']:.0f}")
    return " ".join(parts)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
