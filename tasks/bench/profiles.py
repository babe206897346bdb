"""Where a training block's time goes, by the framework's own profiler: the ops with the most self time, in ms per step (bench-frameworks --profile).

One profiler per framework, each reading what its framework records: torch.profiler's operator table (self CPU
time); for TensorFlow and JAX the XPlane trace their profilers write (TensorFlow's ops, XLA's thunks: fusions,
dots, the loop of a scan), each event's self time being its duration less that of the events nested in it on
the same thread. Run in the framework's own child process, after the timed blocks.
"""

import re
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Callable, Iterable

TOP = 8  # ops reported per side
WAITS = ("ThunkExecutor::Execute (wait for completion)",)  # a client thread waiting on the compute threads: not work


def self_times(lines: Iterable[list[tuple[str, int, int]]]) -> dict[str, tuple[float, int]]:
    """Per event name, (self time in the events' unit, count), over threads' event lists of (name, start, duration):
    on one thread an event nested in another (starting within it) is subtracted from its parent's time."""
    totals: dict[str, list] = defaultdict(lambda: [0, 0])
    for events in lines:
        stack: list[list] = []  # [name, end, self]
        for name, start, duration in sorted(events, key=lambda e: (e[1], -e[2])):
            while stack and start >= stack[-1][1]:
                done = stack.pop()
                totals[done[0]][0] += done[2]
            if stack:
                stack[-1][2] -= min(duration, stack[-1][1] - start)
            stack.append([name, start + duration, duration])
        for done in stack:
            totals[done[0]][0] += done[2]
        for name, _, _ in events:
            totals[name][1] += 1
    return {name: (float(t), c) for name, (t, c) in totals.items()}


def _xla_family(name: str) -> str:
    """An XLA thunk's kind: its name less the instruction's number ('ynn_fusion.11' -> 'ynn_fusion', 'while.18' -> 'while')."""
    return re.sub(r"\.\d+$", "", name)


def _tf_family(name: str) -> str:
    """A TensorFlow op's node and kernel less the path of layers and loops above it and the copies' numbers
    ('.../while/lstm_cell_1/MatMul_1_grad/MatMul_1:_MklMatMul' -> 'MatMul:_MklMatMul')."""
    return re.sub(r"_\d+", "", name.rsplit("/", 1)[-1])


def _top(times: dict[str, tuple[float, int]], to_ms: float, steps: int, family: Callable[[str], str] = str) -> dict:
    """The TOP op families by self time, in ms per step and as a share of every op's self time."""
    work: dict[str, list] = defaultdict(lambda: [0.0, 0])
    for name, (t, c) in times.items():
        if name not in WAITS and not name.startswith("$"):  # '$...': JAX's Python tracer
            work[family(name)][0] += t
            work[family(name)][1] += c
    total = sum(t for t, _ in work.values()) or 1.0
    ranked = sorted(work.items(), key=lambda kv: -kv[1][0])[:TOP]
    return {"busy_ms_per_step": total * to_ms / steps,
            "ops": [{"op": name, "ms_per_step": round(t * to_ms / steps, 4), "share": round(t / total, 4), "calls_per_step": round(c / steps, 2)}
                    for name, (t, c) in ranked]}


def _torch(block: Callable[[], float], steps: int) -> dict:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        block()
    times = {e.key: (e.self_cpu_time_total, e.count) for e in prof.key_averages()}  # microseconds
    return _top(times, 1e-3, steps)


def _xplane_lines(path: Path, xplane_pb2) -> list[list[tuple[str, int, int]]]:
    space = xplane_pb2.XSpace()
    space.ParseFromString(path.read_bytes())
    lines = []
    for plane in space.planes:
        names = {k: v.name for k, v in plane.event_metadata.items()}
        for line in plane.lines:
            lines.append([(names.get(e.metadata_id, "?"), e.offset_ps, e.duration_ps) for e in line.events])
    return lines


def _tensorflow(block: Callable[[], float], steps: int) -> dict:
    import tensorflow as tf
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    with tempfile.TemporaryDirectory() as folder:
        tf.profiler.experimental.start(folder)
        try:
            block()
        finally:
            tf.profiler.experimental.stop()
        lines = [line for path in Path(folder).rglob("*.xplane.pb") for line in _xplane_lines(path, xplane_pb2)]
    return _top(self_times(lines), 1e-9, steps, _tf_family)  # picoseconds


def _jax(block: Callable[[], float], steps: int) -> dict:
    import jax
    from jax.profiler import ProfileData

    with tempfile.TemporaryDirectory() as folder:
        with jax.profiler.trace(folder):
            block()
        lines = []
        for path in Path(folder).rglob("*.xplane.pb"):
            for plane in ProfileData.from_file(str(path)).planes:
                lines += [[(e.name, e.start_ns, e.duration_ns) for e in line.events] for line in plane.lines]
    return _top(self_times(lines), 1e-6, steps, _xla_family)  # nanoseconds


PROFILERS: dict[str, Callable[[Callable[[], float], int], dict]] = {"torch": _torch, "tensorflow": _tensorflow, "jax": _jax}


def profile_block(framework: str, block: Callable[[], float], steps: int) -> dict:
    """``block`` (``steps`` optimiser steps) run once under ``framework``'s profiler: its busiest ops."""
    return PROFILERS[framework](block, steps)
