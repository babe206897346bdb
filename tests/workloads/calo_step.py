"""Child body of the calo tests: one framework's GAN trainer takes two four-tape steps on fixed synthetic showers from nets.py's weights; the losses, scores and a checkpoint round trip.

Each framework's steps run as a job of its own (tests.workloads.digits_step.stepped_in_children: tensorflow and torch_xla
never share a process); ``python -m tests.workloads.calo_step FRAMEWORK`` prints the same as JSON.
"""

import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

from tests.workloads.digits_step import runtime_of

EVENTS, BATCH = 6, 4


def data_of():
    """Six synthetic showers in every role (each role the same), 100-200 GeV, 60-120 degrees."""
    from models.calo.showers import shower_events
    from tasks.workloads.calo.workload import ROLES, CaloData

    energy, angle = np.linspace(105.0, 195.0, EVENTS), np.linspace(65.0, 115.0, EVENTS)
    cells = shower_events(energy, angle, 5)
    sf = float((cells.sum(axis=(1, 2, 3)) / energy).mean())
    return CaloData({r: cells for r in ROLES}, {r: energy.astype(np.float32) for r in ROLES}, {r: angle.astype(np.float32) for r in ROLES},
                    {r: ["synthetic"] for r in ROLES}, "-", sf)


def steps(framework: str, dtype: str) -> dict:
    """Two steps of SMALL at half its width on the coarse grid (the same layers, fewer channels and cells across; the
    published grid's outputs are compared in test_calo_workload), its output scaled by the primary's energy, with a
    moving average of its generator and the profile term in its loss, without dropout (the label flips and noise come from numpy), seed 0, in
    ``dtype`` (float64: the frameworks' rounding out of the way); the cosine schedule, the second step at half the run's progress."""
    if framework == "torch":
        import torch

        torch.set_default_dtype(getattr(torch, dtype))
    elif framework == "tensorflow":
        import keras

        keras.config.set_floatx(dtype)
    from models.calo import keras as keras_nets
    from models.calo.nets import SMALL, average_decay
    from tasks.common.specs import TrainSpec
    from tasks.workloads import framework_module, get_workload

    cfg = replace(SMALL, dropout=0.0, width=0.25, pool=3, energy_scaled=True, average=0.9, profile=1.0, schedule="cosine")
    module = framework_module(get_workload("calo"), framework)
    trainer_class = {"torch": "CaloTorch", "tensorflow": "CaloKeras", "jax": "CaloJax"}[framework]
    trainer_class = getattr(module, trainer_class)
    data, spec, runtime = data_of(), TrainSpec(workload="calo", dataset="calo", framework=framework, seed=0), runtime_of(framework)
    trainer = trainer_class(data, spec, BATCH, runtime, cfg)
    trainer.calibration_batches = 5  # (a run takes 100: at about 0.2 s a Keras forward pass here, they would take most of the test)
    batches = trainer.batches(1, 1)
    weights_of = {"torch": lambda: trainer.g.weights(), "tensorflow": lambda: keras_nets.weights_of(trainer.g), "jax": lambda: trainer.live_weights()}[framework]  # noqa: E731
    live = lambda: {k: np.array(v) for k, v in weights_of().items()}  # noqa: E731  (copies: torch's arrays share the tensors' memory)
    before = live()
    first, flags = trainer.step(next(batches), [0.0, 0.0, 1.5], 0.0)
    after, decay = live(), average_decay(cfg, 0)  # the average after one step: decay x the initial weights + (1 - decay) x the stepped ones
    averaged = all(np.array_equal(v, after[k]) if "moving" in k else np.allclose(v, decay * before[k] + (1 - decay) * after[k], rtol=1e-5, atol=1e-7)
                   for k, v in trainer.weights()["generator"].items()) and not np.array_equal(before["g1/kernel"], after["g1/kernel"])
    trainer.calibrate()  # the average's batch-norm statistics taken afresh from the calibration batches
    statistics = {k: v.tolist() for k, v in trainer.weights()["generator"].items() if "moving" in k}
    recalibrated = not any(np.allclose(statistics[k], after[k]) for k in statistics)
    with tempfile.TemporaryDirectory() as tmp:  # the checkpoint round trip: a fresh trainer takes the stepped one's state
        path = Path(tmp) / runtime.checkpoint
        runtime.save({"model": trainer.state(), "history": {"epoch": 1}}, path)
        fresh = trainer_class(data, spec.model_copy(update={"seed": 1}), BATCH, runtime, cfg)
        fresh.load_state(runtime.load(path)["model"])
        restored = all(np.array_equal(a, b) for net in ("generator", "discriminator")
                       for a, b in zip(trainer.weights()[net].values(), fresh.weights()[net].values()))
        batch = next(trainer.batches(2, 1))
        second, second_fresh = trainer.step(batch, [0.0] * 3, 0.5)[0], fresh.step(batch, [0.0] * 3, 0.5)[0]
    optimisers = (trainer.opt_g, trainer.opt_d) if framework != "jax" else ()
    rates = [trainer.learning_rate()] + (trainer.rates() if framework == "jax" else
                                         [float(o.lr) if framework == "torch" else float(o.learning_rate) for o in optimisers])
    shares = module.step_shares(trainer, 1) if framework == "torch" else {}
    folded = folded_error(cfg) if framework == "jax" else None
    return {"folded": folded, "shares": shares, "averaged": averaged, "statistics": statistics, "recalibrated": recalibrated, "first": first, "second": second, "second_fresh": second_fresh, "flags": flags, "restored": restored, "rates": rates,
            "scores": trainer.evaluate(), "generated_sum": float(trainer.generate("val").sum())}


def folded_error(cfg) -> float:
    """The largest difference, relative to the outputs' largest magnitude, between JAX's convolutions folded into 2-D
    ones and XLA's 3-D convolutions, over every layer of both networks of ``cfg`` (random inputs, nets.py's weights).
    Each network's layers are compared in one compiled function: op by op, JAX compiled each of the 58 convolutions and
    the reshapes around them apart (134 of the script's 186 compilations)."""
    import jax
    import jax.numpy as jnp

    from models.calo.jax import conv
    from models.calo.nets import discriminator_convs, generator_convs, initial_weights

    weights, rng, worst = initial_weights(cfg, 0), np.random.default_rng(2), 0.0
    first = {"generator": tuple(s * u for s, u in zip(cfg.seed_grid, cfg.upsample)), "discriminator": cfg.image}  # (x, y, z)
    for net, convs in (("generator", generator_convs(cfg)), ("discriminator", discriminator_convs(cfg))):
        w = {k: jnp.asarray(v) for k, v in weights[net].items()}
        xs = [jnp.asarray(rng.standard_normal((BATCH, nz, nx, ny, c.cin)), jnp.float32)  # (B, z, x, y, cin): each layer's input cells
              for c, (nx, ny, nz) in zip(convs, [first[net]] + [c.out for c in convs])]

        def errors(xs, w, convs=convs):
            def error(x, c):
                native = conv(x, w, c, False)
                return jnp.abs(native - conv(x, w, c, True)).max() / jnp.abs(native).max()

            return jnp.stack([error(x, c) for c, x in zip(convs, xs)])

        worst = max(worst, float(jax.jit(errors)(xs, w).max()))
    return worst


def result(framework: str) -> dict:
    return steps(framework, "float32")


if __name__ == "__main__":
    from tasks.common.process.job_main import load

    load(sys.argv[1])  # the framework loaded as a job loads it
    print(json.dumps(result(sys.argv[1])))
