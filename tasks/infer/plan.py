"""A rollout request turned into one checked RolloutPlan, in the flow process (no framework imported); the rollout job receives it as JSON."""

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from models.host import cpu_cores
from models.nets.config import NetConfig
from models.tiling import TilePlan, TilingError
from tasks.common import plans
from tasks.common import probe
from tasks.common.errors import UserError
from tasks.common.launch import device_env, run_child
from tasks.common.names import Tag
from tasks.common.registry import resolve_model_uri
from tasks.common.settings import Settings
from tasks.common.specs import InferSpec
from tasks.common.store import file_sha256, load_manifest
from tasks.common.tracking import client_for, experiment_id, missing, training_run
from tasks.workloads.karman.data import CONDITIONS, OUTPUTS, model_inputs
from tasks.workloads.karman.scoring import rollout_steps
from tasks.workloads.karman.simulation import SimulationSpec

# MlflowException is imported in the functions that catch it: Dask workers import the flows' modules and need no MLflow.


def download(settings: Settings, model_run: str, path: str, tmp: str) -> Path:
    """A training run's artifact ``path`` downloaded under ``tmp``; UserError if the run has none."""
    from mlflow.exceptions import MlflowException

    try:
        return Path(client_for(settings).download_artifacts(model_run, path, tmp))
    except MlflowException as exc:
        if not missing(exc):
            raise
        raise UserError(f"training run {model_run!r} has no {path} artifact ({type(exc).__name__})") from None


def model_meta(settings: Settings, model_run: str) -> dict:
    """The metadata of a training run's model (network, normaliser, channels, dataset, split)."""
    with tempfile.TemporaryDirectory() as tmp:
        return json.loads(download(settings, model_run, "model/meta.json", tmp).read_text())


def weights_file(meta: dict) -> str:
    """The name of a model's weights file in its 'model' artifact (runs from before it was recorded: torch's)."""
    return meta.get("weights_file", "generator.pt")


def check_model_size(settings: Settings, model_run: str, meta: dict) -> None:
    """Refuse, before any work, a model whose weights file is not the size it was written with (a
    truncated or replaced artifact); runs logged before the size was recorded are not checked here."""
    expected = meta.get("generator_bytes")
    if expected is None:
        return
    name = weights_file(meta)
    listed = {f.path: f.file_size for f in client_for(settings).list_artifacts(model_run, "model")}
    found = listed.get(f"model/{name}")
    if found != expected:
        raise UserError(f"the model artifact model/{name} of training run {model_run} has {found} bytes, not the {expected} "
                        "it was written with: it is truncated or damaged; train again or roll out another run")


def check_model_file(path: Path, model_run: str, meta: dict) -> None:
    """Refuse a downloaded weights file whose checksum differs from the one recorded when it was written."""
    expected = meta.get("generator_sha256")
    if expected is not None and file_sha256(path) != expected:
        raise UserError(f"the model artifact model/{path.name} of training run {model_run} is damaged (its SHA-256 differs "
                        "from the one recorded when it was written); train again or roll out another run")


def resolve_model_run(settings: Settings, model_run: str):
    """The MLflow run of a finished training run: ``model_run`` itself, the newest one for 'latest', or the run
    whose generator a registered model's URI (models:/NAME@ALIAS, models:/NAME/VERSION) names."""
    if model_run.startswith("models:/"):
        model_run = resolve_model_uri(settings, model_run)
    client = client_for(settings)
    if model_run == "latest":
        runs = client.search_runs([experiment_id(client, settings)], f"tags.`{Tag.STAGE}` = 'train' and attributes.status = 'FINISHED'",
                                  order_by=["attributes.start_time DESC"], max_results=1)
        if not runs:
            raise UserError(f"no finished training run in experiment {settings.experiment!r}; run 'python -m flows train' first")
        return runs[0]
    return training_run(settings, model_run, "model run")


@dataclass
class RolloutPlan:
    """What a rollout request resolves to, checked: the model, the reference simulation and the tiling."""

    spec: InferSpec
    model_run_id: str
    framework: str  # of the model: selects the rollout job's framework
    meta: dict  # the model's meta.json
    dataset: str
    simulation: str
    sim_spec: SimulationSpec
    tiles: TilePlan  # the request's tiling (one tile, the whole frame, in full mode)
    full_frame: TilePlan | None  # the full-frame plan for the seam error, None if the U-Net can't take the frame

    @property
    def frame_stride(self) -> int:
        return int(self.meta["frame_stride"])

    @property
    def regime(self) -> dict:
        """Where the reference lies against the training data: a training simulation, interpolation
        (a Reynolds number inside the training range the model never saw) or extrapolation."""
        re, seen = float(self.sim_spec.reynolds), self.meta.get("train_reynolds")
        if not seen:
            return {"reynolds": re, "regime": "unknown"}
        lo, hi = min(seen), max(seen)
        if self.dataset == self.meta["dataset"] and self.simulation in self.meta["split"]["train"]:
            regime = "training simulation"
        elif lo <= re <= hi:
            regime = "interpolation"
        else:
            regime = "extrapolation"
        return {"reynolds": re, "train_reynolds_min": lo, "train_reynolds_max": hi, "regime": regime}

    def to_json(self) -> dict:
        """What the rollout job receives: everything it needs, nothing left to check."""
        def tiling(t: TilePlan | None):
            return None if t is None else {"height": t.height, "width": t.width, "tile": list(t.tile), "halo": t.halo, "unit": t.unit}
        return {"spec": self.spec.model_dump(), "model_run_id": self.model_run_id, "framework": self.framework, "meta": self.meta,
                "dataset": self.dataset, "simulation": self.simulation, "sim_spec": self.sim_spec.model_dump(),
                "tiles": tiling(self.tiles), "full_frame": tiling(self.full_frame)}

    @classmethod
    def from_json(cls, data: dict) -> "RolloutPlan":
        def tiling(t: dict | None):
            return None if t is None else TilePlan(t["height"], t["width"], tuple(t["tile"]), t["halo"], t["unit"])
        return cls(InferSpec(**data["spec"]), data["model_run_id"], data["framework"], data["meta"], data["dataset"],
                   data["simulation"], SimulationSpec(**data["sim_spec"]), tiling(data["tiles"]), tiling(data["full_frame"]))


def plan_rollout(settings: Settings, spec: InferSpec, log) -> RolloutPlan:
    """Every check of a rollout request, before any work: the model run, its channels against the
    dataset, the tiling against the frame, the steps against the simulation, the workers against the
    cores or devices (a probe child for cuda and xla). A plan the CLI made for the same spec is taken
    instead. UserError names the value and what is allowed."""
    handed = plans.take("infer", spec)
    if handed is not None:
        return handed
    model = resolve_model_run(settings, spec.model_run)
    model_run_id = model.info.run_id
    meta = model_meta(settings, model_run_id)
    check_model_size(settings, model_run_id, meta)
    net = NetConfig(**meta["net"])
    dataset = spec.dataset or meta["dataset"]
    inputs = list(meta.get("inputs", model_inputs("none")))
    known = [list(model_inputs(c)) for c in CONDITIONS]  # the stored inputs, and those plus a simulation's Reynolds number
    if net.in_channels != len(inputs) or net.out_channels != len(OUTPUTS) or inputs not in known:
        raise UserError(f"model run {model_run_id} maps {net.in_channels} channels ({', '.join(inputs)}) to "
                        f"{net.out_channels}, but dataset {dataset!r} gives {len(known[0])} ({', '.join(known[0])}), or "
                        f"{len(known[1])} with each simulation's Reynolds number, -> {len(OUTPUTS)} ({', '.join(OUTPUTS)}); "
                        "roll it out on data with the model's channels")
    manifest = load_manifest(settings.dataset_dir(dataset))
    sims = manifest["simulations"]
    if spec.simulation:
        simulation = spec.simulation
    elif dataset == meta["dataset"]:
        simulation = (meta["split"]["test"] or meta["split"]["train"])[0]
    else:
        simulation = sorted(sims)[0]
    if simulation not in sims:
        raise UserError(f"simulation {simulation!r} is not in dataset {dataset!r}; choose one of {', '.join(sorted(sims))}")
    sim_spec = SimulationSpec(**sims[simulation]["spec"])
    height, width = sim_spec.ny, sim_spec.nx
    unit = 2**net.generator_depth
    full_fits = height % unit == 0 and width % unit == 0
    if spec.mode == "full":
        if not full_fits:
            raise UserError(f"frame {height}x{width} of {simulation} does not fit the model's U-Net (depth {net.generator_depth}: "
                            f"sides must be multiples of {unit}); use --mode mapreduce with tiles of a multiple of {unit}")
        tiles = TilePlan(height, width, (height, width), 0, unit)
    else:
        tile = tuple(spec.tile) if spec.tile else (net.size, net.size)
        try:
            tiles = TilePlan(height, width, (tile[0], tile[-1]), spec.halo, unit)
        except TilingError as exc:
            raise UserError(f"tiling of the {height}x{width} frame of {simulation}: {exc}") from None
    if rollout_steps(sim_spec.frames, spec.start_frame, int(meta["frame_stride"]), spec.steps) < 1:
        raise UserError(f"simulation {simulation} has {sim_spec.frames} frames: no rollout step fits after start frame "
                        f"{spec.start_frame} with frame stride {meta['frame_stride']}")
    check_workers(spec, log)
    full_frame = TilePlan(height, width, (height, width), 0, unit) if full_fits else None
    framework = meta.get("framework", model.data.params.get("framework", "torch"))
    return RolloutPlan(spec, model_run_id, framework, meta, dataset, simulation, sim_spec, tiles, full_frame)


def check_workers(spec: InferSpec, log) -> None:
    """Workers against this host's cores (cpu) or the devices a probe child finds (cuda, xla)."""
    if spec.device == "cpu":
        if spec.workers > cpu_cores():
            raise UserError(f"{spec.workers} workers requested but this host has {cpu_cores()} CPU cores; use at most {cpu_cores()}")
        return
    probed = run_child("probe", probe.BODY, {"device": spec.device}, log, env=device_env(spec.device, spec.workers))
    available = int(probed["world_size"])
    if spec.workers > available:
        raise UserError(f"{spec.workers} workers requested but {probed['device']} has {available} {spec.device} device(s); use at most {available}")
    if spec.device == "xla" and spec.workers not in (1, available):
        raise UserError(f"xla map-reduce shards each batch over all {available} devices; use --workers 1 or {available}")
