"""A classifier's trainer in PyTorch, for any workload's network.

On classifier.py: mean cross-entropy and one optimiser step per batch (DDP where the runtime wraps the network),
logits for scoring, the weights and the checkpoint state."""

import numpy as np
import torch
import torch.nn.functional as F

from tasks.common.runtimes.classifier import Classifier


class TorchClassifier(Classifier):
    """The workload's trainer sets ``net`` (a module with ``weights()`` in the workload's numpy layout) through ``_place``, and ``opt``."""

    framework = "torch"

    @staticmethod
    def share(runtime) -> tuple[int, int]:
        """(this rank, the ranks each global batch is split over): every DDP rank takes its share; SPMD splits on the device."""
        ctx = runtime.ctx
        return ctx.rank, ctx.world_size if ctx.strategy == "ddp" else 1

    def _place(self, runtime, net: torch.nn.Module) -> None:
        ctx = runtime.ctx
        self.runtime, self.net = runtime, net.to(ctx.device)
        self.run_net = ctx.wrap(self.net) if ctx.wrap else self.net  # DDP: the ranks' gradients averaged in the backward pass
        self.speed = {"threads": runtime.threads, "precision": self.spec.precision}

    def _device(self, x: np.ndarray, y: np.ndarray):
        ctx = self.runtime.ctx
        return ctx.shard(torch.from_numpy(x).to(ctx.device)), ctx.shard(torch.from_numpy(y).to(ctx.device))  # (b, ...), (b,)

    def step(self, batch, flags: list[float], progress: float):
        x, y = batch
        self.opt.zero_grad(set_to_none=True)
        with self.runtime.ctx.autocast():
            loss = F.cross_entropy(self.run_net(x).float(), y)
        loss.backward()
        self.opt.step()
        self.runtime.ctx.step_end()
        return self.runtime.reduce({"loss_ce": loss.detach()}, flags)

    @torch.no_grad()
    def logits(self, x: np.ndarray) -> np.ndarray:
        with self.runtime.ctx.autocast():
            return self.net(torch.from_numpy(x).to(self.runtime.ctx.device)).float().cpu().numpy()

    def weights(self) -> dict[str, np.ndarray]:
        return self.net.weights()

    def state(self) -> dict:
        return {"net": self.net.state_dict(), "opt": self.opt.state_dict()}

    def load_state(self, state: dict) -> None:
        self.net.load_state_dict(state["net"])
        self.opt.load_state_dict(state["opt"])
