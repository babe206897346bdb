"""What bench-frameworks' idiomatic references share, whatever the workload: a Keras epoch's timer and how the bench reads a classifier's side.

A workload's references live in its own folder, one module per framework (``references/<framework>.py`` beside its
framework modules; the workload's ``references`` names the frameworks that have one, and
tasks.workloads.reference_module finds them). Each is the workload's network and optimiser written as its
framework's own documentation teaches, outside the product's harness, and defines
``Reference(spec, weights, x, y, batch_size)``: the network from the workload's initial ``weights`` (its numpy
layout), trained on the training inputs ``x`` and targets ``y`` held in memory, with

* ``words``: how it is written, in one line, for the command's JSON;
* ``train(steps) -> seconds``: ``steps`` optimiser steps of ``batch_size`` over a fresh shuffle, the device's work
  finished before the clock stops;
* ``loss(x, y) -> float``: the workload's training loss of a batch under the current weights (a classifier's mean
  cross-entropy; karman's: the recipe's generator loss without its input noise).

and how the bench reads our side for it (the classifier's ``classifier_*`` below, or the workload's own):

* ``arrays(data) -> (x, y)``: the training inputs and targets of the workload's prepared data, in memory;
* ``ours_weights(trainer)``: our trainer's initial weights in the numpy layout ``Reference`` takes;
* ``ours_loss(trainer, x, y) -> float``: our trainer's loss of a batch, as ``Reference.loss`` computes it.

The references import the workload's constants and initial weights (numbers, not code): the network itself, its
step and its data path are written anew, so that they share nothing with what they are compared with. A classifier's
references share their framework's training loop and loss here (``TorchClassifierReference``,
``KerasClassifierReference``, ``JaxClassifierReference``): its network, optimiser and weights' layout are its own.
"""

import time

import numpy as np


def epoch_timer():
    """A Keras callback keeping the seconds of the last epoch, from its start to its end (fit's set-up before it is left
    out, as in every epoch of a multi-epoch fit; the epoch's end reads its logs, so its steps have run)."""
    import keras

    class EpochTimer(keras.callbacks.Callback):
        seconds = float("nan")

        def on_epoch_begin(self, epoch, logs=None):
            self.t0 = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.seconds = time.perf_counter() - self.t0

    return EpochTimer()


def classifier_arrays(data):
    """A classifier's training inputs and labels (its prepared data's ``x`` and ``y``)."""
    return data.x["train"], data.y["train"]


def classifier_weights(trainer):
    """A classifier trainer's weights in the workload's numpy layout."""
    return trainer.weights()


def classifier_loss(trainer, x, y) -> float:
    """A classifier trainer's mean cross-entropy of a batch (the workload's scores of its logits)."""
    return float(trainer.scores_of(trainer.logits(x), y)["loss"])


class TorchClassifierReference:
    """A classifier's reference in a plain PyTorch loop: batches sliced from tensors in memory in a ``torch.randperm`` order,
    ``F.cross_entropy``. The workload's ``__init__`` sets ``device``, ``model``, ``optimizer``, ``x`` and ``y`` (on the device),
    ``batch_size`` and ``generator``; ``inputs`` lays a numpy batch out as its model takes it."""

    def inputs(self, x: np.ndarray):
        import torch

        return torch.from_numpy(x).to(self.device)

    def _sync(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def train(self, steps: int) -> float:
        import torch
        import torch.nn.functional as F

        self.model.train()
        self._sync()
        t0 = time.perf_counter()
        order = torch.randperm(len(self.y), generator=self.generator).to(self.device)
        for i in range(steps):
            take = order[i * self.batch_size: (i + 1) * self.batch_size]
            inputs, labels = self.x[take], self.y[take]
            self.optimizer.zero_grad()
            loss = F.cross_entropy(self.model(inputs), labels)
            loss.backward()
            self.optimizer.step()
        self._sync()
        return time.perf_counter() - t0

    def loss(self, x: np.ndarray, y: np.ndarray) -> float:
        import torch
        import torch.nn.functional as F

        self.model.eval()
        with torch.no_grad():
            return float(F.cross_entropy(self.model(self.inputs(x)), torch.from_numpy(y).to(self.device)))


class KerasClassifierReference:
    """A classifier's reference in Keras: ``compile`` with sparse categorical cross-entropy on the logits, ``Model.fit`` on the
    arrays for an epoch of the steps asked, timed by ``epoch_timer``. The workload's ``__init__`` builds ``model`` with its
    weights, then calls ``compile_with`` its optimiser."""

    def compile_with(self, optimizer, x: np.ndarray, y: np.ndarray, batch_size: int) -> None:
        import keras

        self.model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        self.x, self.y, self.batch_size = x, y, batch_size
        self.timer = epoch_timer()

    def train(self, steps: int) -> float:
        n = steps * self.batch_size
        self.model.fit(self.x[:n], self.y[:n], batch_size=self.batch_size, epochs=1, shuffle=True, verbose=0, callbacks=[self.timer])
        return self.timer.seconds

    def loss(self, x: np.ndarray, y: np.ndarray) -> float:
        return float(self.model.evaluate(x, y, batch_size=len(x), verbose=0))


class JaxClassifierReference:
    """A classifier's reference in JAX with optax: ``jax.jit`` over the whole step (loss, gradients, optax update), numpy
    batches in a permuted order, optax's mean cross-entropy of the logits. The workload's ``__init__`` calls ``start`` with its
    parameters, its pure ``model(params, x) -> logits`` and its optax optimiser."""

    def start(self, params, model, optimizer, x: np.ndarray, y: np.ndarray, batch_size: int, seed: int) -> None:
        import jax
        import optax

        def loss_fn(params, x, y):
            return optax.softmax_cross_entropy_with_integer_labels(model(params, x), y).mean()

        @jax.jit
        def train_step(params, opt_state, x, y):
            loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss

        self.params, self.opt_state, self.train_step, self.loss_fn = params, optimizer.init(params), train_step, jax.jit(loss_fn)
        self.x, self.y, self.batch_size = x, y.astype(np.int32), batch_size
        self.rng = np.random.default_rng(seed)

    def train(self, steps: int) -> float:
        import jax

        t0 = time.perf_counter()
        order = self.rng.permutation(len(self.y))
        for i in range(steps):
            take = order[i * self.batch_size: (i + 1) * self.batch_size]
            self.params, self.opt_state, loss = self.train_step(self.params, self.opt_state, self.x[take], self.y[take])
        jax.block_until_ready(self.params)
        return time.perf_counter() - t0

    def loss(self, x: np.ndarray, y: np.ndarray) -> float:
        return float(self.loss_fn(self.params, x, y.astype(np.int32)))
