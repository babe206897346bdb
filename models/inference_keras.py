"""The map step of models.inference for a Keras generator: groups of NCHW tiles through the NHWC network over W workers.

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


class KerasRunner:
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
        self._calls = [tf.function(lambda x, m=m: m(x, training=False), reduce_retracing=True) for m in replicas]
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="map-worker")

    def run(self, groups: np.ndarray) -> tuple[np.ndarray, float]:
        """Groups (G, g, C, h, w) -> outputs (G, g, Cout, h, w) and the mean transfer seconds per worker
        (the layout change and the copy to and from the device)."""

        def work(w: int) -> tuple[dict[int, np.ndarray], float]:
            outs, transfer = {}, 0.0
            with tf.device(self.devices[w]):
                for i in range(w, len(groups), self.workers):
                    t0 = time.perf_counter()
                    x = tf.constant(np.ascontiguousarray(groups[i].transpose(0, 2, 3, 1)))  # (g, h, w, C)
                    t1 = time.perf_counter()
                    y = self._calls[w](x).numpy()  # (g, h, w, Cout); .numpy() waits for the device
                    t2 = time.perf_counter()
                    outs[i] = y.transpose(0, 3, 1, 2)  # (g, Cout, h, w)
                    transfer += (t1 - t0) + (time.perf_counter() - t2)
            return outs, transfer

        results = list(self._pool.map(work, range(self.workers)))
        merged = {i: out for outs, _ in results for i, out in outs.items()}
        return np.stack([merged[i] for i in range(len(groups))]), float(np.mean([t for _, t in results]))

    def close(self) -> None:
        self._pool.shutdown()
