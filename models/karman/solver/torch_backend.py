"""The solver's step in torch (CUDA GPUs, XLA devices), whole-array operations equal to the NumPy reference.

The operators of ``models.karman.solver.operators`` as whole-array tensor operations (streaming by shifted views, the obstacle by gathers and a scatter).
Semantics match ``numpy_backend.step``; tests hold them equal on the CPU.
"""

import numpy as np
import torch

from models.karman.solver.lattice import CX, CY, OPP, W
from models.karman.solver.operators import INLET_DIRS, OUTLET_DIRS, StepPlan


class TorchStepper:
    """Holds the populations on ``device`` and advances them."""

    def __init__(self, plan: StepPlan, f: np.ndarray, device: str = "cpu"):
        self.plan, self.device = plan, torch.device(device)
        t = lambda a, dt=None: torch.as_tensor(np.ascontiguousarray(a), device=self.device, dtype=dt)  # noqa: E731
        self.f = t(f)
        dtype = self.f.dtype
        _, ny, nx = f.shape
        self.cx, self.cy = t(CX, dtype)[:, None, None], t(CY, dtype)[:, None, None]
        self.w = t(W, dtype)[:, None, None]
        self.opp = t(OPP)
        # obstacle links as flat indices into (9, ny, nx)
        b, i = np.nonzero(plan.kind == 2)
        y, x = plan.cells[b, 0], plan.cells[b, 1]
        o = OPP[i]
        flat = lambda d, yy, xx: (d * ny + yy) * nx + xx  # noqa: E731
        self.link_target = t(flat(i, y, x))
        self.link_sources = t(np.stack([flat(o, y, x), flat(o, y + CY[i], x + CX[i]), flat(i, y, x)]))
        self.link_coef = t(plan.coef[b, i].T, dtype)  # (3, nlinks)
        self.link_dir = t(np.stack([CX[i], CY[i]]), torch.float64)  # (2, nlinks)
        self.solid = t(plan.solid)
        self.set_plan(plan)
        self.omega = (plan.omega_plus, plan.omega_minus)

    def set_plan(self, plan: StepPlan) -> None:
        """Take a plan that differs only in its inflow (see ChannelSolver.set_inflow_scale)."""
        self.plan = plan
        self.inlet_u = torch.as_tensor(plan.inlet_u, device=self.device, dtype=self.f.dtype)

    def _stream(self, f: torch.Tensor) -> torch.Tensor:
        out = torch.stack([torch.roll(f[i], shifts=(int(CY[i]), int(CX[i])), dims=(0, 1)) for i in range(9)])
        if not self.plan.periodic:
            for i in range(9):
                if CY[i] == 1:
                    out[i, 1] = f[OPP[i], 1]
                elif CY[i] == -1:
                    out[i, -2] = f[OPP[i], -2]
        return out

    def _collide(self, f: torch.Tensor) -> torch.Tensor:
        rho = f.sum(0)
        ux = (self.cx * f).sum(0) / rho
        uy = (self.cy * f).sum(0) / rho
        cu = self.cx * ux + self.cy * uy
        feq = self.w * rho * (1 + 3 * cu + 4.5 * cu * cu - 1.5 * (ux * ux + uy * uy))
        f_opp, feq_opp = f[self.opp], feq[self.opp]
        wp, wm = self.omega
        return f - wp * (0.5 * (f + f_opp) - 0.5 * (feq + feq_opp)) - wm * (0.5 * (f - f_opp) - 0.5 * (feq - feq_opp))

    def _fill_ghosts(self, fnew: torch.Tensor, fpost: torch.Tensor) -> None:
        if self.plan.periodic:
            fnew[:, :, 0], fnew[:, :, -1] = fnew[:, :, -2].clone(), fnew[:, :, 1].clone()
            fnew[:, 0, :], fnew[:, -1, :] = fnew[:, -2, :].clone(), fnew[:, 1, :].clone()
            return
        ny = fnew.shape[1]
        for k, i in enumerate(INLET_DIRS):
            lo, hi = max(1, 1 - CY[i]), min(ny - 1, ny - 1 - CY[i])
            fnew[i, lo:hi, 0] = fnew[OPP[i], lo + CY[i] : hi + CY[i], 1] + 6.0 * W[i] * CX[i] * self.inlet_u[k, lo:hi]
        u = self.plan.u_convect
        drift = 1.0 - fnew[:, 1:-1, -2].sum(0).mean()
        for i in OUTLET_DIRS:
            fnew[i, 1:-1, -1] = (fpost[i, 1:-1, -1] + u * fnew[i, 1:-1, -2]) / (1.0 + u) + W[i] * self.plan.outlet_anchor * drift

    def step(self) -> torch.Tensor:
        """One step; returns the force (fx, fy) on the obstacle as a tensor of two float64."""
        fpost = self.f
        f = self._stream(fpost)
        src = fpost.reshape(-1)[self.link_sources]  # (3, nlinks)
        new = (self.link_coef * src).sum(0)
        f.view(-1)[self.link_target] = new
        force = -(self.link_dir * (src[0] + new).to(torch.float64)).sum(1)
        fnew = fpost.clone()
        fnew[:, 1:-1, 1:-1] = self._collide(f)[:, 1:-1, 1:-1]
        fnew[:, self.solid[:, 0], self.solid[:, 1]] = self.w[:, :, 0]
        self._fill_ghosts(fnew, fpost)
        self.f = fnew
        return force

    def run(self, steps: int, probes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        py, px = torch.as_tensor(probes[:, 0], device=self.device), torch.as_tensor(probes[:, 1], device=self.device)
        forces, rho = [], []
        cut = _graph_cut(self.device)
        for _ in range(steps):
            forces.append(self.step())
            rho.append(self.f[:, py, px].sum(0).to(torch.float64))
            cut()
        if not steps:
            return np.zeros((0, 2)), np.zeros((0, len(probes)))
        return torch.stack(forces).cpu().numpy(), torch.stack(rho).cpu().numpy()

    def state(self) -> np.ndarray:
        return self.f.cpu().numpy()

    def finite(self, row: int) -> bool:
        return bool(torch.isfinite(self.f[:, row]).all())


def _graph_cut(device: torch.device):
    """On XLA devices, end the traced graph after every step (one compiled step, reused), rather than
    tracing a whole run into one graph; elsewhere nothing."""
    if device.type != "xla":
        return lambda: None
    import torch_xla  # only where the device is XLA: flow processes never get here

    return torch_xla.sync
