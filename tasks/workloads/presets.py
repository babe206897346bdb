"""The named benchmark matrices, each written once and sized from the workload table.

The CLI's ``--quick`` is the preset "quick"; prefect.yaml's deployments of the benchmark spell the same values
out so the UI can show and edit them (tests/test_deployed.py holds each equal to its preset). A workload whose
cells would take too long at its own sizes says what the quick preset gives it (``Workload.quick``); every other
workload trains at its own batch sizes and epochs there (digits at 64 for 8 epochs: at karman's batch 4 its SGD
rate left three of four runs at chance).
"""

from tasks.common.specs import BenchmarkSpec
from tasks.workloads import WORKLOADS, get_workload


def _quick() -> dict:
    quick = {name: sizes for name in WORKLOADS if (sizes := get_workload(name).quick)}
    per_workload = {name: own for name, sizes in quick.items() if (own := {k: v for k, v in sizes.items() if k not in ("options", "generate")})}
    options = {name: sizes["options"] for name, sizes in quick.items() if "options" in sizes}
    generate = {name: sizes["generate"] for name, sizes in quick.items() if "generate" in sizes}
    # one run a cell: a smoke test of the whole pipeline in minutes, whose results the report marks indicative
    return {"train": {"options": options}, "per_workload": per_workload, "repeats": 1, "infer": {"steps": 40}, "workers": [1, 2],
            "generate": {"options": generate}, "aggregate": {"name": "quick"}}


def presets() -> dict[str, dict]:
    """name -> the benchmark spec's values."""
    quick = _quick()
    return {
        # The demo's sizes for karman (a narrow Pix2Pix at batch 4 and 8), the others at theirs; rollouts full-frame and
        # map-reduce on 1 and 2 workers.
        "quick": quick,
        # PyTorch and TensorFlow side by side at the quick matrix's sizes, batch 8, two seeds each.
        "frameworks": quick | {"frameworks": ["torch", "tensorflow"], "batch_sizes": [8], "repeats": 2, "aggregate": {"name": "frameworks"}},
        # Seed 004 done right: the digits CNN in the three frameworks on CPU, three seeds each, ranked by time to the target.
        "seeds-quick": {"workloads": ["digits"], "frameworks": ["torch", "tensorflow", "jax"], "devices": ["cpu"], "repeats": 3,
                        "aggregate": {"name": "seeds-quick"}},
    }


def benchmark_preset(name: str) -> BenchmarkSpec:
    """The named matrix; ValueError naming the presets for any other name."""
    known = presets()
    if name not in known:
        raise ValueError(f"unknown benchmark preset {name!r}; choose one of {', '.join(known)}")
    return BenchmarkSpec.model_validate(known[name])


def quick_benchmark() -> BenchmarkSpec:
    """The quick matrix on CPU (``--quick``): a small sweep, a narrow Pix2Pix at two batch sizes, rollouts full-frame and
    map-reduce on one and two workers, every other workload at its own sizes, one run a cell."""
    return benchmark_preset("quick")
