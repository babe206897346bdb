"""Each convolution of the calo GAN's CPU network timed alone in JAX (its folded form, as the trainer runs it) and in torch.

``python -m tests.workloads.calo_convs [BATCH]`` (default 8), one thread each (run it with XLA_FLAGS="--xla_cpu_multi_thread_eigen=false
intra_op_parallelism_threads=1" for JAX's): per layer the median of five calls, in ms, of JAX's forward, its gradient with respect
to the input and with respect to the kernel, and torch's forward and backward (both gradients); then the totals. The figures of
docs/har-and-calo.md on JAX's calo step come from it.
"""

import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from models.calo import jax as calo_jax  # noqa: E402
from models.calo.nets import discriminator_convs, generator_convs  # noqa: E402
from tasks.workloads.calo.workload import CPU  # noqa: E402


def median_ms(call, n: int = 5) -> float:
    call()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return 1000 * float(np.median(times))


def main(batch: int) -> None:
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    totals = np.zeros(5)
    for c in [*generator_convs(CPU), *discriminator_convs(CPU)]:
        shape = tuple(o - p[0] - p[1] + k - 1 for o, p, k in zip(c.out, c.pad, c.kernel))  # its input's (x, y, z)
        x = rng.random((batch, shape[2], shape[0], shape[1], c.cin), np.float32)
        w = {f"{c.name}/kernel": 0.01 * rng.random((*c.kernel, c.cin, c.cout), np.float32), f"{c.name}/bias": np.zeros(c.cout, np.float32)}

        def forward(x, w, c=c):
            return calo_jax.conv(x, w, c, True)

        def loss(x, w, c=c):
            return jnp.sum(calo_jax.conv(x, w, c, True) ** 2)

        jitted = [jax.jit(forward), jax.jit(jax.grad(loss, argnums=0)), jax.jit(jax.grad(loss, argnums=1))]
        ours = [median_ms(lambda f=f: jax.block_until_ready(f(x, w))) for f in jitted]
        tx = torch.tensor(x.transpose(0, 4, 2, 3, 1)).requires_grad_(True)  # (B, C, x, y, z)
        tw = torch.tensor(w[f"{c.name}/kernel"].transpose(4, 3, 0, 1, 2)).requires_grad_(True)
        pad = [v for p in reversed(c.pad) for v in p]

        def torch_forward():
            return torch.nn.functional.conv3d(torch.nn.functional.pad(tx, pad), tw)

        def torch_both():
            torch.autograd.grad((torch_forward() ** 2).sum(), (tx, tw))

        with torch.no_grad():
            t_forward = median_ms(torch_forward)
        t_backward = median_ms(torch_both) - t_forward
        row = np.array([*ours, t_forward, t_backward])
        totals += row
        print(f"{c.name} {shape}x{c.cin} kernel {c.kernel} -> {c.out}x{c.cout}: JAX forward {row[0]:.1f}, d/dinput {row[1]:.1f}, "
              f"d/dkernel {row[2]:.1f} ms; torch forward {row[3]:.1f}, backward {row[4]:.1f} ms", flush=True)
    print(f"total: JAX {totals[:3].sum():.1f} ms ({totals[0]:.1f} + {totals[1]:.1f} + {totals[2]:.1f}), "
          f"torch {totals[3:].sum():.1f} ms ({totals[3]:.1f} + {totals[4]:.1f})")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 8)
