"""The 3DGAN's trainer in Keras 3: the published four-tape step, a custom loop of GradientTapes under the run's tf.distribute strategy, over the networks of models.calo.keras."""

import numpy as np

from models.calo.keras import build_generator, build_networks, load_weights, variables_of, weights_of
from models.calo.nets import LEARNING_RATE, LOSS_WEIGHTS, POWER, PROFILE_FLOOR, NetConfig, average_decay, initial_weights
from tasks.workloads.calo.workload import CaloData, CaloTrainer

EPSILON = 1e-7  # Keras' fuzz factor: the clip of the probabilities and the floor of the percentage errors' denominators


def weighted_loss(outputs, label, energy, angle, ecal):
    """The published loss of the discriminator's four heads, each (B, 1): 3 BCE(real/fake) + 0.1 MAPE(energy)
    + 25 MAE(angle) + 0.1 MAPE(deposit sum), with nets.LOSS_WEIGHTS (the formulas of torch.py's)."""
    from keras import ops

    p, e, a, s = outputs
    p = ops.clip(p, EPSILON, 1.0 - EPSILON)
    bce = -ops.mean(label * ops.log(p) + (1.0 - label) * ops.log(1.0 - p))
    mape = lambda truth, pred: 100.0 * ops.mean(ops.abs(truth - pred) / ops.maximum(ops.abs(truth), EPSILON))  # noqa: E731
    w = LOSS_WEIGHTS
    return w["real_fake"] * bce + w["energy"] * mape(energy, e) + w["angle"] * ops.mean(ops.abs(angle - a)) + w["ecal_sum"] * mape(ecal, s)


def profile_loss(fake, real, energy):
    """The generator's profile term (nets.py, ``profile``; torch.py's formula) in float64."""
    from keras import ops

    def layers(image):
        return ops.sum(ops.power(ops.maximum(ops.cast(image[..., 0], "float64"), 0.0), 1.0 / POWER), axis=(1, 2))  # (B, nz)

    made, data = layers(fake), ops.stop_gradient(layers(real))
    made_sum = ops.maximum(ops.sum(made, axis=1, keepdims=True), 1e-30)
    data_sum = ops.maximum(ops.sum(data, axis=1, keepdims=True), 1e-30)
    data_share = data / data_sum
    diff = ops.concatenate([made / made_sum - data_share, ops.log(made_sum / data_sum)], axis=1)
    scale = ops.concatenate([ops.maximum(ops.mean(data_share, axis=0), PROFILE_FLOOR), ops.ones((1,), "float64")])
    c = ops.reshape(ops.cast(energy, "float64"), (-1, 1))
    c = c - ops.mean(c)
    level = ops.mean(diff, axis=0)
    slope = ops.mean(c * diff, axis=0) / ops.maximum(ops.sqrt(ops.mean(c * c)), 1e-12)
    return ops.cast(ops.mean((level ** 2 + slope ** 2) / scale ** 2), fake.dtype)


class CaloKeras(CaloTrainer):
    framework = "tensorflow"

    def __init__(self, data: CaloData, spec, batch_size: int, runtime, cfg: NetConfig | None = None):
        import keras
        import tensorflow as tf

        super().__init__(data, spec, batch_size, cfg, runtime.ctx.rank, runtime.ctx.workers)  # this worker's share of each batch
        self.runtime = runtime
        strategy = runtime.ctx.strategy
        replicas = strategy.num_replicas_in_sync
        with strategy.scope():
            self.g, self.d = build_networks(self.cfg, initial_weights(self.cfg, spec.seed))
            self.opt_g = keras.optimizers.RMSprop(LEARNING_RATE, rho=0.9, epsilon=EPSILON)
            self.opt_d = keras.optimizers.RMSprop(LEARNING_RATE, rho=0.9, epsilon=EPSILON)
            self.opt_g.build(self.g.trainable_variables)
            self.opt_d.build(self.d.trainable_variables)
            # the generator's moving average (nets.average_decay), which generates wherever the trainer's showers are scored
            self.g_avg = build_generator(self.cfg) if self.cfg.average else None
            self.averaged = tf.Variable(0, dtype="int64", trainable=False, name="averaged")
        if self.g_avg is not None:
            load_weights(self.g_avg, weights_of(self.g))
        self.speed = {"threads": runtime.threads, "jit_compile": spec.compile == "on"}
        self._dtype = np.dtype(keras.config.floatx())  # float32 (float64 in the tests)
        g, d, opt_g, opt_d = self.g, self.d, self.opt_g, self.opt_d

        def update(tape, loss, net, opt):
            # the gradient of this replica's mean over the replicas: the optimiser sums them, which makes the global batch's mean
            grads = [g / replicas for g in tape.gradient(loss, net.trainable_variables)]
            opt.apply_gradients(zip(grads, net.trainable_variables))

        def replica_step(b):  # this replica's share of the batch
            with tf.GradientTape() as tape:  # (1) D on real images
                loss_real = weighted_loss(d(b["image"], training=True), b["real_label"], b["energy"], b["angle"], b["ecal"])
            update(tape, loss_real, d, opt_d)
            fake = g(b["latent"][0], training=True)  # (B, 51, 51, 25, 1), batch statistics, outside any tape
            with tf.GradientTape() as tape:  # (2) D on generated images
                loss_fake = weighted_loss(d(fake, training=True), b["fake_label"], b["energy"], b["angle"], b["ecal_fit"])
            update(tape, loss_fake, d, opt_d)
            loss_g = []
            for i in (1, 2):  # (3, 4) G twice through the frozen D (inference mode)
                with tf.GradientTape() as tape:
                    fake = g(b["latent"][i], training=True)
                    loss = weighted_loss(d(fake, training=False), tf.ones_like(b["real_label"]), b["energy"], b["angle"], b["ecal_fit"])
                    loss_g.append(loss + self.cfg.profile * profile_loss(fake, b["image"], b["energy"]) if self.cfg.profile else loss)
                update(tape, loss_g[-1], g, opt_g)
            return {"loss_d_real": loss_real, "loss_d_fake": loss_fake, "loss_g_first": loss_g[0], "loss_g_second": loss_g[1],
                    "loss_g": (loss_g[0] + loss_g[1]) / 2}

        live, avg = variables_of(g), variables_of(self.g_avg) if self.g_avg is not None else {}

        def step(b, decay):
            per_replica = strategy.run(replica_step, args=(b,))
            for name, a in avg.items():  # (in the cross-replica context: every replica's copy takes the same values)
                a.assign(live[name] if "moving" in name else decay * a + (1.0 - decay) * live[name])
            if avg:
                self.averaged.assign_add(1)
            return {k: strategy.reduce(tf.distribute.ReduceOp.MEAN, v, axis=None) for k, v in per_replica.items()}

        self._step = tf.function(step, jit_compile=spec.compile == "on", autograph=False)
        self._generate = tf.function(lambda z: self.generator(z, training=False), reduce_retracing=True, autograph=False)
        self._probe = None  # set_statistics' copy of the generator, outside the strategy, and its batch norms' inputs

    @property
    def generator(self):
        """The generator that generates: the moving average where there is one."""
        return self.g if self.g_avg is None else self.g_avg

    def _device(self, batch: dict[str, np.ndarray]):
        """This worker's batch in the network's float type, split over its replicas (the latent as three (b, latent) arrays: batch first)."""
        batch = {k: v.astype(self._dtype, copy=False) for k, v in batch.items()}
        return self.runtime.distribute(batch | {"latent": tuple(batch["latent"])})

    def step(self, batch, flags: list[float], progress: float):
        rate = self.rate_at(progress)
        self.opt_g.learning_rate, self.opt_d.learning_rate = rate, rate  # the optimisers' rate variables, assigned outside the traced step
        decay = np.asarray(average_decay(self.cfg, int(self.averaged.numpy())) if self.g_avg is not None else 0.0, self._dtype)
        losses = {k: float(v) for k, v in self._step(batch, decay).items()}  # reading the losses waits for the step
        self.calibrated = False
        return losses, self.runtime.agree(flags)

    def set_statistics(self, latents: list[np.ndarray]) -> None:
        """The averaged generator's moving statistics: the mean over the calibration batches of each batch norm's
        input moments (float64, biased variance, as the layer takes them), from forward passes in training mode of a
        copy of the average outside the strategy, whose own statistics the passes move, not the average's."""
        import keras
        import tensorflow as tf

        if self._probe is None:
            copy = build_generator(self.cfg)
            norms = [layer for layer in copy.layers if layer.name.endswith("_bn")]
            inputs = keras.Model(copy.inputs, [layer.input for layer in norms])  # each batch norm's input
            self._probe = copy, tf.function(lambda z: inputs(z, training=True), autograph=False), [layer.name for layer in norms]
        copy, probe, names = self._probe
        load_weights(copy, weights_of(self.g_avg))
        sums = {name: [0.0, 0.0] for name in names}
        for latent in latents:
            for name, x in zip(names, probe(latent.astype(self._dtype, copy=False))):
                x = np.asarray(x, np.float64)
                sums[name][0] = sums[name][0] + x.mean(axis=(0, 1, 2, 3))
                sums[name][1] = sums[name][1] + x.var(axis=(0, 1, 2, 3))
        variables = variables_of(self.g_avg)
        for name, (mean, var) in sums.items():
            variables[f"{name}/moving_mean"].assign((mean / len(latents)).astype(self._dtype))
            variables[f"{name}/moving_variance"].assign((var / len(latents)).astype(self._dtype))

    def generate_images(self, latent: np.ndarray) -> np.ndarray:
        return self._generate(latent.astype(self._dtype, copy=False)).numpy()

    def weights(self) -> dict[str, dict[str, np.ndarray]]:
        return {"generator": weights_of(self.generator), "discriminator": weights_of(self.d)}

    def _all(self) -> list:
        averaged = self.g_avg.weights + [self.averaged] if self.g_avg is not None else []
        return self.g.weights + self.d.weights + self.opt_g.variables + self.opt_d.variables + averaged

    def state(self) -> dict:
        return {f"{i:04d}": np.asarray(v.numpy()) for i, v in enumerate(self._all())}

    def load_state(self, state: dict) -> None:
        for key, v in zip(sorted(state), self._all()):
            v.assign(state[key])
        self.calibrated = False


def build(data: CaloData, spec, batch_size: int, runtime) -> CaloKeras:
    return CaloKeras(data, spec, batch_size, runtime)
