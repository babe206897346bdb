"""The Kármán workload, framework-neutral: its dataset (solver frames in zarr), split, normalisation, networks' shapes, validation rollouts and quality target.

Every framework module (torch.py, tensorflow.py, jax.py) trains on what ``prepare`` returns, so all see
the same pairs, split, normalisation, recipe and validation.
"""

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from models.karman.solver import vorticity

from tasks.common.config.errors import UserError
from tasks.common.reports.plots import vorticity_panels
from tasks.common.stores.store import file_sha256, load_manifest
from tasks.common.config.settings import Settings
from tasks.common.specs import GenerateSpec, TrainSpec
from tasks.workloads import RunRules, Workload
from tasks.workloads.karman.data import IN_MEMORY_BYTES, OUTPUTS, Normalizer, PairSource, StepCodec, model_inputs, split_of, training_net
from tasks.workloads.karman.registry import register_champion, spec_target
from tasks.workloads.karman.report import ablation_table, sections as report_sections


HEADLINE = {"horizon_vorticity": "vorticity horizon", "horizon_u": "u horizon"}  # the validation scores an epoch's line shows, in words


@dataclass
class KarmanData:
    """What a Kármán training run trains on, the same in every framework."""

    dataset_dir: Path
    manifest: dict
    split: dict[str, list[str]]
    recipe: object  # models.karman.recipe.Recipe
    train: PairSource
    codec: StepCodec
    net: object  # models.karman.nets.config.NetConfig
    validation: object | None  # tasks.workloads.karman.scoring.Validation on rank 0, else None
    spec_crop: int | None = None  # the side of the training crops (None: whole frames)

    @property
    def dataset_digest(self) -> str:
        return self.manifest["digest"]

    @property
    def in_memory(self) -> bool:
        return self.train.in_memory

    @property
    def flops_per_sample(self) -> float:
        """Training FLOPs of one (frame, next frames) pair: the recipe's step on the training image (or crop)."""
        side = (self.spec_crop, self.spec_crop) if self.spec_crop else (self.train.height, self.train.width)
        return self.net.training_flops(*side, self.recipe.unroll, self.recipe.gan_weight > 0)

    def params(self, g_params: int, d_params: int) -> dict:
        """The workload's own parameters of a run's record (MLflow params under their long-standing names)."""
        return {"image_height": self.train.height, "image_width": self.train.width, "generator_depth": self.net.generator_depth,
                "generator_params": g_params, "discriminator_params": d_params, "recipe_label": self.recipe.name,
                **{f"recipe_{k}": v for k, v in dataclasses.asdict(self.recipe).items() if k != "name"}}


class KarmanTrainer:
    """What the three frameworks' karman trainers share: the validation rollouts scored through the trainer's
    ``forward`` (encoded states -> the generator's outputs) and the quality target they are held to."""

    data: KarmanData
    forward: Callable[[np.ndarray], np.ndarray]  # each framework's trainer defines it

    def evaluate(self) -> dict[str, float]:
        return self.data.validation.score_forward(self.forward)

    def reached(self, scores: dict[str, float]) -> bool:
        return self.data.validation.reached(scores)


def _pairs(settings, spec) -> tuple[Path, dict, dict, object, PairSource]:
    dataset_dir = settings.dataset_dir(spec.dataset)
    manifest = load_manifest(dataset_dir)
    split = split_of(manifest, spec.options.val_simulations, spec.options.test_simulations, spec.seed)
    recipe = spec.options.resolved_recipe()
    reynolds = [float(manifest["simulations"][s]["spec"]["reynolds"]) for s in split["train"]] if recipe.condition == "reynolds" else None
    return dataset_dir, manifest, split, recipe, PairSource(dataset_dir, split["train"], spec.options.stride, unroll=recipe.unroll,
                                                            reynolds=reynolds)


def _net(source: PairSource, spec, recipe):
    return training_net(source.height, source.width, spec.options.crop, spec.options.depth, in_channels=source.channels, ngf=recipe.ngf,
                        ndf=recipe.ndf, norm=spec.options.norm, dropout=recipe.dropout, upsample=recipe.upsample, output=recipe.output)


def prepare(settings: Settings, spec: TrainSpec, main: bool = True) -> KarmanData:
    """The training data of ``spec``: training sets that fit are decoded once and held in memory; the
    normalisation is fitted by streaming over the training frames; rank 0 (``main``) loads the
    validation simulations."""
    from tasks.workloads.karman.scoring import Validation

    dataset_dir, manifest, split, recipe, train = _pairs(settings, spec)
    if train.nbytes <= IN_MEMORY_BYTES:  # decoded once, not per batch on the cores that train
        train.hold_in_memory()
    codec = StepCodec(Normalizer.fit(train), train.change_rms().tolist() if recipe.predict == "delta" else None, recipe.damping, recipe.constrain)
    net = _net(train, spec, recipe)
    validation = (Validation.of(dataset_dir, manifest, split["val"], codec, net, spec.options.stride, spec.validate_every,
                                spec.options.validate_steps, spec.options.target_vorticity, spec.options.target_steps, recipe.condition) if main else None)
    return KarmanData(dataset_dir, manifest, split, recipe, train, codec, net, validation, spec.options.crop)


def check(settings: Settings, spec: TrainSpec, batch_sizes: list[int], world: int, memory: int | None = None) -> None:
    """What can be refused before any run starts (reads the dataset's metadata only): the frames must
    fit the U-Net, each batch must split over the devices and fit in the training pairs, and (given a
    device's ``memory`` in bytes) the estimated memory of a step must fit it."""
    _, manifest, split, recipe, source = _pairs(settings, spec)
    net = _net(source, spec, recipe)
    if spec.stop_at_target and spec.validate_every and split["val"]:
        shortest = min((int(manifest["simulations"][s]["frames"]) - 1) // spec.options.stride for s in split["val"])
        if spec.options.target_steps > shortest:
            raise UserError(f"target_steps {spec.options.target_steps} exceeds the {shortest} steps of frame stride {spec.options.stride} that the shortest "
                            f"validation simulation of dataset {spec.dataset!r} holds, so --stop-at-target could never stop; "
                            f"use --target-steps {shortest} or less, or a smaller stride")
    for b in batch_sizes:
        if b % world:
            raise UserError(f"batch size {b} does not split evenly over {world} devices; use a multiple of {world}")
        if b > len(source):
            raise UserError(f"batch size {b} exceeds the {len(source)} training pairs of dataset {spec.dataset!r}")
    if memory:
        side = (spec.options.crop, spec.options.crop) if spec.options.crop else (source.height, source.width)
        need = net.training_bytes(max(batch_sizes) // world, *side, recipe.unroll)
        if need > 0.8 * memory:  # the rest for the data, the framework and everything else on the host
            raise UserError(f"ngf {recipe.ngf} and ndf {recipe.ndf} at batch {max(batch_sizes)} need about {need / 2**30:.3g} GiB a device "
                            f"to train ({sum(net.weight_count()):,} parameters), more than 80% of the {memory / 2**30:.3g} GiB this {spec.device} "
                            "device has; use narrower networks or a smaller batch (the paper's width is 64)")


def dataset_info(settings: Settings, dataset: str) -> tuple[str, dict]:
    """The dataset's digest and how many simulations it holds."""
    manifest = load_manifest(settings.dataset_dir(dataset))
    return manifest["digest"], {"simulations": len(manifest["simulations"])}


def largest_corner(x: np.ndarray, unit: int) -> np.ndarray:
    """The largest top-left corner of (..., H, W) whose sides are multiples of ``unit`` (what a U-Net
    trained on crops takes)."""
    return x[..., : x.shape[-2] - x.shape[-2] % unit, : x.shape[-1] - x.shape[-1] % unit]


def sample_figure(forward: Callable[[np.ndarray], np.ndarray], source: PairSource, codec: StepCodec, path: Path, unit: int) -> Path:
    """Vorticity of one-step predictions against targets for three training pairs; ``forward`` maps
    encoded states (B, 4 or 5, H, W) to the network's outputs (B, 3, H, W) (any framework, on the CPU)."""
    picks = np.linspace(0, len(source) - 1, 3).astype(int)
    cond, ref = source.physical(picks)  # (3, 4 or 5, H, W), (3, 3, H, W)
    # A model trained on crops may not take whole frames: show the largest corner it takes.
    cond, ref = largest_corner(cond, unit), largest_corner(ref[:, :3], unit)  # the first step's target
    pred = codec.next_state(cond, forward(codec.norm.encode(cond)))  # (3, 3, H, W)
    mask = cond[:, 3] > 0.5
    w_pred = vorticity(pred[:, 0], pred[:, 1], mask)
    w_ref = vorticity(ref[:, 0], ref[:, 1], mask)
    return vorticity_panels(w_pred, w_ref, [f"pair {j}" for j in picks], path, "one-step predictions (training pairs)")


def model_meta(net, codec: StepCodec, spec, manifest: dict, split: dict, framework: str, weights: Path) -> dict:
    """meta.json of a trained model: what a rollout needs besides the weights, and the weights file's name, size and checksum."""
    inputs = model_inputs(spec.options.resolved_recipe().condition)
    return {"net": dataclasses.asdict(net), "normalizer": dataclasses.asdict(codec.norm), "inputs": inputs, "outputs": OUTPUTS,
            "predict": "delta" if codec.delta_scale is not None else "state", "delta_scale": codec.delta_scale,
            "damping": codec.damping, "constrain": codec.constrain, "recipe": spec.options.resolved_recipe().name, "frame_stride": spec.options.stride, "dataset": spec.dataset, "dataset_digest": manifest["digest"],
            "split": split, "framework": framework, "weights_file": weights.name,
            "train_reynolds": sorted(float(manifest["simulations"][s]["spec"]["reynolds"]) for s in split["train"]),
            # what a rollout checks before it uses the weights: their size (before any work) and checksum (on loading)
            "generator_bytes": weights.stat().st_size, "generator_sha256": file_sha256(weights)}


def setting(spec: TrainSpec) -> str:
    """The recipe and its widths, in words."""
    recipe = spec.options.resolved_recipe()
    return f"recipe {recipe.name}" + ("" if "ngf=" in recipe.name else f", ngf {recipe.ngf}") + (f", crop {spec.options.crop}" if spec.options.crop else "")


def generate(settings: Settings, spec: GenerateSpec, parent_run_id: str | None = None) -> dict:
    """The solver sweep of ``spec`` (GenerateSpec) into its dataset (tasks.workloads.karman.sweep, imported here: Prefect's
    task runner and Dask load with it, which a training child never needs)."""
    from tasks.workloads.karman.sweep import run_sweep

    return run_sweep(settings, spec, parent_run_id)


def rollouts(settings, spec, model, log):
    """The checked plan of a rollout of training run ``model`` (tasks.workloads.karman.infer.plan, imported here: the
    training child never needs it)."""
    from tasks.workloads.karman.infer.plan import plan_rollout

    return plan_rollout(settings, spec, model, log)


def bench_quality(settings, bench, spec, runtime, train, folders) -> dict:
    """bench-quality's scoring of karman's models (tasks.workloads.karman.bench.quality, imported here with torch)."""
    from tasks.workloads.karman.bench.quality import bench_quality as scored

    return scored(settings, bench, spec, runtime, train, folders)


def bench_train(bench, seed: int = 0) -> dict:
    """bench-train of the Pix2Pix step (tasks.workloads.karman.bench.train, imported here: torch loads with it)."""
    from tasks.workloads.karman.bench.train import bench_train as timed

    return timed(bench, seed)


def bench_infer(bench, seed: int = 0) -> dict:
    """bench-infer of the generator's rollout step (tasks.workloads.karman.bench.infer, imported here: torch loads with it)."""
    from tasks.workloads.karman.bench.infer import bench_infer as timed

    return timed(bench, seed)


def check_generate(settings: Settings, spec: GenerateSpec) -> None:
    """What the sweep of ``spec`` refuses before anything runs (tasks.workloads.karman.sweep.check_sweep)."""
    from tasks.workloads.karman.sweep import check_sweep

    check_sweep(settings, spec)


WORKLOAD = Workload(
    name="karman",
    title="Pix2Pix surrogate of a Kármán vortex street",
    data="lattice-Boltzmann simulations of channel flow past obstacles (python -m flows generate)",
    frameworks=("torch", "tensorflow", "jax"),
    references=("torch", "tensorflow", "jax"),  # bench-frameworks' idiomatic references (references/)
    main_loss="loss_l1",
    target="vorticity relative L2 within the target for the first target-steps steps of every validation rollout",
    prepare=prepare,
    check=check,
    dataset_info=dataset_info,
    setting=setting,
    generate=generate,
    check_generate=check_generate,
    swept=True,
    rollouts=rollouts,
    bench_quality=bench_quality,
    bench_train=bench_train,
    bench_infer=bench_infer,
    ablation=ablation_table,
    spec_target=spec_target,
    register=register_champion,
    report=report_sections,
    rules=RunRules(runs=5, failures=1, max_runtime_s=1800.0),  # the long-horizon recipe's half hour
    quick={"batch_sizes": [4, 8], "epochs": 3, "options": {"ngf": 16, "ndf": 16}},  # the demo's sizes: a quick benchmark's karman cells take minutes, not hours
)
