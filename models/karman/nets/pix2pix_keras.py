"""The Pix2Pix networks in Keras 3 (TensorFlow backend, NHWC), layer for layer the torch ones of pix2pix.py, with a weight copy from them."""

import numpy as np
import keras
from keras import layers, ops

from models.karman.nets.config import NetConfig

# Keras defaults that differ from torch's and from the paper's: batch norm momentum 0.99 (torch's 0.1
# is Keras' 0.9) and epsilon 1e-3 (torch 1e-5), LeakyReLU slope 0.3 (pix2pix 0.2). Stride-2 4x4
# convolutions pad one pixel on every side (explicitly: TF's "same" pads bottom/right first at odd
# totals), the stride-1 4x4 ones likewise, as torch's padding=1 does.
BN_MOMENTUM, BN_EPSILON, SLOPE = 0.9, 1e-5, 0.2


class TorchBatchNormalization(layers.BatchNormalization):
    """Batch norm whose moving variance takes the batch's *unbiased* variance, as torch's BatchNorm2d
    does (Keras takes the biased one: on the U-Net's innermost 1x2 maps at batch 8 that is 16/15 of a
    difference). Normalisation itself uses the biased variance in both. Used for training only: the
    exported generator has plain BatchNormalization layers with the same weights (see ``plain``)."""

    def call(self, inputs, training=None, mask=None):
        if not (training and self.trainable):
            return super().call(inputs, training=training, mask=mask)
        before = ops.add(self.moving_variance, 0.0)  # a copy of the value (a plain read may alias the variable)
        outputs = super().call(inputs, training=training, mask=mask)
        n = ops.cast(ops.prod(ops.shape(inputs)[:-1]), before.dtype)  # values per channel in the batch
        kept = before * self.momentum
        self.moving_variance.assign(kept + (self.moving_variance - kept) * n / ops.maximum(n - 1.0, 1.0))
        return outputs


def _norm(kind: str, name: str, torch_statistics: bool = False):
    if kind == "batch":
        cls = TorchBatchNormalization if torch_statistics else layers.BatchNormalization
        return cls(momentum=BN_MOMENTUM, epsilon=BN_EPSILON, gamma_initializer=keras.initializers.RandomNormal(1.0, 0.02), name=name)
    if kind == "instance":  # per sample and channel, no affine parameters (torch's InstanceNorm2d default)
        return layers.GroupNormalization(groups=-1, epsilon=BN_EPSILON, center=False, scale=False, name=name)
    raise ValueError(f"unknown norm {kind!r}; choose batch or instance")


def _pix2pix_init() -> dict:
    """The torch networks' initialisation (pix2pix's): kernels N(0, 0.02), zero biases; Keras' own
    (Glorot-uniform kernels) starts training elsewhere."""
    return {"kernel_initializer": keras.initializers.RandomNormal(0.0, 0.02), "bias_initializer": "zeros"}


def _conv4(filters: int, stride: int, bias: bool, name: str):
    """ZeroPadding(1) then a 4x4 convolution without padding: torch's Conv2d(k=4, padding=1)."""
    def apply(x):
        x = layers.ZeroPadding2D(1, name=f"{name}_pad")(x)
        return layers.Conv2D(filters, 4, strides=stride, padding="valid", use_bias=bias, name=name, **_pix2pix_init())(x)
    return apply


def _up(kind: str, filters: int, bias: bool, name: str):
    if kind == "transpose":  # torch ConvTranspose2d(k=4, s=2, p=1): the adjoint of the padded stride-2 conv
        return layers.Conv2DTranspose(filters, 4, strides=2, padding="same", use_bias=bias, name=name, **_pix2pix_init())
    if kind == "resize":  # nearest doubling, then a 3x3 convolution
        def apply(x):
            x = layers.UpSampling2D(2, interpolation="nearest", name=f"{name}_double")(x)
            return layers.Conv2D(filters, 3, padding="same", use_bias=bias, name=name, **_pix2pix_init())(x)
        return apply
    raise ValueError(f"unknown upsampling {kind!r}; choose resize or transpose")


def build_generator(cfg: NetConfig, training: bool = False) -> keras.Model:
    """The U-Net: (B, H, W, in_channels) -> (B, H, W, out_channels), H and W multiples of 2^depth.
    ``training``: batch norm keeps torch's running statistics (TorchBatchNormalization)."""
    depth = cfg.generator_depth
    if depth < 2:
        raise ValueError(f"U-Net depth {depth} must be >= 2")
    if cfg.output not in ("tanh", "linear"):
        raise ValueError(f"unknown output activation {cfg.output!r}; choose tanh or linear")
    bias = cfg.norm == "instance"
    widths = cfg.generator_widths()
    dropout_levels = set(range(max(1, depth - 4), depth - 1))
    inputs = keras.Input((None, None, cfg.in_channels), name="state")
    skips, h = [], inputs
    for i in range(depth):
        if i > 0:
            h = layers.LeakyReLU(SLOPE)(h)
        h = _conv4(widths[i], 2, bias, f"down{i}")(h)
        if 0 < i < depth - 1:
            h = _norm(cfg.norm, f"down{i}_norm", training)(h)
        skips.append(h)
    h = skips[-1]
    for i in range(depth - 1, -1, -1):
        if i < depth - 1:
            h = layers.Concatenate(axis=-1)([skips[i], h])
        h = layers.ReLU()(h)
        if i == 0:
            h = _up(cfg.upsample, cfg.out_channels, True, "up0")(h)
            if cfg.output == "tanh":
                h = layers.Activation("tanh")(h)
        else:
            h = _up(cfg.upsample, widths[i - 1], bias, f"up{i}")(h)
            h = _norm(cfg.norm, f"up{i}_norm", training)(h)
            if i in dropout_levels and cfg.dropout > 0:
                h = layers.Dropout(cfg.dropout)(h)
    return keras.Model(inputs, h, name="unet_generator")


def build_discriminator(cfg: NetConfig, training: bool = False) -> keras.Model:
    """PatchGAN: (condition, image) NHWC -> (B, h, w, 1) logits per patch (``training`` as for the generator)."""
    bias = cfg.norm == "instance"
    condition = keras.Input((None, None, cfg.in_channels), name="condition")
    image = keras.Input((None, None, cfg.out_channels), name="image")
    h = layers.Concatenate(axis=-1)([condition, image])
    h = layers.LeakyReLU(SLOPE)(_conv4(cfg.ndf, 2, True, "d0")(h))
    for n in range(1, cfg.d_layers + 1):
        width = cfg.ndf * min(2**n, 8)
        h = _conv4(width, 2 if n < cfg.d_layers else 1, bias, f"d{n}")(h)
        h = layers.LeakyReLU(SLOPE)(_norm(cfg.norm, f"d{n}_norm", training)(h))
    h = _conv4(1, 1, True, f"d{cfg.d_layers + 1}")(h)
    return keras.Model([condition, image], h, name="patch_discriminator")


def plain(cfg: NetConfig, generator: keras.Model) -> keras.Model:
    """The generator with plain Keras layers only and the given one's weights: what is saved and logged
    (it loads anywhere Keras does, no class of ours needed)."""
    export = build_generator(cfg)
    export.set_weights(generator.get_weights())
    return export


def trainable_count(model: keras.Model) -> int:
    """Trainable parameters (the moving statistics of batch norm are state, as torch's buffers are)."""
    return int(sum(np.prod(w.shape) for w in model.trainable_weights))


# ------------------------------------------------------------------------------------------------
# Weights from the torch networks (their state_dict as numpy arrays): Conv2d (O, I, kh, kw) -> Conv2D
# (kh, kw, I, O); ConvTranspose2d (I, O, kh, kw) -> Conv2DTranspose (kh, kw, O, I); batch norm weight,
# bias, running mean and variance -> gamma, beta, moving mean and variance.

def _torch_generator_layers(cfg: NetConfig) -> dict[str, tuple[str, str]]:
    """Keras layer name -> (torch state_dict prefix, kind) for the U-Net."""
    depth, names = cfg.generator_depth, {}
    for i in range(depth):
        names[f"down{i}"] = ("down.0" if i == 0 else f"down.{i}.1", "conv")
        if 0 < i < depth - 1:
            names[f"down{i}_norm"] = (f"down.{i}.2", "norm")
        conv = f"up.{i}.1" if cfg.upsample == "transpose" else f"up.{i}.1.1"
        names[f"up{i}"] = (conv, "transpose" if cfg.upsample == "transpose" else "conv")
        if i > 0:
            names[f"up{i}_norm"] = (f"up.{i}.2", "norm")
    return names


def _torch_discriminator_layers(cfg: NetConfig) -> dict[str, tuple[str, str]]:
    names = {"d0": ("net.0", "conv")}
    index = 2
    for n in range(1, cfg.d_layers + 1):
        names[f"d{n}"], names[f"d{n}_norm"] = (f"net.{index}", "conv"), (f"net.{index + 1}", "norm")
        index += 3
    names[f"d{cfg.d_layers + 1}"] = (f"net.{index}", "conv")
    return names


def _copy(model: keras.Model, state: dict[str, np.ndarray], mapping: dict[str, tuple[str, str]]) -> None:
    for layer_name, (prefix, kind) in mapping.items():
        layer = model.get_layer(layer_name)
        if kind == "norm":
            if not layer.weights:  # instance norm: nothing to copy
                continue
            layer.set_weights([state[f"{prefix}.{k}"] for k in ("weight", "bias", "running_mean", "running_var")])
            continue
        w = state[f"{prefix}.weight"]
        kernel = w.transpose(2, 3, 1, 0)  # conv: (O, I, kh, kw) -> (kh, kw, I, O); transpose: (I, O, kh, kw) -> (kh, kw, O, I)
        layer.set_weights([kernel] + ([state[f"{prefix}.bias"]] if f"{prefix}.bias" in state else []))


def copy_from_torch(cfg: NetConfig, generator: keras.Model, discriminator: keras.Model | None,
                    generator_state: dict[str, np.ndarray], discriminator_state: dict[str, np.ndarray] | None = None) -> None:
    """Load the torch networks' weights (state_dict values as numpy arrays) into the Keras ones."""
    _copy(generator, generator_state, _torch_generator_layers(cfg))
    if discriminator is not None and discriminator_state is not None:
        _copy(discriminator, discriminator_state, _torch_discriminator_layers(cfg))
