"""The Kármán workload in PyTorch: the Pix2Pix trainer's batches, step, state and validation for the training loop, and the trained generator's artifacts."""

import json
from pathlib import Path

import numpy as np
import torch

from models.device import to_cpu
from models.karman.nets.pix2pix import build_generator
from models.karman.nets.trainer import NoClock, PhaseClock, build_trainer, speed_options
from models.karman.recipe import OptimConfig
from models.schedule import lr_factor
from tasks.common.runtimes.data import epoch_order
from tasks.common.tracking.names import Tag
from tasks.workloads.karman.data import OUTPUTS, crop_offsets, crop_pairs
from tasks.workloads.karman.workload import HEADLINE, KarmanData, KarmanTrainer, largest_corner, model_meta, sample_figure


class KarmanTorch(KarmanTrainer):
    """Pix2Pix (generator, discriminator, their optimisers) on the runtime's device; rank r trains on
    its slice of every global batch."""

    def __init__(self, data: KarmanData, spec, batch_size: int, runtime):
        self.data, self.spec, self.batch_size, self.runtime = data, spec, batch_size, runtime
        ctx = runtime.ctx
        self.local_batch = batch_size // ctx.world_size if ctx.strategy == "ddp" else batch_size
        self.options = speed_options(spec.device, spec.precision, spec.options.channels_last, spec.compile, spec.options.winograd, spec.options.cuda_graph) | {
            "keep_freed_memory": runtime.keeps_freed_memory}
        torch.manual_seed(spec.seed)  # the same initial weights on every rank
        self.model = build_trainer(data.net, OptimConfig.from_recipe(data.recipe, data.codec.delta_ratio, data.codec.zero), ctx, self.options)
        self.samples = len(data.train)
        self.has_validation = data.validation is not None and bool(data.validation.sims)
        self.headline = HEADLINE
        self.flops_per_sample = data.flops_per_sample
        self.clock = NoClock()
        g = sum(p.numel() for p in self.model.generator.parameters())
        d = sum(p.numel() for p in self.model.discriminator.parameters())
        self.params, self.speed = data.params(g, d), self.options

    def batches(self, epoch: int, steps: int):
        """This rank's (cond (b, 4 or 5, H, W), target (b, 3·unroll, H, W)) of each global batch, on the device;
        the next batch is read on a background thread while this one trains."""
        spec, ctx, train, b = self.spec, self.runtime.ctx, self.data.train, self.batch_size
        self.model.train()
        # no phase clock where the step is one graph (its boundaries would cut it) or lazy (XLA)
        self.clock = NoClock() if ctx.kind == "xla" or self.model.captured is not None else PhaseClock(ctx.sync)
        order = epoch_order(len(train), spec.seed, epoch)  # the same on every rank
        lo, hi = ctx.rank * self.local_batch, (ctx.rank + 1) * self.local_batch
        reader = train.prefetch((order[s * b: (s + 1) * b][lo:hi] for s in range(steps)), self.data.codec.norm)
        try:
            for step, (cond, target) in enumerate(reader):
                if spec.options.crop:  # this rank's slice of the global batch's crops
                    corners = crop_offsets(b, train.height, train.width, spec.options.crop, spec.seed, epoch, step)[lo:hi]
                    cond, target = crop_pairs(cond, target, corners, spec.options.crop)
                yield ctx.shard(self._to_device(cond)), ctx.shard(self._to_device(target))
        finally:
            reader.close()

    def _to_device(self, array: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(array).to(self.runtime.ctx.device)
        return t.contiguous(memory_format=torch.channels_last) if self.options["channels_last"] else t

    def step(self, batch, flags: list[float], progress: float) -> tuple[dict[str, float], list[float]]:
        if self.data.recipe.schedule != "constant":
            self.model.set_lr_factor(lr_factor(self.data.recipe.schedule, progress))
        cond, target = batch
        losses = self.model.train_step(cond, target, self.runtime.ctx.autocast, self.clock, self.data.recipe.loss_steps(progress))
        self.runtime.ctx.step_end()
        return self.runtime.reduce(losses, flags)

    def learning_rate(self) -> float:
        return float(self.model.opt_g.param_groups[0]["lr"])

    def epoch_metrics(self) -> dict[str, float]:
        return {f"{k}_s": v for k, v in self.clock.totals.items()} if not isinstance(self.clock, NoClock) else {}

    def state(self) -> dict:
        return {"generator": self.model.generator.state_dict(), "discriminator": self.model.discriminator.state_dict(),
                "optimizers": self.model.optimizer_state()}

    def load_state(self, state: dict) -> None:
        self.model.generator.load_state_dict(state["generator"])
        self.model.discriminator.load_state_dict(state["discriminator"])
        self.model.load_optimizer_state(state["optimizers"])

    def evaluate(self) -> dict[str, float]:
        return self.data.validation.score(self.model.generator, self.runtime.ctx)

    @property
    def generator(self) -> torch.nn.Module:
        return self.model.generator

    def finish(self, run_dir: Path, run, settings) -> None:
        """The trained generator as the run's artifacts: weights and meta.json, a figure of one-step
        predictions, and the MLflow model 'generator' (rank 0)."""
        data, net = self.data, self.data.net
        generator_state = to_cpu(self.model.generator.state_dict())
        model_dir = run_dir / "model"
        model_dir.mkdir(exist_ok=True)
        torch.save(generator_state, model_dir / "generator.pt")
        meta = model_meta(net, data.codec, self.spec, data.manifest, data.split, "torch", model_dir / "generator.pt")
        (model_dir / "meta.json").write_text(json.dumps(meta, indent=2))
        run.log_artifact(model_dir, "model")
        cpu_generator = build_generator(net)
        cpu_generator.load_state_dict(generator_state)
        cpu_generator.eval()
        run.log_artifact(sample_figure(_numpy_forward(cpu_generator), data.train, data.codec, run_dir / "sample_predictions.png",
                                       2**net.generator_depth))
        log_surrogate(settings, run, cpu_generator, data, meta)


def build(data: KarmanData, spec, batch_size: int, runtime) -> KarmanTorch:
    return KarmanTorch(data, spec, batch_size, runtime)


def _numpy_forward(generator):
    """Encoded states (B, 4, H, W) -> the generator's outputs (B, 3, H, W), numpy in and out (CPU)."""
    def forward(cond: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return generator(torch.from_numpy(cond)).float().numpy()
    return forward


def log_surrogate(settings, run, generator: torch.nn.Module, data: KarmanData, meta: dict) -> str:
    """The generator with its normalisation (models.karman.nets.surrogate.Surrogate) as the run's MLflow model
    'generator': listed under the run's Models, loadable with mlflow.pytorch.load_model, registrable.
    Its signature is one physical state (u, v, p, mask, and the Reynolds number for a model conditioned on
    it) of the training frames' size -> the next (u, v, p); the model's code travels with it. Returns the model's URI."""
    import mlflow
    import mlflow.pytorch
    from mlflow.models import infer_signature

    from models.karman.nets.surrogate import Surrogate

    codec = data.codec
    model = Surrogate(generator.eval(), codec.norm.center, codec.norm.scale, codec.delta_scale, codec.norm.reynolds,
                      codec.damping).eval()
    example = np.ascontiguousarray(largest_corner(data.train.physical([0])[0], 2**data.net.generator_depth), dtype=np.float32)  # (1, 4 or 5, H, W)
    with torch.no_grad():
        out = model(torch.from_numpy(example)).numpy()
    mlflow.set_tracking_uri(settings.tracking_uri)
    mlflow.set_experiment(experiment_id=run.client.get_run(run.run_id).info.experiment_id)
    root = Path(__file__).resolve().parents[3]
    info = mlflow.pytorch.log_model(
        model, name="generator", run_id=run.run_id, signature=infer_signature(example, out), serialization_format="pickle",
        code_paths=[str(root / "models")], pip_requirements=[f"torch=={torch.__version__.split('+')[0]}", "numpy"],
        metadata={"inputs": list(meta["inputs"]), "outputs": list(OUTPUTS), "recipe": meta["recipe"], "dataset": meta["dataset"],
                  "dataset_digest": meta["dataset_digest"], "frame_stride": meta["frame_stride"]})
    run.set_tags({Tag.MODEL_URI: info.model_uri})
    return info.model_uri
