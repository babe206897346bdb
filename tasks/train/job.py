"""The training job (child process): one Pix2Pix training run of a TrainPlan, on any device.

One code path for every device: ``cpu`` and ``cuda`` run one process per device under torchrun
(DistributedDataParallel) when the run asks for more than one, ``xla`` runs one process over all
cores with SPMD. Rank 0 talks to MLflow and writes the checkpoint; every rank reads its own slice of
each global batch from the zarr store.

Reproducibility: the weights come from the seed, each epoch's shuffle from (seed, epoch) and each
epoch's dropout from (seed, epoch, rank), so a run resumed from its end-of-epoch checkpoint takes the
same steps as one that was never interrupted.
"""

import contextlib
import json
import logging
import os
import time
from pathlib import Path

import numpy as np
import torch

from models.device import DeviceContext, keep_freed_memory, resolve_device
from models.nets.pix2pix import build_generator
from models.nets.trainer import NoClock, OptimConfig, PhaseClock, build_trainer, speed_options
from models.recipe import lr_factor
from tasks.common.data import INPUTS, OUTPUTS, PairSource, StepCodec, crop_offsets, crop_pairs, epoch_order, epoch_seed
from tasks.common.errors import UserError
from tasks.common.lifetime import stop_requested
from tasks.common.names import Tag
from tasks.common.settings import Settings
from tasks.common.specs import TrainSpec
from tasks.common.tracking import Run, client_for, system_metrics
from tasks.infer.scoring import Validation
from tasks.train.plan import TrainPlan, checkpoint_name
from tasks.train.record import WARMUP_STEPS, training_data, StepLog, StepProgress, check_finite, stopped, validate, host_peak_memory_mb, largest_corner, log_epoch, model_meta, run_params, sample_figure, summary

log = logging.getLogger("karman.train")
SYSTEM_METRICS_EVERY_S = 5


def probe_device(job: dict) -> dict:
    """Check that the job's device can be opened; DeviceUnavailable names what is missing."""
    ctx = resolve_device(job["device"])
    memory = torch.cuda.get_device_properties(ctx.device).total_memory if ctx.kind == "cuda" else None
    return {"device": ctx.description, "world_size": ctx.world_size, "memory_bytes": memory}


def _to_cpu(obj):
    """The same nested structure with every tensor detached and on the CPU (XLA and CUDA state)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


def save_checkpoint(state: dict, path: Path) -> None:
    """Write atomically: a crash mid-write leaves the previous checkpoint in place."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # one per process: two writers never share one
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: Path) -> dict:
    """The checkpoint's contents; UserError naming the file if its tensors do not load or it is not ours
    (the plan checked that it exists and is whole)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise UserError(f"checkpoint {path} is corrupt or truncated ({type(exc).__name__}); start the run afresh") from None
    missing = {"epoch", "global_step", "model", "optimizers"} - set(state) if isinstance(state, dict) else {"everything"}
    if missing:
        raise UserError(f"checkpoint {path} is not a training checkpoint (missing {', '.join(sorted(missing))})")
    return state


def _seed_epoch(ctx: DeviceContext, seed: int, epoch: int) -> None:
    """Dropout randomness of one epoch on this rank, independent of what ran before."""
    value = epoch_seed(seed, epoch, ctx.rank)
    torch.manual_seed(value)
    if ctx.kind == "xla":
        import torch_xla.core.xla_model as xm

        xm.set_rng_state(value, device=ctx.device)


def _xla_compilations() -> tuple[int, float]:
    """(graphs compiled so far, seconds spent compiling) in this process."""
    import torch_xla.debug.metrics as met

    data = met.metric_data("CompileTime")
    return (int(data[0]), data[1] / 1e9) if data else (0, 0.0)


def _peak_memory_mb(ctx: DeviceContext) -> float:
    if ctx.kind == "cuda":
        return torch.cuda.max_memory_allocated(ctx.device) / 2**20
    return host_peak_memory_mb()


def run_training(job: dict) -> dict | None:
    """Train one configuration; rank 0 returns the summary, other ranks None."""
    plan, settings = TrainPlan(**job["plan"]), Settings(**job["settings"])
    spec, batch_size, resume = plan.spec, int(job["batch_size"]), plan.resume is not None
    if plan.threads:
        torch.set_num_threads(plan.threads)
    ctx = resolve_device(spec.device, spec.precision, data_parallel=True)
    if not ctx.is_main:  # one voice per run: rank 0 reports
        log.setLevel(logging.WARNING)
    monitor = system_metrics(settings, job["run_id"], SYSTEM_METRICS_EVERY_S, resume) if ctx.is_main else contextlib.nullcontext()
    try:
        with monitor:
            return _train(spec, settings, batch_size, resume, job["run_id"], ctx)
    finally:
        ctx.close()


def _train(spec: TrainSpec, settings: Settings, batch_size: int, resume: bool, run_id: str, ctx: DeviceContext) -> dict | None:
    run = Run(client_for(settings), run_id) if ctx.is_main else None
    local_batch = batch_size // ctx.world_size if ctx.strategy == "ddp" else batch_size

    dataset_dir, manifest, split, recipe, train, codec, net = training_data(settings, spec)
    norm = codec.norm
    steps_per_epoch = len(train) // batch_size  # at least 1: the plan checked the batch against the pairs

    # A training child runs one job: its heap may keep freed memory (no per-step page faults).
    options = speed_options(spec.device, spec.precision, spec.channels_last, spec.compile, spec.winograd) | {"keep_freed_memory": keep_freed_memory()}
    torch.manual_seed(spec.seed)  # the same initial weights on every rank
    model = build_trainer(net, OptimConfig.from_recipe(recipe, codec.delta_ratio), ctx, options)
    run_dir = settings.run_dir(run_id)
    run_dir.mkdir(parents=True, exist_ok=True)
    checkpoint = run_dir / checkpoint_name("torch")
    start_epoch, global_step, history = 0, 0, {"epoch_s": [], "warmup_s": []}
    if resume:
        state = load_checkpoint(checkpoint)
        model.generator.load_state_dict(state["model"]["generator"])
        model.discriminator.load_state_dict(state["model"]["discriminator"])
        model.load_optimizer_state(state["optimizers"])
        start_epoch, global_step, history = state["epoch"], state["global_step"], state["history"]
        log.info("resuming %s after epoch %d (step %d) from %s", run_id, start_epoch, global_step, checkpoint)

    g_params = sum(p.numel() for p in model.generator.parameters())
    d_params = sum(p.numel() for p in model.discriminator.parameters())
    if run is not None and not resume:
        run.log_params(run_params(framework="torch", version=torch.__version__, device_name=ctx.description, world_size=ctx.world_size,
                                  strategy=ctx.strategy, batch_size=batch_size, train=train, net=net, g_params=g_params, d_params=d_params,
                                  manifest=manifest, split=split, speed=options, recipe=recipe))
    log.info("training on %s: %d pairs from %d simulations (%s), batch %d, %d steps/epoch, generator %.2fM params",
             ctx.description, len(train), len(split["train"]), "held in memory" if train.in_memory else "read per batch",
             batch_size, steps_per_epoch, g_params / 1e6)

    steps = StepLog(run)
    progress = StepProgress(log, ctx.is_main)
    session_steps, warmup_t0, warmup_s = 0, time.perf_counter(), None
    last: dict[str, float] = {}
    compiled_before = _xla_compilations()[0] if ctx.kind == "xla" else 0
    validation = (Validation.of(dataset_dir, manifest, split["val"], codec, net, spec.frame_stride, spec.validate_every,
                                spec.validate_steps, spec.target_vorticity, spec.target_steps) if ctx.is_main else None)
    # Training time runs on across a resume: the clock starts where the checkpoint's left off.
    clock_t0 = time.perf_counter() - history.get("train_s", 0.0)
    train_s = history.get("train_s", 0.0)  # the ranks' agreed training time, for the learning-rate schedule
    stopping = None  # why training ends before its epoch limit: "time budget" or "target reached"
    for epoch in range(start_epoch + 1, spec.epoch_limit + 1):
        model.train()
        _seed_epoch(ctx, spec.seed, epoch)
        order = epoch_order(len(train), spec.seed, epoch)  # the same on every rank
        lo, hi = ctx.rank * local_batch, (ctx.rank + 1) * local_batch
        wanted = (order[s * batch_size : (s + 1) * batch_size][lo:hi] for s in range(steps_per_epoch))
        clock = NoClock() if ctx.kind == "xla" else PhaseClock(ctx.sync)
        t_epoch, data_s, sums, done = time.perf_counter(), 0.0, {}, 0
        # The next batch is read on a background thread while this one trains: data_s is only the
        # time the loop still waits for it.
        batches = train.prefetch(wanted, norm)
        try:
            for step in range(steps_per_epoch):
                t0 = time.perf_counter()
                cond, target = next(batches)
                if spec.crop:  # this rank's slice of the global batch's crops
                    corners = crop_offsets(batch_size, train.height, train.width, spec.crop, spec.seed, epoch, step)[lo:hi]
                    cond, target = crop_pairs(cond, target, corners, spec.crop)
                cond = ctx.shard(_to_device(cond, ctx, options))  # (B, 4, H, W)
                target = ctx.shard(_to_device(target, ctx, options))  # (B, 3, H, W)
                t1 = time.perf_counter()
                if recipe.schedule != "constant":
                    model.set_lr_factor(lr_factor(recipe.schedule, spec.progress(train_s, global_step, steps_per_epoch)))
                losses = model.train_step(cond, target, ctx.autocast, clock)
                ctx.step_end()
                names = sorted(losses)
                # Every rank must stop at the same step and use the same learning rate: the budget's
                # verdict and the training time travel with the losses.
                elapsed = time.perf_counter() - clock_t0
                over = float(spec.time_budget is not None and elapsed >= spec.time_budget)
                signalled = stop_requested()  # SIGTERM or SIGINT: every rank stops after the same step
                agreed = [torch.full_like(losses[names[0]], x, dtype=torch.float32) for x in (over, float(signalled or 0), elapsed)]
                reduced = ctx.mean_over_ranks(torch.stack([losses[k].float() for k in names] + agreed)).tolist()
                values, train_s = dict(zip(names, reduced[:-3])), reduced[-1]
                t2 = time.perf_counter()
                data_s += t1 - t0
                global_step, session_steps, done = global_step + 1, session_steps + 1, done + 1
                if session_steps == WARMUP_STEPS:
                    warmup_s = t2 - warmup_t0
                check_finite(values, epoch, global_step, checkpoint, steps)
                for k, v in values.items():
                    sums[k] = sums.get(k, 0.0) + v
                steps.add(global_step, {f"step_{k}": v for k, v in values.items()} | {"step_time_s": t2 - t0})
                progress.step(epoch, step + 1, steps_per_epoch, spec.progress(train_s, global_step, steps_per_epoch), train_s)
                if reduced[-2] > 0:
                    raise stopped(signalled, epoch, global_step, checkpoint, run_id, steps)
                if spec.max_steps and global_step >= spec.max_steps:
                    break
                if reduced[-3] > 0:
                    stopping = "time budget"
                    break
        finally:
            batches.close()  # stops the reader thread on a break or an error
        epoch_s = time.perf_counter() - t_epoch
        history["epoch_s"].append(epoch_s)
        last = {k: v / done for k, v in sums.items()}
        metrics = {
            "epoch_time_s": epoch_s, "epoch_samples_per_s": done * batch_size / epoch_s, "data_wait_fraction": data_s / epoch_s,
            "peak_memory_mb": _peak_memory_mb(ctx), "learning_rate": model.opt_g.param_groups[0]["lr"],
            **{f"epoch_{k}": v for k, v in last.items()},
        }
        if ctx.kind != "xla":
            metrics |= {f"{k}_s": v for k, v in clock.totals.items()}
        else:
            compiled, compile_s = _xla_compilations()
            metrics |= {"xla_compilations": compiled, "xla_compile_s": compile_s}
            if epoch > start_epoch + 1 and compiled > compiled_before:
                log.warning("epoch %d compiled %d new XLA graphs after warm-up: some shape or branch keeps changing", epoch, compiled - compiled_before)
            compiled_before = compiled
        steps.flush()
        history["samples"] = history.get("samples", 0) + done * batch_size
        last_epoch = stopping is not None or epoch == spec.epoch_limit or bool(spec.max_steps and global_step >= spec.max_steps)
        reached = 0.0
        if validation is not None and validation.due(epoch, last_epoch):
            reached = validate(lambda: validation.score(model.generator, ctx), validation, spec, epoch, history,
                               time.perf_counter() - clock_t0, metrics, log)
        if ctx.world_size > 1:  # rank 0 judged the target: every rank stops with it
            reached = ctx.mean_over_ranks(torch.full((1,), reached, device=ctx.device)).item()
        if reached > 0 and stopping is None:
            stopping = "target reached"
        history["train_s"] = time.perf_counter() - clock_t0
        metrics["train_time_s"] = history["train_s"]
        if ctx.is_main:
            run.log_metrics(metrics, step=epoch)
            save_checkpoint({"epoch": epoch, "global_step": global_step, "history": history,
                             "model": {"generator": _to_cpu(model.generator.state_dict()),
                                       "discriminator": _to_cpu(model.discriminator.state_dict())},
                             "optimizers": _to_cpu(model.optimizer_state())}, checkpoint)
        ends = stopping is not None or last_epoch
        done_fraction = 1.0 if ends else spec.progress(history["train_s"], global_step, steps_per_epoch)
        log_epoch(log, epoch, metrics, last, done_fraction, history["train_s"])
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
                   steps_per_epoch * batch_size, ctx, g_params, d_params)


def _to_device(array: np.ndarray, ctx: DeviceContext, options: dict) -> torch.Tensor:
    t = torch.from_numpy(array).to(ctx.device)
    return t.contiguous(memory_format=torch.channels_last) if options["channels_last"] else t


def _finish(spec, settings, run, run_dir, model, net, codec, train, manifest, split, history, global_step, last,
            samples_per_epoch, ctx, g_params, d_params) -> dict:
    """Model artifact, sample figure and summary metrics of a finished run."""
    generator_state = _to_cpu(model.generator.state_dict())
    model_dir = run_dir / "model"
    model_dir.mkdir(exist_ok=True)
    torch.save(generator_state, model_dir / "generator.pt")
    meta = model_meta(net, codec, spec, manifest, split, "torch", model_dir / "generator.pt")
    (model_dir / "meta.json").write_text(json.dumps(meta, indent=2))
    run.log_artifact(model_dir, "model")
    cpu_generator = build_generator(net)
    cpu_generator.load_state_dict(generator_state)
    run.log_artifact(sample_figure(_cpu_forward(cpu_generator), train, codec, run_dir / "sample_predictions.png", 2**net.generator_depth))
    log_surrogate(settings, run, cpu_generator, codec, train, meta, 2**net.generator_depth)
    totals = summary(history, global_step, last, samples_per_epoch)
    run.log_metrics(totals)
    run.set_tags({Tag.TARGET: "reached" if "target" in history else "not reached"})
    return {**totals, "split": split, "device": ctx.description, "world_size": ctx.world_size, "strategy": ctx.strategy}


def log_surrogate(settings: Settings, run: Run, generator: torch.nn.Module, codec: StepCodec, source: PairSource, meta: dict, unit: int) -> str:
    """The generator with its normalisation (models.nets.surrogate.Surrogate) as the run's MLflow model
    'generator': listed under the run's Models, loadable with mlflow.pytorch.load_model, registrable.
    Its signature is one physical state (u, v, p, mask) of the training frames' size -> the next (u, v,
    p); the model's code travels with it. Returns the model's URI."""
    import mlflow
    import mlflow.pytorch
    from mlflow.models import infer_signature

    from models.nets.surrogate import Surrogate

    model = Surrogate(generator.eval(), codec.norm.center, codec.norm.scale, codec.delta_scale).eval()
    example = np.ascontiguousarray(largest_corner(source.physical([0])[0], unit), dtype=np.float32)  # (1, 4, H, W)
    with torch.no_grad():
        out = model(torch.from_numpy(example)).numpy()
    mlflow.set_tracking_uri(settings.tracking_uri)
    mlflow.set_experiment(experiment_id=run.client.get_run(run.run_id).info.experiment_id)
    root = Path(__file__).resolve().parents[2]
    info = mlflow.pytorch.log_model(
        model, name="generator", run_id=run.run_id, signature=infer_signature(example, out), serialization_format="pickle",
        code_paths=[str(root / "models")], pip_requirements=[f"torch=={torch.__version__.split('+')[0]}", "numpy"],
        metadata={"inputs": list(INPUTS), "outputs": list(OUTPUTS), "recipe": meta["recipe"], "dataset": meta["dataset"],
                  "dataset_digest": meta["dataset_digest"], "frame_stride": meta["frame_stride"]})
    run.set_tags({Tag.MODEL_URI: info.model_uri})
    return info.model_uri


def _cpu_forward(generator):
    """Encoded states (B, 4, H, W) -> the generator's outputs (B, 3, H, W), numpy in and out (eval mode, CPU)."""
    generator.eval()

    def forward(cond: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return generator(torch.from_numpy(cond)).float().numpy()
    return forward
