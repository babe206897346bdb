"""One Pix2Pix optimisation step: discriminator, then generator (GAN + λ·L1), as in the paper."""

from dataclasses import dataclass

import torch
from torch import nn

from models.nets.pix2pix import NetConfig, build_discriminator, build_generator


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 2e-4
    beta1: float = 0.5
    l1_weight: float = 100.0


class Pix2Pix(nn.Module):
    """Generator, discriminator and their Adam optimisers."""

    def __init__(self, net: NetConfig, optim: OptimConfig):
        super().__init__()
        self.net_config, self.optim_config = net, optim
        self.generator = build_generator(net)
        self.discriminator = build_discriminator(net)
        betas = (optim.beta1, 0.999)
        self.opt_g = torch.optim.Adam(self.generator.parameters(), lr=optim.lr, betas=betas)
        self.opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=optim.lr, betas=betas)
        self.bce = nn.BCEWithLogitsLoss()

    def train_step(self, cond: torch.Tensor, target: torch.Tensor, autocast) -> dict[str, torch.Tensor]:
        """Update D then G on a batch; cond (B, Cin, H, W), target (B, Cout, H, W). Returns detached losses."""
        with autocast():
            fake = self.generator(cond)
        # Discriminator: real pairs towards 1, generated pairs towards 0.
        self.opt_d.zero_grad(set_to_none=True)
        with autocast():
            real_logits = self.discriminator(cond, target)
            fake_logits = self.discriminator(cond, fake.detach())
            loss_d = 0.5 * (
                self.bce(real_logits.float(), torch.ones_like(real_logits, dtype=torch.float32))
                + self.bce(fake_logits.float(), torch.zeros_like(fake_logits, dtype=torch.float32))
            )
        loss_d.backward()
        self.opt_d.step()
        # Generator: fool the discriminator and stay close to the target.
        self.opt_g.zero_grad(set_to_none=True)
        with autocast():
            fake_logits = self.discriminator(cond, fake)
            loss_gan = self.bce(fake_logits.float(), torch.ones_like(fake_logits, dtype=torch.float32))
            loss_l1 = (fake.float() - target.float()).abs().mean()
            loss_g = loss_gan + self.optim_config.l1_weight * loss_l1
        loss_g.backward()
        self.opt_g.step()
        return {"loss_d": loss_d.detach(), "loss_g_gan": loss_gan.detach(), "loss_l1": loss_l1.detach()}
