"""The Kármán surrogate's step in Keras 3 as the TensorFlow pix2pix tutorial writes it: ``downsample`` / ``upsample`` blocks of built-in layers in a functional U-Net, a ``tf.function`` train step under a ``tf.GradientTape`` with ``optimizer.apply_gradients``, batches from ``tf.data.Dataset.from_tensor_slices(...).shuffle(...).batch(...)``.

Two departures from the tutorial, so that the network is ours: each block's activation comes before its
convolution and the skip is the block's normalised output (the pix2pix repository's order; the tutorial applies
the activation after and skips it, another function), and the decoder doubles by nearest-neighbour and a 3x3
convolution (the recipe's). Batch norm takes torch's epsilon (1e-5) and momentum (0.9 in Keras' terms); Keras' Adam
with ε 1e-8 (it adds ε before the bias correction, torch after: a step's difference far below the tests'
tolerance). The learning rate follows Keras' ``CosineDecay`` over each block, assigned before each step.
"""

import time

import numpy as np

from models.schedule import LR_FLOOR
from tasks.workloads.karman.references import arrays, depth_of, recipe_of, unet_order, widths_of  # noqa: F401 (arrays: how the bench reads our side)

BN = {"momentum": 0.9, "epsilon": 1e-5}


def downsample(filters: int, apply_batchnorm: bool = True, activate: bool = True):
    import keras

    result = keras.Sequential()
    if activate:
        result.add(keras.layers.LeakyReLU(0.2))
    result.add(keras.layers.Conv2D(filters, 4, strides=2, padding="same", use_bias=False))
    if apply_batchnorm:
        result.add(keras.layers.BatchNormalization(**BN))
    return result


def upsample(filters: int, apply_batchnorm: bool = True):
    import keras

    result = keras.Sequential([keras.layers.ReLU(), keras.layers.UpSampling2D(2, interpolation="nearest"),
                               keras.layers.Conv2D(filters, 3, padding="same", use_bias=not apply_batchnorm)])
    if apply_batchnorm:
        result.add(keras.layers.BatchNormalization(**BN))
    return result


def Generator(in_channels: int, widths: list[int], tanh: bool):
    """The U-Net, NHWC: (B, H, W, in_channels) -> (B, H, W, 3); its blocks in the pix2pix repository's nesting order
    (``unet_order``) as ``blocks``."""
    import keras

    down_stack = ([downsample(widths[0], apply_batchnorm=False, activate=False)] + [downsample(w) for w in widths[1:-1]]
                  + [downsample(widths[-1], apply_batchnorm=False)])
    up_stack = [upsample(w) for w in reversed(widths[:-1])]
    last = upsample(3, apply_batchnorm=False)
    inputs = keras.Input((None, None, in_channels))
    x, skips = inputs, []
    for down in down_stack:
        x = down(x)
        skips.append(x)
    for up, skip in zip(up_stack, reversed(skips[:-1])):
        x = keras.layers.Concatenate()([skip, up(x)])
    x = last(x)
    if tanh:
        x = keras.layers.Activation("tanh")(x)
    return keras.Model(inputs, x), down_stack + up_stack + [last]


class Reference:
    words = ("Keras 3, the TensorFlow pix2pix tutorial's shape: downsample/upsample Sequential blocks in a functional U-Net, "
             "a tf.function train step under tf.GradientTape, Adam with CosineDecay, tf.data from_tensor_slices.shuffle.batch")

    def __init__(self, spec, weights: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray, batch_size: int):
        import keras
        import tensorflow as tf

        self.recipe = recipe = recipe_of(spec)
        depth = depth_of(weights)
        self.generator, blocks = Generator(x.shape[1], widths_of(weights, depth), recipe.output == "tanh")
        layers = [layer for block in blocks for layer in block.layers if isinstance(layer, (keras.layers.Conv2D, keras.layers.BatchNormalization))]
        for layer, (prefix, kind) in zip(layers, unet_order(depth), strict=True):
            if kind == "norm":
                layer.set_weights([weights[f"{prefix}.{part}"] for part in ("weight", "bias", "running_mean", "running_var")])
            else:
                layer.set_weights([weights[f"{prefix}.weight"].transpose(2, 3, 1, 0)] + ([weights[f"{prefix}.bias"]] if layer.use_bias else []))
        ratio = weights.get("delta_ratio")
        self.delta_ratio = None if ratio is None else tf.constant(ratio.reshape(1, 1, 1, 3))
        self.generator_optimizer = keras.optimizers.Adam(recipe.lr, beta_1=recipe.beta1, beta_2=0.999, epsilon=1e-8)
        self.generator_optimizer.build(self.generator.trainable_variables)
        # the pairs NHWC, as the tutorial's images are
        self.dataset = tf.data.Dataset.from_tensor_slices((x.transpose(0, 2, 3, 1), y.transpose(0, 2, 3, 1))).shuffle(len(x), seed=spec.seed).batch(batch_size)
        self.train_step = tf.function(self._train_step)
        self.batch_size = batch_size

    def generator_loss(self, cond, target, training: bool = True):
        """The unrolled L1: cond (B, H, W, 4), target (B, H, W, 3·unroll), the later steps from the detached predictions."""
        import tensorflow as tf

        state, total = cond[..., :3], 0.0
        for real in tf.split(target, self.recipe.unroll, axis=-1):
            step_in = tf.concat([state, cond[..., 3:]], axis=-1)
            gen_output = self.generator(step_in, training=training)
            wanted = real if self.delta_ratio is None else (real - step_in[..., :3]) / self.delta_ratio
            total += self.recipe.l1_weight * tf.reduce_mean(tf.abs(gen_output - wanted))
            state = tf.stop_gradient(gen_output if self.delta_ratio is None else step_in[..., :3] + gen_output * self.delta_ratio)
        return total

    def _train_step(self, input_image, target):
        import tensorflow as tf

        noise = self.recipe.noise * tf.random.normal(tf.shape(input_image[..., :3]))
        input_image = tf.concat([input_image[..., :3] + noise, input_image[..., 3:]], axis=-1)
        with tf.GradientTape() as gen_tape:
            gen_total_loss = self.generator_loss(input_image, target)
        generator_gradients = gen_tape.gradient(gen_total_loss, self.generator.trainable_variables)
        self.generator_optimizer.apply_gradients(zip(generator_gradients, self.generator.trainable_variables))
        return gen_total_loss

    def train(self, steps: int) -> float:
        import keras

        schedule = keras.optimizers.schedules.CosineDecay(self.recipe.lr, steps, alpha=LR_FLOOR)  # each block is a run of its own
        t0 = time.perf_counter()
        for step, (input_image, target) in enumerate(self.dataset.take(steps)):
            self.generator_optimizer.learning_rate.assign(schedule(step))
            loss = self.train_step(input_image, target)
        float(loss)  # the last step has run
        return time.perf_counter() - t0

    def loss(self, x: np.ndarray, y: np.ndarray) -> float:
        import tensorflow as tf

        saved = [v.numpy() for v in self.generator.non_trainable_variables]  # batch norm's moving statistics move in training mode
        loss = float(self.generator_loss(tf.constant(x.transpose(0, 2, 3, 1)), tf.constant(y.transpose(0, 2, 3, 1))))
        for v, value in zip(self.generator.non_trainable_variables, saved):
            v.assign(value)
        return loss


# -- how the bench reads our side -----------------------------------------------------------------------------------------
def ours_weights(trainer) -> dict[str, np.ndarray]:
    """Our Keras generator's weights under our torch generator's state dict names and layouts, and the recipe's delta_ratio."""
    from models.karman.nets.pix2pix_keras import _torch_generator_layers

    state = {}
    for name, (prefix, kind) in _torch_generator_layers(trainer.data.net).items():
        values = [np.asarray(v) for v in trainer.model.generator.get_layer(name).get_weights()]
        parts = ("weight", "bias", "running_mean", "running_var") if kind == "norm" else ("weight", "bias")
        if kind != "norm":
            values[0] = values[0].transpose(3, 2, 0, 1)  # (kh, kw, I, O) -> (O, I, kh, kw)
        state |= {f"{prefix}.{part}": v for part, v in zip(parts, values)}
    ratio = trainer.data.codec.delta_ratio
    return state | ({} if ratio is None else {"delta_ratio": np.asarray(ratio, np.float32)})


def ours_loss(trainer, x: np.ndarray, y: np.ndarray) -> float:
    """Our trainer's generator loss of a batch without the input noise: its step's algebra (models.karman.nets.trainer_keras), batch
    norm on the batch's statistics, the moving ones put back after."""
    import tensorflow as tf

    model = trainer.model
    o = model.optim
    saved = [v.numpy() for v in model.generator.non_trainable_variables]
    cond = tf.constant(x.transpose(0, 2, 3, 1))
    state, total = cond[..., :3], 0.0
    for target in tf.split(tf.constant(y.transpose(0, 2, 3, 1)), o.unroll, axis=-1):
        step_in = tf.concat([state, cond[..., 3:]], axis=-1)
        out = model.predict(step_in, training=True)
        total += o.l1_weight * float(tf.reduce_mean(tf.abs(out - model.encode_target(step_in, target))))
        state = model.constrain(model.next_state(step_in, out), cond)
    for v, value in zip(model.generator.non_trainable_variables, saved):
        v.assign(value)
    return total
