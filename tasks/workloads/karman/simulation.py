"""What one stored simulation is: its physical parameters as the dataset's manifest records them, its solver setup and its id."""

import hashlib
import json
from typing import Literal

from pydantic import BaseModel, Field

from models.karman.solver import FlowConfig, Obstacle


class SimulationSpec(BaseModel):
    """One simulation of the sweep, in lattice units."""

    nx: int = Field(gt=0)
    ny: int = Field(gt=0)
    reynolds: float
    u_max: float
    inflow: Literal["parabolic", "uniform"] = "parabolic"
    shape: Literal["circle", "square", "rectangle", "ellipse"] = "circle"
    size: float
    cx: float
    cy: float
    aspect: float = 1.0
    warmup_steps: int = Field(ge=0)
    frames: int = Field(gt=0)
    frame_every: int = Field(gt=0)
    seed: int = 0
    backend: Literal["numba", "numpy", "triton"] = "numba"  # triton: batched on a GPU (tasks.workloads.karman.simulate.simulate_batch)
    threads: int = Field(default=1, gt=0)

    def flow_config(self) -> FlowConfig:
        ob = Obstacle(shape=self.shape, cx=self.cx, cy=self.cy, size=self.size, aspect=self.aspect)
        return FlowConfig(nx=self.nx, ny=self.ny, reynolds=self.reynolds, u_max=self.u_max, inflow=self.inflow, obstacle=ob)

    @property
    def sim_id(self) -> str:
        physics = self.model_dump(exclude={"backend", "threads"})
        key = hashlib.sha256(json.dumps(physics, sort_keys=True).encode()).hexdigest()[:8]
        return f"{self.shape}-re{self.reynolds:g}-{key}"
