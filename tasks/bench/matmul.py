"""bench-matmul: the FLOP ceiling of a device per framework and dtype (square products, cold and warm), each framework in its own child process.

The parent imports no framework: it checks the request, runs one child per framework
(``matmul_job``), sets each result beside the device's peak (tasks.common.measures.ceiling), and only then
writes: one MLflow run per (framework, device, dtype) where MLflow is installed, and the ceiling
cache. Bad input, or a child that refuses its request, ends the command before anything is written.
"""

import importlib.util
import logging
import os

from tasks.bench.specs import BenchMatmulSpec
from tasks.common.measures.ceiling import BENCH, cpu_name, host_key, peak_tflops, this_cpu, write_ceiling
from tasks.common.config.errors import UserError
from tasks.common.measures.matmul import BYTES, check

log = logging.getLogger("karman.bench")
BODY = "tasks.bench.matmul:matmul_job"
STAGE = "ceiling"


def matmul_job(job: dict) -> dict:
    """Child side: every dtype, then every size, of one framework on one device, in this process. The
    backends for all dtypes open first, so that a dtype the device lacks stops the job before it measures."""
    from tasks.common.measures.matmul import Timer

    if job.get("threads"):
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[: job["threads"]])
    framework, device = job["framework"], job["device"]
    timers = [Timer(framework, device, dtype) for dtype in job["dtypes"]]
    free = timers[0].backend.free_bytes() if timers else None  # the GPU's, where its framework says (cpu is checked by the parent)
    for timer in timers:
        need = _bytes_needed(max(job["sizes"]), timer.dtype)
        if free is not None and need > free:
            raise UserError(f"size {max(job['sizes'])}: three {timer.dtype} matrices need {need / 2**30:.1f} GiB; "
                            f"{timer.device_name} has {free / 2**30:.1f} GiB free")
    results = [{"dtype": t.dtype, "device_name": t.device_name, "init_s": t.init_s,
                "sizes": [t.measure(n, job["repeats"]) for n in job["sizes"]]} for t in timers]
    return {"framework": framework, "device": device, "cores": len(os.sched_getaffinity(0)), "version": _version(framework), "results": results}


def _version(framework: str) -> str:
    import importlib

    return importlib.import_module(framework).__version__


def _bytes_needed(n: int, dtype: str) -> int:
    """Memory of one timed product: two operands and the result at ``dtype``, and the two fp32 draws they are cast from."""
    return n * n * (3 * BYTES[dtype] + 2 * 4)


def _available_host_bytes() -> int:
    with open("/proc/meminfo") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["MemAvailable"].split()[0]) * 1024


def _check_request(spec: BenchMatmulSpec, dtypes: list[str], sizes: list[int]) -> None:
    """UserError for what the parent can refuse before any child starts: a dtype a framework lacks on the
    device, more threads than cores, matrices that do not fit in the host's memory."""
    from models.host import cpu_cores

    for framework in spec.frameworks:
        for dtype in dtypes:
            check(framework, spec.device, dtype)
    if spec.threads is not None and spec.threads > cpu_cores():
        raise UserError(f"--threads {spec.threads}: this process may run on {cpu_cores()} cores")
    if spec.device == "cpu":
        n, widest = max(sizes), max(dtypes, key=BYTES.get)
        need, available = _bytes_needed(n, widest), _available_host_bytes()
        if need > available:
            raise UserError(f"--sizes {n}: three {n}x{n} {widest} matrices (and their fp32 draws) need {need / 2**30:.1f} GiB; "
                            f"this host has {available / 2**30:.1f} GiB available")


def _row(framework: str, device: str, cores: int, result: dict) -> dict:
    """One (framework, dtype): its sizes, the best warm figure, the peak it is set against and the fraction reached."""
    sizes = [{k: r[k] for k in ("n", "cold_s", "warm_s", "cold_tflops", "warm_tflops", "warm_runs_s", "warm_busy_cores")} for r in result["sizes"]]
    best = max(sizes, key=lambda r: r["warm_tflops"])
    peak = peak_tflops(device, result["device_name"], result["dtype"])
    per_core = {}
    if peak and peak[1].startswith("derived"):  # on a shared host: the rate per core the process actually got, against one core's peak
        per_core = {"best_warm_tflops_per_busy_core": best["warm_tflops"] / best["warm_busy_cores"],
                    "per_busy_core_fraction_of_core_peak": best["warm_tflops"] / best["warm_busy_cores"] / (peak[0] / cores)}
    return {"framework": framework, "device": device, "device_name": result["device_name"], "dtype": result["dtype"],
            "init_s": result["init_s"], "sizes": sizes, "best_warm_tflops": best["warm_tflops"], "best_n": best["n"],
            "peak_tflops": peak[0] if peak else None, "peak_source": peak[1] if peak else None,
            "warm_fraction_of_peak": best["warm_tflops"] / peak[0] if peak else None, **per_core}


def bench_matmul(spec: BenchMatmulSpec) -> dict:
    """Measure every (framework, dtype) of the spec at every size; log and cache the results (unless
    ``--no-log``); return the summary."""
    from tasks.common.process.launch import device_env, run_child
    from tasks.common.config.settings import Settings

    dtypes, sizes = spec.resolved_dtypes(), spec.resolved_sizes()
    _check_request(spec, dtypes, sizes)
    settings = tracked = None
    if spec.log:
        settings = Settings.from_env().require_writable()
        tracked = importlib.util.find_spec("mlflow") is not None
        if tracked:
            from tasks.common.tracking.runs import tracking_ready

            tracking_ready(settings, create=False)  # a server that is down ends it now; a new local store is made once there are results
    load_before = os.getloadavg()[0]
    job = {"device": spec.device, "dtypes": dtypes, "sizes": sizes, "repeats": spec.repeats, "threads": spec.threads}
    children = [run_child("matmul", BODY, {**job, "framework": fw}, log, env=device_env(spec.device, framework=fw), framework=fw)
                for fw in spec.frameworks]
    cpu = this_cpu()
    rows = [_row(child["framework"], spec.device, cpu.cores, result) for child in children for result in child["results"]]
    summary = {"device": spec.device, "cpu_name": cpu_name(cpu), "isa": list(cpu.isa), "host_key": host_key(cpu),
               "cores": children[0]["cores"], "sizes": sizes, "repeats": spec.repeats,
               "versions": {child["framework"]: child["version"] for child in children},
               # the host's 1-minute load average before and after: above its core count, other work shared the cores
               "load_average": {"before": load_before, "after": os.getloadavg()[0]}, "results": rows}
    if not spec.log:
        return {**summary, "logged": "nothing (--no-log)"}
    for row in rows:
        write_ceiling(settings, spec.device, row["framework"], row["dtype"], row["best_warm_tflops"], row["best_n"], BENCH,
                      device_name=row["device_name"])
    summary["ceilings_file"] = str(settings.ceilings_path())
    if tracked:
        tracking_ready(settings)  # a new local store: its tables created under a lock
        for row in rows:
            row["run_id"] = _log_run(settings, summary, row)
    summary["logged"] = "MLflow and the ceiling cache" if tracked else "the ceiling cache (MLflow is not installed)"
    return summary


def _log_run(settings, summary: dict, row: dict) -> str:
    """One MLflow run of stage ``ceiling`` for a (framework, device, dtype); returns its id."""
    from tasks.common.tracking.names import Tag
    from tasks.common.tracking.runs import mlflow_run

    params = {"framework": row["framework"], "device": row["device"], "device_name": row["device_name"], "dtype": row["dtype"],
              "sizes": ",".join(str(s["n"]) for s in row["sizes"]), "repeats": summary["repeats"], "cores": summary["cores"],
              "cpu_name": summary["cpu_name"], "host_key": summary["host_key"], "peak_source": row["peak_source"],
              "framework_version": summary["versions"][row["framework"]]}
    metrics = {"best_warm_tflops": row["best_warm_tflops"], "best_n": row["best_n"], "init_s": row["init_s"]}
    for size in row["sizes"]:
        n = size["n"]
        metrics |= {f"cold_tflops_n{n}": size["cold_tflops"], f"warm_tflops_n{n}": size["warm_tflops"],
                    f"cold_s_n{n}": size["cold_s"], f"warm_s_n{n}": size["warm_s"], f"warm_busy_cores_n{n}": size["warm_busy_cores"]}
    if row["peak_tflops"] is not None:
        metrics |= {"peak_tflops": row["peak_tflops"], "warm_fraction_of_peak": row["warm_fraction_of_peak"]}
    if "per_busy_core_fraction_of_core_peak" in row:
        metrics["per_busy_core_fraction_of_core_peak"] = row["per_busy_core_fraction_of_core_peak"]
    tags = {Tag.FRAMEWORK: row["framework"], Tag.DEVICE: row["device"]}
    name = f"ceiling-{row['framework']}-{row['device']}-{row['dtype']}"
    with mlflow_run(settings, STAGE, name, params=params, tags=tags,
                    description=f"Matmul ceiling of {row['device_name']} in {row['framework']} at {row['dtype']} (bench-matmul).") as run:
        run.log_metrics(metrics)
    return run.run_id
