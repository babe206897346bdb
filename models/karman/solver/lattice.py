"""The D2Q9 lattice: discrete velocities, weights and opposite directions."""

import numpy as np

Q = 9
# Direction order: rest, E, N, W, S, NE, NW, SW, SE.  Arrays are indexed [i, y, x].
CX = np.array([0, 1, 0, -1, 0, 1, -1, -1, 1], dtype=np.int64)
CY = np.array([0, 0, 1, 0, -1, 1, 1, -1, -1], dtype=np.int64)
W = np.array([4 / 9] + [1 / 9] * 4 + [1 / 36] * 4, dtype=np.float64)
OPP = np.array([0, 3, 4, 1, 2, 7, 8, 5, 6], dtype=np.int64)
CS2 = 1.0 / 3.0  # squared lattice speed of sound

# Node types of the geometry mask.
FLUID, SOLID, INLET, OUTLET = 0, 1, 2, 3
