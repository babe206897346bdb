"""The TensorFlow training job (child process): one Pix2Pix training run of a TrainPlan in Keras 3 under a tf.distribute strategy.

The same data, split, normalisation, recipe, seeds' roles, validation, quality target, MLflow names
and checkpoint-per-epoch as the torch job (job.py); what differs is the framework: NHWC tensors, the
step in models.nets.trainer_keras, the batches through tf.data with prefetch, and one process per
worker under MultiWorkerMirroredStrategy (rank 0 reports and writes the checkpoint and the model).
"""

import contextlib
import json
import logging
import os
import time
from pathlib import Path

import numpy as np

from tasks.common.data import Normalizer, PairSource, StepCodec, crop_offsets, crop_pairs, epoch_order, epoch_seed
from tasks.common.errors import UserError
from tasks.common.lifetime import request_stop_on_signals, stop_requested
from tasks.common.names import Tag
from tasks.common.settings import Settings
from tasks.common.specs import TrainSpec
from tasks.common.tracking import Run, client_for, system_metrics
from tasks.infer.scoring import Validation
from tasks.train.plan import TrainPlan, checkpoint_name
from tasks.train.record import (WARMUP_STEPS, training_data, StepLog, StepProgress, check_finite, stopped, validate, host_peak_memory_mb, largest_corner, log_epoch, model_meta, run_params,
                                sample_figure, summary)

log = logging.getLogger("karman.train")
SYSTEM_METRICS_EVERY_S = 5
MODEL_FILE = "generator.keras"


def _nhwc(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x.transpose(0, 2, 3, 1))  # (B, C, H, W) -> (B, H, W, C)


def probe_device(job: dict) -> dict:
    """Check that TensorFlow can open the job's device; DeviceUnavailable names what is missing."""
    from models.device_keras import resolve_strategy

    strategy = "tpu" if job["device"] == "xla" else "mirrored" if job["device"] == "cuda" else "default"
    import tensorflow as tf

    gpus = len(tf.config.list_physical_devices("GPU")) if job["device"] == "cuda" else 1
    ctx = resolve_strategy(job["device"], strategy, max(gpus, 1))
    return {"device": ctx.description, "world_size": ctx.world_size, "memory_bytes": None}


def run_training(job: dict) -> dict | None:
    """Train one configuration; rank 0 returns the summary, other workers None."""
    from models.device_keras import resolve_strategy

    plan, settings = TrainPlan(**job["plan"]), Settings(**job["settings"])
    ctx = resolve_strategy(plan.spec.device, plan.strategy, plan.world, plan.threads)
    # MultiWorkerMirroredStrategy installs a SIGTERM handler of its own (its preemption watch), which would
    # swallow the stop request: the job's handlers are installed again over it.
    request_stop_on_signals()
    if not ctx.is_main:
        log.setLevel(logging.WARNING)
    monitor = system_metrics(settings, job["run_id"], SYSTEM_METRICS_EVERY_S, plan.resume is not None) if ctx.is_main else contextlib.nullcontext()
    with monitor:
        return _train(plan.spec, settings, int(job["batch_size"]), plan.resume is not None, job["run_id"], ctx)


class _Batches:
    """The epoch's batches from the zarr store through tf.data: each worker reads its own slice of every
    global batch (as a torch rank does), cut into its replicas' shares, NHWC, prefetched on tf.data's
    threads while the step runs."""

    def __init__(self, ctx, train: PairSource, norm: Normalizer, spec: TrainSpec, batch_size: int, channels: tuple[int, int]):
        self.ctx, self.train, self.norm, self.spec, self.batch_size = ctx, train, norm, spec, batch_size
        self.side = (spec.crop, spec.crop) if spec.crop else (train.height, train.width)
        self.channels = channels
        self.local = batch_size // ctx.workers  # this worker's share of a global batch
        self.per_replica = batch_size // ctx.world_size

    def epoch(self, epoch: int, steps: int):
        import tensorflow as tf

        spec, ctx, local = self.spec, self.ctx, self.local
        order = epoch_order(len(self.train), spec.seed, epoch)  # the same in every worker
        lo, hi = ctx.rank * local, (ctx.rank + 1) * local

        def shares():
            for step in range(steps):
                cond, target = self.train.batch(order[step * self.batch_size : (step + 1) * self.batch_size][lo:hi], self.norm)
                if spec.crop:
                    corners = crop_offsets(self.batch_size, self.train.height, self.train.width, spec.crop, spec.seed, epoch, step)[lo:hi]
                    cond, target = crop_pairs(cond, target, corners, spec.crop)
                cond, target = _nhwc(cond), _nhwc(target)
                for r in range(ctx.local_replicas):  # replica r of this worker takes the r-th share
                    share = slice(r * self.per_replica, (r + 1) * self.per_replica)
                    yield cond[share], target[share]

        signature = tuple(tf.TensorSpec((self.per_replica, *self.side, c), tf.float32) for c in self.channels)

        def dataset(_context):
            return tf.data.Dataset.from_generator(shares, output_signature=signature).prefetch(2)

        return iter(ctx.strategy.distribute_datasets_from_function(dataset))


def _train(spec: TrainSpec, settings: Settings, batch_size: int, resume: bool, run_id: str, ctx) -> dict | None:
    import tensorflow as tf

    from models.device_keras import peak_memory_mb
    from models.nets.pix2pix_keras import trainable_count
    from models.nets.trainer_keras import AGREED, KerasPix2Pix
    from models.recipe import OptimConfig
    from models.recipe import lr_factor

    run = Run(client_for(settings), run_id) if ctx.is_main else None
    dataset_dir, manifest, split, recipe, train, codec, net = training_data(settings, spec)
    norm = codec.norm
    steps_per_epoch = len(train) // batch_size
    jit = spec.compile == "on"
    speed = {"jit_compile": jit, "threads": tf.config.threading.get_intra_op_parallelism_threads() or os.cpu_count(),
             "data": "tf.data from_generator, prefetch 2"}
    model = KerasPix2Pix(net, OptimConfig.from_recipe(recipe, codec.delta_ratio), ctx.strategy, batch_size, jit_compile=jit, seed=spec.seed)
    run_dir = settings.run_dir(run_id)
    run_dir.mkdir(parents=True, exist_ok=True)
    checkpoint = run_dir / checkpoint_name("tensorflow")
    start_epoch, global_step, history = 0, 0, {"epoch_s": [], "warmup_s": []}
    if resume:
        state = _load_checkpoint(checkpoint)
        model.load_state(state["arrays"])
        start_epoch, global_step, history = state["epoch"], state["global_step"], state["history"]
        log.info("resuming %s after epoch %d (step %d) from %s", run_id, start_epoch, global_step, checkpoint)
    g_params, d_params = trainable_count(model.generator), trainable_count(model.discriminator)
    if run is not None and not resume:
        run.log_params(run_params(framework="tensorflow", version=tf.__version__, device_name=ctx.description, world_size=ctx.world_size,
                                  strategy=ctx.name, batch_size=batch_size, train=train, net=net, g_params=g_params, d_params=d_params,
                                  manifest=manifest, split=split, speed=speed, recipe=recipe))
    log.info("training on %s: %d pairs from %d simulations (%s), batch %d, %d steps/epoch, generator %.2fM params (tensorflow %s)",
             ctx.description, len(train), len(split["train"]), "held in memory" if train.in_memory else "read per batch",
             batch_size, steps_per_epoch, g_params / 1e6, tf.__version__)

    batches = _Batches(ctx, train, norm, spec, batch_size, (net.in_channels, net.out_channels * recipe.unroll))
    predict = tf.function(lambda x: model.generator(x, training=False), reduce_retracing=True)

    def forward(cond: np.ndarray) -> np.ndarray:  # (B, 4, H, W) or (4, H, W) encoded -> (B, 3, H, W) or (3, H, W)
        single = cond.ndim == 3
        out = predict(tf.constant(_nhwc(cond[None] if single else cond))).numpy().transpose(0, 3, 1, 2)
        return out[0] if single else out

    steps = StepLog(run)
    progress = StepProgress(log, ctx.is_main)
    session_steps, warmup_t0, warmup_s = 0, time.perf_counter(), None
    last: dict[str, float] = {}
    validation = (Validation.of(dataset_dir, manifest, split["val"], codec, net, spec.frame_stride, spec.validate_every,
                                spec.validate_steps, spec.target_vorticity, spec.target_steps) if ctx.is_main else None)
    clock_t0 = time.perf_counter() - history.get("train_s", 0.0)
    train_s = history.get("train_s", 0.0)
    stopping = None
    for epoch in range(start_epoch + 1, spec.epoch_limit + 1):
        noise_seed = epoch_seed(spec.seed, epoch, ctx.rank) % 2**31  # the epoch's noise on this worker, whatever ran before
        it = batches.epoch(epoch, steps_per_epoch)
        t_epoch, data_s, sums, done = time.perf_counter(), 0.0, {}, 0
        for _ in range(steps_per_epoch):
            t0 = time.perf_counter()
            cond, target = next(it)
            t1 = time.perf_counter()
            if recipe.schedule != "constant":
                model.set_lr_factor(lr_factor(recipe.schedule, spec.progress(train_s, global_step, steps_per_epoch)))
            elapsed = time.perf_counter() - clock_t0
            signalled = stop_requested()
            over = float(spec.time_budget is not None and elapsed >= spec.time_budget)
            out = model.train_step(cond, target, [over, float(signalled or 0), elapsed], (noise_seed, global_step))
            values = {k: float(v) for k, v in out.items() if k != AGREED}  # reading the losses waits for the step
            over, stop_flag, train_s = (float(x) for x in out[AGREED].numpy())
            t2 = time.perf_counter()
            data_s += t1 - t0
            global_step, session_steps, done = global_step + 1, session_steps + 1, done + 1
            if session_steps == WARMUP_STEPS:
                warmup_s = t2 - warmup_t0
            check_finite(values, epoch, global_step, checkpoint, steps)
            for k, v in values.items():
                sums[k] = sums.get(k, 0.0) + v
            steps.add(global_step, {f"step_{k}": v for k, v in values.items()} | {"step_time_s": t2 - t0})
            progress.step(epoch, done, steps_per_epoch, spec.progress(train_s, global_step, steps_per_epoch), train_s)
            if stop_flag > 0:
                raise stopped(signalled, epoch, global_step, checkpoint, run_id, steps)
            if spec.max_steps and global_step >= spec.max_steps:
                break
            if over > 0:
                stopping = "time budget"
                break
        epoch_s = time.perf_counter() - t_epoch
        history["epoch_s"].append(epoch_s)
        last = {k: v / done for k, v in sums.items()}
        metrics = {"epoch_time_s": epoch_s, "epoch_samples_per_s": done * batch_size / epoch_s, "data_wait_fraction": data_s / epoch_s,
                   "peak_memory_mb": peak_memory_mb(ctx) or host_peak_memory_mb(), "learning_rate": model.learning_rate,
                   **{f"epoch_{k}": v for k, v in last.items()}}
        steps.flush()
        history["samples"] = history.get("samples", 0) + done * batch_size
        last_epoch = stopping is not None or epoch == spec.epoch_limit or bool(spec.max_steps and global_step >= spec.max_steps)
        reached = 0.0
        if validation is not None and validation.due(epoch, last_epoch):
            reached = validate(lambda: validation.score_forward(forward), validation, spec, epoch, history,
                               time.perf_counter() - clock_t0, metrics, log)
        if ctx.workers > 1:  # rank 0 judged the target: every worker stops with it
            reached = float(model.agree([reached])[0])
        if reached > 0 and stopping is None:
            stopping = "target reached"
        history["train_s"] = time.perf_counter() - clock_t0
        metrics["train_time_s"] = history["train_s"]
        if ctx.is_main:
            run.log_metrics(metrics, step=epoch)
            _save_checkpoint(checkpoint, model.state(), {"epoch": epoch, "global_step": global_step, "history": history})
        ends = stopping is not None or last_epoch
        log_epoch(log, epoch, metrics, last, 1.0 if ends else spec.progress(history["train_s"], global_step, steps_per_epoch), history["train_s"])
        progress.restart()
        if spec.max_steps and global_step >= spec.max_steps:
            break
        if stopping is not None:
            log.info("training stops after epoch %d: %s (%.1f s of training)", epoch, stopping, history["train_s"])
            break
    history["warmup_s"].append(warmup_s if warmup_s is not None else float("nan"))
    if not ctx.is_main:
        return None
    return _finish(spec, settings, run, run_dir, model, net, codec, train, manifest, split, history, global_step, last,
                   steps_per_epoch * batch_size, ctx, forward)


def _save_checkpoint(path: Path, arrays: dict[str, np.ndarray], state: dict) -> None:
    """Weights and optimiser state as one npz, written atomically (the previous one stays on a crash)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp.npz")
    np.savez(tmp, history=np.array(json.dumps(state)), **{k.replace("/", "__"): v for k, v in arrays.items()})
    os.replace(tmp, path)


def _load_checkpoint(path: Path) -> dict:
    try:
        with np.load(path) as data:
            state = json.loads(str(data["history"]))
            state["arrays"] = {k.replace("__", "/"): data[k] for k in data.files if k != "history"}
    except Exception as exc:
        raise UserError(f"checkpoint {path} is corrupt or truncated ({type(exc).__name__}); start the run afresh") from None
    return state


def _finish(spec, settings, run, run_dir, model, net, codec, train, manifest, split, history, global_step, last, samples_per_epoch,
            ctx, forward) -> dict:
    """Model artifact (Keras format), sample figure, the logged MLflow model and the summary of a finished run."""
    from models.nets.pix2pix_keras import plain

    model_dir = run_dir / "model"
    model_dir.mkdir(exist_ok=True)
    weights = model_dir / MODEL_FILE
    exported = plain(net, model.generator)  # plain Keras layers: loads wherever Keras does
    exported.save(weights)
    meta = model_meta(net, codec, spec, manifest, split, "tensorflow", weights)
    (model_dir / "meta.json").write_text(json.dumps(meta, indent=2))
    run.log_artifact(model_dir, "model")
    run.log_artifact(sample_figure(forward, train, codec, run_dir / "sample_predictions.png", 2**net.generator_depth))
    _log_keras_model(settings, run, exported, train, codec, meta, 2**net.generator_depth, forward)
    totals = summary(history, global_step, last, samples_per_epoch)
    run.log_metrics(totals)
    run.set_tags({Tag.TARGET: "reached" if "target" in history else "not reached"})
    return {**totals, "split": split, "device": ctx.description, "world_size": ctx.world_size, "strategy": ctx.name}


def _log_keras_model(settings: Settings, run: Run, generator, source: PairSource, codec: StepCodec, meta: dict, unit: int, forward) -> str:
    """The generator as the run's MLflow model 'generator' in Keras format (mlflow.tensorflow.load_model
    loads it); its signature is one encoded state (B, H, W, 4) -> the network's output (B, H, W, 3), and
    the normalisation that maps physical states to and from network units travels in its metadata."""
    import mlflow
    import mlflow.tensorflow
    import tensorflow as tf
    from mlflow.models import infer_signature

    example = _nhwc(codec.norm.encode(largest_corner(source.physical([0])[0], unit)).astype(np.float32))  # (1, H, W, 4)
    out = forward(example.transpose(0, 3, 1, 2)).transpose(0, 2, 3, 1)
    mlflow.set_tracking_uri(settings.tracking_uri)
    mlflow.set_experiment(experiment_id=run.client.get_run(run.run_id).info.experiment_id)
    info = mlflow.tensorflow.log_model(
        generator, name="generator", run_id=run.run_id, signature=infer_signature(example, out),
        pip_requirements=[f"tensorflow=={tf.__version__}", "keras", "numpy"],
        metadata={"inputs": list(meta["inputs"]), "outputs": list(meta["outputs"]), "recipe": meta["recipe"], "dataset": meta["dataset"],
                  "dataset_digest": meta["dataset_digest"], "frame_stride": meta["frame_stride"], "normalizer": meta["normalizer"],
                  "predict": meta["predict"], "delta_scale": meta["delta_scale"], "layout": "NHWC, network units"})
    run.set_tags({Tag.MODEL_URI: info.model_uri})
    return info.model_uri

