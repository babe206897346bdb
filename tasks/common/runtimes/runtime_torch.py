"""PyTorch as the training loop's runtime: the device (cpu, cuda under DDP, xla under SPMD), the collective that agrees, seeding, checkpoint files, memory."""

from pathlib import Path

import torch

from models.device import DeviceContext, keep_freed_memory, resolve_device, to_cpu
from models.host import host_peak_memory_mb
from tasks.common.config.errors import UserError
from tasks.common.runtimes.checkpoint import load_torch, save_torch
from tasks.common.config.frameworks import FRAMEWORKS, DeviceRuntime



class TorchRuntime(DeviceRuntime):
    """torch on one device kind, data-parallel where the launch made several ranks."""

    framework = "torch"
    version = torch.__version__
    checkpoint = FRAMEWORKS["torch"].checkpoint

    def __init__(self, device: str, precision: str = "fp32", threads: int | None = None, data_parallel: bool = True):
        if threads:
            torch.set_num_threads(threads)
        self.ctx: DeviceContext = resolve_device(device, precision, data_parallel=data_parallel)
        self.threads = torch.get_num_threads() if device == "cpu" else None
        # A training process runs one job: its heap may keep freed memory (no per-step page faults).
        self.keeps_freed_memory = keep_freed_memory() if device == "cpu" else False
        self._compiled = self._xla_compilations()[0] if self.ctx.kind == "xla" else 0

    @property
    def strategy(self) -> str:
        return self.ctx.strategy

    def reduce(self, losses: dict[str, torch.Tensor], flags: list[float]) -> tuple[dict[str, float], list[float]]:
        """The losses and ``flags`` averaged over the ranks in one collective (the device's work waits for it)."""
        names = sorted(losses)
        first = losses[names[0]]
        agreed = [torch.full_like(first, x, dtype=torch.float32) for x in flags]
        reduced = self.ctx.mean_over_ranks(torch.stack([losses[k].float() for k in names] + agreed)).tolist()
        return dict(zip(names, reduced[: len(names)])), reduced[len(names):]

    def agree(self, values: list[float]) -> list[float]:
        return self.ctx.mean_over_ranks(torch.tensor(values, dtype=torch.float32, device=self.ctx.device)).tolist()

    def seed_epoch(self, seed: int, epoch: int) -> None:
        """This epoch's randomness on this rank (dropout, noise), independent of what ran before."""
        from tasks.common.runtimes.data import epoch_seed

        value = epoch_seed(seed, epoch, self.ctx.rank)
        torch.manual_seed(value)
        if self.ctx.kind == "xla":
            import torch_xla.core.xla_model as xm

            xm.set_rng_state(value, device=self.ctx.device)

    def save(self, state: dict, path: Path) -> None:
        """Write atomically: a crash mid-write leaves the previous checkpoint in place."""
        save_torch(to_cpu(state), path)

    def load(self, path: Path) -> dict:
        """The checkpoint's contents; UserError naming the file and what is wrong if it does not load or is not ours."""
        state = load_torch(path)
        missing = {"model", "history"} - set(state) if isinstance(state, dict) else {"everything"}
        if missing:
            raise UserError(f"checkpoint {path} is not a training checkpoint (missing {', '.join(sorted(missing))})")
        return state

    def epoch_metrics(self, first: bool) -> dict[str, float]:
        metrics = {"peak_memory_mb": torch.cuda.max_memory_allocated(self.ctx.device) / 2**20 if self.ctx.kind == "cuda" else host_peak_memory_mb()}
        if self.ctx.kind == "xla":
            compiled, compile_s = self._xla_compilations()
            metrics |= {"xla_compilations": compiled, "xla_compile_s": compile_s}
            if not first and compiled > self._compiled:
                import logging

                logging.getLogger("karman.train").warning("%d new XLA graphs compiled after warm-up: some shape or branch keeps changing",
                                                          compiled - self._compiled)
            self._compiled = compiled
        return metrics

    @staticmethod
    def _xla_compilations() -> tuple[int, float]:
        """(graphs compiled so far, seconds spent compiling) in this process."""
        import torch_xla.debug.metrics as met

        data = met.metric_data("CompileTime")
        return (int(data[0]), data[1] / 1e9) if data else (0, 0.0)

    def close(self) -> None:
        self.ctx.close()


def open_runtime(plan) -> TorchRuntime:
    """The plan's device for this rank (torchrun's environment says which)."""
    return TorchRuntime(plan.spec.device, plan.spec.precision, plan.threads)
