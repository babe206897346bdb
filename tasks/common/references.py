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
step and its data path are written anew, so that they share nothing with what they are compared with.
"""


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


def classifier_arrays(data):
    """A classifier's training inputs and labels (its prepared data's ``x`` and ``y``)."""
    return data.x["train"], data.y["train"]


def classifier_weights(trainer):
    """A classifier trainer's weights in the workload's numpy layout."""
    return trainer.weights()


def classifier_loss(trainer, x, y) -> float:
    """A classifier trainer's mean cross-entropy of a batch (the workload's scores of its logits)."""
    return float(trainer.scores_of(trainer.logits(x), y)["loss"])
