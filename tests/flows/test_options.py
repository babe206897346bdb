"""One option generator for every command: pipeline and bench-… options from their specs, and strict JSON summaries."""

import json
import math

import numpy as np
import pytest

from flows.cli import build_parser
from flows.jsonline import json_line
from flows.options import spec_from_args
from tasks.bench.specs import BenchInferSpec, BenchQualitySpec, BenchSolverSpec, BenchTrainSpec
from tasks.common.specs import GenerateSpec
from tests.conftest import strict_json


def parse(*argv: str):
    return build_parser().parse_args(list(argv))


@pytest.mark.parametrize("argv, spec", [
    (["bench-train", "--no-baseline", "--precision", "bf16", "--size", "32"], BenchTrainSpec(baseline=False, precision="bf16", size=32)),
    (["bench-train"], BenchTrainSpec()),
    (["bench-infer", "--tile", "32,64", "--no-compare", "--width", "none"], BenchInferSpec(tile=(32, 64), compare=False)),
    (["bench-solver", "--nx", "64", "--backend", "torch", "--device", "cuda:1"], BenchSolverSpec(nx=64, backend="torch", device="cuda:1")),
    (["bench-quality", "--extra-dataset", "a", "--extra-dataset", "b,c", "--stop-at-target", "--noise", "0"],
     BenchQualitySpec(extra_dataset=["a", "b", "c"], stop_at_target=True, noise=0.0)),
    (["generate", "--reynolds", "80", "--reynolds", "90,100"], GenerateSpec(reynolds=[80.0, 90.0, 100.0])),
])
def test_every_command_is_read_into_its_spec_by_the_same_generator(argv, spec):
    assert spec_from_args(type(spec), parse(*argv)) == spec


def test_bench_specs_take_numbers_and_tiles_as_the_command_line_writes_them():
    assert BenchInferSpec(tile="64").tile == (64, 64) and BenchInferSpec(tile=[16, 32]).tile == (16, 32)
    from tasks.common.specs import TrainSpec

    assert BenchQualitySpec(seed=3, repeats=2, ngf="8", batch_size=4).train_spec() == TrainSpec(seed=3, ngf=8, batch_sizes=[4])
    for field, value, message in (("halo", "-1", "-1 is negative; use 0 or more"), ("workers", "0", "0 must be a positive integer"),
                                  ("size", "2.5", "'2.5' is not an integer"), ("tile", "64x128", "'64x128' is not a tile size")):
        with pytest.raises(ValueError, match=message):
            BenchInferSpec(**{field: value})
    with pytest.raises(ValueError, match="time_budget"):  # bench-quality's training settings are train's, ranges too
        BenchQualitySpec(time_budget="nan")


def test_a_summary_with_non_finite_numbers_is_strict_json_with_nulls():
    summary = {"correlation_periods": float("nan"), "runs": [{"st": np.float32("inf"), "n": np.int64(3)}], "ok": 0.5,
               "pair": (1.0, -math.inf), "flag": True}
    for line in (json_line(summary), json_line(summary, indent=2)):
        assert strict_json(line) == {"correlation_periods": None, "runs": [{"st": None, "n": 3}], "ok": 0.5, "pair": [1.0, None], "flag": True}
    with pytest.raises(AssertionError, match="NaN"):
        strict_json(json.dumps({"x": float("nan")}))  # what a bare NaN would do to a reader
