"""Lattice-Boltzmann D2Q9 solver for 2-D channel flow past obstacles."""

from models.karman.solver.config import SOLVER_VERSION, FlowConfig
from models.karman.solver.geometry import SHAPES, Obstacle
from models.karman.solver.solver import Backend, ChannelSolver, SolverBatch, backend_from_name, vorticity

__all__ = ["SOLVER_VERSION", "SHAPES", "Backend", "ChannelSolver", "FlowConfig", "SolverBatch", "Obstacle", "backend_from_name", "vorticity"]
