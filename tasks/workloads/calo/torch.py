"""The 3DGAN's trainer in PyTorch: the published four-tape step, its losses and Keras' RMSprop, over the networks of models.calo.torch."""

import copy
import time

import numpy as np
import torch

from models.calo.nets import BN_MOMENTUM, LEARNING_RATE, LOSS_WEIGHTS, POWER, PROFILE_FLOOR, NetConfig, average_decay, initial_weights
from models.calo.torch import DEPTH_BLOCKS, BatchNorm, Generator, build_networks
from tasks.workloads.calo.workload import CaloData, CaloTrainer


EPSILON = 1e-7  # Keras' fuzz factor: the clip of the probabilities and the floor of the percentage errors' denominators


def weighted_loss(outputs, label: torch.Tensor, energy: torch.Tensor, angle: torch.Tensor, ecal: torch.Tensor) -> torch.Tensor:
    """The published loss of the discriminator's four heads, each (B, 1): 3 BCE(real/fake) + 0.1 MAPE(energy)
    + 25 MAE(angle) + 0.1 MAPE(deposit sum), with nets.LOSS_WEIGHTS."""
    p, e, a, s = (o.to(label.dtype) for o in outputs)  # fp32 (or the test's fp64) out of a bf16 autocast
    p = p.clamp(EPSILON, 1.0 - EPSILON)
    bce = -(label * torch.log(p) + (1.0 - label) * torch.log(1.0 - p)).mean()
    mape = lambda truth, pred: 100.0 * ((truth - pred).abs() / truth.abs().clamp(min=EPSILON)).mean()  # noqa: E731
    w = LOSS_WEIGHTS
    return w["real_fake"] * bce + w["energy"] * mape(energy, e) + w["angle"] * (angle - a).abs().mean() + w["ecal_sum"] * mape(ecal, s)


def profile_loss(fake: torch.Tensor, real: torch.Tensor, energy: torch.Tensor) -> torch.Tensor:
    """The generator's profile term (nets.py, ``profile``) of generated and real images (B, 51, 51, 25, 1) as
    deposits^POWER of the same conditions, energy labels (B, 1), in float64 like the weightless heads; the real side is data."""
    def layers(image: torch.Tensor) -> torch.Tensor:
        return image[..., 0].double().clamp(min=0.0).pow(1.0 / POWER).sum(dim=(1, 2))  # (B, nz)

    made, data = layers(fake), layers(real).detach()
    made_sum, data_sum = made.sum(dim=1, keepdim=True).clamp(min=1e-30), data.sum(dim=1, keepdim=True).clamp(min=1e-30)
    data_share = data / data_sum
    # per shower against the real one of its conditions: each layer's share of the sum, then the log of the sums' ratio
    diff = torch.cat([made / made_sum - data_share, (made_sum / data_sum).log()], dim=1)  # (B, nz + 1)
    scale = torch.cat([data_share.mean(dim=0).clamp(min=PROFILE_FLOOR), data_share.new_ones(1)])
    c = energy.double().reshape(-1, 1)
    c = c - c.mean()  # the batch's energies about their mean
    level, slope = diff.mean(dim=0), (c * diff).mean(dim=0) / c.pow(2).mean().sqrt().clamp(min=1e-12)
    return ((level ** 2 + slope ** 2) / scale ** 2).mean().to(fake.dtype)


class RMSprop:
    """Keras' RMSprop (no momentum, not centred): v = rho v + (1 - rho) g^2; w -= lr g / sqrt(v + epsilon)."""

    def __init__(self, params, lr: float = LEARNING_RATE, rho: float = 0.9, epsilon: float = EPSILON):
        self.params, self.lr, self.rho, self.epsilon = list(params), lr, rho, epsilon
        self.velocity = [torch.zeros_like(p) for p in self.params]

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        for p, v in zip(self.params, self.velocity):
            v.mul_(self.rho).addcmul_(p.grad, p.grad, value=1.0 - self.rho)
            p.sub_(self.lr * p.grad / (v + self.epsilon).sqrt())

    def state_dict(self) -> dict:
        return {"velocity": list(self.velocity)}

    def load_state_dict(self, state: dict) -> None:
        for v, saved in zip(self.velocity, state["velocity"]):
            v.copy_(saved)


class CaloTorch(CaloTrainer):
    framework = "torch"

    def __init__(self, data: CaloData, spec, batch_size: int, runtime, cfg: NetConfig | None = None):
        ctx = runtime.ctx
        super().__init__(data, spec, batch_size, cfg, ctx.rank, ctx.world_size if ctx.strategy == "ddp" else 1)  # this rank's share of each batch
        self.runtime = runtime
        self.g, self.d = build_networks(self.cfg, initial_weights(self.cfg, spec.seed))
        self.g.to(ctx.device), self.d.to(ctx.device)
        for bn in (m for net in (self.g, self.d) for m in net.modules() if isinstance(m, BatchNorm)):
            bn.moments = torch.float64 if ctx.kind == "cpu" else torch.float32  # see BatchNorm
        for layers in (self.g.layers, self.d.layers):
            layers.depth_block, layers.channels_last = DEPTH_BLOCKS.get(ctx.kind, (0, False))
        # the generator's moving average (nets.average_decay), which generates wherever the trainer's showers are scored
        self.g_avg = copy.deepcopy(self.g).requires_grad_(False).eval() if self.cfg.average else None
        self.averaged = 0
        self.opt_g, self.opt_d = RMSprop(self.g.parameters()), RMSprop(self.d.parameters())
        self.speed = {"threads": runtime.threads, "precision": spec.precision}
        self._sections: dict[str, float] | None = None
        self._last = 0.0

    def _device(self, batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        dtype = self.d.fake.weight.dtype  # float32 (a float64 network in the tests)
        return {k: torch.from_numpy(v).to(self.runtime.ctx.device, dtype) for k, v in batch.items()}

    def _mark(self, section: str) -> None:
        """While step_shares times the step: the time since the last mark goes to ``section`` (the device waited for)."""
        if self._sections is not None:
            self.runtime.ctx.sync()
            now = time.perf_counter()
            self._sections[section] = self._sections.get(section, 0.0) + now - self._last
            self._last = now

    def _update(self, loss: torch.Tensor, opt: RMSprop) -> None:
        self._mark("forward")
        opt.zero_grad()
        loss.backward()
        self._mark("backward")
        if self.world > 1:
            self._mean_gradients(opt.params)
            self._mark("allreduce")
        opt.step()
        self._mark("optimizer")

    def _mean_gradients(self, params: list[torch.Tensor]) -> None:
        """Each gradient averaged over the ranks in one all-reduce (the ranks' shares are equal, so this is the
        gradient of the global batch's mean loss): every rank then takes the same optimiser step.

        Not DistributedDataParallel: a step calls D four times and G three, two of D's calls frozen inside G's
        updates, which DDP's one-forward-one-backward bookkeeping does not follow; and one explicit all-reduce per
        update is what the step's profile times apart (step_shares' ``allreduce``)."""
        grads = [p.grad for p in params]
        flat = self.runtime.ctx.mean_over_ranks(torch.cat([g.reshape(-1) for g in grads]))
        for g, mean in zip(grads, flat.split([g.numel() for g in grads])):
            g.copy_(mean.view_as(g))

    def step(self, batch, flags: list[float], progress: float):
        """The four tapes: D on real images, D on generated ones (G in training mode, no gradient), then two
        generator updates through the frozen D (inference mode: batch norm from its moving statistics, no dropout)."""
        b, ctx = batch, self.runtime.ctx
        self.opt_g.lr = self.opt_d.lr = self.rate_at(progress)
        self.g.train(), self.d.train()
        with ctx.autocast():
            loss_real = weighted_loss(self.d(b["image"]), b["real_label"], b["energy"], b["angle"], b["ecal"])
        self._update(loss_real, self.opt_d)
        with torch.no_grad(), ctx.autocast():
            fake = self.g(b["latent"][0])  # (B, 51, 51, 25, 1)
        with ctx.autocast():
            loss_fake = weighted_loss(self.d(fake.to(b["image"].dtype)), b["fake_label"], b["energy"], b["angle"], b["ecal_fit"])
        self._update(loss_fake, self.opt_d)
        self.d.eval()
        self.d.requires_grad_(False)
        try:
            loss_g = []
            for latent in (b["latent"][1], b["latent"][2]):
                with ctx.autocast():
                    fake = self.g(latent)
                    loss = weighted_loss(self.d(fake), torch.ones_like(b["real_label"]), b["energy"], b["angle"], b["ecal_fit"])
                    loss_g.append(loss + self.cfg.profile * profile_loss(fake, b["image"], b["energy"]) if self.cfg.profile else loss)
                self._update(loss_g[-1], self.opt_g)
        finally:
            self.d.requires_grad_(True)
        self._average()
        self.calibrated = False
        ctx.step_end()
        losses = {"loss_d_real": loss_real.detach(), "loss_d_fake": loss_fake.detach(), "loss_g_first": loss_g[0].detach(),
                  "loss_g_second": loss_g[1].detach(), "loss_g": (loss_g[0].detach() + loss_g[1].detach()) / 2}
        return self.runtime.reduce(losses, flags)

    @torch.no_grad()
    def _average(self) -> None:
        if self.g_avg is None:
            return
        decay = average_decay(self.cfg, self.averaged)
        self.averaged += 1
        for avg, p in zip(self.g_avg.parameters(), self.g.parameters()):
            avg.lerp_(p, 1.0 - decay)
        for avg, b in zip(self.g_avg.buffers(), self.g.buffers()):
            avg.copy_(b)

    @torch.no_grad()
    def set_statistics(self, latents: list[np.ndarray]) -> None:
        """The averaged generator's moving statistics: the running mean of each calibration batch's moments (momentum
        n / (n + 1) at batch n), its forward passes in training mode."""
        g, dtype = self.g_avg, self.d.fake.weight.dtype
        norms = [m for m in g.modules() if isinstance(m, BatchNorm)]
        g.train()
        try:
            for n, latent in enumerate(latents):
                for bn in norms:
                    bn.momentum = n / (n + 1.0)
                with self.runtime.ctx.autocast():
                    g(torch.from_numpy(latent).to(self.runtime.ctx.device, dtype))
        finally:
            for bn in norms:
                bn.momentum = BN_MOMENTUM
            g.eval()

    @property
    def generator(self) -> Generator:
        """The generator that generates: the moving average where there is one."""
        return self.g if self.g_avg is None else self.g_avg

    @torch.no_grad()
    def generate_images(self, latent: np.ndarray) -> np.ndarray:
        g = self.generator
        was_training = g.training
        g.eval()
        try:
            with self.runtime.ctx.autocast():
                return g(torch.from_numpy(latent).to(self.runtime.ctx.device, self.d.fake.weight.dtype)).float().cpu().numpy()
        finally:
            g.train(was_training)

    def weights(self) -> dict[str, dict[str, np.ndarray]]:
        return {"generator": self.generator.weights(), "discriminator": self.d.weights()}

    def state(self) -> dict:
        state = {"g": self.g.state_dict(), "d": self.d.state_dict(), "opt_g": self.opt_g.state_dict(), "opt_d": self.opt_d.state_dict()}
        if self.g_avg is not None:
            state |= {"g_avg": self.g_avg.state_dict(), "averaged": self.averaged}
        return state

    def load_state(self, state: dict) -> None:
        self.g.load_state_dict(state["g"]), self.d.load_state_dict(state["d"])
        self.opt_g.load_state_dict(state["opt_g"]), self.opt_d.load_state_dict(state["opt_d"])
        if self.g_avg is not None:
            self.g_avg.load_state_dict(state["g_avg"])
            self.averaged = int(state["averaged"])
        self.calibrated = False


def step_shares(trainer: CaloTorch, steps: int = 3) -> dict[str, float]:
    """Where a step's time goes: the fractions of ``steps`` steps' wall time (after one warm-up step) spent on
    input (the numpy batch and its copy to the device), forward passes (with the losses), backward passes, the
    gradients' all-reduce (over DDP ranks only), optimizer updates and the rest (the losses read back), timed section by section with the device waited for at each boundary (which costs a
    little overlap on an accelerator), and the mean step time in seconds."""
    batches = trainer.batches(1, steps + 1)
    trainer.step(next(batches), [0.0] * 3, 0.0)
    trainer._sections = {}
    try:
        t0 = trainer._last = time.perf_counter()
        for _ in range(steps):
            batch = next(batches)
            trainer._mark("input")
            trainer.step(batch, [0.0] * 3, 0.0)
            trainer._mark("other")  # the losses read back, the runtime's agreement
        total = trainer._last - t0  # to the last mark: the sections add up to it exactly
        shares = {k: v / total for k, v in trainer._sections.items()}
    finally:
        trainer._sections = None
    return {**shares, "step_s": total / steps}


def build(data: CaloData, spec, batch_size: int, runtime) -> CaloTorch:
    return CaloTorch(data, spec, batch_size, runtime)
