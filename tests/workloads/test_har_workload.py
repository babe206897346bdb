"""The har workload: the synthetic generator (deterministic, balanced, split by subject), the macro scores, the BiLSTM's FLOPs against torch's counter, torch, Keras and JAX from the same weights (parameters, one Adam step, checkpoint, the learning-rate schedule), and what a spec refuses."""

import numpy as np
import pytest

from tests.workloads.digits_step import stepped_in_children

FRAMEWORKS = ("torch", "tensorflow", "jax")


@pytest.fixture(scope="module")
def stepped() -> dict[str, dict]:
    """Each framework's one step on the same batch from the same weights, each in a job process of its own."""
    return stepped_in_children("tests.workloads.har_step", FRAMEWORKS)


def test_torch_keras_and_jax_train_the_same_parameters_take_the_same_first_step_and_restore_from_a_checkpoint(stepped):
    from tasks.workloads.har.workload import Network
    from tests.workloads.har_step import NETWORK

    expected = Network(**NETWORK).parameter_count()
    # per layer and direction 4H(in + H) + 4H (one bias: torch's second is frozen at zero), then the dense layer
    assert expected == 2 * (4 * 8 * (9 + 8) + 32) + 2 * (4 * 8 * (16 + 8) + 32) + 16 * 6 + 6 == 2854
    assert {f: (r["parameters"], r["trainable"], r["params"]) for f, r in stepped.items()} == {f: (expected,) * 3 for f in FRAMEWORKS}
    torch_ = stepped["torch"]
    assert torch_["after"] < torch_["before"] - 0.02  # the step learned something
    for other in (stepped["tensorflow"], stepped["jax"]):
        assert other["before"] == pytest.approx(torch_["before"], abs=1e-5)  # the same initial weights, gates and pooling
        assert other["step_loss"] == pytest.approx(torch_["step_loss"], abs=1e-5)
        assert other["after"] == pytest.approx(torch_["after"], abs=1e-5)  # the same Adam step
    for framework, r in stepped.items():
        assert r["flags"] == pytest.approx([0.0, 0.0, 1.5]), framework
        assert r["restored"] and r["second_steps"][0] == pytest.approx(r["second_steps"][1], abs=1e-6), framework  # moments too


def test_the_learning_rate_schedule_is_the_same_in_every_framework(stepped):
    from tasks.workloads.har.workload import LEARNING_RATE, SCHEDULE

    assert SCHEDULE == "constant"  # the seed's: every step at LEARNING_RATE unless the run asks for cosine
    for framework, r in stepped.items():
        assert r["rate"] == pytest.approx(LEARNING_RATE), framework
        # at the end of a cosine run the rate is a hundredth (models.schedule.LR_FLOOR); Adam's first step moves a weight by it
        assert r["late_rate"] == pytest.approx(LEARNING_RATE / 100), framework
        assert r["late_moved"] == pytest.approx(LEARNING_RATE / 100, rel=0.01), framework  # float32 weights near 0.5: ulp 6e-8


def test_the_generator_is_deterministic_balanced_and_split_by_subject():
    from tasks.workloads.har.synthetic import SPLIT, subject_split, synthesize
    from tasks.workloads.har.windows import CHANNELS, CLASSES, SUBJECTS
    from tasks.workloads.har.workload import content_digest

    windows, activities, subjects = synthesize(per_activity=2, subjects=6)
    assert windows.shape == (72, 128, len(CHANNELS)) and windows.dtype == np.float32 and np.isfinite(windows).all()
    assert np.bincount(activities).tolist() == [12] * CLASSES and np.bincount(subjects)[1:].tolist() == [12] * 6
    again = synthesize(per_activity=2, subjects=6)
    assert all(np.array_equal(a, b) for a, b in zip((windows, activities, subjects), again))
    assert not np.array_equal(windows, synthesize(seed=1, per_activity=2, subjects=6)[0])
    # total acceleration = body acceleration + gravity: 1 g whatever the posture, within the per-axis gains (4 %)
    gravity = (windows[..., 6:] - windows[..., :3]).mean(axis=1)
    assert np.linalg.norm(gravity, axis=1) == pytest.approx(1.0, abs=0.2)
    assert np.linalg.norm(gravity, axis=1).std() > 0.02  # the gains differ by subject

    split = subject_split()
    assert {role: len(s) for role, s in split.items()} == SPLIT
    assert sorted(np.concatenate(list(split.values())).tolist()) == list(range(1, SUBJECTS + 1))  # disjoint, every subject once
    assert all(np.array_equal(split[r], subject_split()[r]) for r in SPLIT)
    small = subject_split(subjects=6)
    assert sorted(np.concatenate(list(small.values())).tolist()) == list(range(1, 7)) and min(map(len, small.values())) == 1
    assert content_digest(windows, activities, subjects, split) == content_digest(*again, split)


def test_macro_scores_by_hand():
    from tasks.workloads.har.workload import scores

    labels = np.array([0, 0, 1, 1, 2, 2])
    predicted = np.array([0, 1, 1, 1, 1, 2])  # class 0: p 1, r 1/2; class 1: p 2/4, r 1; class 2: p 1, r 1/2
    logits = np.full((6, 3), -5.0)
    logits[np.arange(6), predicted] = 5.0
    out = scores(logits, labels, classes=3)
    f1 = [2 * 0.5 / 1.5, 2 * 0.5 / 1.5, 2 * 0.5 / 1.5]
    assert out["accuracy"] == pytest.approx(4 / 6)
    assert out["precision"] == pytest.approx((1 + 0.5 + 1) / 3) and out["recall"] == pytest.approx((0.5 + 1 + 0.5) / 3)
    assert out["f1"] == pytest.approx(np.mean(f1)) and out["loss"] > 0
    never = scores(np.tile([[5.0, 0.0, 0.0]], (6, 1)), labels, classes=3)  # classes 1 and 2 never predicted: precision 0, not NaN
    assert never["precision"] == pytest.approx(1 / 3 / 3) and never["f1"] == pytest.approx(2 * (1 / 3) / (4 / 3) / 3)


@pytest.mark.parametrize("layers, units", [(2, 32), (3, 8)])
def test_flops_per_sample_match_torchs_flop_counter_on_a_real_training_step(layers, units):
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from models.har.torch import HarBiLSTM
    from tasks.workloads.har.workload import Network

    network = Network(layers, units)
    net = HarBiLSTM(network)
    net.load_weights(network.initial_weights(0))
    x, y = torch.rand(4, 128, 9), torch.tensor([0, 1, 2, 3])
    # oneDNN's fused LSTM is one operator the counter does not see: without it the LSTM runs as matrix products
    # (allow_tf32=None leaves TF32 alone: setting it warns on a build without Intel GPU support)
    with torch.backends.mkldnn.flags(enabled=False, allow_tf32=None), FlopCounterMode(display=False) as counter:
        torch.nn.functional.cross_entropy(net(x), y).backward()
    # torch skips the gradient into the zero initial state: one recurrent product per layer and direction fewer
    assert network.train_flops_per_sample() == pytest.approx(counter.get_total_flops() / 4, rel=0.002)


def test_weights_round_trip_through_torch_in_the_workloads_layout():
    from models.har.torch import HarBiLSTM
    from tasks.workloads.har.workload import Network

    network = Network(2, 4)
    weights = network.initial_weights(3)
    assert {k: v.shape for k, v in weights.items()} == network.weight_shapes()
    assert weights["lstm0/fw/bias"].tolist() == [0.0] * 4 + [1.0] * 4 + [0.0] * 8  # the forget gate's bias is 1
    recurrent = weights["lstm1/bw/recurrent"]
    assert recurrent @ recurrent.T == pytest.approx(np.eye(4), abs=1e-5)  # orthonormal rows
    net = HarBiLSTM(network)
    net.load_weights(weights)
    assert all(np.array_equal(weights[k], v) for k, v in net.weights().items())
    assert not np.array_equal(weights["dense/kernel"], network.initial_weights(4)["dense/kernel"])


@pytest.mark.parametrize("fields, message", [
    ({"layers": 0}, "greater than 0"),
    ({"units": 0}, "greater than 0"),
    ({"units": 5000}, "less than or equal to 4096"),
])
def test_a_spec_refuses_a_network_without_layers_or_units(fields, message):
    from pydantic import ValidationError

    from tasks.common.specs import TrainSpec

    with pytest.raises(ValidationError, match=message):
        TrainSpec(workload="har", dataset="har", **fields)


def test_the_network_of_a_spec_and_its_size():
    from tasks.common.config.errors import UserError
    from tasks.common.specs import TrainSpec
    from tasks.workloads.har.workload import Network, network_of

    assert network_of(TrainSpec(workload="har")) == Network(2, 32)
    assert network_of(TrainSpec(workload="har", layers=3, units=128)) == Network(3, 128)
    with pytest.raises(UserError, match=r"^units 0: the har network needs at least 1$"):
        Network(2, 0)
