"""The workload contract's hooks, typed: how the stages call each part of a workload and of its framework modules.

Each hook is a Protocol whose ``__call__`` is the signature the stages call it with. ``conforms`` holds a workload's
part to its hook: it takes the hook's parameters by position (more only with defaults), and where it annotates a
parameter or its result, with the hook's type (``Any`` in the hook leaves the workload's own type free). The
workload table checks every registered workload's parts when it loads them, and tests check them all.
"""

import inspect
import typing
from logging import Logger
from pathlib import Path
from typing import Any, Callable, Protocol

from tasks.common.config.settings import Settings
from tasks.common.specs import GenerateSpec, InferSpec, TrainSpec


class Prepare(Protocol):
    """The training data and everything the framework modules share, in the training child (``main``: rank 0)."""

    def __call__(self, settings: Settings, spec: TrainSpec, main: bool = True) -> Any: ...


class Check(Protocol):
    """None, or UserError for what cannot run: batch sizes over ``world`` devices of ``memory`` bytes (None: unknown)."""

    def __call__(self, settings: Settings, spec: TrainSpec, batch_sizes: list[int], world: int, memory: int | None = None) -> None: ...


class DatasetInfo(Protocol):
    """(the dataset's digest, a few facts for MLflow's dataset profile); UserError where it is missing."""

    def __call__(self, settings: Settings, dataset: str) -> tuple[str, dict]: ...


class Setting(Protocol):
    """The workload's own settings of a run in a few words (recipe, widths), for descriptions and the report."""

    def __call__(self, spec: TrainSpec) -> str: ...


class Generate(Protocol):
    """Write the workload's dataset into the store as an MLflow generate run: its summary (dataset, path, digest, run_id)."""

    def __call__(self, settings: Settings, spec: GenerateSpec, parent_run_id: str | None = None) -> dict: ...


class CheckGenerate(Protocol):
    """None, or UserError for what its generate would refuse, before it starts."""

    def __call__(self, settings: Settings, spec: GenerateSpec) -> None: ...


class SpecTarget(Protocol):
    """The run's quality target in words, where its spec sets one."""

    def __call__(self, spec: TrainSpec) -> str: ...


class Register(Protocol):
    """Register the best of ``run_ids`` in the Model Registry and move the alias 'champion' to it where it beats the holder."""

    def __call__(self, settings: Settings, run_ids: list[str]) -> dict: ...


class LearnedNothing(Protocol):
    """Why a finished run's test scores show it learned nothing (a classifier at chance), with the figure; None where not."""

    def __call__(self, test: dict) -> str | None: ...


class Report(Protocol):
    """Its own sections of the report (tasks.common.reports.reporting.Sections) from its training rows, rollout entries,
    run id -> Markdown link, and the report's folder."""

    def __call__(self, trains: list[dict], rollouts: list, link: Callable[[str], str], out: Path) -> Any: ...


class Rollouts(Protocol):
    """The checked plan of a rollout of its trained ``model`` (the child's job body, framework, model run, dataset, simulation)."""

    def __call__(self, settings: Settings, spec: InferSpec, model: Any, log: Logger) -> Any: ...


class BenchQuality(Protocol):
    """bench-quality's result, where the workload scores its trained models itself; ``train(spec)`` is the stage's training."""

    def __call__(self, settings: Settings, bench: Any, spec: TrainSpec, runtime: Any, train: Any, folders: list) -> dict: ...


class BenchStep(Protocol):
    """bench-train's or bench-infer's result for its request ``bench`` and seed."""

    def __call__(self, bench: Any, seed: int = 0) -> dict: ...


class Ablation(Protocol):
    """(rows, Markdown) of the ablate flow's table over each variant's training and rollouts."""

    def __call__(self, name: str, params: dict, results: list[tuple], simulation: str, extra: list[str] = ()) -> tuple[list[dict], str]: ...


class Build(Protocol):
    """A framework module's trainer for the one training loop (tasks.common.runtimes.loop)."""

    def __call__(self, data: Any, spec: TrainSpec, batch_size: int, runtime: Any) -> Any: ...


# The Workload's hook fields and the framework module's entry, each with its Protocol
HOOKS: dict[str, type] = {
    "prepare": Prepare, "check": Check, "dataset_info": DatasetInfo, "setting": Setting, "generate": Generate,
    "check_generate": CheckGenerate, "spec_target": SpecTarget, "register": Register, "learned_nothing": LearnedNothing,
    "report": Report, "rollouts": Rollouts, "bench_quality": BenchQuality, "bench_train": BenchStep, "bench_infer": BenchStep,
    "ablation": Ablation,
}


def _hints(function) -> dict:
    try:
        return typing.get_type_hints(function)
    except Exception:  # an annotation that does not resolve in its module: held to nothing
        return {}


def conforms(part, hook: type, what: str) -> None:
    """TypeError naming ``what`` unless ``part`` can stand for ``hook`` (a Protocol above): it takes the hook's parameters
    by position, any further ones have defaults, and its annotations, where given, are the hook's (or the hook's is Any)."""
    expected = inspect.signature(hook.__call__)
    wanted = [p for p in expected.parameters.values() if p.name != "self"]
    words = f"({', '.join(p.name for p in wanted)})"
    if not callable(part):
        raise TypeError(f"{what} is {type(part).__name__}, not a function taking {words}")
    try:
        given = list(inspect.signature(part).parameters.values())
    except (TypeError, ValueError):
        return  # a builtin without a signature: nothing to hold it to
    positional = [p for p in given if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    takes_more = any(p.kind == p.VAR_POSITIONAL for p in given)
    if len(positional) < len(wanted) and not takes_more:
        raise TypeError(f"{what} takes {len(positional)} positional argument(s); the stages call it with {words}")
    if any(p.default is p.empty for p in positional[len(wanted):]) or any(p.kind == p.KEYWORD_ONLY and p.default is p.empty for p in given):
        raise TypeError(f"{what} needs more arguments than the stages give it {words}")
    theirs, ours = _hints(hook.__call__), _hints(part)
    for mine, want in zip(positional, wanted):
        if want.name in theirs and mine.name in ours and theirs[want.name] is not Any and ours[mine.name] != theirs[want.name]:
            raise TypeError(f"{what}: its parameter {mine.name} is annotated {ours[mine.name]}, where the stages pass {theirs[want.name]}")
    if "return" in theirs and "return" in ours and theirs["return"] is not Any and ours["return"] != theirs["return"]:
        raise TypeError(f"{what} returns {ours['return']}, where the stages take {theirs['return']}")
