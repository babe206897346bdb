"""The toy test workload in TensorFlow (Keras 3 under the runtime's strategy): the same MLP, batches, step, state and evaluation for the training loop."""

import numpy as np

from tasks.common.runtimes.data import epoch_order
from tests.workloads.toy.workload import TARGET_ACCURACY, ToyData, flops_per_sample


class ToyKeras:
    def __init__(self, data: ToyData, spec, batch_size: int, runtime):
        import keras
        import tensorflow as tf

        self.data, self.spec, self.batch_size, self.runtime = data, spec, batch_size, runtime
        keras.utils.set_random_seed(spec.seed)  # the same initial weights in every worker
        strategy = runtime.ctx.strategy
        with strategy.scope():
            self.net = keras.Sequential([keras.Input((2,)), keras.layers.Dense(spec.options.hidden, activation="tanh"), keras.layers.Dense(2)])
            self.opt = keras.optimizers.SGD(0.2)
            self.opt.build(self.net.trainable_variables)
        self.samples = len(data.y["train"])
        self.has_validation = True
        self.headline = {"accuracy": "accuracy"}
        self.flops_per_sample = flops_per_sample(spec.options.hidden)
        self.params = {"hidden_units": spec.options.hidden, "parameters": int(sum(np.prod(v.shape) for v in self.net.trainable_variables))}
        self.speed = {}
        replicas = strategy.num_replicas_in_sync

        def replica_step(x, y):
            with tf.GradientTape() as tape:
                per_sample = keras.losses.sparse_categorical_crossentropy(y, self.net(x, training=True), from_logits=True)
                loss = tf.reduce_sum(per_sample) / batch_size  # the replicas' sum is the global batch's mean
            self.opt.apply_gradients(zip(tape.gradient(loss, self.net.trainable_variables), self.net.trainable_variables))
            return loss

        def step(x, y):
            return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(replica_step, args=(x, y)), axis=None)

        self._step = tf.function(step, autograph=False)
        self._replicas = replicas

    def batches(self, epoch: int, steps: int):
        ctx, b = self.runtime.ctx, self.batch_size
        local = b // ctx.workers
        order = epoch_order(self.samples, self.spec.seed, epoch)
        for s in range(steps):
            take = order[s * b: (s + 1) * b][ctx.rank * local: (ctx.rank + 1) * local]
            yield self.data.x["train"][take], self.data.y["train"][take]  # (b, 2), (b,)

    def step(self, batch, flags: list[float], progress: float):
        loss = float(self._step(*batch))
        return {"loss_ce": loss}, self.runtime.agree(flags)  # the flags in a collective of their own

    def learning_rate(self) -> float:
        return float(self.opt.learning_rate.numpy())

    def epoch_metrics(self) -> dict:
        return {}

    def state(self) -> dict:
        return {f"{i:04d}": np.asarray(v.numpy()) for i, v in enumerate(self.net.weights + self.opt.variables)}

    def load_state(self, state: dict) -> None:
        for key, v in zip(sorted(state), self.net.weights + self.opt.variables):
            v.assign(state[key])

    def evaluate(self) -> dict[str, float]:
        predicted = np.argmax(self.net(self.data.x["val"], training=False).numpy(), axis=1)
        return {"accuracy": float(np.mean(predicted == self.data.y["val"]))}

    def reached(self, scores: dict[str, float]) -> bool:
        return scores["accuracy"] >= TARGET_ACCURACY

    def finish(self, run_dir, run, settings) -> None:
        (run_dir / "model").mkdir(exist_ok=True)
        self.net.save(run_dir / "model" / "mlp.keras")
        run.log_artifact(run_dir / "model", "model")


def build(data: ToyData, spec, batch_size: int, runtime) -> ToyKeras:
    return ToyKeras(data, spec, batch_size, runtime)
