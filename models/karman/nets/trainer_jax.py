"""One Pix2Pix optimisation step in JAX, jitted whole: the torch trainer's recipe (models.karman.nets.trainer), NHWC inside.

The discriminator's update (when the recipe has an adversarial term), then the generator's: GAN + λ·L1 and
the pushforward terms of an unrolled loss, detached or through the chain, the predicted change damped and
the recipe's constraints imposed as torch does. Adam is optax's ``scale_by_adam`` (ε added to the
bias-corrected sqrt(v), as torch adds it) times the step's learning rate, an argument of the step, so a
schedule never recompiles it. Batch norm's running statistics move at every network call in the order
torch's step makes them. The generator's first forward is taken once (``jax.vjp``): its output feeds the
discriminator's update and the generator's loss, whose gradient comes back through the saved pullback.
"""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax

from models.karman.damping import passes
from models.karman.nets import pix2pix_jax as nets
from models.karman.nets.config import NetConfig
from models.karman.recipe import OptimConfig

BETA2, EPSILON = 0.999, 1e-8  # torch's Adam defaults


def damp(x: jax.Array, strength: float) -> jax.Array:
    """x (B, H, W, C) with its highest wavenumbers damped by ``strength``: models.karman.damping.damp in JAX."""
    for weight in passes(strength):
        blurred = x
        for axis in (1, 2):  # H, then W, edges repeated
            n = blurred.shape[axis]
            padded = jnp.concatenate([lax_take(blurred, 0, 1, axis), blurred, lax_take(blurred, n - 1, n, axis)], axis=axis)
            blurred = 0.25 * lax_take(padded, 0, n, axis) + 0.5 * lax_take(padded, 1, n + 1, axis) + 0.25 * lax_take(padded, 2, n + 2, axis)
        x = x - weight * (x - blurred)
    return x


def lax_take(x: jax.Array, start: int, stop: int, axis: int) -> jax.Array:
    return jax.lax.slice_in_dim(x, start, stop, axis=axis)


def bce(logits: jax.Array, label: float) -> jax.Array:
    """Mean binary cross-entropy of logits against a constant label (torch's BCEWithLogitsLoss)."""
    return jnp.mean(jnp.maximum(logits, 0) - logits * label + jnp.log1p(jnp.exp(-jnp.abs(logits))))


class Pix2PixJax:
    """The recipe's algebra and the jitted step. The state is a dict of pytrees of arrays: ``g``, ``d`` (params),
    ``g_stats``, ``d_stats`` (running statistics), ``opt_g``, ``opt_d`` (Adam's moments and count)."""

    def __init__(self, net: NetConfig, optim: OptimConfig):
        self.net, self.optim = net, optim
        self.adam = optax.scale_by_adam(b1=optim.beta1, b2=BETA2, eps=EPSILON)
        self.ratio = None if optim.delta_ratio is None else jnp.asarray(np.asarray(optim.delta_ratio, np.float32))  # (3,), NHWC's last axis
        self.step = jax.jit(self._step, static_argnums=(5,), donate_argnums=(0,))
        self.predict = jax.jit(partial(nets.infer, net))  # (g, g_stats, x (B, Cin, H, W)) -> (B, Cout, H, W), inference mode

    def initial_state(self, seed: int) -> dict:
        """Pix2pix's initialisation drawn from ``seed`` (numpy), with fresh Adam states."""
        rng = np.random.default_rng(seed)
        g, g_stats = nets.initial_state(nets.generator_layers(self.net), self.net.norm, rng)
        d, d_stats = nets.initial_state(nets.discriminator_layers(self.net), self.net.norm, rng)
        return self.with_optimisers(g, g_stats, d, d_stats)

    def with_optimisers(self, g: dict, g_stats: dict, d: dict, d_stats: dict) -> dict:
        """The networks' arrays (torch's state dict names) with fresh Adam states."""
        g, d = jax.tree.map(jnp.asarray, g), jax.tree.map(jnp.asarray, d)
        return {"g": g, "g_stats": jax.tree.map(jnp.asarray, g_stats), "d": d, "d_stats": jax.tree.map(jnp.asarray, d_stats),
                "opt_g": self.adam.init(g), "opt_d": self.adam.init(d)}

    # -- the recipe's algebra (NHWC; network units) ----------------------------------------------------
    def generate(self, g, stats, cond, key):
        out, stats = nets.generator(self.net, g, stats, cond, train=True, key=key)
        return damp(out, self.optim.damping), stats

    def next_state(self, cond, out):
        """The state at t+k (B, H, W, 3) from cond (B, H, W, Cin) and the network's output."""
        return out if self.ratio is None else cond[..., :3] + out * self.ratio

    def encode_target(self, cond, target):
        return target if self.ratio is None else (target - cond[..., :3]) / self.ratio

    def constrain(self, state, start):
        """u, v, p zero inside the obstacle (start's mask), u and v of the inlet column start's (the torch trainer's constrain)."""
        zero = self.optim.constrain
        if zero is None:
            return state
        inlet = (jnp.arange(state.shape[2]) == 0)[None, None, :, None] & jnp.array([True, True, False])
        state = jnp.where(inlet, start[..., :3], state)
        return jnp.where(start[..., 3:4] > 0, jnp.asarray(zero, state.dtype), state)

    def _adam(self, params, grads, opt_state, lr):
        updates, opt_state = self.adam.update(grads, opt_state, params)
        return jax.tree.map(lambda p, u: p - lr * u, params, updates), opt_state

    def _chain(self, g, stats, cond, start, state, targets, key, first: int):
        """The unrolled chain's L1 terms as a ``lax.scan`` unrolled in full (XLA's CPU backend gives convolutions inside a
        scan's loop body none of its fast kernels: the rolled scan's step was 20 times slower; the generator is compiled
        once per step of the chain instead, the recipe's few): from ``state`` (B, H, W, 3), step n = first, first + 1, ... predicts from the state with
        cond's mask, is scored against its target, and hands on its prediction, constrained, held (detached) or not
        (through). Returns (the steps' L1s (n,), the generator's running stats after them)."""
        o = self.optim
        hold = (lambda x: x) if o.pushforward == "through" else jax.lax.stop_gradient

        def body(carry, xs):
            state_n, stats_n = carry
            target_n, n = xs
            cond_n = jnp.concatenate([state_n, cond[..., 3:]], axis=-1)  # (B, H, W, Cin)
            out_n, stats_n = self.generate(g, stats_n, cond_n, jax.random.fold_in(key, n))
            l1 = jnp.abs(out_n - self.encode_target(cond_n, target_n)).mean()
            return (self.constrain(hold(self.next_state(cond_n, out_n)), start), stats_n), l1

        steps = jnp.arange(first, first + len(targets))
        (_, stats), l1s = jax.lax.scan(body, (state, stats), (jnp.stack(targets), steps), unroll=True)
        return l1s, stats

    def _step(self, state: dict, cond: jax.Array, target: jax.Array, lr: jax.Array, key: jax.Array, steps: int):
        """cond (B, Cin, H, W) and target (B, 3·unroll, H, W), NCHW as the data reads; ``steps`` of the unrolled
        targets enter the loss. Returns the new state and the losses (the torch trainer's names)."""
        o = self.optim
        cond, target = jnp.transpose(cond, (0, 2, 3, 1)), jnp.transpose(target, (0, 2, 3, 1))  # NHWC
        targets = jnp.split(target, o.unroll, axis=-1)[:steps]  # steps × (B, H, W, 3)
        start = cond  # before the noise: the constraints hold the inlet at the clean start's
        if o.noise > 0:  # noise on u, v, p; the mask stays exact
            draw = jax.random.normal(jax.random.fold_in(key, 0), cond[..., :3].shape, cond.dtype)
            cond = jnp.concatenate([cond[..., :3] + o.noise * draw, cond[..., 3:]], axis=-1)
        d, d_stats, opt_d = state["d"], state["d_stats"], state["opt_d"]
        zero = jnp.zeros(())
        if o.gan_weight == 0:  # L1 only: every step, the first included, is one step of the chain
            def l1_loss(g):
                l1s, stats = self._chain(g, state["g_stats"], cond, start, cond[..., :3], targets, key, 1)
                return o.l1_weight * l1s.sum(), (l1s, stats)

            (_, (l1s, g_stats)), grads = jax.value_and_grad(l1_loss, has_aux=True)(state["g"])
            losses = {"loss_d": zero, "loss_g_gan": zero}
        else:
            grads, l1s, g_stats, d, d_stats, opt_d, losses = self._adversarial(state, cond, start, targets, lr, key)
        g, opt_g = self._adam(state["g"], grads, state["opt_g"], lr)
        new = {"g": g, "g_stats": g_stats, "d": d, "d_stats": d_stats, "opt_g": opt_g, "opt_d": opt_d}
        return new, losses | {"loss_l1": l1s[0]} | {f"loss_l1_step{n}": l1s[n - 1] for n in range(2, len(targets) + 1)}

    def _adversarial(self, state: dict, cond, start, targets, lr, key):
        """The adversarial recipe's step: the generator's first forward once (its output feeds D's update and G's loss,
        whose gradient comes back through the saved pullback), D's update, then G's gradient from GAN + λ·L1 against
        the updated D (its weights untouched) and the chain's later steps."""
        o = self.optim
        out, pullback, g_stats = jax.vjp(lambda g: self.generate(g, state["g_stats"], cond, jax.random.fold_in(key, 1)), state["g"],
                                         has_aux=True)
        fake = self.next_state(cond, out)
        d_stats = state["d_stats"]

        def d_loss(d):
            real, stats = nets.discriminator(self.net, d, d_stats, cond, targets[0], train=True)
            fake_logits, stats = nets.discriminator(self.net, d, stats, cond, fake, train=True)
            return 0.5 * (bce(real, 1.0) + bce(fake_logits, 0.0)), stats

        (loss_d, d_stats), d_grads = jax.value_and_grad(d_loss, has_aux=True)(state["d"])
        d, opt_d = self._adam(state["d"], d_grads, state["opt_d"], lr)

        def g_loss(g, out):
            l1 = jnp.abs(out - self.encode_target(cond, targets[0])).mean()
            fake = self.next_state(cond, out)
            logits, stats_d = nets.discriminator(self.net, d, d_stats, cond, fake, train=True)
            gan = bce(logits, 1.0)
            l1s, stats_g = jnp.stack([l1]), g_stats
            if len(targets) > 1:
                held = fake if o.pushforward == "through" else jax.lax.stop_gradient(fake)
                later, stats_g = self._chain(g, g_stats, cond, start, self.constrain(held, start), targets[1:], key, 2)
                l1s = jnp.concatenate([l1s, later])
            return o.l1_weight * l1s.sum() + o.gan_weight * gan, (l1s, gan, stats_g, stats_d)

        (_, (l1s, gan, g_stats, d_stats)), (direct, through_out) = jax.value_and_grad(g_loss, argnums=(0, 1), has_aux=True)(state["g"], out)
        (first,) = pullback(through_out)
        grads = jax.tree.map(jnp.add, direct, first)
        return grads, l1s, g_stats, d, d_stats, opt_d, {"loss_d": loss_d, "loss_g_gan": gan}
