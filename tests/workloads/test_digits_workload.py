"""The digits workload: the same CNN in torch, tensorflow and jax (parameters, one step from the same weights), its FLOPs against torch's counter, its split, and what planning refuses."""

import numpy as np
import pytest

from tests.workloads.digits_step import stepped_in_children

FRAMEWORKS = ("torch", "tensorflow", "jax")


@pytest.fixture(scope="module")
def stepped() -> dict[str, dict]:
    """Each framework's one step on the same batch from the same weights, each in a job process of its own."""
    return stepped_in_children("tests.workloads.digits_step", FRAMEWORKS)


def test_the_three_networks_have_the_same_parameters_take_the_same_first_step_and_restore_from_a_checkpoint(stepped):
    from tasks.workloads.digits.workload import parameter_count

    assert {f: (r["parameters"], r["params"]) for f, r in stepped.items()} == {f: (parameter_count(),) * 2 for f in FRAMEWORKS}
    assert parameter_count() == 225_034
    reference = stepped["torch"]
    assert reference["after"] < reference["before"] - 0.05  # the step learned something
    for framework in ("tensorflow", "jax"):
        r = stepped[framework]
        assert r["before"] == pytest.approx(reference["before"], abs=1e-5)  # the same initial weights
        assert r["step_loss"] == pytest.approx(reference["step_loss"], abs=1e-5)
        assert r["after"] == pytest.approx(reference["after"], abs=1e-5), framework  # the same optimiser step
        assert r["flags"] == pytest.approx([0.0, 0.0, 1.5])  # agreed through the runtime (one device: themselves)
    for framework, r in stepped.items():  # a checkpoint restores weights and optimiser state exactly
        assert r["restored"] and r["second_steps"][0] == r["second_steps"][1], framework


def test_flops_per_sample_match_torchs_flop_counter_on_a_real_training_step():
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from models.digits.torch import DigitsCNN
    from tasks.workloads.digits.workload import initial_weights, train_flops_per_sample

    net = DigitsCNN()
    net.load_weights(initial_weights(0))
    x, y = torch.rand(4, 28, 28, 1), torch.tensor([0, 1, 2, 3])
    with FlopCounterMode(display=False) as counter:
        torch.nn.functional.cross_entropy(net(x), y).backward()
    assert train_flops_per_sample() == pytest.approx(counter.get_total_flops() / 4, rel=0.02)


def test_the_split_is_stratified_fixed_and_independent_of_the_training_seed():
    from tasks.workloads.digits.workload import SPLIT, read_source, source_file, stratified_split

    images, labels = read_source(source_file())
    assert images.shape == (5000, 28, 28) and images.dtype == np.uint8 and np.bincount(labels).tolist() == [500] * 10
    split = stratified_split(labels)
    assert {role: np.bincount(labels[idx], minlength=10).tolist() for role, idx in split.items()} == {
        role: [n // 10] * 10 for role, n in SPLIT.items()}
    assert len(np.unique(np.concatenate(list(split.values())))) == 5000  # every image in exactly one role
    again = stratified_split(labels)
    assert all(np.array_equal(split[r], again[r]) for r in SPLIT)


@pytest.mark.parametrize("fields, message", [
    ({"framework": "jax", "strategy": "mirrored"}, "strategy mirrored is tensorflow's; jax takes auto"),
    ({"framework": "jax", "precision": "bf16"}, "precision bf16: the jax version trains in fp32 only"),
    ({"target_accuracy": 1.5}, "less than or equal to 1"),
])
def test_a_spec_refuses_what_jax_and_the_target_cannot_take(fields, message):
    from pydantic import ValidationError

    from tasks.common.specs import TrainSpec

    with pytest.raises(ValidationError, match=message):
        TrainSpec(workload="digits", dataset="digits", **fields)


def test_jax_plans_one_process_over_its_devices():
    from tasks.common.config.errors import UserError
    from tasks.common.specs import TrainSpec
    from tasks.train.plan import plan_world

    assert plan_world(TrainSpec(workload="digits", framework="jax"), None) == (1, 1)
    assert plan_world(TrainSpec(workload="digits", framework="jax", world_size=2), None) == (2, 1)  # two CPU devices, one process
    cuda = {"world_size": 4, "device": "4 x H100"}
    assert plan_world(TrainSpec(workload="digits", framework="jax", device="cuda"), cuda) == (4, 1)
    with pytest.raises(UserError, match=r"^world size 4096 exceeds the \d+ CPU cores of this host$"):
        plan_world(TrainSpec(workload="digits", framework="jax", world_size=4096), None)
    with pytest.raises(UserError, match=r"^world size 8 exceeds the 4 cuda devices of this host \(4 x H100\)$"):
        plan_world(TrainSpec(workload="digits", framework="jax", device="cuda", world_size=8), cuda)
