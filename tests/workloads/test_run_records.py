"""A run records only what ran: the shared settings and its own workload's options, no other's and no None.

One short training run of each of the four workloads, through the CLI.
"""

import json
import os

import pytest
from mlflow.tracking import MlflowClient

from tasks.common.specs import GenerateSpec, TrainSpec
from tasks.common.config.workload_table import WORKLOADS, options_model
from tests.conftest import run_in_process, write_sweep

# What every training run logs beside its spec's shared settings: how it ran (tasks.common.records.TrainRecord.mlflow_params)
RUN_FACTS = {"framework_version", "torch_version", "device_name", "world_size", "strategy", "cpu_threads", "batch_size", "per_device_batch",
             "dataset_digest", "train_pairs", "data_in_memory", "split", "host", "code_version", "speed", "energy_source",
             "price_per_device_hour", "currency", "energy_scope"}
SHARED = set(TrainSpec.model_fields) - {"options", "cell", "batch_sizes", "resume"}

RUNS = {  # workload -> (its dataset's generate arguments, its training arguments: one of its own options set where it has one)
    "digits": (("--dataset", "mnist"), ("--dataset", "mnist", "--batch-sizes", "32", "--target-accuracy", "0.5")),
    "har": (("--dataset", "har", "--source", "synthetic"), ("--dataset", "har", "--batch-sizes", "64", "--layers", "1", "--units", "8")),
    "calo": (("--dataset", "showers", "--events", "100", "--workers", "1"), ("--dataset", "showers", "--batch-sizes", "4")),
    "karman": (None, ("--dataset", "karman-tiny", "--batch-sizes", "4", "--ngf", "8", "--ndf", "8", "--val-simulations", "0")),
}
KARMAN_TINY = GenerateSpec(dataset="karman-tiny", reynolds=[40.0, 50.0, 60.0], nx=64, ny=32, size=[6.0], warmup_steps=400, frames=8, frame_every=20)


@pytest.fixture(scope="module")
def runs(module_workdir) -> dict:
    """workload -> its finished training run's MLflow params and tags."""
    write_sweep(module_workdir / "data", KARMAN_TINY)
    client, found = MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"]), {}
    for name, (generate, train) in RUNS.items():
        if generate:
            made = run_in_process("generate", "--workload", name, *generate, cwd=module_workdir)
            assert made.returncode == 0, made.stderr[-3000:]
        proc = run_in_process("train", "--workload", name, *train, "--max-steps", "2", "--validate-every", "0", "--threads", "1", "--json",
                              cwd=module_workdir)
        assert proc.returncode == 0, proc.stderr[-3000:]
        data = client.get_run(json.loads(proc.stdout.strip().splitlines()[-1])["run_id"]).data
        found[name] = data.params, data.tags
    return found


@pytest.mark.parametrize("name", list(RUNS))
def test_a_run_logs_the_shared_settings_and_its_own_options_only(runs, name):
    params, tags = runs[name]
    own = set(options_model(name).model_fields)
    others = set().union(*(options_model(o).model_fields for o in WORKLOADS if o != name)) - own
    assert not others & set(params), f"{name} logs another workload's options: {sorted(others & set(params))}"
    assert "None" not in params.values(), {k: v for k, v in params.items() if v == "None"}
    given = {flag.removeprefix("--").replace("-", "_") for flag in RUNS[name][1] if flag.startswith("--")}
    assert given & own <= set(params)  # the options it was given, under their own names
    workload_params = set(params) - SHARED - RUN_FACTS - own  # what the workload reports of its run (network sizes, data source)
    assert not workload_params & set().union(*(options_model(o).model_fields for o in WORKLOADS)), workload_params
    assert SHARED - {"world_size", "epochs", "time_budget", "threads"} <= set(params)  # the shared settings that are set
    assert ("karman.recipe" in tags) == (name == "karman")  # a workload's tags name its own settings
