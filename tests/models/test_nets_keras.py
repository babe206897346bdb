"""The Keras networks and training step are the torch ones.

The Keras networks are the torch ones: the same parameter count for every width, depth, norm and
upsampling option, and, with the torch weights copied in, the same outputs in inference mode.

Run in a child process: TensorFlow and torch_xla abort when they meet in one process, and the test
process may hold torch_xla."""

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

# One child computes both fixtures' figures: one import of TensorFlow and torch instead of two (this module 86 -> 75 s of CPU,
# `/usr/bin/time pytest` of it on a 2-core host). TensorFlow is imported as a training job imports it.
SCRIPT = r"""
import json, sys
from tasks.common.process.job_main import load
load("tensorflow")
import numpy as np
import tensorflow as tf
import torch
from models.karman.nets.config import NetConfig
from models.karman.nets.pix2pix import build_discriminator, build_generator
from models.karman.nets import pix2pix_keras as kn
from models.karman.nets.trainer import OptimConfig, Pix2Pix
from models.karman.nets.trainer_keras import KerasPix2Pix
from models.karman.recipe import get_recipe

parity = []
for options in json.loads(sys.argv[1]):
    cfg = NetConfig(**options)
    torch.manual_seed(0)
    tg, td = build_generator(cfg).eval(), build_discriminator(cfg).eval()
    with torch.no_grad():  # batch norm with statistics other than the initial ones
        for m in list(tg.modules()) + list(td.modules()):
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2); m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5); m.bias.uniform_(-0.2, 0.2)
    kg, kd = kn.build_generator(cfg), kn.build_discriminator(cfg)
    kn.copy_from_torch(cfg, kg, kd, {k: v.numpy() for k, v in tg.state_dict().items()},
                       {k: v.numpy() for k, v in td.state_dict().items()})
    side = max(2 ** cfg.generator_depth, 32)  # a multiple of the U-Net's unit, large enough for the PatchGAN
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, cfg.in_channels, side, 2 * side)).astype(np.float32)
    y = rng.standard_normal((2, cfg.out_channels, side, 2 * side)).astype(np.float32)
    with torch.no_grad():
        g_t = tg(torch.from_numpy(x)).numpy()
        d_t = td(torch.from_numpy(x), torch.from_numpy(y)).numpy()
    nhwc = lambda a: a.transpose(0, 2, 3, 1)
    g_k = np.asarray(kg(nhwc(x), training=False)).transpose(0, 3, 1, 2)
    d_k = np.asarray(kd([nhwc(x), nhwc(y)], training=False)).transpose(0, 3, 1, 2)
    parity.append({"options": options, "shapes": [list(g_t.shape), list(g_k.shape), list(d_t.shape), list(d_k.shape)],
                   "params_torch": [sum(p.numel() for p in tg.parameters()), sum(p.numel() for p in td.parameters())],
                   "params_keras": [kn.trainable_count(kg), kn.trainable_count(kd)],
                   "generator_error": float(np.abs(g_t - g_k).max() / max(np.abs(g_t).max(), 1e-12)),
                   "discriminator_error": float(np.abs(d_t - d_k).max() / max(np.abs(d_t).max(), 1e-12))})

stepped = []
for name in ("default", "paper", "through"):
    recipe = get_recipe("paper" if name == "paper" else "default").with_overrides(noise=0.0)  # noise: each framework's own draw
    recipe = recipe.with_overrides(dropout=0.0) if name == "paper" else recipe
    recipe = recipe.with_overrides(pushforward="through", damping=1.5, constrain=True) if name == "through" else recipe
    loss_steps = (2, 3, 1) if name == "through" else (None, None, None)  # a curriculum's shorter losses too
    cfg = NetConfig(size=32, ngf=8, ndf=8, upsample=recipe.upsample, output=recipe.output, dropout=recipe.dropout)
    ratio = [0.05, 0.07, 0.11] if recipe.predict == "delta" else None
    torch.manual_seed(0)
    tm = Pix2Pix(cfg, OptimConfig.from_recipe(recipe, ratio, [-0.1, 0.2, 0.05]))
    km = KerasPix2Pix(cfg, OptimConfig.from_recipe(recipe, ratio, [-0.1, 0.2, 0.05]), tf.distribute.get_strategy(), 4)
    kn.copy_from_torch(cfg, km.generator, km.discriminator, {k: v.numpy() for k, v in tm.generator.state_dict().items()},
                       {k: v.numpy() for k, v in tm.discriminator.state_dict().items()})
    rng = np.random.default_rng(2)
    cond = rng.uniform(-1, 1, (4, 4, 32, 64)).astype(np.float32)
    target = rng.uniform(-1, 1, (4, 3 * recipe.unroll, 32, 64)).astype(np.float32)
    nhwc = lambda a: np.ascontiguousarray(a.transpose(0, 2, 3, 1))
    steps = []
    for n in loss_steps:
        lt = tm.train_step(torch.from_numpy(cond), torch.from_numpy(target), __import__("contextlib").nullcontext, steps=n)
        lk = km.train_step(tf.constant(nhwc(cond)), tf.constant(nhwc(target)), steps=n)
        steps.append({k: [float(lt[k]), float(lk[k])] for k in lt})
    tm.generator.eval()
    with torch.no_grad():
        g_t = tm.generator(torch.from_numpy(cond)).numpy()
    g_k = np.asarray(km.generator(nhwc(cond), training=False)).transpose(0, 3, 1, 2)
    stepped.append({"recipe": name, "losses": steps, "after": float(np.abs(g_t - g_k).max() / np.abs(g_t).max())})
print(json.dumps({"parity": parity, "stepped": stepped}))
"""

CONFIGS = [
    dict(size=32, ngf=8, ndf=8),  # the paper's options at a small size: transposed convolutions, batch norm, tanh
    dict(size=64, ngf=16, ndf=16, depth=4, upsample="resize", output="linear"),  # the default recipe's
    dict(size=32, ngf=8, ndf=8, norm="instance"),
    dict(size=16, ngf=4, ndf=4, d_layers=2, upsample="resize"),
    dict(size=64, ngf=16, ndf=16, upsample="resize", output="linear", dropout=0.0),  # the default recipe's networks on the demo's 64-high frames (depth 6)
    dict(),  # the paper's networks at 256 x 256: depth 8, ngf = ndf = 64
]


@pytest.fixture(scope="module")
def computed() -> dict:
    """The child's figures: ``parity`` (each of CONFIGS) and ``stepped`` (each recipe's three steps)."""
    env = {"PYTHONPATH": str(ROOT), "TF_ENABLE_ONEDNN_OPTS": "0", "TF_CPP_MIN_LOG_LEVEL": "3", "KERAS_BACKEND": "tensorflow",
           "CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(CONFIGS)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def parity(computed) -> list[dict]:
    return computed["parity"]


def test_every_option_has_the_torch_parameter_count_and_shapes(parity):
    assert len(parity) == len(CONFIGS)  # one case per option: an empty answer from the child fails
    for case in parity:
        assert case["params_keras"] == case["params_torch"], case
        g_t, g_k, d_t, d_k = case["shapes"]
        assert g_t == g_k and d_t == d_k, case


def test_with_the_torch_weights_the_outputs_agree_in_inference_mode(parity):
    # float32 through up to 16 layers, summed in another order by another library: about 1e-6 of the
    # output's scale is rounding; a wrong layout, padding, momentum or epsilon shows as 1e-2 or more.
    assert len(parity) == len(CONFIGS)
    for case in parity:
        assert case["generator_error"] < 2e-5 and case["discriminator_error"] < 2e-5, case


def test_three_training_steps_from_the_same_weights_give_the_same_losses_and_weights(computed):
    """The recipe is the same in both frameworks: from the torch weights, three steps of the default recipe (delta,
    L1, three-step pushforward), of the paper's (GAN + 100 L1, Adam 0.5) and of the default with gradients through
    the unrolled chain and the predicted change damped (one and a half passes), at 2, 3 and 1 loss steps (a curriculum's), give the same
    losses and networks."""
    assert [case["recipe"] for case in computed["stepped"]] == ["default", "paper", "through"]
    for case in computed["stepped"]:
        assert len(case["losses"]) == 3 and all(case["losses"]), case  # three steps, each with its losses
        # Adam's first steps move every weight by about lr whatever the gradient's size, so a
        # gradient that differs in sign or scale shows at once; rounding stays near 1e-5.
        for step in case["losses"]:
            for name, (t, k) in step.items():
                assert k == pytest.approx(t, rel=1e-4, abs=1e-6), (case["recipe"], name, step)
        # measured 2.3e-6 (default) and 4.1e-5 (paper); with gradients through the damped chain 7.1e-4 on an Intel AVX-512
        # host (below 5e-4 on others): Adam's sign-like first steps turn a gradient near zero's rounding into a whole step
        assert case["after"] < (2e-3 if case["recipe"] == "through" else 5e-4), case
