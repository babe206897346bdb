"""The map step of models.karman.inference for a JAX generator (models.karman.nets.pix2pix_jax): groups of NCHW tiles over W workers.

``cpu``: W threads share the one CPU device's weights, each running its groups while the others run theirs
(a jitted call releases the GIL while XLA computes). ``cuda``: the weights on each of W GPUs, one thread each.
Group ``i`` goes to worker ``i mod W``.
"""

import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import jax
import numpy as np

from models.host import cpu_cores
from models.karman.inference import map_over_workers
from models.karman.nets import pix2pix_jax as nets
from models.karman.nets.config import NetConfig

PLATFORMS = {"cpu": "cpu", "cuda": "gpu"}


class JaxRunner:
    """Groups of tiles over W workers for a JAX generator's weights (see the module text)."""

    whole_rounds = False

    def __init__(self, cfg: NetConfig, params: dict, stats: dict, kind: str, workers: int):
        if kind not in PLATFORMS:
            raise ValueError(f"jax rollouts run on cpu or cuda, not {kind!r}")
        if kind == "cpu":
            if workers > cpu_cores():
                raise ValueError(f"{workers} workers requested but this host has {cpu_cores()} CPU cores; use at most {cpu_cores()}")
            devices = jax.devices("cpu")[:1] * workers
        else:
            devices = jax.devices("gpu")
            if workers > len(devices):
                raise ValueError(f"{workers} workers requested but jax sees {len(devices)} GPUs; use at most {len(devices)}")
            devices = devices[:workers]
        self.workers, self.devices = workers, devices
        placed = {}
        for device in dict.fromkeys(devices):
            placed[device] = jax.device_put((params, stats), device)
        self._weights = [placed[d] for d in devices]
        self._call = jax.jit(partial(nets.infer, cfg))
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="map-worker")

    def run(self, groups: np.ndarray) -> tuple[np.ndarray, float]:
        """Groups (G, g, C, h, w) -> outputs (G, g, Cout, h, w) and the mean transfer seconds per worker."""

        def one(w: int, group: np.ndarray) -> tuple[np.ndarray, float]:
            t0 = time.perf_counter()
            x = jax.device_put(np.ascontiguousarray(group, np.float32), self.devices[w])  # (g, C, h, w)
            t1 = time.perf_counter()
            y = self._call(*self._weights[w], x).block_until_ready()
            t2 = time.perf_counter()
            out = np.asarray(y)  # (g, Cout, h, w)
            return out, (t1 - t0) + (time.perf_counter() - t2)

        return map_over_workers(self._pool, self.workers, groups, one)

    def close(self) -> None:
        self._pool.shutdown()
