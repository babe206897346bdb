"""One prediction step of a frame-to-frame network, full-frame or map-reduce over W workers.

A worker is one compute unit: a CPU core (a thread with one intra-op thread), a GPU (a thread with
its own replica of the network), or a TPU core (one slot of a sharded batch under XLA SPMD). The
step splits the frame into tiles (``models.karman.tiling``), packs them into fixed-shape groups, maps the
groups over the workers, and merges the outputs with blended overlaps. Full-frame is the same step
with one tile, the whole frame, on one worker.

The network runs in eval mode (dropout off, batch-norm running statistics), so a tile's output
does not depend on which tiles share its batch.
"""

from __future__ import annotations

import copy
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from models.host import cpu_cores
from models.karman.tiling import TilePlan, TilingError, pack_groups, unpack_groups

if TYPE_CHECKING:  # torch is imported where a torch runner is made: a TensorFlow rollout uses the Predictor without it
    import torch

    from models.device import DeviceContext


@dataclass
class StepTimes:
    """Seconds of one prediction step by phase; ``transfer`` is host<->device copying."""

    split: float = 0.0
    transfer: float = 0.0
    compute: float = 0.0
    merge: float = 0.0

    @property
    def total(self) -> float:
        return self.split + self.transfer + self.compute + self.merge

    def __add__(self, other: "StepTimes") -> "StepTimes":
        return StepTimes(self.split + other.split, self.transfer + other.transfer, self.compute + other.compute, self.merge + other.merge)


def map_over_workers(pool: ThreadPoolExecutor, workers: int, groups: np.ndarray, one) -> tuple[np.ndarray, float]:
    """Group ``i`` to worker ``i mod W`` on ``pool``'s threads: ``one(w, group)`` -> (its output, the
    seconds it spent copying); the outputs stacked in order and the mean copying seconds per worker."""

    def work(w: int) -> tuple[dict[int, np.ndarray], float]:
        outs, transfer = {}, 0.0
        for i in range(w, len(groups), workers):
            outs[i], seconds = one(w, groups[i])
            transfer += seconds
        return outs, transfer

    results = list(pool.map(work, range(workers)))
    merged = {i: out for outs, _ in results for i, out in outs.items()}
    return np.stack([merged[i] for i in range(len(groups))]), float(np.mean([t for _, t in results]))


class ThreadRunner:
    """Groups mapped over W threads, each driving one device: ``cpu`` W cores with one intra-op thread
    each (the network is shared, read-only), ``cuda`` W GPUs with one replica each. Group ``i`` goes
    to worker ``i mod W``."""

    whole_rounds = False  # groups need not fill every worker

    def __init__(self, model: torch.nn.Module, kind: str, workers: int):
        import torch

        if kind == "cpu":
            if workers > cpu_cores():
                raise ValueError(f"{workers} workers requested but this host has {cpu_cores()} CPU cores; use at most {cpu_cores()}")
            self._threads_before = torch.get_num_threads()
            torch.set_num_threads(1)  # one core per worker: the workers are the parallelism (restored by close)
            self.replicas = [(model.cpu().eval(), torch.device("cpu"))] * workers
            self.sync = lambda device: None
        elif kind == "cuda":
            count = torch.cuda.device_count()
            if workers > count:
                raise ValueError(f"{workers} workers requested but {count} CUDA GPUs are visible; use at most {count}")
            self.replicas = [(copy.deepcopy(model).to(torch.device("cuda", i)).eval(), torch.device("cuda", i)) for i in range(workers)]
            self.sync = torch.cuda.synchronize
        else:
            raise ValueError(f"unknown thread-runner device {kind!r}; choose cpu or cuda")
        self.workers = workers
        self._threads_before = getattr(self, "_threads_before", None)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="map-worker")

    def run(self, groups: np.ndarray) -> tuple[np.ndarray, float]:
        """Groups (G, g, C, h, w) -> outputs (G, g, Cout, h, w) and the mean transfer seconds per worker."""
        import torch

        def one(w: int, group: np.ndarray) -> tuple[np.ndarray, float]:
            model, device = self.replicas[w]
            with torch.no_grad():
                t0 = time.perf_counter()
                x = torch.from_numpy(group).to(device)  # (g, C, h, w)
                self.sync(device)
                t1 = time.perf_counter()
                y = model(x)
                self.sync(device)
                t2 = time.perf_counter()
                out = y.float().cpu().numpy()  # (g, Cout, h, w)
            return out, (t1 - t0) + (time.perf_counter() - t2)

        return map_over_workers(self._pool, self.workers, groups, one)

    def close(self) -> None:
        self._pool.shutdown()
        if self._threads_before:
            import torch

            torch.set_num_threads(self._threads_before)


class MeshRunner:
    """Groups mapped over the devices of one XLA process: each round stacks W groups into one batch
    sharded along the device mesh (SPMD), so device ``d`` computes group ``d`` of the round. The
    batch shape is the same every round, so the graph compiles once."""

    whole_rounds = True  # each round fills every device of the mesh

    def __init__(self, model: torch.nn.Module, ctx: DeviceContext, workers: int):
        if workers not in (1, ctx.world_size) or (workers > 1 and ctx.strategy != "spmd"):
            raise ValueError(f"{workers} workers requested on {ctx.description}; XLA map-reduce shards over all "
                             f"{ctx.world_size} devices, so use 1 or {ctx.world_size}")
        self.model, self.ctx, self.workers = model.to(ctx.device).eval(), ctx, workers

    def run(self, groups: np.ndarray) -> tuple[np.ndarray, float]:
        import torch

        if len(groups) % self.workers:
            raise ValueError(f"{len(groups)} groups do not fill rounds of {self.workers} devices")
        outs, transfer = [], 0.0
        with torch.no_grad():
            for r in range(0, len(groups), self.workers):
                batch = groups[r : r + self.workers]
                t0 = time.perf_counter()
                x = self.ctx.shard(torch.from_numpy(batch.reshape((-1,) + batch.shape[2:])).to(self.ctx.device))  # (W*g, C, h, w)
                t1 = time.perf_counter()
                y = self.model(x)
                self.ctx.sync()
                t2 = time.perf_counter()
                out = y.float().cpu().numpy()  # (W*g, Cout, h, w)
                transfer += (t1 - t0) + (time.perf_counter() - t2)
                outs.append(out.reshape(batch.shape[:2] + out.shape[1:]))
        return np.concatenate(outs), transfer

    def close(self) -> None:
        pass


class Predictor:
    """frame (C, H, W) -> next frame (Cout, H, W), both in network units, by tiles over workers.

    ``group`` tiles make one batch; None = ceil(tiles / workers), one group per worker and frame.
    """

    def __init__(self, plan: TilePlan, runner, group: int | None = None):
        self.plan, self.runner = plan, runner
        workers = runner.workers
        self.group = group or math.ceil(plan.count / workers)
        if self.group <= 0:
            raise TilingError(f"group size {self.group} must be at least 1 tile")
        groups = math.ceil(plan.count / self.group)
        self.rounds = math.ceil(groups / workers)
        # Mesh runners need whole rounds; padding tiles are zeros and are dropped after the map.
        self.padded_tiles = self.rounds * workers * self.group if runner.whole_rounds else groups * self.group
        self._weights = plan.weights().astype(np.float32)

    def __call__(self, frame: np.ndarray) -> tuple[np.ndarray, StepTimes]:
        t0 = time.perf_counter()
        tiles = self.plan.split(frame)  # (N, C, th, tw)
        if self.padded_tiles > len(tiles):
            tiles = np.concatenate([tiles, np.zeros((self.padded_tiles - len(tiles),) + tiles.shape[1:], tiles.dtype)])
        groups, _ = pack_groups(tiles, self.group)  # (G, g, C, th, tw)
        t1 = time.perf_counter()
        outs, transfer = self.runner.run(groups)  # (G, g, Cout, th, tw)
        t2 = time.perf_counter()
        merged = self.plan.merge(unpack_groups(outs, self.plan.count), self._weights)  # (Cout, H, W)
        t3 = time.perf_counter()
        return merged, StepTimes(split=t1 - t0, transfer=transfer, compute=max(t2 - t1 - transfer, 0.0), merge=t3 - t2)

    def close(self) -> None:
        self.runner.close()

    def __enter__(self) -> "Predictor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def make_runner(model: torch.nn.Module, ctx: DeviceContext, workers: int):
    """The runner for ``ctx``'s device kind: threads for cpu and cuda, a sharded mesh for xla."""
    if workers < 1:
        raise ValueError(f"workers {workers} must be at least 1")
    if ctx.kind == "xla":
        return MeshRunner(model, ctx, workers)
    return ThreadRunner(model, ctx.kind, workers)
