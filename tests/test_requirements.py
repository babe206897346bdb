"""The pools' environment files (README, "TensorFlow on GPU and TPU pools"; the JAX TPU pool) stay in step with requirements.txt."""

import re

import pytest

from tests.conftest import ROOT


def pins(name: str) -> dict[str, str]:
    found = {}
    for line in (ROOT / name).read_text().splitlines():
        if match := re.fullmatch(r"([A-Za-z0-9_.-]+)(\[[^\]]*\])?==(\S+)", line.strip()):
            found[match.group(1).lower()] = match.group(3)
    return found


@pytest.mark.parametrize("name, tensorflow", [("requirements-tensorflow-gpu.txt", ("tensorflow", "2.21.0")),
                                              ("requirements-tensorflow-tpu.txt", ("tensorflow-tpu", "2.20.0"))])
def test_a_tensorflow_pool_has_its_tensorflow_no_torch_and_every_other_pin_of_requirements_txt(name, tensorflow):
    main, pool = pins("requirements.txt"), pins(name)
    assert pool.pop(tensorflow[0]) == tensorflow[1]
    assert not {"torch", "torch_xla", "tensorflow"} & set(pool), f"{name} must not install torch or another TensorFlow"
    tools = {"pytest", "pytest-timeout", "pytest-xdist"}  # the test suite runs on the CPU environment only
    assert pool == {k: v for k, v in main.items() if k not in {"torch", "torch_xla", "tensorflow"} | tools}


def test_the_jax_tpu_pool_has_jax_for_tpu_no_torch_no_tensorflow_and_every_other_pin_of_requirements_txt():
    main, pool = pins("requirements.txt"), pins("requirements-jax-tpu.txt")
    assert "jax[tpu]==0.10.2" in (ROOT / "requirements-jax-tpu.txt").read_text().splitlines()
    assert not {"torch", "torch_xla", "tensorflow", "tensorflow-tpu"} & set(pool), "the JAX TPU pool must not install torch or TensorFlow"
    tools = {"pytest", "pytest-timeout", "pytest-xdist"}  # the test suite runs on the CPU environment only
    assert pool == {k: v for k, v in main.items() if k not in {"torch", "torch_xla", "tensorflow"} | tools}


def test_the_gpu_pool_brings_no_compute_stack_and_every_pin_it_has_equals_requirements_txt():
    """requirements-gpu-pool.txt goes on top of a GPU node's own torch, JAX and numpy (infra/wheelhouse.py):
    it pins none of them, and mlflow-skinny stands for mlflow at the same version."""
    main, pool = pins("requirements.txt"), pins("requirements-gpu-pool.txt")
    assert not {"torch", "torch_xla", "tensorflow", "jax", "jaxlib", "numpy", "mlflow"} & set(pool), "the node brings its compute stack"
    assert pool.pop("mlflow-skinny") == main["mlflow"]
    assert pool and set(pool) <= set(main), f"{set(pool) - set(main)} not in requirements.txt"
    assert pool == {name: main[name] for name in pool}
