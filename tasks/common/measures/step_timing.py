"""Training steps timed side by side, whatever the workload; imports no Prefect or MLflow.

Blocks of steps that alternate between the sides, a step served from a process of its own, and the device's known
peak: a workload's bench-train part times its steps with these."""

import json
import time
from pathlib import Path


def alternate(sides: dict, repeats: int, steps: int) -> dict[str, list[float]]:
    """Seconds of ``repeats`` blocks of ``steps`` steps per side, the sides taking turns block by block
    (so that drifts of the machine hit all alike)."""
    times = {key: [] for key in sides}
    for _ in range(repeats):
        for key, run in sides.items():
            times[key].append(run(steps))
    return times


def timed_steps(ctx, n: int, step) -> float:
    """Seconds for n calls of ``step``, each ending the device's step, the device synchronised at both ends."""
    ctx.sync()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
        ctx.step_end()
    ctx.sync()
    return time.perf_counter() - t0


def serve_steps(run, info: dict) -> None:
    """The step server's loop: answer "ready" with ``info`` (JSON), then for each line holding a step
    count run that many steps and answer the seconds taken."""
    import sys

    print("ready " + json.dumps(info), flush=True)
    for line in sys.stdin:
        print(repr(run(int(line))), flush=True)


class StepProcess:
    """A training step in a separate process (``server``: 'module:function' reading the config line,
    e.g. a plain step with default settings, its C heap untouched by ``keep_freed_memory``, or a
    step in another framework), driven block by block from the benchmark process; ``info`` is what it said when ready."""

    def __init__(self, server: str, config: dict, env: dict | None = None, what: str = "plain-step"):
        import os
        import subprocess
        import sys

        module, function = server.split(":")
        self.what = what
        self.proc = subprocess.Popen(
            [sys.executable, "-c", f"from {module} import {function}; {function}()"], env={**os.environ, **(env or {})},
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[3])
        self._send(json.dumps(config))
        ready = self._answer()
        if not ready.startswith("ready"):
            raise RuntimeError(f"the {what} process did not start")
        self.info = json.loads(ready[len("ready"):].strip() or "{}")

    def _send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def _answer(self) -> str:
        line = self.proc.stdout.readline().strip()
        if not line:
            raise RuntimeError(f"the {self.what} process exited with status {self.proc.wait()}")
        return line

    def run(self, n: int) -> float:
        self._send(str(n))
        return float(self._answer())

    def close(self) -> None:
        self.proc.stdin.close()
        if self.proc.wait(timeout=60) != 0:
            raise RuntimeError(f"the {self.what} process exited with status {self.proc.returncode}")


def known_peak(ctx, precision: str) -> float | None:
    """The GPU's datasheet bf16 peak (tasks.common.measures.ceiling's table), for bf16 runs on cuda."""
    if ctx.kind != "cuda" or precision != "bf16":
        return None
    import torch

    from tasks.common.measures.ceiling import peak_tflops

    peak = peak_tflops("cuda", torch.cuda.get_device_name(ctx.device), "bf16")
    return peak[0] if peak else None
