"""Prefect tasks (flow process): a workload's dataset, written by the workload's own ``generate`` (karman's: a solver sweep, tasks.workloads.karman.sweep)."""

from prefect import task

from tasks.common.config.errors import UserError
from tasks.common.config.settings import Settings
from tasks.common.specs import GenerateSpec
from tasks.workloads import Workload, get_workload


def check_generate(settings: Settings, spec: GenerateSpec) -> None:
    """What a generate request can have refused before anything runs (its spec refused another workload's option): a device the workload does not write on, what the workload's own check refuses (a damaged dataset, a
    sweep member that does not validate, a Dask scheduler where none answers and the dataset needs one)."""
    workload = get_workload(spec.workload)
    if spec.device != "cpu" and not workload.swept:
        raise UserError(f"device {spec.device!r}: the {spec.workload} dataset is written on the cpu; use --device cpu")
    if workload.check_generate is not None:
        workload.check_generate(settings, spec)


def generate_dataset(settings: Settings, spec: GenerateSpec, workload: Workload, parent_run_id: str | None = None) -> dict:
    """The dataset of ``spec``'s ``workload`` (its table entry), written by its ``generate``: a sweep runs in the flow itself
    (each of its simulations a task run), any other as one task run ``write <workload> dataset <name>``."""
    write = workload.generate if workload.swept else task(workload.generate, name="write-dataset", retries=0,
                                                          task_run_name=f"write {spec.workload} dataset {spec.dataset}")
    return write(settings, spec, parent_run_id)
