"""Winograd minimal-filtering convolution for 4×4, stride-1 layers on CPU.

The PatchGAN's stride-1 layer (256 -> 512 channels, 4×4 kernel) carries over a third of a Pix2Pix
training step's arithmetic. Winograd's F(3×3, 4×4) computes each 3×3 block of outputs from a 6×6
block of inputs with 36 products per channel pair instead of 144; the three convolutions of
training all take that form:

- forward: Y = X ⋆ W, output tiles of 3, kernel 4 (F(3, 4));
- input gradient: dX = pad(dY) ⋆ flip(W)ᵀ, the same F(3, 4) with the flipped, transposed kernel;
- weight gradient: dW = X ⋆ dY over tiles of 3 of dY, an output of 4 from a "kernel" of 3
  (F(4, 3)). With the same six interpolation points it uses the same input transform as the
  forward, so the forward's transformed input is kept for it.

The transforms are built from interpolation points by the Toom-Cook construction: for F(m, r)
with α = m + r - 1 points, Y = Aᵀ[(G g) ⊙ (Bᵀ d)] with G and Aᵀ Vandermonde rows of degree r - 1
and m - 1 and Bᵀ the inverse transpose of the α × α Vandermonde matrix; the point at infinity
takes the leading coefficient. In two dimensions each matrix acts on both axes, which we apply as
one Kronecker-product matrix. Results match the direct convolution to float32 rounding (about
1e-5 relative to the largest output).

Feature maps are handled channels-last inside (C contiguous), so tiles are gathered in runs of C
floats and each of the 36 transform points is one matrix product (tiles × C_in) @ (C_in × C_out).
"""

from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F

# 0, ±1, ±1/2 and infinity (None): the six points of F(3, 4) and F(4, 3).
POINTS = (0.0, 1.0, -1.0, 0.5, -0.5, None)
TILE = 3  # outputs per tile side in the forward and input gradient; dY tile side in the weight gradient
KERNEL = 4
ALPHA = TILE + KERNEL - 1  # 6: input tile side


def _vandermonde(degree: int) -> np.ndarray:
    """(α, degree) rows [1, p, p², ...] at each point; the point at infinity picks the top power."""
    rows = [[0.0] * (degree - 1) + [1.0] if p is None else [p**k for k in range(degree)] for p in POINTS]
    return np.array(rows, dtype=np.float64)


@lru_cache(maxsize=None)
def _matrices(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Kronecker forms of the transforms: 'in' (36, 36) for input tiles, 'w4' (36, 16) for 4×4
    kernels and 'out3' (9, 36) back to 3×3 outputs (forward); 'g3' (36, 9) for 3×3 gradient tiles
    and 'out4' (16, 36) back to 4×4 kernel gradients (weight gradient)."""
    bt = np.linalg.inv(_vandermonde(ALPHA)).T  # (6, 6)
    kron = {
        "in": np.kron(bt, bt),
        "w4": np.kron(_vandermonde(KERNEL), _vandermonde(KERNEL)),
        "out3": np.kron(_vandermonde(TILE).T, _vandermonde(TILE).T),
        "g3": np.kron(_vandermonde(TILE), _vandermonde(TILE)),
        "out4": np.kron(_vandermonde(KERNEL).T, _vandermonde(KERNEL).T),
    }
    return {k: torch.tensor(v, dtype=dtype) for k, v in kron.items()}


def supports(conv: torch.nn.Conv2d, x: torch.Tensor) -> bool:
    """Whether ``conv`` applied to ``x`` has the form computed here: float32 on CPU, 4×4 kernel,
    stride and dilation 1, one group, zero padding of at most 3, outside autocast."""
    return (x.device.type == "cpu" and x.dtype == torch.float32 and conv.weight.dtype == torch.float32
            and x.dim() == 4 and conv.kernel_size == (KERNEL, KERNEL) and conv.stride == (1, 1)
            and conv.dilation == (1, 1) and conv.groups == 1 and conv.padding_mode == "zeros"
            and isinstance(conv.padding, tuple) and all(0 <= p < KERNEL for p in conv.padding)
            and not torch.is_autocast_enabled("cpu"))


def transform_kernel(w: torch.Tensor) -> torch.Tensor:
    """(O, C, 4, 4) kernel -> (36, C, O) in the Winograd domain."""
    o, c = w.shape[:2]
    flat = w.permute(2, 3, 1, 0).reshape(KERNEL * KERNEL, c * o)  # (16, C*O)
    return (_matrices(w.dtype)["w4"] @ flat).view(ALPHA * ALPHA, c, o)


def transform_kernel_for_input_grad(w: torch.Tensor) -> torch.Tensor:
    """(O, C, 4, 4) kernel -> the flipped, transposed kernel's (36, O, C) transform."""
    return transform_kernel(w.flip(2, 3).transpose(0, 1))


def _input_tiles(x: torch.Tensor, pad: tuple[int, int], tiles: tuple[int, int]) -> torch.Tensor:
    """(N, C, H, W) -> (36, N*th*tw, C): each 6×6 input tile (stride 3, zero padded ``pad`` at the
    top-left and as needed at the bottom-right) in the Winograd domain."""
    n, c, h, w = x.shape
    th, tw = tiles
    padded = x.new_zeros(n, th * TILE + KERNEL - 1, tw * TILE + KERNEL - 1, c)  # (N, Hp, Wp, C)
    padded[:, pad[0]:pad[0] + h, pad[1]:pad[1] + w] = x.permute(0, 2, 3, 1)  # the tiles always cover x
    patches = padded.unfold(1, ALPHA, TILE).unfold(2, ALPHA, TILE)  # (N, th, tw, C, 6, 6)
    patches = patches.permute(4, 5, 0, 1, 2, 3).reshape(ALPHA * ALPHA, -1)  # (36, N*th*tw*C)
    return (_matrices(x.dtype)["in"] @ patches).view(ALPHA * ALPHA, n * th * tw, c)


def _correlate(x: torch.Tensor, u: torch.Tensor, out_hw: tuple[int, int], pad: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Valid correlation of ``x`` (N, C, H, W), zero padded by ``pad`` at the top-left, with the
    kernel whose transform is ``u`` (36, C, O); returns the (N, O, *out_hw) result (channels-last
    in memory) and the transformed input tiles (36, K, C)."""
    n = x.shape[0]
    o = u.shape[2]
    th, tw = -(-out_hw[0] // TILE), -(-out_hw[1] // TILE)
    v = _input_tiles(x, pad, (th, tw))  # (36, K, C)
    m = torch.bmm(v, u)  # (36, K, O)
    y = _matrices(x.dtype)["out3"] @ m.view(ALPHA * ALPHA, -1)  # (9, K*O)
    y = y.view(TILE, TILE, n, th, tw, o).permute(2, 3, 0, 4, 1, 5).reshape(n, th * TILE, tw * TILE, o)
    y = y[:, :out_hw[0], :out_hw[1]].permute(0, 3, 1, 2)  # (N, O, Ho, Wo) view
    return y.contiguous(memory_format=torch.channels_last), v


def _weight_grad(v: torch.Tensor, dy: torch.Tensor, tiles: tuple[int, int]) -> torch.Tensor:
    """dW (O, C, 4, 4) from the forward's transformed input tiles ``v`` (36, K, C) and dY (N, O, Ho, Wo)."""
    n, o, ho, wo = dy.shape
    th, tw = tiles
    g = dy.new_zeros(n, th * TILE, tw * TILE, o)  # (N, th*3, tw*3, O), zeros past the output
    g[:, :ho, :wo] = dy.permute(0, 2, 3, 1)
    g = g.view(n, th, TILE, tw, TILE, o).permute(2, 4, 0, 1, 3, 5).reshape(TILE * TILE, -1)  # (9, K*O)
    mats = _matrices(dy.dtype)
    gt = (mats["g3"] @ g).view(ALPHA * ALPHA, n * th * tw, o)  # (36, K, O)
    m = torch.bmm(v.transpose(1, 2), gt)  # (36, C, O)
    dw = (mats["out4"] @ m.view(ALPHA * ALPHA, -1)).view(KERNEL, KERNEL, v.shape[2], o)
    return dw.permute(3, 2, 0, 1).contiguous()


class KernelCache:
    """The kernel's transforms, kept while the weight's values are unchanged. Values are compared,
    not version counters: fused optimisers update weights in place without bumping the version."""

    _TRANSFORMS = {"forward": transform_kernel, "input_grad": transform_kernel_for_input_grad}

    def __init__(self):
        self._weight: torch.Tensor | None = None  # a copy of the weight the entries were made from
        self._entries: dict[str, torch.Tensor] = {}

    def __getstate__(self) -> dict:  # copies and pickles start empty
        return {"_weight": None, "_entries": {}}

    def get(self, kind: str, weight: torch.Tensor) -> torch.Tensor:
        w = weight.detach()
        if self._weight is None or self._weight.shape != w.shape or not torch.equal(self._weight, w):
            self._weight, self._entries = w.clone(), {}
        if kind not in self._entries:
            self._entries[kind] = self._TRANSFORMS[kind](w)
        return self._entries[kind]


class _WinogradConv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, padding, cache):
        # x (N, C, H, W); weight (O, C, 4, 4); bias (O,) or None
        ph, pw = padding
        out_hw = (x.shape[2] + 2 * ph - KERNEL + 1, x.shape[3] + 2 * pw - KERNEL + 1)
        y, v = _correlate(x, cache.get("forward", weight), out_hw, (ph, pw))
        if bias is not None:
            y = y + bias.view(1, -1, 1, 1)
        ctx.padding, ctx.in_hw, ctx.cache = padding, tuple(x.shape[2:]), cache
        ctx.tiles = (-(-out_hw[0] // TILE), -(-out_hw[1] // TILE))
        # The transformed input tiles serve the weight gradient; keep them only if it is wanted.
        ctx.save_for_backward(weight, v if weight.requires_grad else None)
        return y

    @staticmethod
    def backward(ctx, dy):
        weight, v = ctx.saved_tensors  # autograd refuses a weight changed in place since the forward
        ph, pw = ctx.padding
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            u = ctx.cache.get("input_grad", weight)
            dx, _ = _correlate(dy, u, ctx.in_hw, (KERNEL - 1 - ph, KERNEL - 1 - pw))
        if ctx.needs_input_grad[1]:
            dw = _weight_grad(v, dy, ctx.tiles)
        if ctx.needs_input_grad[2]:
            db = dy.sum((0, 2, 3))
        return dx, dw, db, None, None


def conv4x4(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, padding: tuple[int, int],
            cache: KernelCache | None = None) -> torch.Tensor:
    """F.conv2d(x, weight, bias, stride=1, padding=padding) for a 4×4 kernel by Winograd's
    F(3×3, 4×4), differentiable in x, weight and bias; see ``supports`` for the cases it takes.
    ``cache`` keeps the kernel's transforms between calls with an unchanged weight."""
    return _WinogradConv.apply(x, weight, bias, padding, cache or KernelCache())
