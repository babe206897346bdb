"""TensorFlow (Keras 3) as the training loop's runtime: a tf.distribute strategy, the collective that agrees, seeding, npz checkpoints, memory."""

import os

from models.host import host_peak_memory_mb
from tasks.common.process.lifetime import request_stop_on_signals
from tasks.common.config.frameworks import FRAMEWORKS
from tasks.common.runtimes.npz import NpzRuntime



class KerasRuntime(NpzRuntime):
    """TensorFlow under one strategy: default, mirrored, multiworker (one process per device) or tpu."""

    framework = "tensorflow"
    checkpoint = FRAMEWORKS["tensorflow"].checkpoint

    def __init__(self, device: str, strategy: str, world: int, threads: int | None = None):
        import tensorflow as tf

        from models.device_keras import resolve_strategy

        self.version = tf.__version__
        self.ctx = resolve_strategy(device, strategy, world, threads)
        self.threads = (tf.config.threading.get_intra_op_parallelism_threads() or os.cpu_count()) if device == "cpu" else None
        # MultiWorkerMirroredStrategy installs a SIGTERM handler of its own (its preemption watch), which would
        # swallow the stop request: the job's handlers are installed again over it.
        request_stop_on_signals()
        replicas = self.ctx.strategy.num_replicas_in_sync

        def mean(values):
            per_replica = self.ctx.strategy.run(lambda v: v / replicas, args=(values,))
            return self.ctx.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

        self._mean = tf.function(mean, autograph=False)

    @property
    def strategy(self) -> str:
        return self.ctx.name

    def agree(self, values: list[float]) -> list[float]:
        """The mean over every replica of values each process contributes (a collective: every process calls it)."""
        import tensorflow as tf

        return [float(x) for x in self._mean(tf.constant(values, tf.float32)).numpy()]

    def distribute(self, batch):
        """This worker's share of a global batch (a nest of arrays, batch first) cut into its replicas'
        equal shares, as per-replica values for ``strategy.run``; the batch itself on one replica."""
        import tensorflow as tf

        strategy, local = self.ctx.strategy, self.ctx.local_replicas
        if strategy.num_replicas_in_sync == 1:
            return batch

        def share(context):
            i = context.replica_id_in_sync_group % local  # this worker's replicas take its share in turn
            return tf.nest.map_structure(lambda a: a[i * (len(a) // local): (i + 1) * (len(a) // local)], batch)

        return strategy.experimental_distribute_values_from_function(share)

    def epoch_metrics(self, first: bool) -> dict[str, float]:
        from models.device_keras import peak_memory_mb

        return {"peak_memory_mb": peak_memory_mb(self.ctx) or host_peak_memory_mb()}

    def close(self) -> None:
        pass


def open_runtime(plan) -> KerasRuntime:
    """The plan's strategy over its world (this worker's share of it under multiworker)."""
    return KerasRuntime(plan.spec.device, plan.strategy, plan.world, plan.threads)
