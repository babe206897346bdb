"""The 3DGAN's networks in Keras 3 (channels last): the generator and discriminator layer by layer as nets.py describes them, their weights in its one layout (the trainer is tasks.workloads.calo.tensorflow)."""

import math

import numpy as np

from models.calo.nets import BN_EPSILON, BN_MOMENTUM, LEAKY_SLOPE, POWER, NetConfig, discriminator_convs, generator_convs, seed_channels


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


def variables_of(model) -> dict:
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
    for name, v in variables_of(model).items():
        v.assign(weights[name])


def weights_of(model) -> dict[str, np.ndarray]:
    return {name: np.asarray(v.numpy()) for name, v in variables_of(model).items()}


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
