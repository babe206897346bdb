"""karman's dataset: its GenerateSpec expanded into a sweep of simulations, the missing ones run on Dask (or batched on a GPU), recorded in the manifest.

The workload's ``generate``: not a task itself, each simulation is a task run of the flow (``simulate <sim_id>``), side by side in its graph.
"""

import logging
import shutil
import time

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from tasks.common.process.cluster import check_scheduler, dask_task_runner, finished, worth_retrying
from tasks.common.config.errors import UserError
from tasks.common.tracking.names import Tag
from tasks.common.process.progress import Progress
from tasks.common.config.settings import Settings
from tasks.common.specs import GenerateSpec
from tasks.common.stores.store import Manifest, consolidate, remove_stale_groups, verify_simulation, writer_lock
from tasks.common.tracking.runs import mlflow_run
from tasks.workloads.karman.simulate import expand, run_simulation
from tasks.workloads.karman.simulation import SimulationSpec


# Fields that became lists; a dataset written while they were scalars recorded the scalar.
_WERE_SCALARS = ("size", "x_position", "y_offset")


def sweep_key(spec: GenerateSpec) -> dict:
    """What identifies a dataset's sweep in its manifest. A one-value list of a field that used to be a
    scalar is recorded as that scalar, so datasets generated before stay the same sweep."""
    from tasks.common.config.workload_table import padding_of_others

    key = {"seed": spec.seed} | padding_of_others(spec.workload, "generate") | spec.options.model_dump(exclude={"verify", "cpu_backend"})
    for name in _WERE_SCALARS:
        if len(key[name]) == 1:
            key[name] = key[name][0]
    return key


def check_sweep(settings: Settings, spec: GenerateSpec) -> None:
    """What a sweep can have refused before anything runs: a sweep member that does not validate, a dataset of that name
    written by another sweep (unless it is to be overwritten), a Dask scheduler where none answers (where simulations are
    left to run), a cuda sweep given a Dask scheduler, a cuda sweep without a GPU."""
    sims = expand(spec)
    dataset_dir = settings.dataset_dir(spec.dataset)
    manifest = None
    if not spec.overwrite:
        try:
            manifest = Manifest(dataset_dir, sweep_key(spec))  # UserError where its sweep differs
        except UserError:
            raise
        except (ValueError, OSError):
            pass  # a manifest that cannot be read: the sweep itself says what it finds
    complete = manifest is not None and all(manifest.is_complete(s.sim_id) for s in sims)
    if spec.scheduler and spec.device == "cpu" and (spec.options.verify or not complete):
        check_scheduler(spec.scheduler)  # where Dask will run: a scheduler that is not there, refused now, not after 30 s of retries
    if spec.device == "cuda":
        if spec.scheduler:
            raise UserError(f"--scheduler {spec.scheduler}: a cuda sweep runs batched in one process on this host's GPU, not on Dask workers; drop --scheduler or use --device cpu")
        _probe_gpu()


def _probe_gpu() -> None:
    """UserError unless a CUDA GPU is there (asked in a child process: this one imports no framework)."""
    from tasks.common.runtimes import probe
    from tasks.common.process.launch import run_child

    run_child("probe", probe.BODY, {"device": "cuda"}, logging.getLogger("karman.generate"))


COMPLETE_WAIT_S = 120.0  # how long a sweep of a finished dataset waits for another process's pass over it


def _complete(dataset_dir, spec: GenerateSpec, sims: list[SimulationSpec]) -> bool:
    """Whether the manifest already holds every simulation of the sweep (False where it cannot be read)."""
    try:
        manifest = Manifest(dataset_dir, sweep_key(spec))
    except (UserError, ValueError, OSError):
        return False
    return all(manifest.is_complete(s.sim_id) for s in sims)


def run_sweep(settings: Settings, spec: GenerateSpec, parent_run_id: str | None = None) -> dict:
    """Simulate every missing member of the sweep in parallel on Dask; returns the dataset summary. Not a task
    itself: each simulation is a task run of the flow (``simulate <sim_id>``), side by side in its graph."""
    logger = get_run_logger()
    sims = expand(spec)
    dataset_dir = settings.dataset_dir(spec.dataset)
    # One writer per dataset: a second sweep is refused. A sweep with nothing left to simulate only checks
    # and consolidates, in a second: benchmarks that share a finished dataset wait their turn instead.
    done = not (spec.overwrite or spec.options.verify) and _complete(dataset_dir, spec, sims)
    with writer_lock(dataset_dir, f"dataset {spec.dataset!r}", wait_s=COMPLETE_WAIT_S if done else 0.0):
        return _sweep(settings, spec, sims, dataset_dir, parent_run_id, logger)


def _sweep(settings: Settings, spec: GenerateSpec, sims: list[SimulationSpec], dataset_dir, parent_run_id: str | None, logger) -> dict:
    if spec.overwrite and dataset_dir.exists():
        shutil.rmtree(dataset_dir)
    manifest = Manifest(dataset_dir, sweep_key(spec))
    if spec.options.verify:
        for sim_id in sorted(s for s in manifest.simulations if manifest.is_complete(s)):
            problem = verify_simulation(dataset_dir, sim_id, manifest.simulations[sim_id]["digest"])
            if problem:
                logger.warning("simulation %s is damaged (%s): it is simulated again", sim_id, problem)
                manifest.remove(sim_id)
    todo = [s for s in sims if not manifest.is_complete(s.sim_id)]
    removed = remove_stale_groups(dataset_dir, {s for s in manifest.simulations if manifest.is_complete(s)})
    if removed:
        logger.info("removed %d partial simulation group(s) left by an interrupted run: %s", len(removed), ", ".join(removed))
    logger.info("dataset %s: %d simulations, %d already complete, %d to run", spec.dataset, len(sims), len(sims) - len(todo), len(todo))
    params = {**spec.model_dump(exclude={"options"}), **spec.options.params(), "simulations": len(sims)}
    description = (f"Lattice-Boltzmann sweep into zarr dataset `{spec.dataset}`: {len(sims)} simulations ({len(todo)} run now, the rest "
                   f"were complete), {spec.options.nx}x{spec.options.ny} cells, {spec.options.frames} frames every {spec.options.frame_every} steps.")
    with mlflow_run(settings, "generate", f"generate-{spec.dataset}", params=params, parent_run_id=parent_run_id, description=description) as run:
        t0 = time.perf_counter()
        failures = []
        if todo and spec.device == "cuda":
            _run_on_gpu(spec, dataset_dir, todo, manifest, logger)
        elif todo:
            failures = _run_on_dask(spec, dataset_dir, todo, manifest, logger)
        consolidate(dataset_dir)
        wall = time.perf_counter() - t0
        done = [s.sim_id for s in sims if manifest.is_complete(s.sim_id)]
        mlups = [manifest.simulations[s.sim_id]["mlups"] for s in todo if s.sim_id in manifest.simulations]
        run.log_metrics({"wall_s": wall, "simulations": len(done), "simulated_now": len(todo) - len(failures), **({"mlups_mean": sum(mlups) / len(mlups)} if mlups else {})})
        run.set_tags({Tag.DATASET: spec.dataset, Tag.DATASET_DIGEST: manifest.digest()})
        run.log_dataset(spec.dataset, manifest.digest(), dataset_dir, "generated", {"simulations": len(done)})
        if failures:
            raise RuntimeError(f"{len(failures)} of {len(todo)} simulations failed: " + "; ".join(failures))
    return {"dataset": spec.dataset, "path": str(dataset_dir), "digest": manifest.digest(), "simulations": done, "run_id": run.run_id}


def _run_on_gpu(spec: GenerateSpec, dataset_dir, todo: list[SimulationSpec], manifest: Manifest, logger) -> None:
    """Every missing simulation batched on the GPU, in one child process (the fused kernel advances them
    together, one launch per step); the groups and manifest records are those of the CPU path."""
    from tasks.common.process.launch import run_child
    from tasks.workloads.karman.simulate import BATCH_BODY

    dataset_dir.mkdir(parents=True, exist_ok=True)
    sims = [s.model_dump() for s in todo]
    result = run_child("simulate", BATCH_BODY, {"sims": sims, "dataset_dir": str(dataset_dir), "device": "cuda"}, logger)
    for record in result["records"]:
        manifest.add(record["sim_id"], {k: record[k] for k in ("digest", "frames", "wall_s", "mlups", "steps", "spec")})
    logger.info("%d simulations batched on cuda: %d steps each in %.1f s (%.0f MLUPS per simulation)", len(todo),
                result["records"][0]["steps"], result["records"][0]["wall_s"], result["records"][0]["mlups"])


# One simulation as a Prefect task run on a Dask worker. Nothing is cached or persisted by Prefect: the zarr
# group is the result, and the manifest (written by the flow process) says what is complete.
simulate = task(run_simulation, name="simulate", task_run_name="simulate {spec.sim_id}", retries=2, retry_delay_seconds=[2, 10],
                retry_condition_fn=worth_retrying, cache_policy=NO_CACHE, persist_result=False)


def _run_on_dask(spec: GenerateSpec, dataset_dir, todo: list[SimulationSpec], manifest: Manifest, logger) -> list[str]:
    """Each missing simulation as a Prefect task run ``simulate <sim_id>`` through the Dask task runner; the manifest
    records each as it lands (here, in the flow process, only). A simulation whose worker is lost runs again on
    another; one that fails does not stop the others. Returns the failures, one line each."""
    dataset_dir.mkdir(parents=True, exist_ok=True)
    failures = []
    progress = Progress(f"simulations of dataset {spec.dataset} done")
    workers = min(spec.workers, len(todo))
    logger.info("simulating on %s", f"the Dask scheduler at {spec.scheduler}" if spec.scheduler else f"a local Dask cluster of {workers} worker process(es)")
    with dask_task_runner(workers, spec.scheduler, preload=[__name__]) as runner:
        # One thread per simulation: numba parallelism inside a worker would oversubscribe the other workers' cores.
        futures = [runner.submit(simulate, {"dataset_dir": str(dataset_dir), "spec": s.model_copy(update={"threads": 1})}) for s in todo]
        sims = {f.task_run_id: s for f, s in zip(futures, todo)}
        for i, (future, record, error) in enumerate(finished(runner, futures), 1):
            sim = sims[future.task_run_id]
            if error is not None:  # one failed simulation must not lose the others
                failures.append(f"{sim.sim_id}: {error}")
                logger.error("simulation %s failed: %s", sim.sim_id, error)
                continue
            manifest.add(sim.sim_id, {k: record[k] for k in ("digest", "frames", "wall_s", "mlups", "steps", "spec")})
            left = progress.update(i / len(todo))
            logger.info("[%d/%d] %s done: %d steps at %.0f MLUPS in %.1f s%s", i, len(todo), sim.sim_id, record["steps"], record["mlups"],
                        record["wall_s"], f"; {left}" if left else "")
    return failures
