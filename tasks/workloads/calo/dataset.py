"""The calo workload's dataset: synthetic electron showers (models/calo/showers.py's GFlash model) simulated in chunks of events on Dask into zarr, with its manifest, and read back checked.

The store holds ``cells`` (n, 51, 51, 25) float32 cell energies in GeV, chunked by CHUNK_EVENTS events,
``energy`` (n,) primary energies in GeV and ``angle`` (n,) incidence angles in degrees. Chunk k is a
function of the seed and k only, so the dataset does not depend on how many workers wrote it.
"""

import hashlib
import logging
import time
from pathlib import Path

import numpy as np
import zarr

from models.calo import showers
from tasks.common.process.cluster import dask_task_runner, finished, worth_retrying
from tasks.common.stores.datasets import read_checked, write_once
from tasks.common.config.errors import UserError
from tasks.common.tracking.names import Tag
from tasks.common.stores.store import MANIFEST, STORE, workload_manifest, write_json_atomic
from tasks.common.config.settings import Settings
from tasks.common.specs import GenerateSpec

log = logging.getLogger("karman.calo")
CHUNK_EVENTS = 100
DATA = ("synthetic: electron showers from the GFlash parametrisation (Grindhammer & Peters, arXiv:hep-ex/0001020), "
        "rotated by the incidence angle and binned to 51x51x25 cells; no Geant4")
MODEL = (f"synthetic GFlash electron showers: gamma longitudinal profile in X0 and core-plus-tail radial profile in R_M "
         f"(Grindhammer & Peters, arXiv:hep-ex/0001020, homogeneous media, Z {showers.Z_ATOMIC:g}, E_c {showers.CRITICAL_GEV * 1e3:g} MeV), "
         f"per-event fluctuations of (ln T, ln alpha) and of the deposited energy ({showers.STOCHASTIC:g}/sqrt(E/GeV)), "
         f"{showers.SPOTS_PER_GEV} spots per GeV, rotated by the incidence angle, 51x51x25 cells of {showers.CELL_X0:g} X0 "
         f"({showers.CELL_RM:.3f} R_M), sampling fraction {showers.SAMPLING_FRACTION:g}")


def parameters(spec) -> dict:
    """What identifies a calo dataset: the request and the model's constants."""
    return {"events": spec.options.events, "energy_gev": list(spec.options.energy), "angle_deg": list(spec.options.angle), "seed": spec.seed,
            "chunk_events": CHUNK_EVENTS, "shape": list(showers.SHAPE), "z": showers.Z_ATOMIC, "critical_gev": showers.CRITICAL_GEV,
            "rm_over_x0": showers.RM_OVER_X0, "cell_x0": showers.CELL_X0, "layer_x0": showers.LAYER_X0,
            "sampling_fraction": showers.SAMPLING_FRACTION, "stochastic": showers.STOCHASTIC, "spots_per_gev": showers.SPOTS_PER_GEV,
            "axis_depth_x0": showers.AXIS_DEPTH_X0}


def check_ranges(spec) -> None:
    """UserError unless the energy and angle ranges are ordered and inside the generator's."""
    for name, (lo, hi), (low, high), unit in (("energy", spec.options.energy, showers.ENERGY_LIMITS, "GeV"),
                                              ("angle", spec.options.angle, showers.ANGLE_LIMITS, "degrees")):
        if not (low <= lo < hi <= high):
            raise UserError(f"--{name} {lo:g},{hi:g}: the calo generator covers {low:g}-{high:g} {unit}; "
                            f"give two values inside it, the lower first")


def conditions(spec) -> tuple[np.ndarray, np.ndarray]:
    """Every event's primary energy (GeV) and angle (degrees), uniform in the spec's ranges, from its seed."""
    rng = np.random.default_rng([spec.seed, 30])
    return rng.uniform(*spec.options.energy, spec.options.events), rng.uniform(*spec.options.angle, spec.options.events)


def chunk_digest(cells: np.ndarray, energy: np.ndarray, angle: np.ndarray) -> str:
    h = hashlib.sha256()
    for a in (cells, energy, angle):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def write_chunk(store: str, k: int, energy: np.ndarray, angle: np.ndarray, seed: int) -> dict:
    """Simulate chunk ``k`` (events k * CHUNK_EVENTS on) into the store; its digest, sums and wall time (runs on a Dask worker)."""
    t0 = time.perf_counter()
    cells = showers.shower_events(energy.astype(np.float64), angle.astype(np.float64), (seed, 30, k))
    root = zarr.open_group(store, mode="r+", zarr_format=3)
    start = k * CHUNK_EVENTS
    root["cells"][start: start + len(energy)] = cells
    return {"chunk": k, "digest": chunk_digest(cells, energy, angle), "wall_s": time.perf_counter() - t0,
            "sum_over_energy": float((cells.sum(axis=(1, 2, 3), dtype=np.float64) / energy).sum())}


def _run_on_dask(store: Path, energy: np.ndarray, angle: np.ndarray, spec) -> list[dict]:
    """Every chunk as a Prefect task run ``simulate calo chunk <k>`` through the Dask task runner (a local cluster of
    ``spec.workers`` one-thread processes, or ``spec.scheduler``); RuntimeError naming the chunks that failed."""
    from prefect import task  # here, not at the top: training children import this module and need no Prefect
    from prefect.cache_policies import NO_CACHE

    # A chunk writes its own region of the store whole: one run again (its worker lost) writes the same bytes over
    # the same place. Nothing is cached or persisted by Prefect.
    simulate_chunk = task(write_chunk, name="simulate-chunk", task_run_name="simulate calo chunk {k}", retries=2, retry_delay_seconds=[2, 10],
                          retry_condition_fn=worth_retrying, cache_policy=NO_CACHE, persist_result=False)
    chunks = range(0, len(energy), CHUNK_EVENTS)
    records, failures = [], []
    with dask_task_runner(min(spec.workers, len(chunks)), spec.scheduler, preload=[__name__]) as runner:
        futures = [runner.submit(simulate_chunk, {"store": str(store), "k": i // CHUNK_EVENTS, "energy": energy[i: i + CHUNK_EVENTS],
                                                  "angle": angle[i: i + CHUNK_EVENTS], "seed": spec.seed}) for i in chunks]
        for _, record, error in finished(runner, futures):
            if error is None:
                records.append(record)
            else:
                failures.append(str(error))
    if failures:
        raise RuntimeError(f"{len(failures)} of {len(futures)} chunks of showers failed: " + "; ".join(failures))
    return records


def write_dataset(dataset_dir: Path, spec) -> dict:
    """Simulate the spec's showers into ``dataset_dir`` on Dask; the manifest (written last, atomically)
    marks the dataset complete. Returns the manifest."""
    energy, angle = conditions(spec)
    energy, angle = energy.astype(np.float32), angle.astype(np.float32)
    dataset_dir.mkdir(parents=True, exist_ok=True)
    root = zarr.open_group(dataset_dir / STORE, mode="w", zarr_format=3)
    root.create_array("cells", shape=(spec.options.events, *showers.SHAPE), chunks=(CHUNK_EVENTS, *showers.SHAPE), dtype=np.float32, fill_value=0.0)
    root.create_array("energy", data=energy, chunks=(CHUNK_EVENTS,))  # GeV
    root.create_array("angle", data=angle, chunks=(CHUNK_EVENTS,))  # degrees
    t0 = time.perf_counter()
    records = sorted(_run_on_dask(dataset_dir / STORE, energy, angle, spec), key=lambda r: r["chunk"])
    wall = time.perf_counter() - t0
    digest = hashlib.sha256(";".join(r["digest"] for r in records).encode()).hexdigest()[:16]
    manifest = {"workload": "calo", "synthetic": True, "data": DATA, "model": MODEL, "parameters": parameters(spec),
                "events": spec.options.events, "chunks": len(records), "chunk_digests": [r["digest"] for r in records], "digest": digest,
                "sampling_fraction": sum(r["sum_over_energy"] for r in records) / spec.options.events, "simulate_wall_s": wall}
    write_json_atomic(dataset_dir / MANIFEST, manifest)
    return manifest


def manifest_of(dataset_dir: Path) -> dict:
    return workload_manifest(dataset_dir, "calo")


def read_dataset(dataset_dir: Path, start: int = 0, stop: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(cells (n, 51, 51, 25) GeV, energy (n,) GeV, angle (n,) degrees) of events start..stop of a calo dataset."""
    manifest_of(dataset_dir)
    root = zarr.open_group(dataset_dir / STORE, mode="r", zarr_format=3)
    return root["cells"][start:stop], root["energy"][start:stop], root["angle"][start:stop]


def load_checked(dataset_dir: Path) -> dict:
    """The manifest of a calo dataset whose chunks match their digests; UserError naming what to do if damaged."""
    manifest = manifest_of(dataset_dir)

    def read():
        root = zarr.open_group(dataset_dir / STORE, mode="r", zarr_format=3)
        found = []
        for k in range(manifest["chunks"]):
            s = slice(k * CHUNK_EVENTS, (k + 1) * CHUNK_EVENTS)
            found.append(chunk_digest(root["cells"][s], root["energy"][s], root["angle"][s]))
        return manifest, found == manifest["chunk_digests"]

    return read_checked(dataset_dir, "calo", read)


def check_generate(settings: Settings, spec: GenerateSpec) -> None:
    """UserError if generate would refuse ``spec``: ranges outside the generator's, an existing dataset of that name
    that is another workload's or was written with other parameters (unless it is to be overwritten), or a Dask
    scheduler where none answers and the showers are still to be simulated."""
    check_ranges(spec)
    dataset_dir = settings.dataset_dir(spec.dataset)
    complete = False
    if not spec.overwrite and (dataset_dir / MANIFEST).is_file():
        if manifest_of(dataset_dir)["parameters"] != parameters(spec):
            raise UserError(f"dataset {spec.dataset!r} already exists with different calo parameters; "
                            "choose another --dataset name or pass --overwrite")
        complete = True
    if spec.scheduler and not complete:  # its chunks run on Dask: a scheduler that is not there, refused now
        from tasks.common.process.cluster import check_scheduler

        check_scheduler(spec.scheduler)


def generate(settings: Settings, spec: GenerateSpec, parent_run_id: str | None = None) -> dict:
    """Simulate the calo dataset ``spec.dataset`` (a no-op for a complete one of the same parameters;
    ``spec.overwrite`` writes it afresh), recorded as an MLflow ``generate`` run with the dataset logged."""
    from tasks.common.tracking.runs import mlflow_run

    dataset_dir = settings.dataset_dir(spec.dataset)
    check_ranges(spec)
    manifest, written, wall = write_once(settings, spec, check_generate, lambda folder: write_dataset(folder, spec), manifest_of)
    log.info("dataset %s: %d synthetic showers %s (digest %s)", spec.dataset, manifest["events"],
             "written" if written else "already complete", manifest["digest"])
    description = (f"{manifest['events']:,} synthetic electron showers ({MODEL}); energies {spec.options.energy[0]:g}-{spec.options.energy[1]:g} GeV, "
                   f"angles {spec.options.angle[0]:g}-{spec.options.angle[1]:g} degrees, in zarr dataset `{spec.dataset}`.")
    params = {"workload": "calo", "dataset": spec.dataset, "synthetic": True, "events": spec.options.events, "energy_gev": f"{spec.options.energy[0]:g}-{spec.options.energy[1]:g}",
              "angle_deg": f"{spec.options.angle[0]:g}-{spec.options.angle[1]:g}", "seed": spec.seed, "workers": spec.workers}
    with mlflow_run(settings, "generate", f"generate-{spec.dataset}", params=params, parent_run_id=parent_run_id, description=description) as run:
        run.log_metrics({"wall_s": wall, "events": manifest["events"], "written_now": float(written), "sampling_fraction": manifest["sampling_fraction"]})
        run.set_tags({Tag.DATASET: spec.dataset, Tag.DATASET_DIGEST: manifest["digest"]})
        run.log_dataset(spec.dataset, manifest["digest"], dataset_dir, "generated", {"events": manifest["events"], "synthetic": True})
    return {"dataset": spec.dataset, "path": str(dataset_dir), "digest": manifest["digest"], "events": manifest["events"],
            "synthetic": True, "written": written, "run_id": run.run_id}


# ---- training: the 3DGAN through the one loop -------------------------------------------------------------------
