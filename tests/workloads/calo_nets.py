"""Child body of the calo tests: the torch and Keras 3DGAN networks of each configuration named from the same numpy weights; prints their parameter counts and outputs as JSON.

Run as ``python -m tests.workloads.calo_nets NAME=LATENT,WIDTH[,POOL] ...``: one process for every configuration, which
imports torch and TensorFlow once (about 8 s of CPU each time). Torch and TensorFlow meet in this process only (the
test process may hold torch_xla)."""

import json
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")


def main(latent: int, width: float, pool: int = 1) -> dict:
    import numpy as np
    import torch

    from models.calo import keras as kn
    from models.calo import torch as tn
    from models.calo.nets import POWER, PROFILE_FLOOR, NetConfig, SMALL, initial_weights
    from tasks.workloads.calo.tensorflow import profile_loss as keras_profile_loss
    from tasks.workloads.calo.torch import profile_loss

    cfg = NetConfig(latent=latent, width=width, pool=pool)
    weights = initial_weights(cfg, 0)
    tg, td = tn.build_networks(cfg, weights)
    kg, kd = kn.build_networks(cfg, weights)
    out = {"torch": tn.parameter_counts(tg, td), "keras": kn.parameter_counts(kg, kd)}
    if cfg == SMALL or pool > 1:  # the outputs in inference mode (dropout off, batch norm from its statistics)
        rng = np.random.default_rng(1)
        z = rng.standard_normal((2, cfg.latent)).astype(np.float32)
        z[:, 0], z[:, 1] = [1.2, 1.8], [1.3, 1.9]  # energy / 100 GeV, angle (radians)
        tg.eval(), td.eval()
        with torch.no_grad():
            t_img = tg(torch.from_numpy(z))
            t_heads = td(t_img + 1e-3)
        k_img = kg(z, training=False)
        k_heads = kd(k_img + 1e-3, training=False)
        out["image_max_diff"] = float(np.abs(t_img.numpy() - np.asarray(k_img)).max())
        out["image_mean"] = float(t_img.numpy().mean())
        out["heads_torch"] = [h.numpy().ravel().tolist() for h in t_heads]
        out["heads_keras"] = [np.asarray(h).ravel().tolist() for h in k_heads]
        # the generator's profile term (nets.py) of the generated images against the same images tilted in depth
        # (the lower-energy shower tilted towards the back, the higher one towards the front: errors of opposite sign)
        tilt = np.linspace(0.25, 4.0, t_img.shape[3], dtype=np.float32)
        real = t_img.numpy() * np.stack([tilt, tilt[::-1] ** 0.5])[:, None, None, :, None]
        # (per shower: its energy per layer over its sum, and the log of that sum over the real one's; level and energy slope of
        # the difference, as nets.py says)
        deposits = lambda im: (np.maximum(im[..., 0].astype(np.float64), 0.0) ** (1 / POWER)).sum(axis=(1, 2))  # noqa: E731
        g_layers, r_layers = deposits(t_img.numpy()), deposits(real)  # (2, nz)
        r_share = r_layers / r_layers.sum(1, keepdims=True)
        diff = np.concatenate([g_layers / g_layers.sum(1, keepdims=True) - r_share, np.log(g_layers.sum(1, keepdims=True) / r_layers.sum(1, keepdims=True))], 1)
        scale = np.append(np.maximum(r_share.mean(0), PROFILE_FLOOR), 1.0)
        energy = z[:, :1].astype(np.float64)  # the energy labels (E / 100 GeV), (2, 1)
        offset = energy - energy.mean()
        level_slope = lambda d: (d.mean(0), (offset * d).mean(0) / np.sqrt((offset ** 2).mean()))  # noqa: E731
        level, slope = level_slope(diff)
        # the real showers' deposits 10 % above and below the generated ones': equal shares, the sum alone
        sum_level, sum_slope = level_slope(np.log(1 / np.array([[1.1], [0.9]])))
        e_t, e_k = torch.from_numpy(z[:, :1]), z[:, :1]
        out["profile"] = {"numpy": float(((level ** 2 + slope ** 2) / scale ** 2).mean()),
                          "torch": float(profile_loss(t_img, torch.from_numpy(real), e_t)), "keras": float(keras_profile_loss(k_img, real, e_k)),
                          "level_only": float(profile_loss(t_img, torch.from_numpy(real), torch.ones_like(e_t))),
                          "numpy_level_only": float((level ** 2 / scale ** 2).mean()),
                          "scaled": float(profile_loss(t_img, t_img * torch.tensor([1.1, 0.9]).pow(POWER).reshape(2, 1, 1, 1, 1), e_t)),
                          "numpy_scaled": float((sum_level[0] ** 2 + sum_slope[0] ** 2) / len(scale)),
                          "same": float(profile_loss(t_img, t_img, e_t)) + float(keras_profile_loss(k_img, k_img, e_k))}
        back = kn.weights_of(kd)
        out["round_trip"] = all(np.array_equal(back[k], v) for k, v in td.weights().items()) and set(back) == set(td.weights())
    return out


def _parsed(arg: str) -> tuple[str, tuple]:
    name, values = arg.split("=")
    latent, width, *pool = values.split(",")
    return name, (int(latent), float(width), *map(int, pool))


if __name__ == "__main__":
    print(json.dumps({name: main(*values) for name, values in map(_parsed, sys.argv[1:])}))
