"""A bounded soak test: several benchmarks at once against one MLflow server and one Prefect server, the tracking server restarted mid-way, nothing reported lost.

    python -m infra.soak [--benchmarks N] [--epochs E] [--folder DIR] [--json]

Everything runs on 127.0.0.1 and stops by itself:
1. the Prefect server and the MLflow tracking server start from the infra scripts (SQLite, or the
   stores that ``MLFLOW_BACKEND_STORE_URI`` and Prefect's database settings name);
2. one small Kármán dataset is simulated (``python -m flows generate``);
3. N benchmarks start at once (``python -m flows benchmark --spec``), each a training cell and a
   rollout cell of its own (seeds 0..N-1) on that dataset, all logging to the one server;
4. as soon as a training cell has logged its first step metrics the tracking server is stopped and
   started again on the same port and store, while every benchmark is running;
5. a benchmark that did not finish every cell is run once more (it resumes: finished cells are reused);
6. the store is read back: every cell's per-step metrics (as many steps as its own record says it ran),
   its model and its figures are there, and no run is left RUNNING.

The last line of stdout is a JSON summary (the load held: cells at once, metric values stored per
second, the restart's downtime); the exit code is 0 only if nothing reported is lost. With ``--folder``
the servers' logs, the stores and the specs stay there; otherwise in a temporary folder that is removed
when the soak passes.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from infra.services import ROOT, Services, free_port, wait_http
from tasks.common.measures.ceiling import cpu_name

EXPERIMENT = "soak"
DATASET = "soak-tiny"
# A small sweep and network: the load is many processes logging at once, not long training.
GENERATE = {"dataset": DATASET, "reynolds": [40.0, 50.0, 60.0], "nx": 64, "ny": 32, "size": [6.0], "warmup_steps": 1500,
            "frames": 10, "frame_every": 40, "workers": 1}


def benchmark_spec(index: int, epochs: int) -> dict:
    """Benchmark ``index`` of the soak: one training cell (seed ``index``) and one rollout cell."""
    return {"generate": GENERATE, "batch_sizes": [4], "repeats": 1, "modes": ["full"], "workers": [1],
            "train": {"dataset": DATASET, "ngf": 8, "ndf": 8, "epochs": epochs, "threads": 1, "seed": index},
            "infer": {"steps": 3, "halo": 4}, "aggregate": {"name": f"soak-{index}"}}


class Soak:
    """The servers, the benchmark commands and what the store holds afterwards."""

    def __init__(self, folder: Path, benchmarks: int, epochs: int, log=print):
        self.folder, self.benchmarks, self.epochs, self.log = folder, benchmarks, epochs, log
        self.mlflow_port, self.prefect_port = free_port(), free_port()
        self.uri, self.api = f"http://127.0.0.1:{self.mlflow_port}", f"http://127.0.0.1:{self.prefect_port}/api"
        base = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API_URL", "MLFLOW_TRACKING_URI", "KARMAN_"))}
        keep = {k: v for k, v in os.environ.items() if k.startswith(("KARMAN_MLFLOW_AUTH", "KARMAN_PREFECT_AUTH"))}
        self.env = {**base, **keep, "PREFECT_HOME": str(folder / "prefect-home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                    "PYTHONPATH": str(ROOT)}
        self.cell_env = {**self.env, "PREFECT_API_URL": self.api, "MLFLOW_TRACKING_URI": self.uri,
                         "KARMAN_DATA_ROOT": str(folder / "data"), "KARMAN_EXPERIMENT": EXPERIMENT}
        self.services = Services(folder, self.env)
        self.tracking_env = {"PORT": str(self.mlflow_port), "KARMAN_ARTIFACT_ROOT": str(folder / "mlartifacts"),
                             "MLFLOW_BACKEND_STORE_URI": os.environ.get("MLFLOW_BACKEND_STORE_URI", f"sqlite:///{folder / 'mlflow.db'}")}

    # -- servers ---------------------------------------------------------------------------------
    def start_servers(self) -> None:
        self.prefect, prefect_log = self.services.start("prefect-server", ["infra/start-prefect-server.sh"], {"PORT": str(self.prefect_port)})
        self.tracking, self.tracking_log = self.services.start("mlflow-server", ["infra/start-mlflow-server.sh"], self.tracking_env)
        wait_http(f"{self.api}/health", 300, self.prefect, prefect_log)
        wait_http(f"{self.uri}/health", 300, self.tracking, self.tracking_log)

    def restart_tracking(self) -> float:
        """Stop the tracking server (SIGTERM to its process group) and start it again on the same port
        and store; the seconds it did not answer."""
        t0 = time.monotonic()
        os.killpg(self.tracking.pid, signal.SIGTERM)
        try:
            self.tracking.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.tracking.pid, signal.SIGKILL)
            self.tracking.wait()
        self.tracking, self.tracking_log = self.services.start("mlflow-server-restarted", ["infra/start-mlflow-server.sh"], self.tracking_env)
        wait_http(f"{self.uri}/health", 300, self.tracking, self.tracking_log)
        return time.monotonic() - t0

    # -- commands --------------------------------------------------------------------------------
    def command(self, name: str, spec: dict, kind: str) -> subprocess.Popen:
        path = self.folder / f"{name}.json"
        path.write_text(json.dumps(spec))
        out = (self.folder / f"{name}.log").open("a")
        return subprocess.Popen([sys.executable, "-m", "flows", kind, "--spec", str(path), "--json"], cwd=ROOT, env=self.cell_env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def finished(self, proc: subprocess.Popen, name: str) -> dict | None:
        """The benchmark's JSON summary if it exited 0 with every cell finished, else None."""
        lines = (self.folder / f"{name}.log").read_text().strip().splitlines()
        if proc.returncode != 0 or not lines:
            return None
        try:
            summary = json.loads(lines[-1])
        except json.JSONDecodeError:
            return None
        return summary if summary.get("failed") == 0 else None

    def wait_for_step_metrics(self, procs: list[subprocess.Popen], timeout: float = 900) -> None:
        """Until a training cell of the soak has logged step metrics (a benchmark that exits first is an error)."""
        from mlflow.tracking import MlflowClient

        client = MlflowClient(self.uri)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            experiment = client.get_experiment_by_name(EXPERIMENT)
            if experiment is not None and client.search_runs([experiment.experiment_id], "tags.`karman.stage` = 'train' and metrics.step_time_s >= 0 "
                                                             "and attributes.status = 'RUNNING'", max_results=1):
                return
            if any(p.poll() is not None for p in procs):
                raise RuntimeError("a benchmark ended before any training cell logged a step: see its log in " + str(self.folder))
            time.sleep(0.3)
        raise RuntimeError(f"no training cell logged a step within {timeout:.0f} s")

    # -- the soak --------------------------------------------------------------------------------
    def run(self) -> dict:
        t_start = time.monotonic()
        self.start_servers()
        self.log(f"servers up: MLflow {self.uri}, Prefect {self.api}")
        gen = self.command("generate", GENERATE, "generate")
        if gen.wait() != 0:
            raise RuntimeError(f"generate failed: {(self.folder / 'generate.log').read_text()[-2000:]}")
        names = [f"benchmark-{i}" for i in range(self.benchmarks)]
        t0 = time.monotonic()
        procs = {name: self.command(name, benchmark_spec(i, self.epochs), "benchmark") for i, name in enumerate(names)}
        self.log(f"{len(procs)} benchmarks started at once")
        self.wait_for_step_metrics(list(procs.values()))
        running = sum(p.poll() is None for p in procs.values())
        downtime = self.restart_tracking()
        self.log(f"tracking server restarted with {running} benchmarks running: {downtime:.1f} s without it")
        for p in procs.values():
            p.wait()
        reruns = []
        summaries = {name: self.finished(p, name) for name, p in procs.items()}
        for i, name in enumerate(names):
            if summaries[name] is None:  # resume: its finished cells are reused
                reruns.append(name)
                proc = self.command(name, benchmark_spec(i, self.epochs), "benchmark")
                proc.wait()
                summaries[name] = self.finished(proc, name)
        wall = time.monotonic() - t0
        incomplete = [n for n, s in summaries.items() if s is None]
        if incomplete:
            raise RuntimeError(f"benchmark(s) {', '.join(incomplete)} did not complete after a rerun: see their logs in {self.folder}")
        found = self.read_back(summaries)
        return {"benchmarks": self.benchmarks, "cells": found["cells"], "cells_at_once": found["cells_at_once"],
                "metric_values": found["metric_values"], "metrics_per_s": round(found["metric_values"] / wall, 1),
                "artifacts": found["artifacts"], "restart_downtime_s": round(downtime, 1), "benchmarks_running_at_restart": running,
                "reruns": len(reruns), "lost": found["lost"], "left_running": found["left_running"], "wall_s": round(wall, 1),
                "total_s": round(time.monotonic() - t_start, 1), "cpu": cpu_name(), "cores": os.cpu_count(),
                "tracking_store": self.tracking_env["MLFLOW_BACKEND_STORE_URI"].split(":", 1)[0]}

    def read_back(self, summaries: dict[str, dict]) -> dict:
        """What the store holds for every cell the benchmarks reported, and what is missing from it."""
        from mlflow.tracking import MlflowClient

        client = MlflowClient(self.uri)
        experiment = client.get_experiment_by_name(EXPERIMENT).experiment_id
        runs = client.search_runs([experiment], max_results=1000)
        lost, values, artifacts, spans = [], 0, 0, []
        for run in runs:
            for key in run.data.metrics:
                values += len(client.get_metric_history(run.info.run_id, key))
        cells = [c for s in summaries.values() for c in s["cells"]]
        for cell in cells:
            run_id = cell["run_id"]
            run = client.get_run(run_id)
            spans.append((run.info.start_time, run.info.end_time or run.info.start_time))
            listed = _artifacts(client, run_id)
            artifacts += len(listed)
            if cell["kind"] == "train":
                record = json.loads(Path(client.download_artifacts(run_id, "record.json", str(self.folder / "read-back" / run_id))).read_text())
                steps = {m.step for m in client.get_metric_history(run_id, "step_time_s")}
                if len(steps) != record["summary"]["steps"]:
                    lost.append(f"train run {run_id}: {len(steps)} steps of step metrics stored, its record says {record['summary']['steps']}")
                if not any(p.startswith("model/") for p in listed):
                    lost.append(f"train run {run_id}: no model files")
                if not client.search_logged_models([experiment], filter_string=f"source_run_id = '{run_id}'"):
                    lost.append(f"train run {run_id}: no logged model")
            else:
                steps = {m.step for m in client.get_metric_history(run_id, "step_latency_s")}
                expected = int(run.data.params["steps"])
                if len(steps) != expected:
                    lost.append(f"rollout run {run_id}: {len(steps)} steps of rollout metrics stored, it ran {expected}")
                if not {"rollout_error.png", "rollout.gif"} <= {Path(p).name for p in listed}:
                    lost.append(f"rollout run {run_id}: its figures are missing ({sorted(listed)})")
        for summary in summaries.values():
            aggregate = summary["aggregate_run_id"]
            if "report/report.md" not in _artifacts(client, aggregate):
                lost.append(f"aggregate run {aggregate}: no report")
        left = [r.info.run_id for r in runs if r.info.status == "RUNNING"]
        return {"cells": len(cells), "cells_at_once": _most_at_once(spans), "metric_values": values, "artifacts": artifacts,
                "lost": lost, "left_running": left}


def _artifacts(client, run_id: str, path: str | None = None) -> list[str]:
    """Every artifact file of a run, by path."""
    found = []
    for item in client.list_artifacts(run_id, path):
        found.extend(_artifacts(client, run_id, item.path) if item.is_dir else [item.path])
    return found


def _most_at_once(spans: list[tuple[int, int]]) -> int:
    """The most intervals (start, end) open at one moment."""
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans], key=lambda x: (x[0], x[1]))
    most = now = 0
    for _, change in edges:
        now += change
        most = max(most, now)
    return most


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.soak", description=__doc__.splitlines()[0])
    parser.add_argument("--benchmarks", type=int, default=3, help="Benchmarks started at once, each a training and a rollout cell (default 3)")
    parser.add_argument("--epochs", type=int, default=3, help="Epochs of each training cell (default 3)")
    parser.add_argument("--folder", type=Path, default=None, help="Keep the servers' stores and logs here (default: a temporary folder)")
    parser.add_argument("--json", action="store_true", help="Only the JSON summary on stdout")
    args = parser.parse_args(argv)
    for name, value, low, high in (("--benchmarks", args.benchmarks, 1, 32), ("--epochs", args.epochs, 1, 100)):
        if not low <= value <= high:
            print(f"python -m infra.soak: error: {name} {value} is outside {low}..{high}", file=sys.stderr)
            return 2
    if args.folder is not None and args.folder.exists() and any(args.folder.iterdir()):
        print(f"python -m infra.soak: error: --folder {str(args.folder)!r} is not empty; give a new or empty folder", file=sys.stderr)
        return 2
    folder = args.folder or Path(tempfile.mkdtemp(prefix="karman-soak-"))
    folder.mkdir(parents=True, exist_ok=True)
    say = (lambda line: print(line, file=sys.stderr)) if args.json else print
    soak = Soak(folder, args.benchmarks, args.epochs, say)
    try:
        result = soak.run()
    except Exception as exc:
        print(f"python -m infra.soak: failed: {exc}", file=sys.stderr)
        return 1
    finally:
        soak.services.stop()
    ok = not result["lost"] and not result["left_running"]
    if ok and args.folder is None:
        shutil.rmtree(folder, ignore_errors=True)
    elif not ok:
        say(f"the stores and logs are in {folder}")
    print(json.dumps(result))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
