"""How much of its devices a finished training run used: the network's FLOPs at the run's speed, against the measured matmul ceiling and the datasheet (or derived) peak.

Runs in the training child on rank 0, after training, where the framework is loaded: the ceiling
of the same device kind, framework and dtype comes from the data root's cache (bench-matmul's, or an
earlier run's), else it is measured here in a couple of seconds and cached for the next run. Both
figures are for all the run's devices: per device times the world size; on a CPU, the host's figure
times the share of its cores the run used (threads per process x processes over cores).
"""

import logging

from tasks.common.config.errors import UserError
from tasks.common.records import TrainSummary, Utilisation
from tasks.common.config.frameworks import framework

log = logging.getLogger("karman.train")


def dtype_of(precision: str) -> str:
    """The matmul dtype a run's arithmetic is judged against: bf16 for bf16 autocast, else fp32."""
    return "bf16" if precision == "bf16" else "fp32"


def utilisation(trainer, runtime, summary: TrainSummary, spec, settings) -> Utilisation | None:
    """The run's Utilisation; None if the trainer cannot count its FLOPs. A ceiling that cannot be had
    (a dtype the framework does not multiply on the device) leaves that figure out, with the reason logged."""
    from tasks.common.measures import ceiling, matmul

    flops = getattr(trainer, "flops_per_sample", None)
    if not flops:
        return None
    dtype, device, framework, world = dtype_of(spec.precision), spec.device, runtime.framework, runtime.world_size
    achieved = flops * summary.samples_per_s / 1e12
    result = {"flops_per_sample": float(flops), "achieved_tflops": achieved, "dtype": dtype}
    try:
        share, name, cores_used = _share(runtime, device, world)
        cached = ceiling.read_ceiling(settings, device, framework, dtype, None if device == "cpu" else name)
        if cached is not None:
            per_unit, source = cached["tflops"], f"{cached['source']}, n={cached['n']}, {cached['when']}"
        else:
            timer = matmul.quick_ceiling(framework, device, dtype)
            per_unit, source = timer["warm_tflops"], f"{ceiling.QUICK}, n={timer['n']}"
            if device == "cpu":  # measured with this process's threads: the whole host's is per thread times its cores
                per_unit *= ceiling.this_cpu().cores / max(1, runtime.threads or 1)
            ceiling.write_ceiling(settings, device, framework, dtype, per_unit, timer["n"], ceiling.QUICK, None if device == "cpu" else name)
        result |= {"ceiling_tflops": per_unit * share, "ceiling_source": source}
        peak = ceiling.peak_tflops(device, name, dtype)
        if peak is not None:
            result |= {"peak_tflops": peak[0] * share, "peak_source": peak[1]}
        if device == "cpu" and share != 1:
            note = f"; x{share:.3g}: the run's {cores_used} of the host's {ceiling.this_cpu().cores} cores"
            result |= {"ceiling_source": result["ceiling_source"] + note, **({"peak_source": result["peak_source"] + note} if peak else {})}
    except UserError as exc:
        log.warning("utilisation against the ceiling and peak left out: %s", exc)
    return Utilisation(**result)


def devices_used(runtime, device: str, world: int) -> tuple[float, int]:
    """(the run's devices as a multiple of one unit, CPU cores used): on a CPU the unit is the whole host
    (the run's share of its cores: threads per process x processes), elsewhere one device."""
    from tasks.common.measures import ceiling

    if device == "cpu":
        cores = ceiling.this_cpu().cores
        procs = framework(runtime.framework).procs(device, world, getattr(runtime, "strategy", "auto"))
        used = min(cores, (runtime.threads or cores) * procs)
        return used / cores, used
    return float(world), 0


def _share(runtime, device: str, world: int) -> tuple[float, str | None, int]:
    """(devices_used's multiple of one ceiling unit, the device's name, CPU cores used)."""
    from tasks.common.measures import matmul

    share, used = devices_used(runtime, device, world)
    if device == "cpu":
        return share, None, used
    return share, matmul.Timer(runtime.framework, device, "fp32").device_name, used
