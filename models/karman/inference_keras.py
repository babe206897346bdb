"""The map step of models.karman.inference for a Keras generator: groups of NCHW tiles through the NHWC network over W workers.

``cpu``: W threads share the network, each running its groups while the others run theirs
(TensorFlow releases the GIL inside a call; its intra-op pool is sized to cores / W by the caller).
``cuda``: one replica of the network per GPU, one thread each. Group ``i`` goes to worker ``i mod W``.
"""

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import tensorflow as tf
import keras

from models.host import cpu_cores
from models.karman.inference import map_over_workers


class KerasRunner:
    """Groups of tiles over W workers for a Keras generator (see the module text)."""

    whole_rounds = False

    def __init__(self, model: keras.Model, kind: str, workers: int):
        if kind == "cpu":
            if workers > cpu_cores():
                raise ValueError(f"{workers} workers requested but this host has {cpu_cores()} CPU cores; use at most {cpu_cores()}")
            devices = ["/cpu:0"] * workers
            replicas = [model] * workers
        elif kind == "cuda":
            gpus = tf.config.list_logical_devices("GPU")
            if workers > len(gpus):
                raise ValueError(f"{workers} workers requested but TensorFlow sees {len(gpus)} GPUs; use at most {len(gpus)}")
            devices, replicas = [f"/gpu:{i}" for i in range(workers)], []
            for device in devices:
                with tf.device(device):
                    clone = keras.models.clone_model(model)
                    clone.set_weights(model.get_weights())
                replicas.append(clone)
        else:
            raise ValueError(f"tensorflow rollouts run on cpu or cuda, not {kind!r}")
        self.workers, self.devices = workers, devices
        self._calls = [tf.function(lambda x, m=m: m(x, training=False), reduce_retracing=True, autograph=False) for m in replicas]
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="map-worker")

    def run(self, groups: np.ndarray) -> tuple[np.ndarray, float]:
        """Groups (G, g, C, h, w) -> outputs (G, g, Cout, h, w) and the mean transfer seconds per worker
        (the layout change and the copy to and from the device)."""

        def one(w: int, group: np.ndarray) -> tuple[np.ndarray, float]:
            with tf.device(self.devices[w]):
                t0 = time.perf_counter()
                x = tf.constant(np.ascontiguousarray(group.transpose(0, 2, 3, 1)))  # (g, h, w, C)
                t1 = time.perf_counter()
                y = self._calls[w](x).numpy()  # (g, h, w, Cout); .numpy() waits for the device
                t2 = time.perf_counter()
            return y.transpose(0, 3, 1, 2), (t1 - t0) + (time.perf_counter() - t2)  # (g, Cout, h, w)

        return map_over_workers(self._pool, self.workers, groups, one)

    def close(self) -> None:
        self._pool.shutdown()
