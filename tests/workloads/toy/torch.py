"""The toy test workload in PyTorch: an MLP's batches, step, state and evaluation for the training loop, and its weights as an artifact."""

import numpy as np
import torch
from torch import nn

from tasks.common.runtimes.data import epoch_order
from tests.workloads.toy.workload import TARGET_ACCURACY, ToyData, flops_per_sample


class ToyTorch:
    def __init__(self, data: ToyData, spec, batch_size: int, runtime):
        self.data, self.spec, self.batch_size, self.runtime = data, spec, batch_size, runtime
        torch.manual_seed(spec.seed)  # the same initial weights on every rank
        self.net = nn.Sequential(nn.Linear(2, spec.options.hidden), nn.Tanh(), nn.Linear(spec.options.hidden, 2)).to(runtime.ctx.device)
        self.run_net = runtime.ctx.wrap(self.net) if runtime.ctx.wrap else self.net
        self.opt = torch.optim.SGD(self.net.parameters(), lr=0.2)
        self.samples = len(data.y["train"])
        self.has_validation = True
        self.headline = {"accuracy": "accuracy"}
        self.flops_per_sample = flops_per_sample(spec.options.hidden)
        self.params = {"hidden_units": spec.options.hidden, "parameters": sum(p.numel() for p in self.net.parameters())}
        self.speed = {}

    def batches(self, epoch: int, steps: int):
        ctx, b = self.runtime.ctx, self.batch_size
        local = b // ctx.world_size
        order = epoch_order(self.samples, self.spec.seed, epoch)
        for s in range(steps):
            take = order[s * b: (s + 1) * b][ctx.rank * local: (ctx.rank + 1) * local]
            yield (torch.from_numpy(self.data.x["train"][take]).to(ctx.device),  # (b, 2)
                   torch.from_numpy(self.data.y["train"][take]).to(ctx.device))  # (b,)

    def step(self, batch, flags: list[float], progress: float):
        x, y = batch
        self.opt.zero_grad()
        loss = nn.functional.cross_entropy(self.run_net(x), y)
        loss.backward()
        self.opt.step()
        return self.runtime.reduce({"loss_ce": loss.detach()}, flags)

    def learning_rate(self) -> float:
        return self.opt.param_groups[0]["lr"]

    def epoch_metrics(self) -> dict:
        return {}

    def state(self) -> dict:
        return {"net": self.net.state_dict(), "opt": self.opt.state_dict()}

    def load_state(self, state: dict) -> None:
        self.net.load_state_dict(state["net"])
        self.opt.load_state_dict(state["opt"])

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        x = torch.from_numpy(self.data.x["val"]).to(self.runtime.ctx.device)
        predicted = self.net(x).argmax(1).cpu().numpy()
        return {"accuracy": float(np.mean(predicted == self.data.y["val"]))}

    def reached(self, scores: dict[str, float]) -> bool:
        return scores["accuracy"] >= TARGET_ACCURACY

    def finish(self, run_dir, run, settings) -> None:
        (run_dir / "model").mkdir(exist_ok=True)
        torch.save(self.net.state_dict(), run_dir / "model" / "mlp.pt")
        run.log_artifact(run_dir / "model", "model")


def build(data: ToyData, spec, batch_size: int, runtime) -> ToyTorch:
    return ToyTorch(data, spec, batch_size, runtime)
