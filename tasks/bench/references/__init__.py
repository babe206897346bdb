"""Idiomatic references for bench-frameworks: each workload's network and optimiser written as its framework's own documentation teaches, outside the product's harness.

One folder per workload, one module per framework in it (``references/<workload>/<framework>.py``, as the workloads
are laid out). A module defines ``Reference(spec, weights, x, y, batch_size)``: the network from the workload's
initial ``weights`` (its numpy layout), trained on the training inputs ``x`` and labels ``y`` held in memory, with

* ``words``: how it is written, in one line, for the command's JSON;
* ``train(steps) -> seconds``: ``steps`` optimiser steps of ``batch_size`` over a fresh shuffle, the device's work
  finished before the clock stops;
* ``loss(x, y) -> float``: the mean cross-entropy of a batch under the current weights.

The references import the workload's constants and initial weights (numbers, not code): the network itself, its
step and its data path are written here anew, so that they share nothing with what they are compared with.
"""

import importlib
import importlib.util

FRAMEWORKS = ("torch", "tensorflow", "jax")


def workloads() -> list[str]:
    """The workloads that have references (a folder here with a module per framework)."""
    from pathlib import Path

    here = Path(__file__).parent
    return sorted(p.name for p in here.iterdir() if p.is_dir() and all((p / f"{fw}.py").is_file() for fw in FRAMEWORKS))


def reference_module(workload: str, framework: str):
    """The reference module of ``workload`` in ``framework`` (imports the framework)."""
    return importlib.import_module(f"{__name__}.{workload}.{framework}")


def epoch_timer():
    """A Keras callback keeping the seconds of the last epoch, from its start to its end (fit's set-up before it is left
    out, as in every epoch of a multi-epoch fit; the epoch's end reads its logs, so its steps have run)."""
    import time

    import keras

    class EpochTimer(keras.callbacks.Callback):
        seconds = float("nan")

        def on_epoch_begin(self, epoch, logs=None):
            self.t0 = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.seconds = time.perf_counter() - self.t0

    return EpochTimer()
