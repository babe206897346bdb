"""Measure the product on a CUDA host in one pass: the ceiling's dtypes, the calo GAN's step by variant, Pix2Pix at paper size, the demo surrogate to its target, and the benchmark flow itself.

Usage: ``python infra/gpu_accelerator.py OUT_DIR [STEP ...]`` (steps by name, all when none is named; each in its own
child process group under a time limit, as ``infra/gpu_figures.py`` runs them). Results go to ``OUT_DIR/figures.json``,
output to ``OUT_DIR/log.txt``; the flow steps leave their data root, MLflow store and report under ``OUT_DIR/work``.
Needs torch with CUDA; the flow steps need the GPU pool's packages (``requirements-gpu-pool.txt``, installed from the
wheelhouse ``infra/wheelhouse.py`` builds) and JAX with CUDA for the JAX cells.

``--calo BATCH[,BATCH...] [VARIANT ...]`` (run by the ``calo_*`` steps) times the calo trainer's four-tape step at the
published size on synthetic showers, one variant after another in this process, with a profile of the first.
``--pix2pix [SIZE BATCH]`` (``pix2pix_profile``) times and profiles Pix2Pix's step with and without CUDA graphs against
the plain step; ``--graph-check`` (``graph_check``) compares the graphed step's training with the eager step's;
``--karman-demo COMPILE [REPEATS]`` (``karman_demo*``) trains the demo surrogate to its target. ``--calo``,
``--pix2pix`` and ``--graph-check`` run on the CPU with ``KARMAN_PROBE_DEVICE=cpu`` (their check before a GPU call).
"""

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from infra.gpu_figures import run_steps  # noqa: E402

FLOWS = [sys.executable, "-m", "flows"]
WORK = "work"  # under OUT_DIR: the flow steps' data root and MLflow store

# The calo step's variants: what the product does now, and each earlier or candidate choice beside it.
CALO_VARIANTS = {
    "product": {},  # cuDNN's benchmark, float32 batch-norm moments, a broadcast upsampling, fp32
    "before": {"benchmark": False, "moments": "float64", "upsample": "interpolate"},  # the step as it was first run on an H100
    "no_benchmark": {"benchmark": False},
    "moments64": {"moments": "float64"},
    "bf16": {"precision": "bf16"},
    "channels_last": {"channels_last": True},
    "bf16_channels_last": {"precision": "bf16", "channels_last": True},
    # the convolutions as 2-D ones over runs of depths (models.calo.torch.depth_blocks): depths per plane, planes channels-last
    "conv3d": {"depth_block": 0},
    "conv3d_bf16": {"depth_block": 0, "precision": "bf16"},
    "blocks8": {"depth_block": 8},
    "blocks8_bf16": {"depth_block": 8, "precision": "bf16"},
    "blocks8_bf16_cl": {"depth_block": 8, "precision": "bf16", "planes_cl": True},
    "blocks4_bf16": {"depth_block": 4, "precision": "bf16"},
    "blocks16_bf16": {"depth_block": 16, "precision": "bf16"},
    "blocks16_bf16_cl": {"depth_block": 16, "precision": "bf16", "planes_cl": True},
}


def _steps(out: Path) -> dict[str, tuple[list[str], int]]:
    me = [sys.executable, str(Path(__file__).resolve())]
    quick = ["benchmark", "--quick", "--devices", "cuda", "--pools", "cuda=local", "--frameworks", "torch,jax", "--json"]
    return {
        "matmul": (FLOWS + ["bench-matmul", "--device", "cuda", "--frameworks", "torch,jax", "--dtypes", "fp32,tf32,bf16", "--sizes", "8192",
                            "--json"], 60),
        "calo_variants": (me + ["--calo", "32", "product", "before", "bf16", "channels_last", "bf16_channels_last"], 120),
        "calo_published_batch": (me + ["--calo", "128", "product", "bf16", "bf16_channels_last"], 110),
        "calo_blocks": (me + ["--calo", "32", "blocks8_bf16", "conv3d", "blocks8", "conv3d_bf16", "blocks4_bf16", "blocks16_bf16",
                              "blocks8_bf16_cl", "blocks16_bf16_cl"], 150),
        "calo_blocks_published": (me + ["--calo", "128", "blocks8_bf16", "blocks16_bf16", "blocks8"], 120),
        "pix2pix_profile": (me + ["--pix2pix"], 150),
        "graph_check": (me + ["--graph-check"], 90),
        "calo_product": (me + ["--calo", "128", "product"], 90),
        "pix2pix_eager": (FLOWS + ["bench-train", "--device", "cuda", "--size", "256", "--batch-size", "16", "--precision", "bf16",
                                   "--compile", "off", "--json"], 90),
        "pix2pix": (FLOWS + ["bench-train", "--device", "cuda", "--size", "256", "--batch-size", "16", "--precision", "bf16", "--json"], 90),
        "karman_demo": (me + ["--karman-demo", "auto"], 180),
        "karman_demo_eager": (me + ["--karman-demo", "off"], 180),
        "karman_demo_seeds": (me + ["--karman-demo", "auto", "3"], 300),  # the product's median of three seeds
        "calo_quality": (FLOWS + ["bench-quality", "--workload", "calo", "--dataset", "calo", "--device", "cuda", "--batch-size", "128",
                                  "--time-budget", "480", "--stop-at-target", "--json"], 600),  # the goal: the target within 8 minutes
        "flow_digits": (FLOWS + quick + ["--workloads", "digits"], 120),
        "flow_quick": (FLOWS + quick + ["--workloads", "karman,digits,har,calo"], 300),
    }


def _calo_batch(trainer_module, cfg, batch: int):
    """4 x ``batch`` synthetic showers at the published grid in every role, 10-500 GeV, 60-120 degrees (the dataset's ranges):
    step_shares' three steps after its warm-up take their own."""
    import numpy as np

    from models.calo.showers import shower_events
    from tasks.workloads.calo.workload import ROLES, CaloData

    energy, angle = np.linspace(10.0, 500.0, 4 * batch), np.linspace(60.0, 120.0, 4 * batch)
    cells = shower_events(energy, angle, 5)
    sf = float((cells.sum(axis=(1, 2, 3)) / energy).mean())
    return CaloData({r: cells for r in ROLES}, {r: energy.astype(np.float32) for r in ROLES}, {r: angle.astype(np.float32) for r in ROLES},
                    {r: ["synthetic"] for r in ROLES}, "-", sf)


def calo(batches: list[int], variants: list[str], device: str = "cuda") -> dict:
    """The calo trainer's step at the published size (workload.ACCELERATOR) per variant and batch: seconds per step
    (median of 3 after 2 warm-ups), samples/s, the step's shares by section, and the CUDA kernels of the first
    variant's step ranked by their time (torch.profiler)."""
    import statistics

    import torch
    import torch.nn.functional as F

    from tasks.common.specs import TrainSpec
    from tasks.common.runtimes.runtime_torch import TorchRuntime
    from tasks.workloads.calo import torch as calo_torch
    from models.calo import torch as calo_nets
    from tasks.workloads.calo.workload import ACCELERATOR

    broadcast = calo_nets.upsample
    results, profile = {}, None
    for batch in batches:
        data = _calo_batch(calo_torch, ACCELERATOR, batch)
        for name in variants:
            v = CALO_VARIANTS[name]
            runtime = TorchRuntime(device, precision=v.get("precision", "fp32"))
            sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
            torch.backends.cudnn.benchmark = v.get("benchmark", True)
            calo_nets.upsample = (lambda x, f: F.interpolate(x, scale_factor=f, mode="nearest")) if v.get("upsample") == "interpolate" else broadcast
            spec = TrainSpec(workload="calo", dataset="calo", device=device, seed=0, precision=v.get("precision", "fp32"))
            trainer = calo_torch.CaloTorch(data, spec, batch, runtime, ACCELERATOR)
            for bn in (m for net in (trainer.g, trainer.d) for m in net.modules() if isinstance(m, calo_nets.BatchNorm)):
                bn.moments = getattr(torch, v.get("moments", "float32"))
            if "depth_block" in v:
                for net in (trainer.g, trainer.d, trainer.g_avg):
                    if net is not None:
                        net.layers.depth_block, net.layers.channels_last = v["depth_block"], v.get("planes_cl", False)
            if v.get("channels_last"):
                trainer.g.to(memory_format=torch.channels_last_3d), trainer.d.to(memory_format=torch.channels_last_3d)
            batches_of = (b for epoch in range(1, 10**6) for b in trainer.batches(epoch, 4))
            t_first = time.perf_counter()
            for _ in range(2):
                trainer.step(next(batches_of), [0.0] * 3, 0.0)
            sync()
            warm_s = time.perf_counter() - t_first
            times = []
            for _ in range(3):
                b = next(batches_of)
                sync()
                t0 = time.perf_counter()
                losses, _ = trainer.step(b, [0.0] * 3, 0.0)
                sync()
                times.append(time.perf_counter() - t0)
            step_s = statistics.median(times)
            shares = calo_torch.step_shares(trainer, 3)
            results[f"{name}_b{batch}"] = {"step_s": step_s, "samples_per_s": batch / step_s, "warmup_s": warm_s, "shares": shares,
                                           "losses": losses, "tflops": trainer.flops_per_sample * batch / step_s / 1e12,
                                           "memory_gb": torch.cuda.max_memory_allocated() / 1e9 if device == "cuda" else None}
            print(name, batch, json.dumps(results[f"{name}_b{batch}"]), file=sys.stderr, flush=True)
            if profile is None:
                from torch.profiler import ProfilerActivity
                from torch.profiler import profile as profiler

                with profiler(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])) as prof:
                    trainer.step(next(batches_of), [0.0] * 3, 0.0)
                    sync()
                profile = prof.key_averages().table(sort_by="self_cuda_time_total" if device == "cuda" else "self_cpu_time_total", row_limit=25, max_name_column_width=70)
                print(profile, file=sys.stderr, flush=True)
            del trainer
            if device == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
    return {"variants": results, "profile": profile, "device_name": runtime.ctx.description, "config": str(ACCELERATOR)}


def pix2pix_profile(device: str = "cuda", size: int = 256, batch: int = 16) -> dict:
    """Pix2Pix at paper size, bench-train's sides in one process: our bf16 step replayed from CUDA graphs (eager
    networks, and torch.compile's), run eagerly, and the plain eager fp32 step, timed in alternating blocks (median
    of 3 blocks of 5 steps), then the CUDA kernels of 3 steps of the graphed and the eager step ranked by their time
    (torch.profiler). On a CPU (its test) the graphed sides run eagerly."""
    import statistics

    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler

    from tasks.common.measures.step_timing import alternate
    from tasks.workloads.karman.bench.train import _PlainTrainer, _trainer_side

    sides, info = {}, {}
    graph = "on" if device == "cuda" else "off"
    for name, compile_choice, graph_choice in (("graphed", "off", graph), ("graphed_compiled", "on", graph), ("eager", "off", "off")):
        t0 = time.perf_counter()
        net, ctx, options, model, run, compile_s = _trainer_side(device, size, batch, "bf16", 0, compile_choice, graph_choice)
        sides[name] = run
        info[name] = {"warmup_s": time.perf_counter() - t0, "compile_s": compile_s, "options": options}
    plain = _PlainTrainer(size, batch, 0, ctx)
    plain.run(2)
    sides["plain"] = plain.run
    times = alternate(sides, 3, 5)
    rates = {k: batch * 5 / statistics.median(v) for k, v in times.items()}
    tables = {}
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    for name in ("graphed", "eager"):
        with profiler(activities=activities) as prof:
            sides[name](3)
        tables[name] = prof.key_averages().table(sort_by="self_cuda_time_total" if device == "cuda" else "self_cpu_time_total",
                                                 row_limit=30, max_name_column_width=70)
        print(name, tables[name], file=sys.stderr, flush=True)
    return {"samples_per_s": rates, "speedup": rates["graphed"] / rates["plain"], "speedup_compiled": rates["graphed_compiled"] / rates["plain"],
            "speedup_eager": rates["eager"] / rates["plain"],
            "info": info, "profiles": tables, "device_name": ctx.description,
            "flops_per_sample": net.training_flops(size, size, 1, True)}


def graph_check(device: str = "cuda", size: int = 64, batch: int = 4, steps: int = 4) -> dict:
    """Pix2Pix's step replayed from CUDA graphs against the same step run eagerly: two trainers from the same seed
    (dropout off, so that both compute the same function), ``steps`` steps on the same batches with a two-step
    unrolled loss and the learning rate halved after the first step; the largest relative difference of any weight
    tensor and of the losses (cuDNN's algorithms differ between the two, so not zero)."""
    import torch

    from models.device import resolve_device
    from models.karman.nets.config import NetConfig
    from models.karman.nets.trainer import OptimConfig, build_trainer, speed_options

    net = NetConfig(in_channels=4, out_channels=3, size=size, dropout=0.0)
    ctx = resolve_device(device, "fp32")
    models, losses = [], []
    for graph in ("off", "on"):
        torch.manual_seed(0)
        model = build_trainer(net, OptimConfig(unroll=2), ctx, speed_options(device, "fp32", compile="off", cuda_graph=graph if device == "cuda" else "off"))
        gen = torch.Generator().manual_seed(1)
        seen = []
        for n in range(steps):
            cond, target = torch.rand(batch, 4, size, size, generator=gen) * 2 - 1, torch.rand(batch, 6, size, size, generator=gen) * 2 - 1
            cond, target = (t.to(ctx.device).contiguous(memory_format=torch.channels_last) for t in (cond, target))
            model.set_lr_factor(1.0 if n == 0 else 0.5)
            seen.append({k: float(v) for k, v in model.train_step(cond, target, ctx.autocast, None, 2).items()})
        ctx.sync()
        models.append(model)
        losses.append(seen)
    eager, graphed = models
    worst = max(float((a.detach().float() - b.detach().float()).norm() / a.detach().float().norm().clamp(min=1e-30))
                for a, b in zip(list(eager.parameters()) + list(eager.buffers()), list(graphed.parameters()) + list(graphed.buffers())))
    loss_worst = max(abs(a[k] - b[k]) / max(abs(a[k]), 1e-12) for a, b in zip(*losses) for k in a)
    return {"weights_rel_diff_max": worst, "losses_rel_diff_max": loss_worst, "losses_eager": losses[0], "losses_graphed": losses[1],
            "graphs": len(graphed.captured.graphs) if graphed.captured else 0, "device_name": ctx.description}


def karman_demo(compile_choice: str, repeats: int = 1) -> dict:
    """The demo sweep generated on the GPU into a temporary data root, then bench-quality of the default recipe to its
    target there (``--compile`` as given), ``repeats`` runs (seeds 0, 1, ...): seconds to the target, their median."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as root:
        env = {**os.environ, "KARMAN_DATA_ROOT": root}
        t0 = time.perf_counter()
        subprocess.run(FLOWS + ["generate", "--dataset", "karman-demo", "--device", "cuda"], cwd=ROOT, env=env, check=True,
                       capture_output=True, text=True)
        generate_s = time.perf_counter() - t0
        done = subprocess.run(FLOWS + ["bench-quality", "--dataset", "karman-demo", "--device", "cuda", "--time-budget", "60", "--stop-at-target",
                                       "--repeats", str(repeats), "--compile", compile_choice, "--json"], cwd=ROOT, env=env, capture_output=True,
                              text=True)
        if done.returncode:
            raise RuntimeError(done.stderr[-3000:])
        return {**json.loads(done.stdout.strip().splitlines()[-1]), "generate_s": generate_s}


def summary(r: dict) -> str:
    if "error" in r:
        return f"ERROR {str(r['error'])[-1500:]}"
    if "variants" in r:
        return " | ".join(f"{k}: {v['samples_per_s']:.1f}/s {v['tflops']:.1f} TF" for k, v in r["variants"].items())
    keys = ("device_name", "samples_per_s", "baseline_samples_per_s", "speedup", "mfu", "compile_s", "time_to_target_s", "reached",
            "wall_s", "cells", "step_s")
    return " ".join(f"{k}={r[k]}" for k in keys if k in r) or json.dumps(r)[:1500]


def main(argv: list[str]) -> int:
    if argv[:1] == ["--calo"]:
        # KARMAN_PROBE_DEVICE=cpu: the same probe on the CPU (its test)
        print(json.dumps(calo([int(b) for b in argv[1].split(",")], argv[2:] or list(CALO_VARIANTS), os.environ.get("KARMAN_PROBE_DEVICE", "cuda"))))
        return 0
    if argv[:1] == ["--graph-check"]:
        print(json.dumps(graph_check(os.environ.get("KARMAN_PROBE_DEVICE", "cuda"))))
        return 0
    if argv[:1] == ["--pix2pix"]:
        print(json.dumps(pix2pix_profile(os.environ.get("KARMAN_PROBE_DEVICE", "cuda"), *(int(a) for a in argv[1:]))))
        return 0
    if argv[:1] == ["--karman-demo"]:
        print(json.dumps(karman_demo(argv[1], *(int(a) for a in argv[2:3]))))
        return 0
    if not argv:
        print(f"usage: python infra/gpu_accelerator.py OUT_DIR [STEP ...]; steps: {', '.join(_steps(Path('.')))}", file=sys.stderr)
        return 2
    steps = _steps(Path(argv[0]).resolve())
    unknown = [n for n in argv[1:] if n not in steps]
    if unknown:
        print(f"unknown step {unknown[0]!r}; the steps are {', '.join(steps)}", file=sys.stderr)
        return 2
    out = Path(argv[0]).resolve()
    work = out / WORK
    work.mkdir(parents=True, exist_ok=True)
    # the flow steps' data root and MLflow store inside OUT_DIR (a file store: the report and runs come back with it)
    env = {**os.environ, "KARMAN_DATA_ROOT": str(work / "data"), "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}",
           "KARMAN_ARTIFACT_ROOT": str(work / "mlartifacts"), "PYTHONUNBUFFERED": "1"}
    return run_steps(out, steps, argv[1:], summary, env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
