"""The Kármán surrogate's step in a plain PyTorch loop, as the pix2pix repository (junyanz/pytorch-CycleGAN-and-pix2pix) writes a model: the U-Net of nested skip-connection blocks, ``set_input`` / ``forward`` / ``backward_G`` / ``optimize_parameters``, torch.optim.Adam stepped by a CosineAnnealingLR.

Written anew here, in that repository's shape: a block is (LeakyReLU, down-convolution, norm) around its inner
block, then (ReLU, up-sampling, norm), its input concatenated before its output; the up-sampling is the recipe's
nearest doubling and 3x3 convolution. Torch's defaults throughout (Adam's for-loop implementation on a CPU,
nn.L1Loss, NCHW). The pairs are held in memory as two tensors and each block's batches are sliced from a
``torch.randperm`` order (as the digits reference does: a DataLoader would collate pair by pair).
"""

import time

import numpy as np
import torch
from torch import nn

from models.schedule import LR_FLOOR
from tasks.workloads.karman.references import arrays, depth_of, recipe_of, unet_order, widths_of  # noqa: F401 (arrays: how the bench reads our side)


class UnetSkipConnectionBlock(nn.Module):
    """One level of the U-Net: down-sample, the inner block, up-sample; the input concatenated before the output
    (not at the outermost level)."""

    def __init__(self, outer_nc: int, inner_nc: int, input_nc: int | None = None, submodule: nn.Module | None = None,
                 outermost: bool = False, innermost: bool = False, tanh: bool = False):
        super().__init__()
        self.outermost = outermost
        downconv = nn.Conv2d(input_nc or outer_nc, inner_nc, kernel_size=4, stride=2, padding=1, bias=False)

        def up(cin: int, bias: bool) -> list[nn.Module]:
            return [nn.ReLU(), nn.Upsample(scale_factor=2, mode="nearest"), nn.Conv2d(cin, outer_nc, kernel_size=3, padding=1, bias=bias)]

        if outermost:
            model = [downconv, submodule, *up(inner_nc * 2, True)] + ([nn.Tanh()] if tanh else [])
        elif innermost:
            model = [nn.LeakyReLU(0.2), downconv, *up(inner_nc, False), nn.BatchNorm2d(outer_nc)]
        else:
            model = [nn.LeakyReLU(0.2), downconv, nn.BatchNorm2d(inner_nc), submodule, *up(inner_nc * 2, False), nn.BatchNorm2d(outer_nc)]
        self.model = nn.Sequential(*model)

    def forward(self, x):
        return self.model(x) if self.outermost else torch.cat([x, self.model(x)], 1)


class UnetGenerator(nn.Module):
    """The U-Net from the innermost block out: widths[i] channels after down-block i."""

    def __init__(self, input_nc: int, output_nc: int, widths: list[int], tanh: bool):
        super().__init__()
        block = UnetSkipConnectionBlock(widths[-2], widths[-1], innermost=True)
        for i in range(len(widths) - 2, 0, -1):
            block = UnetSkipConnectionBlock(widths[i - 1], widths[i], submodule=block)
        self.model = UnetSkipConnectionBlock(output_nc, widths[0], input_nc=input_nc, submodule=block, outermost=True, tanh=tanh)

    def forward(self, x):
        return self.model(x)

    def load(self, weights: dict[str, np.ndarray]) -> None:
        """Our weights (state dict names, the same layouts) into the blocks, layer by layer in their nesting order."""
        layers = [m for m in self.modules() if isinstance(m, (nn.Conv2d, nn.BatchNorm2d))]
        with torch.no_grad():
            for m, (prefix, kind) in zip(layers, unet_order(depth_of(weights)), strict=True):
                parts = ("weight", "bias", "running_mean", "running_var") if kind == "norm" else ("weight", "bias") if m.bias is not None else ("weight",)
                for part in parts:
                    getattr(m, part).copy_(torch.from_numpy(np.ascontiguousarray(weights[f"{prefix}.{part}"])))


class Reference:
    words = ("PyTorch, the pix2pix repository's shape: nested UnetSkipConnectionBlocks (NCHW), set_input / forward / backward_G / "
             "optimize_parameters, torch.optim.Adam with CosineAnnealingLR, nn.L1Loss; pairs sliced from tensors in memory in a torch.randperm order")

    def __init__(self, spec, weights: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray, batch_size: int):
        self.recipe = recipe = recipe_of(spec)
        self.device = torch.device(spec.device)
        depth = depth_of(weights)
        self.netG = UnetGenerator(x.shape[1], 3, widths_of(weights, depth), recipe.output == "tanh")
        self.netG.load(weights)
        self.netG.to(self.device)
        ratio = weights.get("delta_ratio")
        self.delta_ratio = None if ratio is None else torch.from_numpy(ratio).view(1, 3, 1, 1).to(self.device)
        self.optimizer_G = torch.optim.Adam(self.netG.parameters(), lr=recipe.lr, betas=(recipe.beta1, 0.999))
        self.criterionL1 = nn.L1Loss()
        self.x, self.y = torch.from_numpy(x).to(self.device), torch.from_numpy(y).to(self.device)  # (N, 4, H, W), (N, 3·unroll, H, W)
        self.batch_size = batch_size
        self.generator = torch.Generator().manual_seed(spec.seed)

    # -- the model, as the repository's Pix2PixModel splits it ---------------------------------------------------------
    def set_input(self, cond, target) -> None:
        self.real_A, self.real_Bs = cond, target.chunk(self.recipe.unroll, dim=1)  # (B, 4, H, W), unroll × (B, 3, H, W)

    def forward(self, noise: bool = True) -> None:
        """The unrolled chain: each step's input, the network's output and the change it should have output."""
        cond = self.real_A
        if noise and self.recipe.noise > 0:  # u, v, p noised; the mask exact
            cond = torch.cat([cond[:, :3] + self.recipe.noise * torch.randn_like(cond[:, :3]), cond[:, 3:]], dim=1)
        self.fake_Bs, self.wanted = [], []
        state = cond[:, :3]
        for real_B in self.real_Bs:
            step_in = torch.cat([state, cond[:, 3:]], dim=1)
            out = self.netG(step_in)
            self.fake_Bs.append(out)
            self.wanted.append(real_B if self.delta_ratio is None else (real_B - step_in[:, :3]) / self.delta_ratio)
            state = (out if self.delta_ratio is None else step_in[:, :3] + out * self.delta_ratio).detach()  # pushforward, detached

    def generator_loss(self):
        return self.recipe.l1_weight * sum(self.criterionL1(fake, wanted) for fake, wanted in zip(self.fake_Bs, self.wanted))

    def backward_G(self) -> None:
        self.loss_G = self.generator_loss()
        self.loss_G.backward()

    def optimize_parameters(self) -> None:
        self.forward()
        self.optimizer_G.zero_grad()
        self.backward_G()
        self.optimizer_G.step()

    # -- the bench's interface ------------------------------------------------------------------------------------------
    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def train(self, steps: int) -> float:
        self.netG.train()
        for group in self.optimizer_G.param_groups:  # each block is a run of its own: the schedule starts again
            group.pop("initial_lr", None)
            group["lr"] = self.recipe.lr
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(self.optimizer_G, T_max=steps, eta_min=self.recipe.lr * LR_FLOOR)
        self._sync()
        t0 = time.perf_counter()
        order = torch.randperm(len(self.x), generator=self.generator).to(self.device)
        for i in range(steps):
            take = order[i * self.batch_size: (i + 1) * self.batch_size]
            self.set_input(self.x[take], self.y[take])
            self.optimize_parameters()
            scheduler.step()
        self._sync()
        return time.perf_counter() - t0

    @torch.no_grad()
    def loss(self, x: np.ndarray, y: np.ndarray) -> float:
        saved = {k: v.clone() for k, v in self.netG.state_dict().items()}  # batch norm's running statistics move in training mode
        self.netG.train()
        self.set_input(torch.from_numpy(x).to(self.device), torch.from_numpy(y).to(self.device))
        self.forward(noise=False)
        loss = float(self.generator_loss())
        self.netG.load_state_dict(saved)
        return loss


# -- how the bench reads our side -----------------------------------------------------------------------------------------
def ours_weights(trainer) -> dict[str, np.ndarray]:
    """Our generator's state dict as numpy arrays (batch norm's step counters left out) and the recipe's delta_ratio."""
    state = {k: v.detach().cpu().numpy() for k, v in trainer.model.generator.state_dict().items() if not k.endswith("num_batches_tracked")}
    ratio = trainer.data.codec.delta_ratio
    return state | ({} if ratio is None else {"delta_ratio": np.asarray(ratio, np.float32)})


@torch.no_grad()
def ours_loss(trainer, x: np.ndarray, y: np.ndarray) -> float:
    """Our trainer's generator loss of a batch without the input noise: its step's algebra (models.karman.nets.trainer), batch
    norm on the batch's statistics, the running ones put back after."""
    from models.karman.nets.surrogate import damp

    model, o = trainer.model, trainer.model.optim_config
    gen = model.generator
    saved = {k: v.clone() for k, v in gen.state_dict().items()}
    gen.train()
    cond = torch.from_numpy(x).to(trainer.runtime.ctx.device)
    state, total = cond[:, :3], 0.0
    for target in torch.from_numpy(y).to(cond.device).chunk(o.unroll, dim=1):
        step_in = torch.cat([state, cond[:, 3:]], dim=1)
        out = damp(gen(step_in), o.damping)
        total += o.l1_weight * float((out - model.encode_target(step_in, target)).abs().mean())
        state = model.constrain(model.next_state(step_in, out), cond)
    gen.load_state_dict(saved)
    return total
