"""What the report asks the workload table about a run's workload: its words, its settings, its capabilities.

A workload this process does not know (a record of one kept outside this repository) reads as one without
any capability, under its bare name."""

from tasks.common.config.errors import UserError
from tasks.common.records import TrainRecord
from tasks.workloads import Workload, get_workload


def workload_of(name: str) -> Workload | None:
    """The workload ``name`` from the table; None where this process does not know it."""
    try:
        return get_workload(name)
    except UserError:
        return None


def learned_nothing(record: TrainRecord) -> str:
    """Why a finished run's test scores show it learned nothing, by its workload's measure; '' where they do not (or it has none)."""
    known = workload_of(record.config.workload)
    return (known.learned_nothing(record.test) or "") if known and known.learned_nothing else ""


def workload_words(name: str, what: str) -> str:
    """A workload's ``what`` (title, data, target) from the table; the bare name where this process does not know it."""
    workload = workload_of(name)
    return getattr(workload, what) if workload else name


def target_words(record: TrainRecord) -> str:
    """A training run's quality target in words: its spec's where its workload takes one from the spec, else its table's."""
    try:
        return get_workload(record.config.workload).target_of(record.config.spec)
    except UserError:
        return record.config.workload


def budget(spec) -> str:
    """A training spec's budget in words: its time budget, steps or epochs."""
    if spec.time_budget is not None:
        return f"{spec.time_budget:g} s"
    if spec.max_steps is not None:
        return f"{spec.max_steps} steps"
    return f"{spec.epoch_limit} epochs"


def setting_label(record: TrainRecord, framework: bool = True) -> str:
    """What a training run's setting is, in words: workload, framework (unless not asked for), precision, the
    workload's own settings (recipe, widths), budget, threads, data."""
    c = record.config
    try:
        own = get_workload(c.workload).setting(c.spec)
    except UserError:  # a workload this process does not know: its recorded label
        own = str(c.workload_params.get("recipe_label", "?"))
    parts = [c.workload] + ([c.framework] if framework else []) + [c.spec.precision, own, f"budget {budget(c.spec)}"]
    if c.threads:
        parts.append(f"{c.threads} CPU thread{'s' if c.threads > 1 else ''}")
    if c.workload_params.get("data"):  # the data's source where the workload records one (har: real (UCI HAPT) or synthetic)
        parts.append(f"{c.workload_params['data']} data")
    if c.dataset_digest:
        parts.append(f"data {c.dataset_digest[:8]}")
    return ", ".join(parts)
