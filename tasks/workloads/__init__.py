"""The workload contract and how the stages find a workload's parts by its name (tasks.common.config.workload_table lists them).

A workload is a folder: ``options.py`` declares its own training options (a tasks.common.specs.WorkloadOptions),
``workload.py`` holds what is framework-neutral (its data, its quality score
and target, its record's parameters) as one ``WORKLOAD`` object, and one module per framework
(``torch.py``, ``tensorflow.py``, ``jax.py``) builds its trainer for the one training loop (tasks.common.runtimes.loop).
Its ``references/`` package, where it has one, holds bench-frameworks' idiomatic references, one module per
framework (``references/torch.py``, ...: tasks.common.runtimes.references says what each defines).
Adding a workload is that folder and one line of tasks.common.config.workload_table. Workloads kept outside this repository
join through ``KARMAN_WORKLOADS=name=package.module,...`` (child processes inherit it).
"""

import importlib
import inspect
from dataclasses import dataclass, fields
from typing import Callable

from tasks.common.config.errors import UserError
from tasks.common.specs import DEFAULT_EPOCHS
from tasks.workloads.contract import (HOOKS, Ablation, BenchQuality, BenchStep, Build, Check, CheckGenerate, DatasetInfo, Generate,
                                      LearnedNothing, Prepare, Register, Report, Rollouts, Setting, SpecTarget, conforms)
from tasks.common.config.workload_table import WORKLOADS, option_owners, options_model, package_of, table  # noqa: F401  (the table, as the stages ask it)


@dataclass(frozen=True)
class RunRules:
    """What makes a result of a cell, as MLPerf's training rules and AlgoPerf say: ``runs`` runs (seeds), of which at most
    ``failures`` may miss the target (MLPerf: one; it then counts as the slowest), each within ``max_runtime_s`` of
    training (AlgoPerf's max_runtime: a run that reaches the target later has not reached it)."""

    runs: int = 5
    failures: int = 1
    max_runtime_s: float = 3600.0

    def reached(self, time_to_target_s: float | None) -> bool:
        return time_to_target_s is not None and time_to_target_s == time_to_target_s and time_to_target_s <= self.max_runtime_s

    def verdict(self, runs: int, reached: int) -> str:
        """'complete' where ``runs`` runs of which ``reached`` reached the target make a result by these rules, else why not."""
        if runs >= self.runs and runs - reached <= self.failures and reached:
            return "complete"
        why = []
        if runs < self.runs:
            why.append(f"{runs} of {self.runs} runs")
        if not reached:
            why.append("none reached the target")
        elif runs - reached > self.failures:
            why.append(f"{runs - reached} missed the target ({self.failures} may)")
        return "indicative: " + ", ".join(why)


@dataclass(frozen=True)
class Workload:
    """What a workload says of itself, whatever the framework."""

    name: str
    title: str  # what it trains, in a few words (the report's headings)
    data: str  # where its data comes from, in words; "synthetic" appears in it when the data is or may be (har: --source synthetic)
    frameworks: tuple[str, ...]  # frameworks with a module in its folder
    main_loss: str  # the loss the report shows (a key of the step's losses, e.g. loss_l1)
    target: str  # the quality target, in words
    prepare: Prepare  # the training data and everything the framework modules share (in the child)
    check: Check  # None; UserError for what cannot run
    dataset_info: DatasetInfo  # (its digest, a few facts for MLflow's dataset profile); UserError if missing
    setting: Setting  # the workload's own settings of a run in a few words (recipe, widths), for descriptions and the report
    dataset: str = ""  # the dataset a benchmark trains it on when the benchmark does not name one (karman's comes from the sweep)
    batch_sizes: tuple[int, ...] = (8, 16, 32, 64)  # a benchmark's global batch sizes when it names none
    epochs: int = DEFAULT_EPOCHS  # a benchmark's epoch limit when it sets neither epochs nor a time budget
    generate: Generate | None = None  # writes the workload's dataset into the store as an MLflow generate run
    # Its dataset is the benchmark's own generate section, a sweep whose simulations are task runs of the flow (Dask, or a GPU
    # pool's deployment: karman's solver sweep), rather than a dataset its generate writes in one task run
    swept: bool = False
    check_generate: CheckGenerate | None = None  # UserError for what its generate would refuse, before it starts
    sizes: tuple[str, ...] = ()  # TrainSpec fields a benchmark sweeps for it (BenchmarkSpec fields of the same names; har: layers, units)
    # Frameworks of its own with an idiomatic reference for bench-frameworks in its folder (references/<framework>.py, found by
    # reference_module); (): bench-frameworks refuses it, naming the workloads that have references
    references: tuple[str, ...] = ()
    one_device: tuple[str, ...] = ()  # frameworks of its own whose version trains on one device only (no data-parallel world)
    # Capabilities: what some workloads have (karman today) and the shared stages ask for by these names, never by a workload's name;
    # each typed by its hook (tasks.workloads.contract), None where the workload has none.
    # The checked plan of a rollout of its model, where the infer stage rolls its trained models out: a benchmark adds rollout
    # cells, bench-quality extra datasets; None: its models are not rolled out
    rollouts: Rollouts | None = None
    spec_target: SpecTarget | None = None  # the run's quality target in words where its spec sets one; None: ``target``
    # A benchmark registers its best trained model in the Model Registry and moves the alias 'champion' to it where it beats the holder
    register: Register | None = None
    # A run whose test scores show it learned nothing is marked (MLflow tag karman.learned_nothing), left out of the report's ranking
    # with that line, and is never a champion.
    learned_nothing: LearnedNothing | None = None
    # Its own sections of the report: its frameworks compared, its rollouts' tables and figures
    report: Report | None = None
    # Where the workload scores its trained models itself (karman: rollouts, the surrogate's step against the solver's); ``train(spec)``
    # is the stage's training through the loop: (data, trainer, loop summary, validations, seconds). None: the test split's scores
    bench_quality: BenchQuality | None = None
    # bench-train: its training step's samples/s against a plain step, on synthetic batches (karman: the Pix2Pix step). None: none
    bench_train: BenchStep | None = None
    # bench-infer: one rollout step's frames/s, full-frame or map-reduce over workers, against the solver. None: none
    bench_infer: BenchStep | None = None
    # The ablate flow's table, where its training recipe can be ablated: results are (variant, seed, training result, test rollout,
    # extra rollouts) each
    ablation: Ablation | None = None
    rules: RunRules = RunRules()  # how many runs make a result of one of its cells, and the time each may take
    # Its cells' sizes in the quick preset where they are not its own (BenchmarkSpec.per_workload's fields, "options": its own training
    # options there, "generate": its dataset's; karman trains at the demo's batch 4 and 8 for 3 epochs, 16 wide); None: its own sizes
    quick: dict | None = None

    def __post_init__(self):
        """TypeError naming the field of a workload whose part cannot stand for its hook (tasks.workloads.contract)."""
        from tasks.common.config.frameworks import FRAMEWORKS

        unknown = [f for f in self.frameworks if f not in FRAMEWORKS]
        if unknown:
            raise TypeError(f"workload {self.name}: frameworks {', '.join(unknown)} are not in the framework table ({', '.join(FRAMEWORKS)})")
        if set(self.references) - set(self.frameworks):
            raise TypeError(f"workload {self.name}: references {', '.join(sorted(set(self.references) - set(self.frameworks)))} are not among its frameworks")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in HOOKS and value is not None:
                conforms(value, HOOKS[f.name], f"workload {self.name}: {f.name}")

    @property
    def synthetic(self) -> bool:
        return "synthetic" in self.data

    def target_of(self, spec) -> str:
        """The quality target of a run of ``spec`` (TrainSpec), in words."""
        return self.spec_target(spec) if self.spec_target else self.target


# What a reference module (references/<framework>.py) defines, and how bench-frameworks calls each (tasks.common.runtimes.references)
REFERENCE = {"Reference": ("spec", "weights", "x", "y", "batch_size"), "arrays": ("data",), "ours_weights": ("trainer",),
             "ours_loss": ("trainer", "x", "y")}


def callable_as(part, arguments: tuple[str, ...], what: str) -> None:
    """TypeError naming ``what`` unless ``part`` is callable with ``arguments`` given by position (a reference module's names)."""
    if not callable(part):
        raise TypeError(f"{what} is {type(part).__name__}, not a function taking ({', '.join(arguments)})")
    try:
        inspect.signature(part).bind(*arguments)
    except TypeError as exc:
        raise TypeError(f"{what} cannot be called with ({', '.join(arguments)}): {exc}") from None


def benchmark_dataset(workload: Workload, generate) -> tuple[str, dict]:
    """The dataset a benchmark trains ``workload`` on and its own generate options that the benchmark's ``generate`` section
    (GenerateOptions) sets: its own dataset, or where the section sets any away from their defaults, a dataset named after
    them (``calo-events400``), so that a default one of the same workload stays as it is."""
    own = generate.options.get(workload.name)
    changed = {f: getattr(own, f) for f, field in type(own).model_fields.items() if getattr(own, f) != field.get_default(call_default_factory=True)} if own else {}
    if not changed:
        return workload.dataset, {}
    show = lambda v: "-".join(f"{x:g}" for x in v) if isinstance(v, list) else v if isinstance(v, str) else f"{v:g}"  # noqa: E731
    return "-".join([workload.dataset, *(f"{k}{show(v)}" for k, v in changed.items())]), changed


def swept_sizes(workload: Workload, spec) -> list[dict]:
    """Every combination of the option values a benchmark ``spec`` sweeps that ``workload`` takes (its ``sizes``: layers x
    units for har; and ``spec.sweep``'s options of its own); [{}] for a workload that takes none, or when the benchmark sweeps none."""
    import itertools

    axes = {name: getattr(spec, name) for name in workload.sizes if getattr(spec, name) is not None}
    own = options_model(workload.name).model_fields
    axes |= {option: values for option, values in spec.sweep.items() if option in own}  # its own options' sweeps
    return [dict(zip(axes, values)) for values in itertools.product(*axes.values())] if axes else [{}]


def with_own_defaults(spec):
    """``spec`` (a TrainSpec or GenerateSpec) with what its request left unset taken from its workload's entry, as a
    benchmark's cell takes it: the dataset (digits trains on and writes ``digits``, not karman's demo sweep), and for a
    training one batch size (the first of the workload's) and the epoch limit. A field the request gave, or one whose
    workload value is the spec's own default (karman's), stays as it is; a resumed run keeps the one it resumes."""
    if getattr(spec, "resume", None):
        return spec
    workload, given, model = get_workload(spec.workload), spec.model_fields_set, type(spec).model_fields
    update = {}
    if "dataset" in model and "dataset" not in given and workload.dataset:
        update["dataset"] = workload.dataset
    if "batch_sizes" in model and "batch_sizes" not in given and [workload.batch_sizes[0]] != model["batch_sizes"].default:
        update["batch_sizes"] = [workload.batch_sizes[0]]
    if "epochs" in model and not {"epochs", "time_budget"} & given and workload.epochs != DEFAULT_EPOCHS:
        update["epochs"] = workload.epochs
    update = {k: v for k, v in update.items() if getattr(spec, k) != v}
    return type(spec).model_validate(spec.model_dump() | update) if update else spec


def check_benchmark_options(spec, base=None) -> None:
    """UserError, in one line, where a benchmark ``spec`` sets a workload's option that none of its workloads takes, away
    from what ``base`` (the preset it started from, else the defaults) gives it: each cell would silently drop it."""
    for section in ("train", "generate"):  # a workload's options for cells the benchmark has none of
        before = getattr(base, section).options if base is not None else {}
        for name, options in getattr(spec, section).options.items():
            changed = [f for f, field in options.model_fields.items() if getattr(options, f) != field.get_default(call_default_factory=True)]
            if name in spec.workloads or (name in before and options == before[name]) or not changed:
                continue
            option = changed[0]
            raise UserError(f"{section}.{option} = {getattr(options, option)!r} is {name}'s option; no workload of this benchmark "
                            f"({', '.join(spec.workloads)}) takes it: add {name} to its workloads, or leave it out")
    train_owners = option_owners()
    for field in ("layers", "units"):  # the matrix's sweeps of a training option: the cells of the workloads that take it
        value, whose = getattr(spec, field), train_owners.get(field, ())
        if value is None or set(whose) & set(spec.workloads) or value == (getattr(base, field) if base is not None else None):
            continue
        raise UserError(f"--{field} {','.join(map(str, value))} sweeps {' and '.join(whose)}'s option; no workload of this benchmark "
                        f"({', '.join(spec.workloads)}) takes it: add {' or '.join(whose)} to its workloads, or leave it out")
    for option, values in spec.sweep.items():
        whose = train_owners.get(option, [])
        if not set(whose) & set(spec.workloads):
            raise UserError(f"--sweep {option}={':'.join(map(str, values))}: " + (
                f"{' and '.join(whose)}'s option; no workload of this benchmark ({', '.join(spec.workloads)}) takes it" if whose else
                f"no workload has an option {option}; the benchmark's workloads' options are "
                + ", ".join(sorted({o for w in spec.workloads if w in table() for o in options_model(w).model_fields}))))


def get_workload(name: str) -> Workload:
    """The workload ``name``; UserError listing the valid names for any other."""
    return importlib.import_module(f"{package_of(name)}.workload").WORKLOAD


def part_of(workload: Workload, part: str, command: str) -> Callable:
    """``workload``'s ``part`` (a capability: a hook of tasks.workloads.contract.HOOKS) that ``command`` runs; UserError, in one line, where it has none,
    naming the workloads that have one."""
    found = getattr(workload, part)
    if found is None:
        having = [name for name in table() if getattr(get_workload(name), part) is not None]
        raise UserError(f"workload {workload.name} has no {command}; "
                        + (f"{' and '.join(having)} {'has' if len(having) == 1 else 'have'} one" if having else "no workload has one"))
    return found


def check_framework(workload: Workload, framework: str) -> None:
    """UserError if ``workload`` has no module for ``framework``, naming those it has."""
    if framework not in workload.frameworks:
        raise UserError(f"workload {workload.name} has no {framework} version; it runs in {', '.join(workload.frameworks)}")


def framework_module(workload: Workload, framework: str):
    """The module that builds ``workload``'s trainer in ``framework`` (imported here: its framework loads with it)."""
    check_framework(workload, framework)
    module = importlib.import_module(f"{table()[workload.name]}.{framework}")
    conforms(getattr(module, "build", None), Build, f"{module.__name__}.build")
    return module


def with_references() -> list[str]:
    """The workloads of this process's table that have idiomatic references for bench-frameworks, by name."""
    return sorted(name for name in table() if get_workload(name).references)


def check_reference(workload: Workload, framework: str) -> None:
    """UserError if ``workload`` has no idiomatic reference in ``framework``, naming those it has (or the workloads that have any)."""
    if framework not in workload.references:
        raise UserError(f"workload {workload.name} has no {framework} reference for bench-frameworks; "
                        + (f"it has {', '.join(workload.references)}" if workload.references else f"{', '.join(with_references())} have references"))


def reference_module(workload: Workload, framework: str):
    """``workload``'s idiomatic reference in ``framework`` (its folder's references/<framework>.py, imported here: its framework
    loads with it), with every name bench-frameworks calls checked (REFERENCE)."""
    check_reference(workload, framework)
    module = importlib.import_module(f"{table()[workload.name]}.references.{framework}")
    for name, arguments in REFERENCE.items():
        callable_as(getattr(module, name, None), arguments, f"{module.__name__}.{name}")
    return module
