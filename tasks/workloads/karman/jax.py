"""The Kármán workload in JAX (one process; data-parallel over the runtime's devices): the jitted Pix2Pix step of models.karman.nets.trainer_jax, its batches, state and validation for the training loop, and the generator's artifacts.

The same pairs, split, normalisation, recipe and validation as the torch module. The weights carry the torch
networks' state dict names and layouts, so the saved generator (``generator.npz``) is a torch state dict's arrays;
the initial weights are pix2pix's initialisation drawn by numpy from the run's seed. The step's randomness (input
noise, dropout) draws statelessly from (this epoch's seed, the step), so a resumed run draws what an uninterrupted
one does. With several devices the batch is split over them and the weights replicated: jit's partitioner
all-reduces the gradients, and batch norm takes the statistics of the whole global batch (as torch's
SyncBatchNorm would; torch's DDP runs take each rank's own).
"""

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from models.karman.nets import pix2pix_jax as nets
from models.karman.nets.trainer_jax import Pix2PixJax
from models.karman.recipe import OptimConfig
from models.schedule import lr_factor
from tasks.common.runtimes.data import epoch_order
from tasks.workloads.karman.data import crop_offsets, crop_pairs
from tasks.workloads.karman.workload import HEADLINE, KarmanData, KarmanTrainer, model_meta, sample_figure

MODEL_FILE = "generator.npz"


def save_generator(path: Path, g: dict, g_stats: dict) -> None:
    """The generator's params and running statistics as one npz, under torch's state dict names."""
    with open(path, "wb") as f:
        np.savez(f, **{k: np.asarray(v) for k, v in (g | g_stats).items()})


def load_generator(path: Path) -> tuple[dict, dict]:
    """(params, stats) of a generator saved by save_generator (arrays only: no pickles are admitted)."""
    with np.load(path, allow_pickle=False) as arrays:
        return nets.split_state({k: arrays[k] for k in arrays.files})


class KarmanJax(KarmanTrainer):
    """Pix2Pix (generator, discriminator, their Adam states) as arrays on the runtime's devices, and the jitted step."""

    def __init__(self, data: KarmanData, spec, batch_size: int, runtime):
        self.data, self.spec, self.batch_size, self.runtime = data, spec, batch_size, runtime
        self.model = Pix2PixJax(data.net, OptimConfig.from_recipe(data.recipe, data.codec.delta_ratio, data.codec.zero))
        self.replicated, self.split = runtime.ctx.shardings()
        self.train_state = jax.device_put(self.model.initial_state(spec.seed), self.replicated)
        self.global_step = 0
        self.lr = data.recipe.lr
        self.samples = len(data.train)
        self.has_validation = data.validation is not None and bool(data.validation.sims)
        self.headline = HEADLINE
        self.flops_per_sample = data.flops_per_sample
        self.params = data.params(nets.parameter_count(self.train_state["g"]), nets.parameter_count(self.train_state["d"]))
        self.speed = {"threads": runtime.threads, "jit": True, "data": "prefetch thread, one batch ahead"}

    def batches(self, epoch: int, steps: int):
        """The epoch's batches (cond (B, 4 or 5, H, W), target (B, 3·unroll, H, W)), split over the devices; the next
        one is read on a background thread while this one trains."""
        spec, train, b = self.spec, self.data.train, self.batch_size
        order = epoch_order(len(train), spec.seed, epoch)
        reader = train.prefetch((order[s * b: (s + 1) * b] for s in range(steps)), self.data.codec.norm)
        try:
            for step, (cond, target) in enumerate(reader):
                if spec.options.crop:
                    cond, target = crop_pairs(cond, target, crop_offsets(b, train.height, train.width, spec.options.crop, spec.seed, epoch, step), spec.options.crop)
                yield jax.device_put(cond, self.split), jax.device_put(target, self.split)
        finally:
            reader.close()

    def step(self, batch, flags: list[float], progress: float) -> tuple[dict[str, float], list[float]]:
        recipe = self.data.recipe
        self.lr = recipe.lr * lr_factor(recipe.schedule, progress)
        key = jax.random.fold_in(jax.random.key(self.runtime.epoch_seed), self.global_step)
        cond, target = batch
        self.train_state, losses = self.model.step(self.train_state, cond, target, jnp.float32(self.lr), key, recipe.loss_steps(progress))
        self.global_step += 1
        return {k: float(v) for k, v in losses.items()}, self.runtime.agree(flags)  # reading the losses waits for the step

    def learning_rate(self) -> float:
        return self.lr

    def epoch_metrics(self) -> dict[str, float]:
        return {}

    def state(self) -> dict:
        leaves = jax.tree_util.tree_leaves(self.train_state)
        return {f"{i:04d}": np.asarray(v) for i, v in enumerate(leaves)} | {"global_step": np.array(self.global_step)}

    def load_state(self, state: dict) -> None:
        state = dict(state)
        self.global_step = int(state.pop("global_step"))
        treedef = jax.tree_util.tree_structure(self.train_state)
        if len(state) != treedef.num_leaves:
            raise ValueError(f"checkpoint holds {len(state)} arrays, the model and its optimisers {treedef.num_leaves}")
        leaves = [jnp.asarray(state[k]) for k in sorted(state)]
        self.train_state = jax.device_put(jax.tree_util.tree_unflatten(treedef, leaves), self.replicated)

    def forward(self, cond: np.ndarray) -> np.ndarray:
        """Encoded states (B, 4, H, W) or (4, H, W) -> the generator's outputs (B, 3, H, W) or (3, H, W), in inference mode."""
        single = cond.ndim == 3
        x = jax.device_put(np.asarray(cond[None] if single else cond, np.float32), self.replicated)
        out = np.asarray(self.model.predict(self.train_state["g"], self.train_state["g_stats"], x))
        return out[0] if single else out

    def finish(self, run_dir: Path, run, settings) -> None:
        """The trained generator as the run's artifacts: its arrays under torch's names (``generator.npz``) and
        meta.json, and a figure of one-step predictions (rank 0)."""
        data, net = self.data, self.data.net
        model_dir = run_dir / "model"
        model_dir.mkdir(exist_ok=True)
        weights = model_dir / MODEL_FILE
        save_generator(weights, jax.device_get(self.train_state["g"]), jax.device_get(self.train_state["g_stats"]))
        meta = model_meta(net, data.codec, self.spec, data.manifest, data.split, "jax", weights)
        (model_dir / "meta.json").write_text(json.dumps(meta, indent=2))
        run.log_artifact(model_dir, "model")
        run.log_artifact(sample_figure(self.forward, data.train, data.codec, run_dir / "sample_predictions.png", 2**net.generator_depth))


def build(data: KarmanData, spec, batch_size: int, runtime) -> KarmanJax:
    return KarmanJax(data, spec, batch_size, runtime)
