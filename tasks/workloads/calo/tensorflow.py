"""The 3DGAN in Keras 3 (channels last): the generator and discriminator layer by layer as models/calo/nets.py describes them (weights in its one layout), and the trainer of the published four-tape step, a custom loop of GradientTapes under the run's tf.distribute strategy."""

import math

import numpy as np

from models.calo.nets import (BN_EPSILON, BN_MOMENTUM, LEAKY_SLOPE, LEARNING_RATE, LOSS_WEIGHTS, POWER, PROFILE_FLOOR, average_decay,
                              NetConfig, discriminator_convs, generator_convs, initial_weights, seed_channels)
from tasks.workloads.calo.workload import CaloData, CaloTrainer

EPSILON = 1e-7  # Keras' fuzz factor: the clip of the probabilities and the floor of the percentage errors' denominators


def _pad_layer(layers, conv):
    return layers.ZeroPadding3D(conv.pad, name=f"{conv.name}_pad")


def _batch_norm(name: str):
    """Keras' BatchNormalization (nets.py's epsilon and momentum) with the batch's moments taken in float64, as
    torch accumulates them on the CPU: in float32 they lose about 1e-4 of the normalised activations where a
    channel's spread is small beside its values, and the two frameworks' steps would part."""
    import keras
    from keras import ops

    class BatchNorm64(keras.layers.BatchNormalization):
        def _moments(self, inputs, mask):
            if mask is not None:
                return super()._moments(inputs, mask)
            mean, variance = ops.moments(ops.cast(inputs, "float64"), axes=self._reduction_axes, synchronized=self.synchronized)
            return ops.cast(mean, inputs.dtype), ops.cast(variance, inputs.dtype)

    return BatchNorm64(epsilon=BN_EPSILON, momentum=BN_MOMENTUM, name=name)


def build_generator(cfg: NetConfig):
    """Latent (B, latent) -> images (B, 51, 51, 25, 1)."""
    import keras

    layers = keras.layers
    z = keras.Input((cfg.latent,), name="latent")
    x = layers.Dense(int(np.prod(cfg.seed_grid)) * seed_channels(cfg), name="dense")(z)
    x = layers.Reshape((*cfg.seed_grid, seed_channels(cfg)))(x)  # (B, 9, 9, 8, c0)
    x = layers.UpSampling3D(cfg.upsample)(x)  # (B, 54, 54, 48, c0)
    for c in generator_convs(cfg):
        if any(p for axis in c.pad for p in axis):
            x = _pad_layer(layers, c)(x)
        x = layers.Conv3D(c.cout, c.kernel, activation="relu", name=c.name)(x)
        if c.bn:
            x = _batch_norm(f"{c.name}_bn")(x)
    if cfg.energy_scaled:  # deposits^POWER of a 100 GeV shower, scaled to the primary's energy (E / 100 GeV, the first input)
        x = x * keras.ops.power(keras.ops.maximum(z[:, :1], 0.0), POWER)[:, None, None, None, :]
    return keras.Model(z, x, name="generator")


def ecal_sum(image):
    """(B, 51, 51, 25) -> (B, 1): the deposits' sum."""
    from keras import ops

    return ops.expand_dims(ops.sum(image, axis=(1, 2, 3)), 1)


def barycentre_angle(image, cell: tuple[float, float, float] = (1.0, 1.0, 1.0)):
    """(B, 51, 51, 25) -> (B, 1) radians: physics.barycentre_angle, the published angle head (cells of ``cell`` extent)."""
    from keras import ops

    nx, ny, nz = image.shape[1:]
    xs, ys, zs = ((ops.arange(n, dtype=image.dtype) + 0.5) * c for n, c in zip((nx, ny, nz), cell))
    total = ops.sum(image, axis=(1, 2, 3))
    empty = ops.equal(total, 0.0)
    safe = ops.where(empty, ops.ones_like(total), total)
    x_ref = ops.where(empty, ops.ones_like(total), ops.matmul(ops.sum(image, axis=(2, 3)), xs) / safe)[:, None]
    y_ref = ops.where(empty, ops.ones_like(total), ops.matmul(ops.sum(image, axis=(1, 3)), ys) / safe)[:, None]
    z_ref = ops.where(empty, ops.ones_like(total), ops.matmul(ops.sum(image, axis=(1, 2)), zs) / safe)[:, None]
    per_layer = ops.sum(image, axis=(1, 2))  # (B, nz)
    layer_empty = ops.equal(per_layer, 0.0)
    safe_layer = ops.where(layer_empty, ops.ones_like(per_layer), per_layer)
    x_mid = ops.where(layer_empty, ops.zeros_like(per_layer), ops.einsum("bxz,x->bz", ops.sum(image, axis=2), xs) / safe_layer)
    y_mid = ops.where(layer_empty, ops.zeros_like(per_layer), ops.einsum("byz,y->bz", ops.sum(image, axis=1), ys) / safe_layer)
    z = zs[None, :]
    proj = ops.sqrt(ops.maximum((x_mid - x_ref) ** 2 + (z - z_ref) ** 2, 1e-7))
    slope = (y_mid - y_ref) / proj
    slope = ops.where(z < z_ref, -slope, slope)
    mask = ops.cast(ops.logical_not(layer_empty), image.dtype)
    ang = (math.pi / 2 - ops.arctan(slope)) * mask * z
    measured = ops.sum(ang, axis=1) / ops.maximum(ops.sum(z * mask, axis=1), 1e-30)
    return ops.where(empty, ops.full_like(measured, 100.0), measured)[:, None]


def build_discriminator(cfg: NetConfig):
    """Images (B, 51, 51, 25, 1) as deposits^POWER -> [real/fake probability, energy / 100 GeV, angle, deposit sum], each (B, 1)."""
    import keras
    from keras import ops

    layers = keras.layers
    image = keras.Input((*cfg.image, 1), name="image")
    x = image
    for c in discriminator_convs(cfg):
        x = _pad_layer(layers, c)(x) if any(p for axis in c.pad for p in axis) else x
        x = layers.Conv3D(c.cout, c.kernel, name=c.name)(x)
        x = layers.LeakyReLU(negative_slope=LEAKY_SLOPE)(x)
        if c.bn:
            x = _batch_norm(f"{c.name}_bn")(x)
        x = layers.Dropout(cfg.dropout)(x)
    x = layers.Flatten()(layers.AveragePooling3D(2)(x))  # (B, features) in (x, y, z, c) order
    fake = layers.Dense(1, activation="sigmoid", name="fake")(x)
    aux = layers.Dense(1, name="aux")(x)
    # the weightless heads in float64 (the angle's slopes are ill-conditioned in float32), each in one layer: Keras casts between layers
    deposits = lambda im: ops.power(ops.cast(im[..., 0], "float64"), 1.0 / POWER)  # noqa: E731
    angle = layers.Lambda(lambda im: ops.cast(barycentre_angle(deposits(im), cfg.cell), im.dtype), name="angle")(image)
    total = layers.Lambda(lambda im: ops.cast(ecal_sum(deposits(im)), im.dtype), name="ecal_sum")(image)
    return keras.Model(image, [fake, aux, angle, total], name="discriminator")


def _named(model) -> dict:
    """nets.py's weight names -> the model's variables."""
    out = {}
    for layer in model.layers:
        if layer.name.endswith("_bn"):
            for part, v in zip(("gamma", "beta", "moving_mean", "moving_variance"), layer.weights):
                out[f"{layer.name}/{part}"] = v
        elif len(layer.weights) == 2:
            out[f"{layer.name}/kernel"], out[f"{layer.name}/bias"] = layer.weights
    return out


def load_weights(model, weights: dict[str, np.ndarray]) -> None:
    for name, v in _named(model).items():
        v.assign(weights[name])


def weights_of(model) -> dict[str, np.ndarray]:
    return {name: np.asarray(v.numpy()) for name, v in _named(model).items()}


def build_networks(cfg: NetConfig, weights: dict[str, dict[str, np.ndarray]] | None = None):
    """The generator and discriminator of ``cfg``, with ``weights`` (nets.initial_weights' layout) if given."""
    g, d = build_generator(cfg), build_discriminator(cfg)
    if weights is not None:
        load_weights(g, weights["generator"])
        load_weights(d, weights["discriminator"])
    return g, d


def parameter_counts(g, d) -> dict[str, dict[str, int]]:
    return {name: {"trainable": int(sum(np.prod(v.shape) for v in m.trainable_weights)), "total": int(m.count_params())}
            for name, m in (("generator", g), ("discriminator", d))}


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

        live, avg = _named(g), _named(self.g_avg) if self.g_avg is not None else {}

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
        variables = _named(self.g_avg)
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
