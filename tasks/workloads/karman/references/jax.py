"""The Kármán surrogate's step in JAX as optax's documentation teaches: the U-Net a pure function of its parameters, ``jax.value_and_grad`` of the unrolled loss and the optax update under one ``jax.jit``, a Python loop over numpy batches.

Flax is not installed here: the layers are written as flax.linen's compute them (``nn.Conv`` is
``lax.conv_general_dilated`` in NHWC/HWIO, ``nn.BatchNorm`` normalises by the batch's statistics in training and
moves its running ones by momentum 0.9, the batch statistics returned as flax's mutable ``batch_stats``), the
doubling is ``jax.image.resize(..., "nearest")``. The learning rate follows optax's ``cosine_decay_schedule`` over
each block, set through ``optax.inject_hyperparams`` (the jitted step is not traced again); the input noise draws
from a key split for each step.
"""

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from models.schedule import LR_FLOOR
from tasks.workloads.karman.references import arrays, depth_of, recipe_of, unet_order  # noqa: F401 (arrays: how the bench reads our side)

EPSILON, MOMENTUM = 1e-5, 0.9  # batch norm's, as torch's (flax's nn.BatchNorm(epsilon=1e-5, momentum=0.9))


def conv(x, p, stride: int):
    """(B, H, W, I) -> (B, H', W', O), one pixel of zeros around (flax's padding=1)."""
    y = jax.lax.conv_general_dilated(x, p["kernel"], (stride, stride), ((1, 1), (1, 1)), dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return y + p["bias"] if "bias" in p else y


def batch_norm(x, p, stats, name: str, new_stats: dict):
    """Training-mode batch norm over NHWC's channels; the moved running statistics go into ``new_stats[name]``."""
    mean, var = x.mean(axis=(0, 1, 2)), x.var(axis=(0, 1, 2))
    new_stats[name] = {"mean": MOMENTUM * stats[name]["mean"] + (1 - MOMENTUM) * mean, "var": MOMENTUM * stats[name]["var"] + (1 - MOMENTUM) * var}
    return (x - mean) * jax.lax.rsqrt(var + EPSILON) * p["scale"] + p["bias"]


def double(x):
    b, h, w, c = x.shape
    return jax.image.resize(x, (b, 2 * h, 2 * w, c), "nearest")


def unet(params, stats, x, depth: int, tanh: bool):
    """(B, H, W, 4) -> ((B, H, W, 3), the new batch statistics)."""
    new_stats = {}
    skips, h = [], x
    for i in range(depth):
        if i == 0:
            h = conv(h, params["down.0"], 2)
        else:
            h = conv(jax.nn.leaky_relu(h, 0.2), params[f"down.{i}.1"], 2)
            if i < depth - 1:
                h = batch_norm(h, params[f"down.{i}.2"], stats, f"down.{i}.2", new_stats)
        skips.append(h)
    for i in range(depth - 1, -1, -1):
        if i < depth - 1:
            h = jnp.concatenate([skips[i], h], axis=-1)
        h = conv(double(jax.nn.relu(h)), params[f"up.{i}.1.1"], 1)
        if i > 0:
            h = batch_norm(h, params[f"up.{i}.2"], stats, f"up.{i}.2", new_stats)
    return (jnp.tanh(h) if tanh else h), new_stats


class Reference:
    words = ("JAX + optax: a pure U-Net (lax.conv_general_dilated NHWC/HWIO, batch norm as flax's with batch_stats, jax.image.resize nearest), "
             "jax.jit over value_and_grad of the unrolled loss and the optax update, optax.adam under inject_hyperparams with "
             "cosine_decay_schedule, numpy batches in a permuted order")

    def __init__(self, spec, weights: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray, batch_size: int):
        self.recipe = recipe = recipe_of(spec)
        depth = depth_of(weights)
        self.params, self.stats = {}, {}
        for prefix, kind in unet_order(depth):
            if kind == "norm":
                self.params[prefix] = {"scale": jnp.asarray(weights[f"{prefix}.weight"]), "bias": jnp.asarray(weights[f"{prefix}.bias"])}
                self.stats[prefix] = {"mean": jnp.asarray(weights[f"{prefix}.running_mean"]), "var": jnp.asarray(weights[f"{prefix}.running_var"])}
            else:
                self.params[prefix] = {"kernel": jnp.asarray(weights[f"{prefix}.weight"].transpose(2, 3, 1, 0))}  # (O, I, kh, kw) -> HWIO
                if f"{prefix}.bias" in weights:
                    self.params[prefix]["bias"] = jnp.asarray(weights[f"{prefix}.bias"])
        ratio = weights.get("delta_ratio")
        ratio = None if ratio is None else jnp.asarray(ratio)  # (3,), NHWC's last axis
        self.optimizer = optax.inject_hyperparams(optax.adam)(learning_rate=recipe.lr, b1=recipe.beta1, b2=0.999, eps=1e-8)
        self.opt_state = self.optimizer.init(self.params)

        def loss_fn(params, stats, cond, targets, noise):
            """The unrolled L1 (cond (B, H, W, 4), targets unroll × (B, H, W, 3)), noise (B, H, W, 3) on the input state."""
            cond = jnp.concatenate([cond[..., :3] + noise, cond[..., 3:]], axis=-1)
            state, total = cond[..., :3], 0.0
            for target in targets:
                step_in = jnp.concatenate([state, cond[..., 3:]], axis=-1)
                out, stats = unet(params, stats, step_in, depth, recipe.output == "tanh")
                wanted = target if ratio is None else (target - step_in[..., :3]) / ratio
                total = total + recipe.l1_weight * jnp.abs(out - wanted).mean()
                state = jax.lax.stop_gradient(out if ratio is None else step_in[..., :3] + out * ratio)  # pushforward, detached
            return total, stats

        def train_step(params, stats, opt_state, cond, target, key):
            cond, target = jnp.transpose(cond, (0, 2, 3, 1)), jnp.transpose(target, (0, 2, 3, 1))  # NHWC
            noise = recipe.noise * jax.random.normal(key, cond[..., :3].shape)
            (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, stats, cond, jnp.split(target, recipe.unroll, axis=-1), noise)
            updates, opt_state = self.optimizer.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), stats, opt_state, loss

        def eval_loss(params, stats, cond, target):
            cond, target = jnp.transpose(cond, (0, 2, 3, 1)), jnp.transpose(target, (0, 2, 3, 1))
            return loss_fn(params, stats, cond, jnp.split(target, recipe.unroll, axis=-1), jnp.zeros(cond[..., :3].shape))[0]

        self.train_step, self.eval_loss = jax.jit(train_step), jax.jit(eval_loss)
        self.x, self.y, self.batch_size = x, y, batch_size
        self.rng = np.random.default_rng(spec.seed)
        self.key = jax.random.key(spec.seed)

    def train(self, steps: int) -> float:
        schedule = optax.cosine_decay_schedule(self.recipe.lr, steps, alpha=LR_FLOOR)  # each block is a run of its own
        t0 = time.perf_counter()
        order = self.rng.permutation(len(self.x))
        for i in range(steps):
            take = order[i * self.batch_size: (i + 1) * self.batch_size]
            self.key, key = jax.random.split(self.key)
            self.opt_state.hyperparams["learning_rate"] = schedule(i)
            self.params, self.stats, self.opt_state, loss = self.train_step(self.params, self.stats, self.opt_state, self.x[take], self.y[take], key)
        jax.block_until_ready(self.params)
        return time.perf_counter() - t0

    def loss(self, x: np.ndarray, y: np.ndarray) -> float:
        return float(self.eval_loss(self.params, self.stats, x, y))


# -- how the bench reads our side -----------------------------------------------------------------------------------------
def ours_weights(trainer) -> dict[str, np.ndarray]:
    """Our generator's arrays (they carry torch's state dict names and layouts) and the recipe's delta_ratio."""
    state = {k: np.asarray(v) for k, v in (trainer.train_state["g"] | trainer.train_state["g_stats"]).items()}
    ratio = trainer.data.codec.delta_ratio
    return state | ({} if ratio is None else {"delta_ratio": np.asarray(ratio, np.float32)})


def ours_loss(trainer, x: np.ndarray, y: np.ndarray) -> float:
    """Our trainer's generator loss of a batch without the input noise: its unrolled chain (models.karman.nets.trainer_jax), every
    step a step of the chain from the clean state, on the batch's statistics."""
    model, state = trainer.model, trainer.train_state
    cond, target = jnp.transpose(jnp.asarray(x), (0, 2, 3, 1)), jnp.transpose(jnp.asarray(y), (0, 2, 3, 1))
    targets = jnp.split(target, model.optim.unroll, axis=-1)
    l1s, _ = model._chain(state["g"], state["g_stats"], cond, cond, cond[..., :3], targets, jax.random.key(0), 1)
    return float(model.optim.l1_weight * l1s.sum())
