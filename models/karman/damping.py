"""A fixed damping of the predicted change's highest wavenumbers, the same in numpy, torch and TensorFlow.

``damp(x, d) = x - d·(x - B x)`` for d up to 1, where ``B`` is the separable binomial filter [1, 2, 1]/4
along each axis with the edge values repeated beyond the frame. On a periodic grid its transfer
function is ``T_d = 1 - d·(1 - cos²(kx/2)·cos²(ky/2))``: a mode at the Nyquist wavenumber along either
axis (the cell-scale checkerboard, or a stripe of period two cells) is scaled by 1 - d, a constant
passes unchanged, and a wave of wavelength λ cells along one axis loses about d·(π/λ)² of its
amplitude. A strength above 1 applies whole passes first and the fraction last (d = 2: ``B B x``,
the [1, 4, 6, 4, 1]/16 filter; transfer T_1², so waves of three to six cells lose about twice as much).
The rollout applies it to the network's output before the change is added to the state; the
trainers apply it in the loss, so a network trained with it learns through it.
"""

import numpy as np


MAX_STRENGTH = 3.0  # passes of the binomial filter at most


def check_strength(strength: float) -> float:
    """The damping strength, 0 (off) to MAX_STRENGTH (1: the checkerboard removed; above 1, further passes
    of the filter); ValueError otherwise."""
    if not 0.0 <= strength <= MAX_STRENGTH:
        raise ValueError(f"damping {strength} is the passes of the binomial filter taken out of the change (1: the cell-scale mode "
                         f"removed): choose 0 (none) to {MAX_STRENGTH:g}")
    return float(strength)


def passes(strength: float) -> list[float]:
    """The weights of the filter's passes: whole passes first, the fraction last (2.5 -> [1, 1, 0.5])."""
    whole = int(strength)
    return [1.0] * whole + ([strength - whole] if strength > whole else [])


def blur(x: np.ndarray, axes: tuple[int, int] = (-2, -1)) -> np.ndarray:
    """The binomial [1, 2, 1]/4 filter along both ``axes`` of ``x``, edges repeated."""
    out = np.asarray(x, np.float32)
    for axis in axes:
        padded = np.concatenate([np.take(out, [0], axis), out, np.take(out, [-1], axis)], axis=axis)
        n = out.shape[axis]
        lo, mid, hi = (np.take(padded, range(i, i + n), axis) for i in range(3))
        out = 0.25 * lo + 0.5 * mid + 0.25 * hi
    return out


def damp(x: np.ndarray, strength: float, axes: tuple[int, int] = (-2, -1)) -> np.ndarray:
    """``x`` with its highest wavenumbers over ``axes`` damped by ``strength`` (see the module's text)."""
    if strength == 0:
        return x
    x = np.asarray(x, np.float32)
    for weight in passes(strength):
        x = x - np.float32(weight) * (x - blur(x, axes))
    return x
