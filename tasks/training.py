"""One Pix2Pix training run, executed inside the child process (see tasks.worker)."""

import dataclasses
import json
import logging
import math
import time
from pathlib import Path

import numpy as np
import torch

from models.device import resolve_device
from models.nets import NetConfig
from models.nets.trainer import OptimConfig, Pix2Pix
from models.solver import vorticity
from tasks.data import INPUTS, OUTPUTS, Normalizer, PairSource, split_simulations
from tasks.errors import UserError
from tasks.plots import vorticity_panels
from tasks.settings import Settings
from tasks.specs import TrainSpec
from tasks.store import load_manifest
from tasks.tracking import Run, client_for

log = logging.getLogger("karman.train")


def probe_device(job: dict) -> dict:
    """Check that the job's device can be opened; DeviceUnavailable names what is missing."""
    ctx = resolve_device(job["device"])
    return {"device": ctx.description, "world_size": ctx.world_size}


def _save_atomic(obj, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    tmp.replace(path)


def run_training(job: dict) -> dict:
    spec, settings = TrainSpec(**job["spec"]), Settings(**job["settings"])
    run = Run(client_for(settings), job["run_id"])
    if spec.threads:
        torch.set_num_threads(spec.threads)
    ctx = resolve_device(spec.device, spec.precision)
    torch.manual_seed(spec.seed)
    rng = np.random.default_rng(spec.seed)

    dataset_dir = settings.dataset_dir(spec.dataset)
    manifest = load_manifest(dataset_dir)
    split = split_simulations(list(manifest["simulations"]), spec.val_simulations, spec.test_simulations, spec.seed)
    train = PairSource(dataset_dir, split["train"], spec.frame_stride)
    norm = Normalizer.fit(train)  # streamed over the training simulations' frames
    net = NetConfig(in_channels=len(INPUTS), out_channels=len(OUTPUTS), size=min(train.height, train.width),
                    depth=spec.depth, ngf=spec.ngf, ndf=spec.ndf, norm=spec.norm)
    try:
        net.check_image(train.height, train.width)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    steps_per_epoch = len(train) // spec.batch_size
    if steps_per_epoch == 0:
        raise UserError(f"batch size {spec.batch_size} exceeds the {len(train)} training pairs of dataset {spec.dataset!r}")

    model = Pix2Pix(net, OptimConfig(lr=spec.lr, l1_weight=spec.l1_weight)).to(ctx.device)
    g_params = sum(p.numel() for p in model.generator.parameters())
    d_params = sum(p.numel() for p in model.discriminator.parameters())
    run.log_params({
        "framework": "torch", "torch_version": torch.__version__, "device_name": ctx.description,
        "world_size": ctx.world_size, "image_height": train.height, "image_width": train.width,
        "generator_depth": net.generator_depth, "generator_params": g_params, "discriminator_params": d_params,
        "dataset_digest": manifest["digest"], "train_pairs": len(train), "split": json.dumps(split),
    })
    run_dir = settings.run_dir(job["run_id"])
    run_dir.mkdir(parents=True, exist_ok=True)
    checkpoint = run_dir / "checkpoint.pt"

    log.info("training on %s: %d pairs from %d simulations, %d steps/epoch, generator %.2fM params",
             ctx.description, len(train), len(split["train"]), steps_per_epoch, g_params / 1e6)
    global_step, warmup_s, epoch_times = 0, None, []
    last = {}
    for epoch in range(1, spec.epochs + 1):
        model.train()
        order = rng.permutation(len(train))
        t_epoch, data_s, sums = time.perf_counter(), 0.0, {}
        # The next batch is read on a background thread while this one trains: data_s below is only
        # the time the loop still waits for it.
        batches = train.prefetch((order[s * spec.batch_size : (s + 1) * spec.batch_size] for s in range(steps_per_epoch)), norm)
        for step in range(steps_per_epoch):
            t0 = time.perf_counter()
            cond, target = next(batches)
            cond = torch.from_numpy(cond).to(ctx.device)  # (B, 4, H, W)
            target = torch.from_numpy(target).to(ctx.device)  # (B, 3, H, W)
            t1 = time.perf_counter()
            losses = model.train_step(cond, target, ctx.autocast)
            ctx.sync()
            values = {k: float(v) for k, v in losses.items()}
            t2 = time.perf_counter()
            data_s += t1 - t0
            global_step += 1
            if warmup_s is None:
                warmup_s = t2 - t0
            if not all(math.isfinite(v) for v in values.values()):
                raise RuntimeError(f"loss became non-finite at epoch {epoch}, step {step + 1}: {values}; "
                                   f"last good checkpoint: {checkpoint if checkpoint.exists() else 'none'}")
            for k, v in values.items():
                sums[k] = sums.get(k, 0.0) + v
            run.log_metrics({f"step_{k}": v for k, v in values.items()} | {"step_time_s": t2 - t0}, step=global_step)
            if spec.max_steps and global_step >= spec.max_steps:
                break
        batches.close()  # stops the reader thread after a max_steps break
        steps_done = step + 1
        epoch_s = time.perf_counter() - t_epoch
        epoch_times.append(epoch_s)
        last = {k: v / steps_done for k, v in sums.items()}
        metrics = {
            "epoch_time_s": epoch_s,
            "samples_per_s": steps_done * spec.batch_size / epoch_s,
            "data_wait_fraction": data_s / epoch_s,
            **{f"epoch_{k}": v for k, v in last.items()},
        }
        run.log_metrics(metrics, step=epoch)
        _save_atomic({"epoch": epoch, "global_step": global_step, "model": model.state_dict(),
                      "opt_g": model.opt_g.state_dict(), "opt_d": model.opt_d.state_dict()}, checkpoint)
        log.info("epoch %d/%d: %.1f s, %.1f samples/s, L1 %.4f, D %.3f", epoch, spec.epochs, epoch_s,
                 metrics["samples_per_s"], last["loss_l1"], last["loss_d"])
        if spec.max_steps and global_step >= spec.max_steps:
            break

    model_dir = run_dir / "model"
    model_dir.mkdir(exist_ok=True)
    torch.save({k: v.detach().cpu() for k, v in model.generator.state_dict().items()}, model_dir / "generator.pt")
    meta = {"net": dataclasses.asdict(net), "normalizer": dataclasses.asdict(norm), "inputs": INPUTS, "outputs": OUTPUTS,
            "frame_stride": spec.frame_stride, "dataset": spec.dataset, "dataset_digest": manifest["digest"], "split": split}
    (model_dir / "meta.json").write_text(json.dumps(meta, indent=2))
    run.log_artifact(model_dir, "model")
    figure = _sample_figure(model.generator, train, norm, ctx.device, run_dir / "sample_predictions.png")
    run.log_artifact(figure)
    steady = epoch_times[1:] or epoch_times
    summary = {
        "epochs": len(epoch_times), "steps": global_step, "warmup_s": warmup_s or 0.0,
        "time_per_epoch_s": float(np.median(steady)), "samples_per_s": steps_per_epoch * spec.batch_size / float(np.median(steady)),
        "final_l1": last.get("loss_l1", float("nan")), "generator_params": g_params, "discriminator_params": d_params,
    }
    run.log_metrics({k: v for k, v in summary.items() if isinstance(v, (int, float))})
    return {**summary, "split": split, "device": ctx.description, "world_size": ctx.world_size}


@torch.no_grad()
def _sample_figure(generator, source: PairSource, norm: Normalizer, device, path: Path) -> Path:
    """Vorticity of one-step predictions against targets for three training pairs."""
    generator.eval()
    picks = np.linspace(0, len(source) - 1, 3).astype(int)
    cond, ref = source.physical(picks)  # (3, 4, H, W), (3, 3, H, W)
    pred = norm.decode(generator(torch.from_numpy(norm.encode(cond)).to(device)).float().cpu().numpy())  # (3, 3, H, W)
    mask = cond[:, 3] > 0.5
    w_pred = vorticity(pred[:, 0], pred[:, 1], mask)
    w_ref = vorticity(ref[:, 0], ref[:, 1], mask)
    return vorticity_panels(w_pred, w_ref, [f"pair {j}" for j in picks], path, "one-step predictions (training pairs)")
