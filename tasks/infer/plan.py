"""A rollout request turned into the checked plan of the workload that trained its model, in the flow process.

It resolves the model run the request names and asks that run's workload for its own plan (Workload.rollouts); no
framework is imported here."""

from tasks.common.config import plans
from tasks.common.config.errors import UserError
from tasks.common.stores.model_files import resolve_model_run
from tasks.common.tracking.names import Tag
from tasks.common.config.settings import Settings
from tasks.common.specs import DEFAULT_WORKLOAD, InferSpec
from tasks.workloads import get_workload, table


def trained_workload(run) -> str:
    """The workload a training run trained (runs logged before runs named theirs: the table's default)."""
    return run.data.tags.get(Tag.WORKLOAD) or DEFAULT_WORKLOAD


def plan_rollout(settings: Settings, spec: InferSpec, log):
    """Every check of a rollout request, before any work, by the workload whose model it names; a plan the CLI made for
    the same spec is taken instead. The plan has the child's job body (``body``), the model's ``framework``,
    ``model_run_id``, ``dataset`` and ``simulation``, and ``to_json()`` for the child. UserError names the value and what
    is allowed: a model of a workload whose models are not rolled out among them."""
    handed = plans.take("infer", spec)
    if handed is not None:
        return handed
    workload, model = rolled_model(settings, spec.model_run)
    return workload.rollouts(settings, spec, model, log)


def rolled_model(settings: Settings, model_run: str):
    """(the workload, the MLflow run) of the training run ``model_run`` names (InferSpec.model_run: 'latest' takes the
    newest of a workload whose models are rolled out); UserError for a run of a workload whose models are not."""
    rolled = [name for name in table() if get_workload(name).rollouts]
    model = resolve_model_run(settings, model_run, lambda run: trained_workload(run) in rolled,
                              f"training run of a workload whose models are rolled out ({', '.join(rolled)})")
    workload = trained_workload(model)
    if workload not in rolled:
        raise UserError(f"training run {model.info.run_id} trained workload {workload}, whose models are not rolled out; "
                        f"infer rolls out models of {', '.join(rolled)}")
    return get_workload(workload), model
