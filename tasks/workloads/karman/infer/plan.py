"""A rollout request of a karman model turned into one checked RolloutPlan, in the flow process (no framework imported); the rollout job receives it as JSON."""

from dataclasses import dataclass

from models.host import cpu_cores
from models.karman.nets.config import NetConfig
from models.karman.tiling import TilePlan, TilingError
from tasks.common.runtimes import probe
from tasks.common.config.errors import UserError
from tasks.common.process.launch import device_env, run_child
from tasks.common.stores.model_files import check_model_size, model_meta
from tasks.common.config.settings import Settings
from tasks.common.runtimes import probe
from tasks.common.specs import InferSpec
from tasks.common.stores.store import load_manifest
from tasks.workloads.karman.data import CONDITIONS, OUTPUTS, model_inputs
from tasks.workloads.karman.scoring import rollout_steps
from tasks.workloads.karman.simulation import SimulationSpec

# Each framework's rollout job body ("module:function"), run in its own child.
BODIES = {"torch": "tasks.workloads.karman.infer.torch:run_rollout", "tensorflow": "tasks.workloads.karman.infer.tensorflow:run_rollout",
          "jax": "tasks.workloads.karman.infer.jax:run_rollout"}


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
    def body(self) -> str:
        """The child's job body for the model's framework ("module:function")."""
        return BODIES[self.framework]

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


def plan_rollout(settings: Settings, spec: InferSpec, model, log) -> RolloutPlan:
    """Every check of a rollout request of training run ``model`` (MLflow's Run, resolved by the infer stage), before any
    work: its channels against the dataset, the tiling against the frame, the steps against the simulation, the workers
    against the cores or devices (a probe child for cuda and xla). UserError names the value and what is allowed."""
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
