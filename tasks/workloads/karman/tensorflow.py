"""The Kármán workload in TensorFlow (Keras 3 under a tf.distribute strategy): batches through tf.data, the distributed Pix2Pix step, state and validation for the training loop, and the generator's artifacts.

The same pairs, split, normalisation, recipe and validation as the torch module; what differs is the
framework: NHWC tensors, the step in models.karman.nets.trainer_keras, batches through tf.data with prefetch,
and one process per worker under MultiWorkerMirroredStrategy.
"""

import json
from pathlib import Path

import numpy as np

from models.karman.recipe import OptimConfig
from models.schedule import lr_factor
from tasks.common.runtimes.data import epoch_order
from tasks.common.tracking.names import Tag
from tasks.workloads.karman.data import crop_offsets, crop_pairs
from tasks.workloads.karman.workload import HEADLINE, KarmanData, KarmanTrainer, largest_corner, model_meta, sample_figure

MODEL_FILE = "generator.keras"


def nhwc(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x.transpose(0, 2, 3, 1))  # (B, C, H, W) -> (B, H, W, C)


class KarmanKeras(KarmanTrainer):
    """KerasPix2Pix made in the strategy's scope; each worker reads its own slice of every global batch
    (as a torch rank does), cut into its replicas' shares."""

    def __init__(self, data: KarmanData, spec, batch_size: int, runtime):
        import tensorflow as tf

        from models.karman.nets.pix2pix_keras import trainable_count
        from models.karman.nets.trainer_keras import KerasPix2Pix

        self.data, self.spec, self.batch_size, self.runtime = data, spec, batch_size, runtime
        ctx = runtime.ctx
        jit = spec.compile == "on"
        self.model = KerasPix2Pix(data.net, OptimConfig.from_recipe(data.recipe, data.codec.delta_ratio, data.codec.zero), ctx.strategy, batch_size,
                                  jit_compile=jit, seed=spec.seed)
        self.samples = len(data.train)
        self.has_validation = data.validation is not None and bool(data.validation.sims)
        self.headline = HEADLINE
        self.flops_per_sample = data.flops_per_sample
        self.side = (spec.options.crop, spec.options.crop) if spec.options.crop else (data.train.height, data.train.width)
        self.channels = (data.net.in_channels, data.net.out_channels * data.recipe.unroll)
        self.local = batch_size // ctx.workers  # this worker's share of a global batch
        self.per_replica = batch_size // ctx.world_size
        self.global_step = 0
        self.params = data.params(trainable_count(self.model.generator), trainable_count(self.model.discriminator))
        self.speed = {"jit_compile": jit, "threads": runtime.threads, "data": "tf.data from_generator, prefetch 2"}
        self._predict = tf.function(lambda x: self.model.generator(x, training=False), reduce_retracing=True, autograph=False)

    def batches(self, epoch: int, steps: int):
        """The epoch's distributed batches (NHWC), prefetched on tf.data's threads while the step runs."""
        import tensorflow as tf

        spec, ctx, train, b, local = self.spec, self.runtime.ctx, self.data.train, self.batch_size, self.local
        order = epoch_order(len(train), spec.seed, epoch)  # the same in every worker
        lo, hi = ctx.rank * local, (ctx.rank + 1) * local

        def shares():
            for step in range(steps):
                cond, target = train.batch(order[step * b: (step + 1) * b][lo:hi], self.data.codec.norm)
                if spec.options.crop:
                    corners = crop_offsets(b, train.height, train.width, spec.options.crop, spec.seed, epoch, step)[lo:hi]
                    cond, target = crop_pairs(cond, target, corners, spec.options.crop)
                cond, target = nhwc(cond), nhwc(target)
                for r in range(ctx.local_replicas):  # replica r of this worker takes the r-th share
                    share = slice(r * self.per_replica, (r + 1) * self.per_replica)
                    yield cond[share], target[share]

        signature = tuple(tf.TensorSpec((self.per_replica, *self.side, c), tf.float32) for c in self.channels)

        def dataset(_context):
            return tf.data.Dataset.from_generator(shares, output_signature=signature).prefetch(2)

        return iter(ctx.strategy.distribute_datasets_from_function(dataset))

    def step(self, batch, flags: list[float], progress: float) -> tuple[dict[str, float], list[float]]:
        from models.karman.nets.trainer_keras import AGREED

        if self.data.recipe.schedule != "constant":
            self.model.set_lr_factor(lr_factor(self.data.recipe.schedule, progress))
        cond, target = batch
        # the input noise draws statelessly from (this epoch's seed on this worker, the step)
        out = self.model.train_step(cond, target, flags, (self.runtime.epoch_seed, self.global_step),
                                    self.data.recipe.loss_steps(progress))
        self.global_step += 1
        values = {k: float(v) for k, v in out.items() if k != AGREED}  # reading the losses waits for the step
        return values, [float(x) for x in out[AGREED].numpy()]

    def learning_rate(self) -> float:
        return self.model.learning_rate

    def epoch_metrics(self) -> dict[str, float]:
        return {}

    def state(self) -> dict:
        return self.model.state() | {"global_step": np.array(self.global_step)}

    def load_state(self, state: dict) -> None:
        self.global_step = int(state.pop("global_step"))
        self.model.load_state(state)

    def forward(self, cond: np.ndarray) -> np.ndarray:
        """Encoded states (B, 4, H, W) or (4, H, W) -> the generator's outputs (B, 3, H, W) or (3, H, W)."""
        import tensorflow as tf

        single = cond.ndim == 3
        out = self._predict(tf.constant(nhwc(cond[None] if single else cond))).numpy().transpose(0, 3, 1, 2)
        return out[0] if single else out

    def finish(self, run_dir: Path, run, settings) -> None:
        """The trained generator as the run's artifacts: the Keras file (plain layers) and meta.json, a
        figure of one-step predictions, and the MLflow model 'generator' (rank 0)."""
        from models.karman.nets.pix2pix_keras import plain

        data, net = self.data, self.data.net
        model_dir = run_dir / "model"
        model_dir.mkdir(exist_ok=True)
        weights = model_dir / MODEL_FILE
        exported = plain(net, self.model.generator)  # plain Keras layers: loads wherever Keras does
        exported.save(weights)
        meta = model_meta(net, data.codec, self.spec, data.manifest, data.split, "tensorflow", weights)
        (model_dir / "meta.json").write_text(json.dumps(meta, indent=2))
        run.log_artifact(model_dir, "model")
        run.log_artifact(sample_figure(self.forward, data.train, data.codec, run_dir / "sample_predictions.png", 2**net.generator_depth))
        self._log_model(settings, run, exported, meta)

    def _log_model(self, settings, run, generator, meta: dict) -> str:
        """The generator as the run's MLflow model 'generator' in Keras format (mlflow.tensorflow.load_model
        loads it); its signature is one encoded state (B, H, W, 4 or 5) -> the network's output (B, H, W, 3), and
        the normalisation that maps physical states to and from network units travels in its metadata."""
        import mlflow
        import mlflow.tensorflow
        import tensorflow as tf
        from mlflow.models import infer_signature

        unit = 2**self.data.net.generator_depth
        example = nhwc(self.data.codec.norm.encode(largest_corner(self.data.train.physical([0])[0], unit)).astype(np.float32))  # (1, H, W, 4 or 5)
        out = self.forward(example.transpose(0, 3, 1, 2)).transpose(0, 2, 3, 1)
        mlflow.set_tracking_uri(settings.tracking_uri)
        mlflow.set_experiment(experiment_id=run.client.get_run(run.run_id).info.experiment_id)
        info = mlflow.tensorflow.log_model(
            generator, name="generator", run_id=run.run_id, signature=infer_signature(example, out),
            pip_requirements=[f"tensorflow=={tf.__version__}", "keras", "numpy"],
            metadata={"inputs": list(meta["inputs"]), "outputs": list(meta["outputs"]), "recipe": meta["recipe"], "dataset": meta["dataset"],
                      "dataset_digest": meta["dataset_digest"], "frame_stride": meta["frame_stride"], "normalizer": meta["normalizer"],
                      "predict": meta["predict"], "delta_scale": meta["delta_scale"], "damping": meta["damping"], "layout": "NHWC, network units"})
        run.set_tags({Tag.MODEL_URI: info.model_uri})
        return info.model_uri


def build(data: KarmanData, spec, batch_size: int, runtime) -> KarmanKeras:
    return KarmanKeras(data, spec, batch_size, runtime)
