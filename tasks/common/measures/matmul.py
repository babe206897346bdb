"""Square matrix products timed cold and warm, in torch, tensorflow or jax (each imported only inside its own backend), as TFLOP/s.

Run in a process that has (or may load) the framework: bench-matmul's children, or a training run
measuring a quick ceiling in its own process. ``cold_s`` is the first product at a size (output
allocation, kernel choice, tracing or compilation), after one tiny product at the dtype has started
the framework's device runtime (``init_s``); ``warm_s`` is the median of ``repeats`` later products,
each ended by the device's synchronisation.
"""

import statistics
import time
from typing import Callable

from tasks.common.measures.ceiling import on_host_cpu
from tasks.common.config.errors import UserError

FRAMEWORKS = ("torch", "tensorflow", "jax")
DTYPES = ("fp32", "tf32", "bf16", "fp16")
BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2}

# The dtypes each framework multiplies on each device kind. tf32 also needs an NVIDIA GPU of compute
# capability 8.0 (Ampere) or later, checked where the GPU is open. On a CPU every framework here does
# fp32 and bf16 (oneDNN/MKL or XLA's CPU dot); fp16 only torch (oneDNN's fp16 GEMM) and jax (XLA's
# dot, converting); TensorFlow's CPU fp16 matmul is Eigen's scalar path and is not offered. XLA devices
# (TPUs) multiply bf16 natively and fp32 in several bf16 passes.
OFFERED: dict[str, dict[str, tuple[str, ...]]] = {
    "torch": {"cpu": ("fp32", "bf16", "fp16"), "cuda": DTYPES, "xla": ("fp32", "bf16")},
    "tensorflow": {"cpu": ("fp32", "bf16"), "cuda": DTYPES},
    "jax": {"cpu": ("fp32", "bf16", "fp16"), "cuda": DTYPES, "xla": ("fp32", "bf16")},
}
# What bench-matmul measures when no dtype is given: the device's native ones.
DEFAULT_DTYPES = {"cpu": ("fp32", "bf16"), "cuda": DTYPES, "xla": ("fp32", "bf16")}
QUICK_SIZE = {"cpu": 2048, "cuda": 8192, "xla": 8192}


def quick_size(device: str, device_name: str) -> int:
    """The size of a quick ceiling's product: QUICK_SIZE's, the CPU's for XLA on the host CPU (PJRT_DEVICE=CPU),
    where an accelerator's 8192 would take tens of seconds a product."""
    return QUICK_SIZE["cpu" if on_host_cpu(device, device_name) else device]


def tflops(n: int, seconds: float) -> float:
    """TFLOP/s of one n x n by n x n product taking ``seconds``: 2·n³ FLOPs (a multiply and an add per term)."""
    return 2 * n**3 / seconds / 1e12


def check(framework: str, device: str, dtype: str) -> None:
    """UserError unless ``framework`` multiplies ``dtype`` on ``device``, naming what it offers there."""
    if framework not in OFFERED:
        raise UserError(f"unknown framework {framework!r}; choose one of {', '.join(FRAMEWORKS)}")
    offered = OFFERED[framework].get(device)
    if offered is None:
        raise UserError(f"{framework} does not run matmuls on device {device!r} here; it runs on {', '.join(OFFERED[framework])}")
    if dtype not in offered:
        raise UserError(f"dtype {dtype!r} is not offered by {framework} on {device}; it offers {', '.join(offered)}")


class _Backend:
    """One framework on one device at one dtype: ``operands(n)``, ``matmul(a, b)``, ``sync(out)``, ``name``, and
    ``precision()``: the process-wide switches this dtype needs (TF32 on or off), set before each of its products,
    since timers of several dtypes open in one process before any of them measures."""

    name: str
    operands: Callable
    matmul: Callable
    sync: Callable
    precision: Callable = staticmethod(lambda: None)
    free_bytes: Callable = staticmethod(lambda: None)  # free memory of the GPU it multiplies on, where its framework says; None elsewhere


def _no_tf32(name: str, major: int, minor: int, framework: str) -> UserError:
    return UserError(f"dtype 'tf32' needs an NVIDIA GPU of compute capability 8.0 or later; {name} is {major}.{minor}, "
                     f"where {framework} offers fp32, fp16" + (", bf16" if major >= 8 else ""))


def _torch(device: str, dtype: str) -> _Backend:
    import torch

    b = _Backend()
    if device == "xla":
        import torch_xla
        import torch_xla.core.xla_model as xm

        dev = torch_xla.device()

        def sync(out) -> None:
            torch_xla.sync()
            xm.wait_device_ops()

        hw = xm.xla_device_hw(dev)
        if hw == "TPU":  # the chip's generation, as the peak table names it
            from torch_xla._internal import tpu

            hw = f"TPU v{tpu.version()}"
        b.name, b.sync = hw, sync
    elif device == "cuda":
        if not torch.cuda.is_available():
            raise UserError("device cuda requested but no CUDA GPU is visible to torch")
        dev = torch.device("cuda")
        b.name = torch.cuda.get_device_name(dev)
        major, minor = torch.cuda.get_device_capability(dev)
        if dtype == "tf32" and major < 8:
            raise _no_tf32(b.name, major, minor, "torch")
        # one switch for the process (torch's TF32 setting; allow_tf32 is its deprecated spelling)
        b.precision = lambda: setattr(torch.backends.cuda.matmul, "fp32_precision", "tf32" if dtype == "tf32" else "ieee")
        b.sync = lambda out: torch.cuda.synchronize()
        b.free_bytes = lambda: torch.cuda.mem_get_info()[0]
    else:
        from tasks.common.measures.ceiling import cpu_name

        dev, b.name, b.sync = torch.device("cpu"), cpu_name(), lambda out: None
    kind = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]

    def operands(n: int):
        gen = torch.Generator().manual_seed(0)
        a, c = (torch.rand(n, n, generator=gen).to(kind).to(dev) for _ in range(2))  # (n, n) each
        b.sync(None)
        return a, c

    b.operands, b.matmul = operands, lambda x, y: x @ y
    return b


def _tensorflow(device: str, dtype: str) -> _Backend:
    import tensorflow as tf

    b = _Backend()
    if device == "cuda":
        gpus = tf.config.list_physical_devices("GPU")
        if not gpus:
            raise UserError("device cuda requested but TensorFlow sees no GPU")
        details = tf.config.experimental.get_device_details(gpus[0])
        b.name = details.get("device_name", "GPU")
        major, minor = details.get("compute_capability", (0, 0))
        if dtype == "tf32" and major < 8:
            raise _no_tf32(b.name, major, minor, "tensorflow")
        place = "/GPU:0"
    else:
        from tasks.common.measures.ceiling import cpu_name

        b.name, place = cpu_name(), "/CPU:0"
    # on by default (fp32 must turn it off), and one switch for the process
    b.precision = lambda: tf.config.experimental.enable_tensor_float_32_execution(dtype == "tf32")
    kind = {"fp32": tf.float32, "tf32": tf.float32, "bf16": tf.bfloat16, "fp16": tf.float16}[dtype]
    product = tf.function(tf.linalg.matmul, autograph=False)  # traced at the first call of each shape

    def operands(n: int):
        with tf.device(place):
            gen = tf.random.Generator.from_seed(0)
            return tuple(tf.cast(gen.uniform((n, n)), kind) for _ in range(2))  # (n, n) each

    def matmul(x, y):
        with tf.device(place):
            return product(x, y)

    # reading one element waits for the product; tf.test.experimental.sync_devices fails inside a multiworker job
    b.operands, b.matmul, b.sync = operands, matmul, lambda out: out[:1, :1].numpy()
    return b


def _jax(device: str, dtype: str) -> _Backend:
    import jax
    import jax.numpy as jnp

    platform = {"cpu": "cpu", "cuda": "gpu", "xla": "tpu"}[device]
    try:
        dev = jax.devices(platform)[0]
    except Exception as exc:  # a missing backend raises RuntimeError, or an AssertionError when its plugin is absent
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else f"{type(exc).__name__}; is jax's {platform} plugin installed?"
        raise UserError(f"device {device} requested but jax has no {platform} backend here ({why})") from None
    b = _Backend()
    if device == "cpu":
        from tasks.common.measures.ceiling import cpu_name

        b.name = cpu_name()
    else:
        b.name = dev.device_kind
        if dtype == "tf32" and device == "cuda":
            major, minor = (int(p) for p in str(getattr(dev, "compute_capability", "0.0")).split(".")[:2])
            if major < 8:
                raise _no_tf32(b.name, major, minor, "jax")
        if device == "cuda":
            def free_bytes() -> int | None:
                stats = dev.memory_stats() or {}
                return stats["bytes_limit"] - stats.get("bytes_in_use", 0) if "bytes_limit" in stats else None

            b.free_bytes = free_bytes
    kind = {"fp32": jnp.float32, "tf32": jnp.float32, "bf16": jnp.bfloat16, "fp16": jnp.float16}[dtype]
    # fp32 asks for full precision (jax's default on GPUs and TPUs multiplies fp32 in fewer bits)
    precision = {"fp32": "highest", "tf32": "tensorfloat32"}.get(dtype, "default")
    product = jax.jit(lambda x, y: jnp.matmul(x, y, precision=precision))

    def operands(n: int):
        keys = jax.random.split(jax.random.key(0))
        return tuple(jax.device_put(jax.random.uniform(k, (n, n), dtype=jnp.float32).astype(kind), dev).block_until_ready() for k in keys)

    b.operands, b.matmul, b.sync = operands, product, lambda out: out.block_until_ready()
    return b


BACKENDS = {"torch": _torch, "tensorflow": _tensorflow, "jax": _jax}


class Timer:
    """Times products of one framework, device and dtype in this process; the backend opens at construction."""

    def __init__(self, framework: str, device: str, dtype: str):
        check(framework, device, dtype)
        self.framework, self.device, self.dtype = framework, device, dtype
        t0 = time.perf_counter()
        self.backend = BACKENDS[framework](device, dtype)
        self.device_name = self.backend.name
        self.init_s = self._call(*self.backend.operands(16)) + (time.perf_counter() - t0)  # the runtime's start, not a size's

    def _call(self, a, b) -> float:
        return self._timed(a, b)[0]

    def _timed(self, a, b) -> tuple[float, float]:
        """(wall seconds, this process's CPU seconds over all its threads) of one synchronised product."""
        self.backend.precision()  # this timer's TF32 switch, whatever another timer of this process set since
        t, cpu = time.perf_counter(), time.process_time()
        self.backend.sync(self.backend.matmul(a, b))
        return time.perf_counter() - t, time.process_time() - cpu

    def measure(self, n: int, repeats: int, budget_s: float | None = None) -> dict:
        """One size: the first product (cold) and the median of ``repeats`` more (warm), in s and TFLOP/s;
        with ``budget_s``, the warm products stop once that much time has passed since the first began (one at least)."""
        if n <= 0 or repeats <= 0:
            raise UserError(f"size {n} and repeats {repeats} must be positive")
        a, b = self.backend.operands(n)
        start = time.perf_counter()
        cold = self._call(a, b)
        timed = [self._timed(a, b)]
        while len(timed) < repeats and (budget_s is None or time.perf_counter() - start < budget_s):
            timed.append(self._timed(a, b))
        warm_runs = [wall for wall, _ in timed]
        warm = statistics.median(warm_runs)
        # CPU seconds per wall second while warm: the cores the process got (a host shared with other work
        # gives fewer than it asked for; spinning threads count as busy)
        busy = sum(cpu for _, cpu in timed) / sum(warm_runs)
        return {"framework": self.framework, "device": self.device, "device_name": self.device_name, "dtype": self.dtype, "n": n,
                "repeats": len(timed), "cold_s": cold, "warm_s": warm, "warm_runs_s": warm_runs, "warm_busy_cores": busy,
                "cold_tflops": tflops(n, cold), "warm_tflops": tflops(n, warm)}


def measure(framework: str, device: str, dtype: str, n: int, repeats: int) -> dict:
    """Cold and warm timing of an n x n product in ``framework`` on ``device`` at ``dtype``, in this process:
    {framework, device, device_name, dtype, n, repeats, cold_s, warm_s, warm_runs_s, warm_busy_cores, cold_tflops, warm_tflops, init_s}."""
    timer = Timer(framework, device, dtype)
    return {**timer.measure(n, repeats), "init_s": timer.init_s}


def quick_ceiling(framework: str, device: str, dtype: str, repeats: int = 3, budget_s: float = 2.0) -> dict:
    """A quick warm ceiling for a training run, in its own process (framework already loaded): one size
    (2048 on cpu and XLA's host CPU, 8192 on cuda and other xla devices), up to ``repeats`` warm products while ``budget_s`` lasts (one at
    least). Returns ``measure``'s dictionary; ``repeats`` in it is the number of warm products made."""
    timer = Timer(framework, device, dtype)
    return {**timer.measure(quick_size(device, timer.device_name), repeats, budget_s), "init_s": timer.init_s}
