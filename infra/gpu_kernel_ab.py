"""Time the fused kernel's launch shapes, and optionally another revision of the kernel, in one process on a GPU.

Usage: ``python infra/gpu_kernel_ab.py [--against FILE]``. At each size (16 simulations of 128x64, 1024x256,
4096x1024, the bench-solver flows in fp32) every variant is built, run once to compile and capture its CUDA
graphs, then timed five times, the variants interleaved so that they share the GPU's state. Variants: the
kernel with its own ``launch_shape``, the same kernel with other (cells a block, warps) shapes, and with
``--against`` a ``triton_backend.py`` of another revision (``git show REV:models/karman/solver/triton_backend.py``).
Prints one JSON line per size: median steps/s per simulation and MLUPS per variant, each run's steps/s, and the
largest difference between the variants' final states (fp32 rounding only: the shapes change no arithmetic but
the order of the force sums).
"""

import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.karman.solver import ChannelSolver  # noqa: E402
from models.karman.solver import triton_backend  # noqa: E402
from tasks.workloads.karman.bench.solver import bench_batch_configs  # noqa: E402

NO_PROBES = np.zeros((0, 2), np.int64)
# (nx, ny, simulations, steps a timed run, shapes tried beside the rule's)
SIZES = [(128, 64, 16, 2400, [(128, 4), (32, 1), (64, 1), (128, 2)]),
         (1024, 256, 1, 2000, [(256, 8), (128, 4), (128, 2), (512, 8)]),
         (4096, 1024, 1, 300, [(256, 8), (128, 4), (512, 8), (128, 2)])]


def build(module, nx: int, ny: int, batch: int, shape: tuple[int, int] | None = None):
    """A FusedBatch of ``module`` over bench-solver's flows (tasks.workloads.karman.bench.solver.bench_batch_configs), at ``shape``
    (None: the module's own choice)."""
    solvers = [ChannelSolver(config, backend="numpy") for config in bench_batch_configs(nx, ny, "float32", batch)]
    own = getattr(module, "launch_shape", None)
    if shape and own is not None:
        module.launch_shape = lambda _nx: shape
    try:
        return module.FusedBatch([s.plan for s in solvers], np.stack([s.f for s in solvers]), device="cuda", storage="float32")
    finally:
        if own is not None:
            module.launch_shape = own


def main(argv: list[str]) -> int:
    if argv and not (argv[0] == "--against" and len(argv) == 2 and Path(argv[1]).is_file()):
        print(f"gpu_kernel_ab: arguments {' '.join(argv)!r} not understood; usage: python infra/gpu_kernel_ab.py [--against FILE] "
              "(FILE: an existing triton_backend.py)", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("gpu_kernel_ab: no CUDA GPU visible; this script times the kernel on one", file=sys.stderr)
        return 2
    other = None
    if argv:
        spec = importlib.util.spec_from_file_location("triton_backend_other", argv[1])
        other = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(other)
    for nx, ny, batch, steps, shapes in SIZES:
        variants = {f"rule {triton_backend.launch_shape(nx)}": build(triton_backend, nx, ny, batch)}
        if other is not None:
            variants["other revision"] = build(other, nx, ny, batch)
        for shape in shapes:
            variants[f"{shape[0]} cells, {shape[1]} warps"] = build(triton_backend, nx, ny, batch, shape)
        for fused in variants.values():
            fused.run(steps, NO_PROBES)  # compile and capture
        torch.cuda.synchronize()
        seconds: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(5):
            for name, fused in variants.items():
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                fused.run(steps, NO_PROBES)
                torch.cuda.synchronize()
                seconds[name].append(time.perf_counter() - t0)
        first = next(iter(variants.values())).current
        diff = max(float((first - fused.current).abs().max()) for fused in variants.values())
        out = {name: {"steps_per_s": round(steps / statistics.median(t)), "mlups": round(batch * nx * ny * steps / statistics.median(t) / 1e6),
                      "runs_steps_per_s": [round(steps / x) for x in t]} for name, t in seconds.items()}
        print(json.dumps({"size": f"{batch}x{nx}x{ny}", "steps": steps, "max_state_diff": diff, **out}), flush=True)
        del variants, first
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
