"""karman's part of bench-train: Pix2Pix training in samples/s against a plain eager fp32 step, in one run; imports no Prefect or MLflow.

torch trains in this process, the Keras step in its own (train_keras.py). ``spec`` is bench-train's
(tasks.bench.specs.BenchTrainSpec), passed in by the shared command through ``Workload.bench_train``."""

import contextlib
import json
import statistics

from tasks.common.process.launch import device_env
from tasks.common.measures.step_timing import StepProcess, alternate, known_peak, serve_steps, timed_steps


def _plain_step(gen, disc, opt_g, opt_d, cond, target, l1_weight: float) -> None:
    """The textbook eager float32 Pix2Pix step the trainer is compared with: same networks, losses
    and update order, default (multi-tensor) Adam, and D's weight gradients computed during the
    generator's update too (then discarded), as a plain implementation does."""
    import torch
    import torch.nn.functional as F

    fake = gen(cond)
    opt_d.zero_grad()
    real, fake_d = disc(cond, target), disc(cond, fake.detach())
    loss_d = 0.5 * (F.binary_cross_entropy_with_logits(real, torch.ones_like(real))
                    + F.binary_cross_entropy_with_logits(fake_d, torch.zeros_like(fake_d)))
    loss_d.backward()
    opt_d.step()
    opt_g.zero_grad()
    fake_g = disc(cond, fake)
    loss_g = F.binary_cross_entropy_with_logits(fake_g, torch.ones_like(fake_g)) + l1_weight * (fake - target).abs().mean()
    loss_g.backward()
    opt_g.step()


def _synthetic_batch(batch_size: int, size: int, seed: int):
    """(cond (B, 4, S, S) with an obstacle mask in channel 3, target (B, 3, S, S)) in network units."""
    import torch

    gen_cpu = torch.Generator().manual_seed(seed)
    cond = torch.rand(batch_size, 4, size, size, generator=gen_cpu) * 2 - 1
    cond[:, 3] = torch.where(cond[:, 3] > 0.8, 1.0, -1.0)
    target = torch.tanh(torch.randn(batch_size, 3, size, size, generator=gen_cpu))
    return cond, target


class _PlainTrainer:
    """The plain step's networks, optimisers and batch; ``run(n)`` times n steps in seconds."""

    def __init__(self, size: int, batch_size: int, seed: int, ctx):
        import torch

        from models.karman.nets.config import NetConfig
        from models.karman.nets.pix2pix import build_discriminator, build_generator

        net = NetConfig(in_channels=4, out_channels=3, size=size)
        torch.manual_seed(seed)
        self.gen, self.disc = build_generator(net).to(ctx.device), build_discriminator(net).to(ctx.device)
        self.opt_g = torch.optim.Adam(self.gen.parameters(), lr=2e-4, betas=(0.5, 0.999))
        self.opt_d = torch.optim.Adam(self.disc.parameters(), lr=2e-4, betas=(0.5, 0.999))
        self.cond, self.target = (t.to(ctx.device) for t in _synthetic_batch(batch_size, size, seed))
        self.ctx = ctx

    def run(self, n: int) -> float:
        with textbook_settings():
            return timed_steps(self.ctx, n, lambda: _plain_step(self.gen, self.disc, self.opt_g, self.opt_d, self.cond, self.target, 100.0))


@contextlib.contextmanager
def textbook_settings():
    """torch's process-wide switches at their defaults while the plain step runs (cuDNN's heuristic algorithm choice:
    no benchmark), whatever our trainer in the same process set (models.device turns the benchmark on for CUDA)."""
    import torch

    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = False
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = before


def plain_step_server() -> None:
    """Child side of ``_plain_process``: a CPU process left with its default settings. Reads one JSON
    line (size, batch_size, seed, threads), warms up, answers "ready", then for each line holding a
    step count runs that many plain steps and answers the seconds taken."""
    import sys

    import torch

    from models.device import resolve_device

    config = json.loads(sys.stdin.readline())
    torch.set_num_threads(config["threads"])
    plain = _PlainTrainer(config["size"], config["batch_size"], config["seed"], resolve_device("cpu"))
    plain.run(2)
    serve_steps(plain.run, {})


def _plain_process(size: int, batch_size: int, seed: int) -> StepProcess:
    import torch

    return StepProcess("tasks.workloads.karman.bench.train:plain_step_server",
                       {"size": size, "batch_size": batch_size, "seed": seed, "threads": torch.get_num_threads()})


def bench_train(spec, seed: int = 0) -> dict:
    """Training samples/s of the spec's framework (torch: ours, below; tensorflow: ``bench_train_keras``)."""
    return {"torch": bench_train_torch, "tensorflow": bench_train_keras}[spec.framework](spec, seed)


def bench_train_torch(spec, seed: int = 0) -> dict:
    """Training samples/s of the default Pix2Pix networks on synthetic (B, 4, size, size) -> (B, 3, ...)
    pairs with the trainer's speed options, against the plain eager fp32 step.

    On CPU the trainer's process keeps freed memory (as a training child does, see
    ``keep_freed_memory``); the plain step runs twice: in a separate process with default settings
    (``baseline_samples_per_s``, ``speedup``: what a plain script gets) and in the benchmark's own
    process (``same_process_baseline_samples_per_s``, ``speedup_same_process``: the code's share
    alone). On GPUs and XLA only the latter, reported as the baseline. Timed blocks of ``steps``
    steps alternate between the sides (``repeats`` each) so drifts of the machine hit all alike;
    each side reports its median block. ``compile_s`` is the trainer's first step (warm-up,
    compilation)."""
    if spec.jit_compile:
        raise ValueError("--jit-compile is tensorflow's; torch compiles with the trainer's speed options")
    device, size, batch_size, steps, repeats = spec.device, spec.size, spec.batch_size, spec.steps, spec.repeats
    precision, baseline, peak_tflops = spec.precision, spec.baseline, spec.peak_tflops
    net, ctx, options, model, run_fast, compile_s = _trainer_side(device, size, batch_size, precision, seed, spec.compile, spec.cuda_graph)
    sides = {"fast": run_fast}
    with contextlib.ExitStack() as stack:
        if baseline:
            same = _PlainTrainer(size, batch_size, seed, ctx)
            same.run(2)
            sides["same"] = same.run
            if device == "cpu":
                child = _plain_process(size, batch_size, seed)
                stack.callback(child.close)
                sides["child"] = child.run
        times = alternate(sides, repeats, steps)

    def rate(key: str) -> float:
        return batch_size * steps / statistics.median(times[key])

    def runs(key: str) -> list[float]:
        return [round(batch_size * steps / t, 4) for t in times[key]]

    flops = _flops_per_sample(net)
    result = {
        "samples_per_s": rate("fast"), "in_channels": net.in_channels, "out_channels": net.out_channels,
        "generator_params": sum(p.numel() for p in model.generator.parameters()),
        "discriminator_params": sum(p.numel() for p in model.discriminator.parameters()),
        "compile_s": compile_s, "device": device, "device_name": ctx.description, "size": size, "batch_size": batch_size,
        "steps": steps, "repeats": repeats, "precision": precision, "options": options,
        "samples_per_s_runs": runs("fast"),
        "flops_per_sample": flops,
        "achieved_tflops": flops * rate("fast") / 1e12 if flops else None,
    }
    if baseline:
        base = "child" if "child" in times else "same"
        result |= {"baseline_samples_per_s": rate(base), "speedup": rate("fast") / rate(base),
                   "baseline_samples_per_s_runs": runs(base), "baseline_process": "separate" if base == "child" else "same"}
        if base == "child":
            result |= {"same_process_baseline_samples_per_s": rate("same"), "speedup_same_process": rate("fast") / rate("same"),
                       "same_process_baseline_samples_per_s_runs": runs("same")}
    peak = peak_tflops or known_peak(ctx, precision)
    result["peak_tflops"] = peak
    result["mfu"] = flops * rate("fast") / (peak * 1e12) if (flops and peak) else None
    return result


def _trainer_side(device: str, size: int, batch_size: int, precision: str, seed: int, compile: str = "auto", cuda_graph: str = "auto"):
    """Our torch trainer on the default networks and a synthetic batch, warmed up: (net, ctx, options,
    model, run(n) -> seconds, compile_s: the first step)."""
    import torch

    from models.device import keep_freed_memory, resolve_device
    from models.karman.nets.config import NetConfig
    from models.karman.nets.trainer import OptimConfig, build_trainer, speed_options

    net = NetConfig(in_channels=4, out_channels=3, size=size)
    net.check_image(size, size)
    ctx = resolve_device(device, precision)
    options = speed_options(device, precision, compile=compile, cuda_graph=cuda_graph) | {"keep_freed_memory": device == "cpu" and keep_freed_memory()}
    torch.manual_seed(seed)
    model = build_trainer(net, OptimConfig(), ctx, options)
    cond, target = (t.to(ctx.device) for t in _synthetic_batch(batch_size, size, seed))
    if options["channels_last"]:
        cond, target = cond.contiguous(memory_format=torch.channels_last), target.contiguous(memory_format=torch.channels_last)

    def run(n: int) -> float:
        return timed_steps(ctx, n, lambda: model.train_step(cond, target, ctx.autocast))

    compile_s = run(1)
    run(1)
    return net, ctx, options, model, run, compile_s


def bench_train_keras(spec, seed: int = 0) -> dict:
    """Training samples/s of the Keras Pix2Pix step (the same networks and recipe as bench_train_torch's) in
    its own process, against, in the same run, our torch trainer (``torch_samples_per_s``,
    ``vs_torch``: this process) and the plain eager fp32 torch step (``baseline_samples_per_s``,
    ``speedup``: its own CPU process with default settings, as for torch). Timed blocks alternate
    between the sides; each reports its median block. ``compile_s`` is the Keras step's first call
    (tracing, and XLA compilation with ``jit_compile``)."""
    device, size, batch_size, steps, repeats = spec.device, spec.size, spec.batch_size, spec.steps, spec.repeats
    precision, baseline, jit_compile = spec.precision, spec.baseline, spec.jit_compile
    if precision != "fp32":
        raise ValueError(f"--precision {precision}: the tensorflow step runs in fp32 only")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"--device {device}: bench-train --framework tensorflow runs on cpu or cuda (TPUStrategy needs a TPU host)")
    import torch

    from models.karman.nets.config import NetConfig

    NetConfig(size=size).check_image(size, size)
    threads = torch.get_num_threads()
    config = {"size": size, "batch_size": batch_size, "seed": seed, "threads": threads, "device": device, "jit_compile": jit_compile}
    with contextlib.ExitStack() as stack:
        keras = StepProcess("tasks.workloads.karman.bench.train_keras:keras_step_server", config, device_env(device, framework="tensorflow"), "Keras-step")
        stack.callback(keras.close)
        sides = {"keras": keras.run}
        if baseline:
            net, ctx, options, model, run_torch, torch_compile_s = _trainer_side(device, size, batch_size, precision, seed)
            sides["torch"] = run_torch
            if device == "cpu":
                plain = _plain_process(size, batch_size, seed)
                stack.callback(plain.close)
                sides["plain"] = plain.run
            else:
                same = _PlainTrainer(size, batch_size, seed, ctx)
                same.run(2)
                sides["plain"] = same.run
        times = alternate(sides, repeats, steps)

    def rate(key: str) -> float:
        return batch_size * steps / statistics.median(times[key])

    flops = _flops_per_sample(NetConfig(in_channels=4, out_channels=3, size=size))
    result = {
        "framework": "tensorflow", "samples_per_s": rate("keras"), "in_channels": 4, "out_channels": 3,
        "generator_params": keras.info["generator_params"], "discriminator_params": keras.info["discriminator_params"],
        "compile_s": keras.info["compile_s"], "device": device, "device_name": keras.info["device_name"], "size": size,
        "batch_size": batch_size, "steps": steps, "repeats": repeats, "precision": precision,
        "options": {"jit_compile": jit_compile, "threads": threads, "tensorflow_version": keras.info["tensorflow_version"]},
        "samples_per_s_runs": [round(batch_size * steps / t, 4) for t in times["keras"]],
        "flops_per_sample": flops, "achieved_tflops": flops * rate("keras") / 1e12 if flops else None,
    }
    if baseline:
        result |= {"torch_samples_per_s": rate("torch"), "vs_torch": rate("keras") / rate("torch"), "torch_compile_s": torch_compile_s,
                   "torch_generator_params": sum(p.numel() for p in model.generator.parameters()),
                   "baseline_samples_per_s": rate("plain"), "speedup": rate("keras") / rate("plain"),
                   "baseline_process": "separate" if device == "cpu" else "same"}
    return result


def _flops_per_sample(net) -> float:
    """FLOPs of one training step of the benchmarked trainer (the default OptimConfig: adversarial term, one step) per sample, from the layer shapes."""
    from models.karman.recipe import OptimConfig

    o = OptimConfig()
    return net.training_flops(net.size, net.size, o.unroll, o.gan_weight > 0)
