"""The 3DGAN's trainer in JAX (one jitted step): the published four-tape step with optax's RMSprop scaling, over the networks of models.calo.jax.

The profile term is taken in float64, as torch and Keras take it: jax computes in float64 only with x64 enabled,
which the trainer turns on in its process.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from models.calo.jax import Net, discriminator, generator, moved, split
from models.calo.nets import LEARNING_RATE, LOSS_WEIGHTS, POWER, PROFILE_FLOOR, NetConfig, average_decay, initial_weights
from tasks.workloads.calo.workload import CaloData, CaloTrainer

EPSILON = 1e-7  # Keras' fuzz factor: the clip of the probabilities, the floor of the percentage errors' denominators, RMSprop's epsilon


def weighted_loss(outputs, label: jax.Array, energy: jax.Array, angle: jax.Array, ecal: jax.Array) -> jax.Array:
    """The published loss of the discriminator's four heads, each (B, 1): 3 BCE(real/fake) + 0.1 MAPE(energy)
    + 25 MAE(angle) + 0.1 MAPE(deposit sum), with nets.LOSS_WEIGHTS (torch.py's formulas)."""
    p, e, a, s = outputs
    p = jnp.clip(p, EPSILON, 1.0 - EPSILON)
    bce = -(label * jnp.log(p) + (1.0 - label) * jnp.log(1.0 - p)).mean()
    mape = lambda truth, pred: 100.0 * (jnp.abs(truth - pred) / jnp.maximum(jnp.abs(truth), EPSILON)).mean()  # noqa: E731
    lw = LOSS_WEIGHTS
    return lw["real_fake"] * bce + lw["energy"] * mape(energy, e) + lw["angle"] * jnp.abs(angle - a).mean() + lw["ecal_sum"] * mape(ecal, s)


def profile_loss(fake: jax.Array, real: jax.Array, energy: jax.Array) -> jax.Array:
    """The generator's profile term (nets.py, ``profile``; torch.py's formula) in float64; the real side is data."""
    def layers(image):
        return jnp.power(jnp.maximum(image[..., 0].astype(jnp.float64), 0.0), 1.0 / POWER).sum(axis=(1, 2))  # (B, nz)

    made, data = layers(fake), jax.lax.stop_gradient(layers(real))
    made_sum, data_sum = jnp.maximum(made.sum(axis=1, keepdims=True), 1e-30), jnp.maximum(data.sum(axis=1, keepdims=True), 1e-30)
    data_share = data / data_sum
    diff = jnp.concatenate([made / made_sum - data_share, jnp.log(made_sum / data_sum)], axis=1)  # (B, nz + 1)
    scale = jnp.concatenate([jnp.maximum(data_share.mean(axis=0), PROFILE_FLOOR), jnp.ones((1,), jnp.float64)])
    c = energy.astype(jnp.float64).reshape(-1, 1)
    c = c - c.mean()  # the batch's energies about their mean
    level, slope = diff.mean(axis=0), (c * diff).mean(axis=0) / jnp.maximum(jnp.sqrt(jnp.mean(c * c)), 1e-12)
    return ((level ** 2 + slope ** 2) / scale ** 2).mean().astype(fake.dtype)


RMS = optax.scale_by_rms(decay=0.9, eps=EPSILON)  # Keras' RMSprop: v = rho v + (1 - rho) g^2, the step g / sqrt(v + epsilon)


def rmsprop(w: dict, opt: dict, grads: dict, rate: jax.Array) -> tuple[dict, dict]:
    """One RMSprop update at ``rate``; the optimiser's state keeps the rate it took (``rate``)."""
    scaled, rms = RMS.update(grads, opt["rms"])
    return jax.tree.map(lambda p, s: p - rate * s, w, scaled), {"rms": rms, "rate": rate}


def four_tapes(net: Net, s: dict, b: dict, rate: jax.Array, decay: jax.Array, key: jax.Array) -> tuple[dict, dict]:
    """The published step on the trainer's state ``s`` (both networks, their statistics, optimisers and the generator's
    average) and a batch ``b``: D on real images, D on images of G in training mode (no gradient), then two generator
    updates through the frozen D (inference mode: moving statistics, no dropout). -> (the new state, the losses).

    G's images for the second tape come first (D's update does not touch G), so that each network's two updates are
    one body scanned twice: XLA compiles each once, which halves the step's compile time, and computes what the
    four tapes in order would."""
    s = dict(s)
    fake, found = generator(net, s["g"], s["g_stats"], b["latent"][0], True)
    s["g_stats"] = moved(s["g_stats"], found)

    def d_loss(wd, stats, image, label, ecal, k):
        heads, found = discriminator(net, wd, stats, image, True, k)
        return weighted_loss(heads, label, b["energy"], b["angle"], ecal), found

    def d_tape(carry, tape):  # (1) real images, (2) generated ones
        wd, stats, opt = carry
        (loss, found), grads = jax.value_and_grad(d_loss, has_aux=True)(wd, stats, *tape)
        wd, opt = rmsprop(wd, opt, grads, rate)
        return (wd, moved(stats, found), opt), loss

    tapes = (jnp.stack([b["image"], jax.lax.stop_gradient(fake).astype(b["image"].dtype)]), jnp.stack([b["real_label"], b["fake_label"]]),
             jnp.stack([b["ecal"], b["ecal_fit"]]), jnp.stack([jax.random.fold_in(key, 0), jax.random.fold_in(key, 1)]))
    (s["d"], s["d_stats"], s["opt_d"]), loss_d = jax.lax.scan(d_tape, (s["d"], s["d_stats"], s["opt_d"]), tapes)

    def g_loss(wg, stats, latent):
        made, found = generator(net, wg, stats, latent, True)
        heads, _ = discriminator(net, s["d"], s["d_stats"], made, False)
        loss = weighted_loss(heads, jnp.ones_like(b["real_label"]), b["energy"], b["angle"], b["ecal_fit"])
        return (loss + net.cfg.profile * profile_loss(made, b["image"], b["energy"]) if net.cfg.profile else loss), found

    def g_tape(carry, latent):  # (3, 4) G through the frozen D
        wg, stats, opt = carry
        (loss, found), grads = jax.value_and_grad(g_loss, has_aux=True)(wg, stats, latent)
        wg, opt = rmsprop(wg, opt, grads, rate)
        return (wg, moved(stats, found), opt), loss

    (s["g"], s["g_stats"], s["opt_g"]), loss_g = jax.lax.scan(g_tape, (s["g"], s["g_stats"], s["opt_g"]), jnp.stack(b["latent"][1:]))
    if "avg" in s:  # the generator's moving average (nets.average_decay); its statistics copied
        s["avg"] = jax.tree.map(lambda a, p: decay * a + (1.0 - decay) * p, s["avg"], s["g"])
        s["avg_stats"] = s["g_stats"]
    losses = {"loss_d_real": loss_d[0], "loss_d_fake": loss_d[1], "loss_g_first": loss_g[0], "loss_g_second": loss_g[1], "loss_g": loss_g.mean()}
    return s, losses


@functools.cache
def compiled(net: Net):
    """The jitted step, inference, and a calibration pass (the generator's statistics moved by a training-mode pass's
    batch moments), once per process for each ``net`` (a second trainer, as a resumed or a test's fresh one, reuses the
    compiled step). The calibration's update is inside its jit: op by op, a validation's passes took seconds of dispatch."""
    step = jax.jit(functools.partial(four_tapes, net), donate_argnums=(0,))
    generate = jax.jit(lambda w, stats, z: generator(net, w, stats, z, False)[0])
    calibration = jax.jit(lambda w, stats, z, momentum, rest: moved(stats, generator(net, w, stats, z, True)[1], momentum, rest))
    return step, generate, calibration


class CaloJax(CaloTrainer):
    """The calo trainer in JAX: the state one pytree on the runtime's devices (replicated; each batch split over them
    along its batch axis, so the batch norms' moments and the losses are the global batch's), one jitted step."""

    framework = "jax"

    def __init__(self, data: CaloData, spec, batch_size: int, runtime, cfg: NetConfig | None = None):
        jax.config.update("jax_enable_x64", True)  # the float64 heads and moments (see the module); the networks stay float32
        super().__init__(data, spec, batch_size, cfg)  # one process: the whole batch, split over its devices by the step
        self.runtime = runtime
        self.replicated, self.sharded = runtime.ctx.shardings()
        weights = initial_weights(self.cfg, spec.seed)
        (g, g_stats), (d, d_stats) = split(weights["generator"]), split(weights["discriminator"])
        rate = np.float32(LEARNING_RATE)
        s = {"g": g, "g_stats": g_stats, "d": d, "d_stats": d_stats,
             "opt_g": {"rms": RMS.init(g), "rate": rate}, "opt_d": {"rms": RMS.init(d), "rate": rate}}
        if self.cfg.average:  # the generator's moving average, which generates wherever the trainer's showers are scored
            s |= {"avg": g, "avg_stats": g_stats}
        self.s = self._put(s)
        self.updates = 0  # steps taken: the average's decay and each step's dropout draw
        self.speed = {"threads": runtime.threads, "jit": True}
        cpu = runtime.ctx.kind == "cpu"
        self._step, self._generate, self._calibration_pass = compiled(Net(self.cfg, jnp.float64 if cpu else jnp.float32, cpu))
        self._key = jax.random.PRNGKey(spec.seed)

    def _put(self, tree):
        return jax.device_put(jax.tree.map(jnp.asarray, tree), self.replicated)

    def _device(self, batch: dict[str, np.ndarray]) -> dict:
        """The numpy batch on the devices, split along its batch axis (the latent as three (b, latent) arrays: batch first)."""
        return jax.device_put(batch | {"latent": tuple(batch["latent"])}, self.sharded)

    def step(self, batch, flags: list[float], progress: float):
        rate = np.float32(self.rate_at(progress))
        decay = np.float32(average_decay(self.cfg, self.updates) if self.cfg.average else 0.0)
        self.s, losses = self._step(self.s, batch, rate, decay, jax.random.fold_in(self._key, self.updates))
        self.updates += 1
        self.calibrated = False
        return {k: float(v) for k, v in losses.items()}, self.runtime.agree(flags)  # reading the losses waits for the step

    def set_statistics(self, latents: list[np.ndarray]) -> None:
        """The averaged generator's moving statistics: the mean over the calibration batches of each batch norm's
        batch moments, from forward passes in training mode (the momentum n / (n + 1) at batch n of torch.py's)."""
        stats = dict(self.s["avg_stats"])
        for n, latent in enumerate(latents):  # each momentum and its complement rounded to float32 here, as Python floats would be
            momentum = n / (n + 1.0)
            stats = self._calibration_pass(self.s["avg"], stats, jax.device_put(latent, self.replicated), np.float32(momentum), np.float32(1.0 - momentum))
        self.s = self.s | {"avg_stats": stats}

    def _generator(self) -> tuple[dict, dict]:
        """The generator that generates (its weights, its statistics): the moving average where there is one."""
        return (self.s["avg"], self.s["avg_stats"]) if self.cfg.average else (self.s["g"], self.s["g_stats"])

    def generate_images(self, latent: np.ndarray) -> np.ndarray:
        return np.asarray(self._generate(*self._generator(), jax.device_put(latent, self.replicated)), np.float32)

    def live_weights(self) -> dict[str, np.ndarray]:
        """The trained (not averaged) generator's weights in nets.py's layout."""
        return {k: np.asarray(v) for k, v in (self.s["g"] | self.s["g_stats"]).items()}

    def weights(self) -> dict[str, dict[str, np.ndarray]]:
        w, stats = self._generator()
        return {"generator": {k: np.asarray(v) for k, v in (w | stats).items()},
                "discriminator": {k: np.asarray(v) for k, v in (self.s["d"] | self.s["d_stats"]).items()}}

    def rates(self) -> list[float]:
        """The learning rate each optimiser's last update took (generator, discriminator)."""
        return [float(self.s["opt_g"]["rate"]), float(self.s["opt_d"]["rate"])]

    def state(self) -> dict:
        leaves = jax.tree_util.tree_leaves(self.s)
        return {f"{i:04d}": np.asarray(v) for i, v in enumerate(leaves)} | {"updates": np.asarray(self.updates)}

    def load_state(self, state: dict) -> None:
        self.updates = int(state["updates"])
        leaves = [state[k] for k in sorted(state) if k != "updates"]
        self.s = self._put(jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(self.s), leaves))
        self.calibrated = False


def build(data: CaloData, spec, batch_size: int, runtime) -> CaloJax:
    return CaloJax(data, spec, batch_size, runtime)
