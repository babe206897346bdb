"""One Pix2Pix optimisation step in TensorFlow under any tf.distribute strategy: the torch trainer's recipe (models.karman.nets.trainer), NHWC.

The step is one ``tf.function`` run by ``strategy.run`` on every replica: the discriminator's update
(when the recipe has an adversarial term), then the generator's (GAN + λ·L1 and the pushforward terms
of an unrolled loss). Each replica's losses are sums over its own samples divided by the *global*
batch, so the strategy's sum of the replicas' gradients is the gradient of the global batch's mean,
as the strategies require; the reported losses are those global means. Batch norm uses each
replica's own batch statistics (as DistributedDataParallel does without SyncBatchNorm).
"""

import numpy as np
import tensorflow as tf
import keras
from keras import ops

from models.karman.damping import passes
from models.karman.nets.config import NetConfig
from models.karman.nets.pix2pix_keras import build_discriminator, build_generator
from models.karman.recipe import OptimConfig


ADAM_EPSILON = 1e-8  # torch's default; Keras' is 1e-7
AGREED = "agreed"  # the key of train_step's reduced flags


def damp(x, strength: float):
    """x (B, H, W, C) with its highest wavenumbers damped by ``strength``: models.karman.damping.damp in TensorFlow."""
    for weight in passes(strength):
        blurred = x
        for axis in (1, 2):  # H, then W, edges repeated
            n = tf.shape(blurred)[axis]
            padded = tf.concat([tf.gather(blurred, [0], axis=axis), blurred, tf.gather(blurred, [n - 1], axis=axis)], axis=axis)
            lo, mid, hi = (tf.gather(padded, tf.range(i, i + n), axis=axis) for i in range(3))
            blurred = 0.25 * lo + 0.5 * mid + 0.25 * hi
        x = x - weight * (x - blurred)
    return x


class TorchAdam(keras.optimizers.Adam):
    """Adam as torch computes it: lr/(1-β1^t) · m / (sqrt(v)/sqrt(1-β2^t) + ε). Keras adds ε to sqrt(v)
    before the bias correction (an effective ε of ε/sqrt(1-β2^t), 3e-7 at the first step), which moves
    weights with small gradients measurably less in the first steps."""

    def update_step(self, gradient, variable, learning_rate):
        dtype = variable.dtype
        lr, gradient = ops.cast(learning_rate, dtype), ops.cast(gradient, dtype)
        step = ops.cast(self.iterations + 1, dtype)
        correction1 = 1 - ops.power(ops.cast(self.beta_1, dtype), step)
        correction2 = 1 - ops.power(ops.cast(self.beta_2, dtype), step)
        m = self._momentums[self._get_variable_index(variable)]
        v = self._velocities[self._get_variable_index(variable)]
        self.assign_add(m, ops.multiply(ops.subtract(gradient, m), 1 - self.beta_1))
        self.assign_add(v, ops.multiply(ops.subtract(ops.square(gradient), v), 1 - self.beta_2))
        denominator = ops.add(ops.divide(ops.sqrt(v), ops.sqrt(correction2)), self.epsilon)
        self.assign_sub(variable, ops.divide(ops.multiply(m, lr / correction1), denominator))


class KerasPix2Pix:
    """Generator, discriminator and their Adam optimisers, made in ``strategy``'s scope (mirrored
    variables under a distribution strategy), and the distributed training step."""

    def __init__(self, net: NetConfig, optim: OptimConfig, strategy: tf.distribute.Strategy, global_batch: int,
                 jit_compile: bool = False, seed: int = 0):
        self.net, self.optim, self.strategy, self.global_batch = net, optim, strategy, global_batch
        keras.utils.set_random_seed(seed)  # the same initial weights in every worker process
        with strategy.scope():
            self.generator = build_generator(net, training=True)
            self.discriminator = build_discriminator(net, training=True)
            self.opt_g = TorchAdam(optim.lr, beta_1=optim.beta1, beta_2=0.999, epsilon=ADAM_EPSILON)
            self.opt_d = TorchAdam(optim.lr, beta_1=optim.beta1, beta_2=0.999, epsilon=ADAM_EPSILON)
            self.opt_g.build(self.generator.trainable_variables)
            self.opt_d.build(self.discriminator.trainable_variables)
        ratio = optim.delta_ratio
        self.delta_ratio = None if ratio is None else tf.constant(np.asarray(ratio, np.float32).reshape(1, 1, 1, -1))
        # Traced as written, without autograph (as every tf.function of this project's own): its branches and loops are on
        # Python values (the recipe's options, the loss steps), so converting its source first would change nothing but
        # cost the conversion and leave the converted source in the temporary folder; a branch on a tensor fails the trace.
        self._step = tf.function(self._distributed_step, jit_compile=jit_compile, reduce_retracing=True, autograph=False)

    # -- the recipe's algebra (NHWC; network units) ----------------------------------------------
    def predict(self, cond, training: bool = True):
        """The generator's output (B, H, W, 3), its highest wavenumbers damped as the recipe says."""
        return damp(self.generator(cond, training=training), self.optim.damping)

    def next_state(self, cond, out):
        """The state at t+k (B, H, W, 3) from cond (B, H, W, 4) and the network's output."""
        return out if self.delta_ratio is None else cond[..., :3] + out * self.delta_ratio

    def constrain(self, state, start):
        """A predicted state (B, H, W, 3) with the recipe's constraints (the torch trainer's constrain, NHWC)."""
        zero = self.optim.constrain
        if zero is None:
            return state
        inlet = tf.logical_and(tf.reshape(tf.one_hot(0, tf.shape(state)[2], on_value=True, off_value=False), (1, 1, -1, 1)),
                               tf.constant([True, True, False], shape=(1, 1, 1, 3)))
        state = tf.where(inlet, start[..., :3], state)
        return tf.where(start[..., 3:4] > 0, tf.constant(zero, tf.float32, shape=(1, 1, 1, len(zero))), state)

    def encode_target(self, cond, target):
        return target if self.delta_ratio is None else (target - cond[..., :3]) / self.delta_ratio

    def _mean(self, x):
        """Sum over this replica's samples over the global batch's element count: the replicas' sum is the global mean."""
        per_sample = tf.cast(tf.reduce_prod(tf.shape(x)[1:]), tf.float32)
        return tf.reduce_sum(x) / (per_sample * self.global_batch)

    def _bce(self, logits, label: float):
        return self._mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=tf.fill(tf.shape(logits), label), logits=logits))

    def _replica_step(self, cond, target, seed, steps: int):
        """cond (b, H, W, 4) and target (b, H, W, 3·unroll): this replica's share of the global batch;
        seed (2,) int32: the step's noise seed (stateless: a resumed run draws what an uninterrupted one does);
        steps: how many of the unrolled targets enter the loss (a Python int: one trace per value)."""
        o = self.optim
        gen, disc = self.generator, self.discriminator
        targets = tf.split(target, o.unroll, axis=-1)[:steps]
        hold = (lambda x: x) if o.pushforward == "through" else tf.stop_gradient  # gradients through the chain, or not
        start = cond  # before the noise: the constraints hold the inlet at the clean start's
        if o.noise > 0:  # noise on u, v, p; the mask stays exact; each replica its own draw
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            draw = tf.random.stateless_normal(tf.shape(cond[..., :3]), seed=seed + tf.stack([0, 7919 * replica]))
            cond = tf.concat([cond[..., :3] + o.noise * draw, cond[..., 3:]], axis=-1)
        zero = tf.zeros(())
        loss_d = loss_gan = zero
        with tf.GradientTape() as g_tape:
            out = self.predict(cond)
            fake = self.next_state(cond, out)
            if o.gan_weight > 0:
                with g_tape.stop_recording(), tf.GradientTape() as d_tape:
                    real_logits = disc([cond, targets[0]], training=True)
                    fake_logits = disc([cond, tf.stop_gradient(fake)], training=True)
                    loss_d = 0.5 * (self._bce(real_logits, 1.0) + self._bce(fake_logits, 0.0))
                d_vars = disc.trainable_variables
                with g_tape.stop_recording():
                    self.opt_d.apply_gradients(zip(d_tape.gradient(loss_d, d_vars), d_vars))
            loss_l1 = self._mean(tf.abs(out - self.encode_target(cond, targets[0])))
            loss_g = o.l1_weight * loss_l1
            if o.gan_weight > 0:
                loss_gan = self._bce(disc([cond, fake], training=True), 1.0)  # the updated D, its weights untouched
                loss_g = loss_g + o.gan_weight * loss_gan
            losses = {"loss_d": loss_d, "loss_g_gan": loss_gan, "loss_l1": loss_l1}
            # Pushforward: predict again from the network's own prediction (with the mask).
            state = self.constrain(hold(fake), start)
            for n, target_n in enumerate(targets[1:], start=2):
                cond_n = tf.concat([state, cond[..., 3:]], axis=-1)
                out_n = self.predict(cond_n)
                loss_n = self._mean(tf.abs(out_n - self.encode_target(cond_n, target_n)))
                loss_g = loss_g + o.l1_weight * loss_n
                losses[f"loss_l1_step{n}"] = loss_n
                state = self.constrain(hold(self.next_state(cond_n, out_n)), start)
        g_vars = gen.trainable_variables
        self.opt_g.apply_gradients(zip(g_tape.gradient(loss_g, g_vars), g_vars))
        return losses

    def _distributed_step(self, cond, target, flags, seed, steps):
        def replica(cond, target, flags, seed):
            return self._replica_step(cond, target, seed, steps) | {AGREED: flags / self.strategy.num_replicas_in_sync}

        per_replica = self.strategy.run(replica, args=(cond, target, flags, seed))
        return {k: self.strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=None) for k, v in per_replica.items()}

    def train_step(self, cond, target, flags=None, seed: tuple[int, int] = (0, 0), steps: int | None = None) -> dict:
        """One step on a distributed batch (what the strategy's distributed dataset yields); the global
        batch's mean losses as tensors, and under AGREED the mean over the replicas of ``flags``, values
        each process contributes (a stop request, its clock) so that every process decides alike.
        ``seed`` (this process's, this step's) seeds the input noise; ``steps`` (default: unroll) of the
        unrolled targets enter the loss."""
        steps = self.optim.unroll if steps is None else steps
        if not 1 <= steps <= self.optim.unroll:
            raise ValueError(f"{steps} loss steps: choose 1 to the unroll, {self.optim.unroll}")
        flags = tf.zeros((1,)) if flags is None else tf.constant(flags, tf.float32)
        return self._step(cond, target, flags, tf.constant(seed, tf.int32), int(steps))

    def set_lr_factor(self, factor: float) -> None:
        for opt in (self.opt_g, self.opt_d):
            opt.learning_rate.assign(self.optim.lr * factor)

    @property
    def learning_rate(self) -> float:
        return float(self.opt_g.learning_rate.numpy())

    # -- state (plain numpy arrays: the checkpoint of a run) --------------------------------------
    def state(self) -> dict[str, np.ndarray]:
        arrays = {}
        for prefix, variables in (("generator", self.generator.weights), ("discriminator", self.discriminator.weights),
                                  ("opt_g", self.opt_g.variables), ("opt_d", self.opt_d.variables)):
            for i, v in enumerate(variables):
                arrays[f"{prefix}/{i:04d}"] = np.asarray(v.numpy())
        return arrays

    def load_state(self, arrays: dict[str, np.ndarray]) -> None:
        for prefix, variables in (("generator", self.generator.weights), ("discriminator", self.discriminator.weights),
                                  ("opt_g", self.opt_g.variables), ("opt_d", self.opt_d.variables)):
            keys = sorted(k for k in arrays if k.startswith(prefix + "/"))
            if len(keys) != len(variables):
                raise ValueError(f"checkpoint holds {len(keys)} {prefix} variables, the model has {len(variables)}")
            for key, v in zip(keys, variables):
                v.assign(arrays[key])
