"""What one time step needs besides the populations, computed once per simulation.

Every backend runs the same composition on post-collision populations f* (9, ny, nx):

1. pull streaming, with half-way bounce-back off the channel walls (rows 0 and ny-1);
2. interpolated bounce-back off the obstacle, and the force on it by momentum exchange;
3. TRT collision of every interior node;
4. the obstacle's interior held at rest;
5. ghost nodes: velocity bounce-back at the inlet (column 0) and a convective, non-reflecting outflow
   at the outlet (column nx-1) with its mean density anchored at 1; or, in a periodic box, copies of
   the opposite side.
"""

from dataclasses import dataclass

import numpy as np

from models.karman.solver.collision import trt_rates
from models.karman.solver.config import FlowConfig
from models.karman.solver.geometry import channel_nodes, obstacle_links
from models.karman.solver.lattice import CX, CY

# Weak on purpose: the anchor reflects the channel's uniform acoustic mode, and with a rate of 1 that
# mode rang on through a steady 2D-1 run (c_D swinging by 2%); 0.02 held the density, and c_D to about 0.1%.
OUTLET_ANCHOR = 0.02
INLET_DIRS = tuple(int(i) for i in np.nonzero(CX == 1)[0])  # populations entering through the inlet
OUTLET_DIRS = tuple(int(i) for i in np.nonzero(CX == -1)[0])  # populations entering through the outlet


@dataclass(frozen=True)
class StepPlan:
    """Geometry and rates of one simulation, as flat arrays the kernels take."""

    nodes: np.ndarray  # (ny, nx) uint8 node types
    periodic: bool
    omega_plus: float
    omega_minus: float
    cells: np.ndarray  # (nb, 2) fluid nodes next to the obstacle
    kind: np.ndarray  # (nb, 9) how each population arrives (see geometry.ObstacleLinks)
    coef: np.ndarray  # (nb, 9, 3) interpolated bounce-back weights
    solid: np.ndarray  # (ns, 2) obstacle interior
    inlet_u: np.ndarray  # (3, ny) inflow velocity at the mid-link of each inlet direction and ghost row
    u_convect: float  # convection speed of the outflow condition
    outlet_anchor: float  # rate at which the outlet pulls its mean density back to 1


def plan_for(config: FlowConfig, periodic: bool = False, obstacle: bool = True) -> StepPlan:
    """The StepPlan of a channel (or of a periodic box holding the same obstacle); ``obstacle=False``
    leaves the obstacle out."""
    body = config.obstacle if obstacle else None
    nodes = channel_nodes(config.ny, config.nx, body, periodic=periodic)
    links = obstacle_links(nodes, body, interpolated=config.wall == "interpolated")
    ys = np.arange(config.ny, dtype=np.float64)
    inlet_u = np.stack([config.inflow_velocity(ys + 0.5 * CY[i]) for i in INLET_DIRS])
    wp, wm = trt_rates(config.tau, config.magic)
    return StepPlan(
        nodes=nodes, periodic=periodic, omega_plus=wp, omega_minus=wm, cells=links.cells, kind=links.kind,
        coef=links.coef, solid=links.solid, inlet_u=inlet_u, u_convect=config.u_mean, outlet_anchor=OUTLET_ANCHOR,
    )
