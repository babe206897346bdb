"""One Pix2Pix optimisation step: discriminator, then generator (GAN + λ·L1), as in the paper."""

import contextlib
import dataclasses
import time
from typing import Callable

import torch
from torch import nn

from models.karman.nets.config import check_cuda_graph
from models.karman.nets.pix2pix import NetConfig, build_discriminator, build_generator, use_gemm_for_small_maps, use_winograd
from models.karman.nets.surrogate import damp
from models.karman.recipe import OptimConfig  # torch-free, shared with the Keras trainer

PHASES = ("forward", "backward", "optimizer")


class PhaseClock:
    """Wall time per phase of the step (forward, backward, optimizer), synchronising the device at each
    boundary so queued work is charged to the phase that queued it."""

    def __init__(self, sync: Callable[[], None]):
        self.sync, self.totals, self._t = sync, dict.fromkeys(PHASES, 0.0), 0.0

    def start(self) -> None:
        self.sync()
        self._t = time.perf_counter()

    def lap(self, phase: str) -> None:
        self.sync()
        now = time.perf_counter()
        self.totals[phase] += now - self._t
        self._t = now


class NoClock(PhaseClock):
    """No boundaries: for lazy devices (XLA), where a sync would cut the step's graph into pieces."""

    def __init__(self):
        super().__init__(lambda: None)

    def start(self) -> None:
        pass

    def lap(self, phase: str) -> None:
        pass


class Pix2Pix(nn.Module):
    """Generator, discriminator and their Adam optimisers. ``generator`` and ``discriminator`` are the
    plain modules (their state is the model); ``distribute`` wraps them for data parallelism."""

    def __init__(self, net: NetConfig, optim: OptimConfig):
        super().__init__()
        self.net_config, self.optim_config = net, optim
        self.generator = build_generator(net)
        self.discriminator = build_discriminator(net)
        self.bce = nn.BCEWithLogitsLoss()
        ratio = optim.delta_ratio
        # (1, 3, 1, 1) on the model's device; not part of the state dict (it is the data's, in meta.json)
        self.register_buffer("delta_ratio", None if ratio is None else torch.tensor(ratio, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
        zero = optim.constrain
        # the constrained state's values inside the obstacle (B, 3, H, W)-broadcastable, on the model's device
        self.register_buffer("zero_inside", None if zero is None else torch.tensor(zero, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
        self._runners: tuple[nn.Module, nn.Module] | None = None  # wrapped nets, outside the state dict
        self.captured: CapturedSteps | None = None  # the step as CUDA graphs (build_trainer's cuda_graph option)
        self.make_optimizers()

    def make_optimizers(self, capturable: bool = False) -> None:
        """(Re)create Adam over the current parameters. Call again after moving the model to a device
        whose tensors cannot share storage with the CPU's (XLA): .to() makes new Parameters there.
        ``capturable``: for a step recorded as a CUDA graph, its learning rate a tensor on the device (a
        schedule changes it in place, which every replay reads)."""
        o = self.optim_config
        lr = torch.tensor(o.lr, device=next(self.generator.parameters()).device) if capturable else o.lr
        kwargs = {"betas": (o.beta1, 0.999), **({"fused": True} if o.fused else {}), **({"capturable": True} if capturable else {})}
        self.opt_g = torch.optim.Adam(self.generator.parameters(), lr=lr, **kwargs)
        self.opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=lr.clone() if capturable else lr, **kwargs)

    def set_lr_factor(self, factor: float) -> None:
        """Both optimisers' learning rate at ``factor`` times the configured one (a schedule's value)."""
        for opt in (self.opt_g, self.opt_d):
            for group in opt.param_groups:
                if isinstance(group["lr"], torch.Tensor):
                    group["lr"].fill_(self.optim_config.lr * factor)
                else:
                    group["lr"] = self.optim_config.lr * factor

    def distribute(self, wrap: Callable[[nn.Module], nn.Module]) -> None:
        """Run the networks through ``wrap`` (DistributedDataParallel, torch.compile, ...)."""
        self._runners = (wrap(self.generator), wrap(self.discriminator))

    def optimizer_state(self) -> dict:
        return {"opt_g": self.opt_g.state_dict(), "opt_d": self.opt_d.state_dict()}

    def load_optimizer_state(self, state: dict) -> None:
        for opt, key in ((self.opt_g, "opt_g"), (self.opt_d, "opt_d")):
            lrs = [group["lr"] for group in opt.param_groups]
            opt.load_state_dict(state[key])
            for group, lr in zip(opt.param_groups, lrs):
                if isinstance(lr, torch.Tensor):  # a captured step's: the loaded rate into the tensor its graphs read
                    group["lr"] = lr.fill_(float(group["lr"]))
        if self.captured is not None:
            self.captured.forget()  # the graphs read the optimiser states that loading replaced

    def train_step(self, cond: torch.Tensor, target: torch.Tensor, autocast, clock: PhaseClock | None = None,
                   steps: int | None = None) -> dict[str, torch.Tensor]:
        """One step (see ``eager_step``): replayed from its CUDA graph where the model has them (``captured``) and
        no clock times its phases, else eagerly."""
        if self.captured is not None and (clock is None or isinstance(clock, NoClock)):
            return self.captured(cond, target, self.optim_config.unroll if steps is None else steps)
        return self.eager_step(cond, target, autocast, clock, steps)

    def eager_step(self, cond: torch.Tensor, target: torch.Tensor, autocast, clock: PhaseClock | None = None,
                   steps: int | None = None) -> dict[str, torch.Tensor]:
        """Update D (if the loss has an adversarial term), then G, on a batch. cond (B, Cin, H, W) is
        the state at t with the mask; target (B, 3·unroll, H, W) the states at t+k, ..., t+unroll·k,
        all in network units; ``steps`` (default: unroll) of them enter the loss (a curriculum's
        shorter loss). Returns detached losses.

        As in the reference implementation, D's weights take no gradient during G's update: the
        generator step back-propagates through D to its input only."""
        o = self.optim_config
        steps = o.unroll if steps is None else steps
        clock = clock or NoClock()
        gen, disc = self._runners or (self.generator, self.discriminator)
        if target.shape[1] != 3 * o.unroll:
            raise ValueError(f"target has {target.shape[1]} channels; unroll {o.unroll} needs {3 * o.unroll} (u, v, p per step)")
        if not 1 <= steps <= o.unroll:
            raise ValueError(f"{steps} loss steps: choose 1 to the unroll, {o.unroll}")
        targets = target.chunk(o.unroll, dim=1)[:steps]  # steps × (B, 3, H, W)
        through = o.pushforward == "through"
        clock.start()
        start = cond  # before the noise: the constraints hold the inlet at the clean start's
        if o.noise > 0:  # (B, 3, H, W) noise on u, v, p; the mask stays exact
            state = cond[:, :3] + o.noise * torch.randn_like(cond[:, :3])
            cond = torch.cat([state, cond[:, 3:]], dim=1)
        # Under DDP a forward decides whether its backward reduces gradients: with an unrolled loss
        # only the last forward's backward does, after the steps' gradients have been summed locally.
        with self._gen_no_sync(gen, steps > 1), autocast():
            out = damp(gen(cond), o.damping)  # (B, Cout, H, W)
        fake = self.next_state(cond, out)  # (B, 3, H, W) the predicted state at t+k
        zero = torch.zeros((), device=cond.device)
        loss_d = loss_gan = zero
        if o.gan_weight > 0:
            # Discriminator: real pairs towards 1, generated pairs towards 0.
            self.opt_d.zero_grad(set_to_none=True)
            with autocast():
                real_logits = disc(cond, targets[0])  # (B, 1, h, w)
                fake_logits = disc(cond, fake.detach())
                loss_d = 0.5 * (
                    self.bce(real_logits.float(), torch.ones_like(real_logits, dtype=torch.float32))
                    + self.bce(fake_logits.float(), torch.zeros_like(fake_logits, dtype=torch.float32))
                )
            clock.lap("forward")
            loss_d.backward()
            clock.lap("backward")
            self.opt_d.step()
            clock.lap("optimizer")
        # Generator: stay close to the target (and fool the updated discriminator).
        self.opt_g.zero_grad(set_to_none=True)
        no_sync = disc.no_sync() if hasattr(disc, "no_sync") else contextlib.nullcontext()
        self.discriminator.requires_grad_(False)
        try:
            with no_sync:  # D takes no gradient here, so DDP has nothing of D's to reduce
                with autocast():
                    loss_l1 = (out.float() - self.encode_target(cond, targets[0]).float()).abs().mean()
                    loss_g = o.l1_weight * loss_l1
                    if o.gan_weight > 0:
                        fake_logits = disc(cond, fake)
                        loss_gan = self.bce(fake_logits.float(), torch.ones_like(fake_logits, dtype=torch.float32))
                        loss_g = loss_g + o.gan_weight * loss_gan
                clock.lap("forward")
                if not through:
                    loss_g.backward()
                    clock.lap("backward")
        finally:
            self.discriminator.requires_grad_(True)
        losses = {"loss_d": loss_d.detach(), "loss_g_gan": loss_gan.detach(), "loss_l1": loss_l1.detach()}
        # Pushforward: predict again from the network's own prediction (with the mask), so training
        # sees the inputs a rollout produces; each step is scored against the reference. Detached,
        # each step's loss is back-propagated at once; through, the chain's summed loss at the end.
        state = self.constrain(fake if through else fake.detach(), start)
        for n, target_n in enumerate(targets[1:], start=2):
            cond_n = torch.cat([state, cond[:, 3:]], dim=1)  # (B, Cin, H, W)
            with self._gen_no_sync(gen, n < steps):
                with autocast():
                    out_n = damp(gen(cond_n), o.damping)
                    loss_n = (out_n.float() - self.encode_target(cond_n, target_n).float()).abs().mean()
                clock.lap("forward")
                if through:
                    loss_g = loss_g + o.l1_weight * loss_n
                else:
                    (o.l1_weight * loss_n).backward()
            clock.lap("backward")
            losses[f"loss_l1_step{n}"] = loss_n.detach()
            state = self.next_state(cond_n, out_n)
            state = self.constrain(state if through else state.detach(), start)
        if through:
            loss_g.backward()
            clock.lap("backward")
        self.opt_g.step()
        clock.lap("optimizer")
        return losses

    @staticmethod
    def _gen_no_sync(gen: nn.Module, skip: bool):
        return gen.no_sync() if skip and hasattr(gen, "no_sync") else contextlib.nullcontext()

    def next_state(self, cond: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The state at t+k (B, 3, H, W) in network units from the state at t (cond, with the mask)
        and the network's output: the output itself, or the current state plus the decoded change."""
        if self.delta_ratio is None:
            return out
        return cond[:, :3] + out * self.delta_ratio.to(out.dtype)

    def constrain(self, state: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """A predicted state (B, 3, H, W) with the recipe's constraints imposed, as a rollout imposes them: u, v
        and p zero inside the obstacle (the mask of ``start``, the chain's first input), u and v of the inlet
        column those of ``start``. Unconstrained recipes: the state as it is."""
        zero = self.optim_config.constrain
        if zero is None:
            return state
        inlet = torch.zeros((1, 3, 1, state.shape[-1]), dtype=torch.bool, device=state.device)
        inlet[:, :2, :, 0] = True
        state = torch.where(inlet, start[:, :3].to(state.dtype), state)
        return torch.where(start[:, 3:4] > 0, self.zero_inside.to(state.dtype), state)

    def encode_target(self, cond: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """What the network should output for a target state (B, 3, H, W) in network units: the state
        itself, or its change from cond in units of the change's RMS (noise on cond included)."""
        if self.delta_ratio is None:
            return target
        return (target - cond[:, :3]) / self.delta_ratio


class CapturedSteps:
    """Pix2Pix's step recorded as CUDA graphs and replayed: one graph per loss-step count and batch shape, recorded
    after three warm-up steps on a side stream (cuDNN's benchmark and the optimisers' lazy state happen there), whose
    updates are then undone (weights, batch-norm statistics and optimiser states put back as they were), so that
    training takes exactly the steps it asks for. A replay launches the whole step, both updates included, at once:
    no Python between the kernels and no gaps between their launches, which at small batches or small images are
    most of an eager step's time on a GPU. The batch is copied into the graph's own input tensors; the losses come
    back as copies. The networks' random draws (dropout, input noise) come from torch's generator, which graphs
    advance at each replay."""

    WARMUP = 3

    def __init__(self, model: "Pix2Pix", precision: str):
        self.model = model
        # autocast's cache of cast weights must be off while a graph records (the graph would keep stale casts)
        self.autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False)) if precision == "bf16" else contextlib.nullcontext
        self.graphs: dict[tuple, tuple] = {}

    def forget(self) -> None:
        """Drop the recorded graphs (the optimiser's state tensors were replaced): the next step records again."""
        self.graphs.clear()

    def __call__(self, cond: torch.Tensor, target: torch.Tensor, steps: int) -> dict[str, torch.Tensor]:
        key = (steps, tuple(cond.shape), cond.stride(), tuple(target.shape), target.stride(), cond.dtype)
        graph, inputs, losses = self.graphs.get(key) or self._record(key, cond, target, steps)
        inputs[0].copy_(cond)
        inputs[1].copy_(target)
        graph.replay()
        return {k: v.clone() for k, v in losses.items()}

    def _state(self) -> list[torch.Tensor]:
        m = self.model
        tensors = list(m.parameters()) + list(m.buffers())
        for opt in (m.opt_g, m.opt_d):
            tensors += [t for state in opt.state.values() for t in state.values() if isinstance(t, torch.Tensor)]
        return tensors

    @torch.no_grad()
    def _restore(self, saved: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Every tensor of the model and its optimisers back to ``saved``; optimiser state the warm-up created
        (a first step's moments and count) back to zero, as before any step."""
        for t in self._state():
            if id(t) in saved:
                t.copy_(saved[id(t)][1])
            else:
                t.zero_()

    def _record(self, key: tuple, cond: torch.Tensor, target: torch.Tensor, steps: int) -> tuple:
        inputs = (cond.clone(), target.clone())
        with torch.no_grad():
            saved = {id(t): (t, t.detach().clone()) for t in self._state()}
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.WARMUP):
                self.model.eager_step(*inputs, self.autocast, None, steps)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            losses = self.model.eager_step(*inputs, self.autocast, None, steps)
        self._restore(saved)
        self.graphs[key] = entry = (graph, inputs, losses)
        return entry


def speed_options(device: str, precision: str = "fp32", channels_last: str = "auto", compile: str = "auto",
                  winograd: str = "auto", cuda_graph: str = "auto") -> dict:
    """The trainer's speed choices for a device kind; ``channels_last``, ``compile``, ``winograd`` and
    ``cuda_graph`` ("auto", "on", "off") override the device's default."""
    options = _default_options(device)
    check_cuda_graph(cuda_graph, device)
    for name, choice in (("channels_last", channels_last), ("compile", compile), ("winograd", winograd), ("cuda_graph", cuda_graph)):
        if choice not in ("auto", "on", "off"):
            raise ValueError(f"unknown {name} choice {choice!r}; choose auto, on or off")
        if choice != "auto":
            options[name] = choice == "on"
    return options | {"precision": precision}


def _default_options(device: str) -> dict:
    if device == "cpu":
        # Measured on a 2-core AVX2 CPU: channels_last and torch.compile were slower than eager, bf16
        # has no hardware support there; fused Adam, matrix products for the U-Net's tiny inner
        # maps and Winograd for the PatchGAN's stride-1 layer were faster.
        return {"fused_adam": True, "gemm_max_side": 8, "winograd": True, "channels_last": False, "compile": False, "cuda_graph": False}
    if device == "cuda":
        # Measured on an H200 (docs/accelerator.md), Pix2Pix at paper size and batch 16: torch.compile's step kept
        # the GPU busy 40 % of its time (the rest Python and launches) and ran slower than the eager step, after
        # a compilation every run pays; the step recorded as CUDA graphs ran 1.4x the eager one.
        return {"fused_adam": True, "gemm_max_side": 0, "winograd": False, "channels_last": True, "compile": False, "cuda_graph": True}
    return {"fused_adam": False, "gemm_max_side": 0, "winograd": False, "channels_last": False, "compile": False, "cuda_graph": False}


def build_trainer(net, optim, ctx, options: dict):
    """A Pix2Pix on ``ctx.device`` with the given speed options applied (see speed_options)."""
    model = Pix2Pix(net, dataclasses.replace(optim, fused=options["fused_adam"]))
    use_gemm_for_small_maps(model.generator, options["gemm_max_side"])
    use_winograd(model.discriminator, enabled=options["winograd"])
    model = model.to(ctx.device)
    if options["channels_last"]:
        model = model.to(memory_format=torch.channels_last)
    captured = options.get("cuda_graph", False) and ctx.wrap is None  # one process: DDP's hooks reduce outside any graph
    model.make_optimizers(capturable=captured)
    if captured:
        model.captured = CapturedSteps(model, options["precision"])
    wrappers = []
    if ctx.wrap is not None:
        wrappers.append(ctx.wrap)
    if options["compile"]:
        wrappers.append(torch.compile)
    if wrappers:
        def wrap(module):
            for w in wrappers:
                module = w(module)
            return module
        model.distribute(wrap)
    return model
