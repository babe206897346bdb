"""``python -m flows <command> [options] [--json]``: the pipeline from the command line.

Options are generated from the command's Spec model by flows.options, as the bench-… commands' are, so
the CLI, the Prefect UI form and the child processes validate the same fields. Bad input ends with one line on stderr and exit code 2.
"""

import argparse
import logging
import os
import signal
import sys
from dataclasses import dataclass
from typing import Any, Callable

from pydantic import BaseModel, ValidationError

from flows.bench import BENCH_COMMANDS, add_bench_commands, run_bench
from flows.jsonline import json_line
from flows.options import OneLineParser, add_spec_options, cli_fields, option_models, parse_command, spec_from_args, validation_message
from tasks.common.config.errors import UserError
from tasks.common.config.settings import folders_to_make, remove_if_empty
from tasks.workloads.presets import quick_benchmark
from tasks.common.specs import AggregateSpec, BenchmarkSpec, DemoSpec, GenerateSpec, InferSpec, TrainSpec
from tasks.workloads.karman.specs import AblationSpec, ValidateSpec
from tasks.report.convergence import ConvergenceSpec

EXIT_USAGE = 2


def _log() -> logging.Logger:
    return logging.getLogger("karman.cli")


# Checks that must fail before any flow starts, with one clear line; a stage that plans hands its
# plan to the flow, which takes it instead of planning again.

def _check_generate(settings, spec: GenerateSpec) -> None:
    from tasks.generate.task import check_generate

    check_generate(settings, spec)


def _check_demo(settings, spec: DemoSpec) -> None:
    _check_generate(settings, spec.generate)


def _check_train(settings, spec: TrainSpec) -> None:
    from tasks.common.config import plans
    from tasks.train.plan import plan_training

    plan = plan_training(settings, spec, _log())
    plans.hand_over("train", spec, plan)
    from tasks.common.process.warm import start_early

    start_early(plan.framework, plan.procs, plan.hosts, plan.child_env())  # the job's warm server imports while the flow starts


def _check_ablation(settings, spec: AblationSpec) -> None:
    from tasks.train.plan import check_training_input

    for variant in spec.variants:
        check_training_input(settings, spec.train_spec(variant), [spec.batch_size], 1)
    if spec.extra_dataset:  # every model is rolled out there: a missing dataset ends the command before anything trains
        from tasks.common.stores.store import load_manifest

        load_manifest(settings.dataset_dir(spec.extra_dataset))


def _check_infer(settings, spec: InferSpec) -> None:
    from tasks.common.config import plans
    from tasks.infer.plan import plan_rollout

    plans.hand_over("infer", spec, plan_rollout(settings, spec, _log()))


def _check_benchmark(settings, spec: BenchmarkSpec) -> None:
    from flows.matrix import benchmark_matrix, check_deployments, deployment_for

    matrix = benchmark_matrix(spec)
    for m in matrix:
        if m.workload.swept:
            remote = deployment_for("generate", m.generate.device, spec.pools) is not None  # its GPU is the pool's, not this host's
            _check_generate(settings, m.generate.model_copy(update={"device": "cpu", "scheduler": None}) if remote else m.generate)
    check_deployments(spec, matrix)


def _check_references(settings, spec: ConvergenceSpec) -> None:
    from tasks.report.convergence import check_spec

    check_spec(spec)
    _check_benchmark(settings, spec.benchmark_spec())


def _check_aggregate(settings, spec: AggregateSpec) -> None:
    from tasks.report.task import check_report_source

    check_report_source(settings, spec)


def _check_validation(settings, spec: ValidateSpec) -> None:
    from models.karman.solver import backend_from_name
    from tasks.common.runtimes import probe
    from tasks.common.process.launch import run_child
    from tasks.workloads.karman.validate.task import setups

    setups(spec)
    kind = spec.device.split(":")[0]
    if backend_from_name(spec.backend).batched and kind != "cuda":  # the fused kernel: CUDA only
        raise UserError(f"device {spec.device!r} is not offered by the triton backend; use cuda")
    if kind != "cpu":  # the device is there (asked in a child process: this one imports no framework)
        run_child("probe", probe.BODY, {"device": kind}, _log())


def _without(*keys: str) -> Callable[[dict], dict]:
    return lambda result: {k: v for k, v in result.items() if k not in keys}


def _only(*keys: str) -> Callable[[dict], dict]:
    return lambda result: {k: result[k] for k in keys}


def _with_convergence(summary: Callable[[dict], dict]) -> Callable[[dict], dict]:
    """``summary`` with the report's convergence verdicts (its folder's convergence.json: one per judged cell) and each training
    cell's medians with their 95 % intervals and n (intervals.json)."""
    def summarise(result: dict) -> dict:
        from tasks.report.task import cell_intervals, convergence_verdicts

        return summary(result) | {"convergence": convergence_verdicts(result["report"]), "intervals": cell_intervals(result["report"])}
    return summarise


def _flow(name: str) -> Callable[[], Callable]:
    """The pipeline's flow ``name``, imported when the command runs (Prefect loads only then)."""
    def load() -> Callable:
        from flows import pipeline

        if name == "rcp":
            from flows.references import make_references

            return make_references
        return {"demo": pipeline.demo, "generate": pipeline.generate, "train": pipeline.train, "infer": pipeline.infer,
                "aggregate": pipeline.aggregate, "validate_solver": pipeline.validate_solver, "ablate": pipeline.ablate,
                "benchmark": pipeline.benchmark}[name]
    return load


@dataclass(frozen=True)
class Command:
    """One pipeline command: its spec (options and help from the spec's fields), its flow, the checks
    before the flow starts, and what its JSON summary keeps."""

    spec: type[BaseModel]
    help: str
    flow: Callable[[], Callable]
    check: Callable[[Any, Any], None]
    summary: Callable[[dict], dict] = lambda result: result


COMMANDS: dict[str, Command] = {
    "demo": Command(DemoSpec, "Run the quick CPU pipeline: simulate, train, roll out, report", _flow("demo"), _check_demo),
    "generate": Command(GenerateSpec, "Write a workload's dataset into the store (karman's solver sweep, or another workload's own data); "
                        "with --workload NAME, --help shows that workload's options", _flow("generate"), _check_generate),
    "train": Command(TrainSpec, "Train a workload on a dataset, in one framework, on one kind of device; with --workload NAME, --help shows "
                     "that workload's options", _flow("train"), _check_train),
    # the per-step errors stay (u, v, p, vorticity), the other per-step lists are in MLflow
    "infer": Command(InferSpec, "Roll a trained model out against the reference solver", _flow("infer"), _check_infer,
                     _without("seam_errors", "vorticity_correlation", "energy_ratio")),
    "aggregate": Command(AggregateSpec, "Write comparison tables, figures and a report from MLflow runs", _flow("aggregate"), _check_aggregate,
                         _with_convergence(lambda r: {"report": r["report"], "run_id": r["run_id"], "train_rows": len(r["train_rows"]),
                                                      "infer_rows": len(r["infer_rows"])})),
    # the benchmark's figures; the checks and the run id are in MLflow
    "validate-solver": Command(ValidateSpec, "Check the solver against the Schäfer-Turek cylinder benchmark", _flow("validate_solver"),
                               _check_validation, _without("run_id", "checks")),
    "ablate": Command(AblationSpec, "Train each recipe variant on the same data and budget and tabulate rollout quality", _flow("ablate"),
                      _check_ablation, _only("report", "run_id", "rows")),
    "benchmark": Command(BenchmarkSpec, "Run the benchmark matrix: generate, train (frameworks x devices x batch sizes), roll out (modes x workers), report",
                         _flow("benchmark"), _check_benchmark,
                         _with_convergence(_only("dataset", "cells", "report", "benchmark_run_id", "aggregate_run_id", "failed"))),
    "rcp": Command(ConvergenceSpec, "Measure a workload's reference convergence points (epochs to its target per framework and batch size, "
                   "several seeds, through the benchmark) into its folder's convergence.json", _flow("rcp"), _check_references),
}


def _prefect_ready() -> None:
    """UserError (one line) if the Prefect server in PREFECT_API_URL refuses this process's auth string,
    or asks for one and it has none; nothing to check on Prefect's temporary local API."""
    from tasks.common.tracking.credentials import PREFECT_AUTH_ENV, PREFECT_FILE_ENV, auth_refused

    api, auth = os.environ.get("PREFECT_API_URL"), os.environ.get(PREFECT_AUTH_ENV)
    if api and (code := auth_refused(api.rstrip("/") + "/admin/version", auth)):
        given = "refuses the auth string given" if auth else "asks for an auth string"
        raise UserError(f"the Prefect server {api} {given} (HTTP {code}); set {PREFECT_AUTH_ENV}, or {PREFECT_FILE_ENV}, to the server's")


def spec_file(model: type[BaseModel], path: str) -> BaseModel:
    """The spec in the JSON or YAML file ``path``; UserError (one line naming the file, and the field
    where a value is wrong) if it cannot be read, parsed or validated."""
    import yaml

    try:
        text = open(path, encoding="utf-8").read()
    except OSError as exc:
        raise UserError(f"--spec {path!r} cannot be read ({exc.strerror or type(exc).__name__})") from None
    try:
        values = yaml.safe_load(text)  # JSON is YAML
    except yaml.YAMLError as exc:
        raise UserError(f"--spec {path!r} is neither JSON nor YAML ({str(exc).splitlines()[0]})") from None
    if isinstance(values, dict) and set(values) == {"spec"}:  # a deployment's parameters, as prefect.yaml holds them
        values = values["spec"]
    if not isinstance(values, dict):
        raise UserError(f"--spec {path!r} holds a {type(values).__name__}, not a mapping of the spec's fields")
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        got = f" (got {err['input']!r})" if where else ""
        raise UserError(f"--spec {path!r}: {where + ': ' if where else ''}{err['msg'].removeprefix('Value error, ').rstrip('.')}{got}") from None


OWN_DEFAULTS = (TrainSpec, GenerateSpec)  # the specs whose dataset (and sizes) a request leaves to its workload


def help_workload(argv: list[str]) -> str | None:
    """The workload named by ``--workload`` where the command line asks for help, so that the help shows its options."""
    if not {"-h", "--help"} & set(argv):
        return None
    for i, arg in enumerate(argv):
        if arg == "--workload" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--workload="):
            return arg.partition("=")[2]
    return None


def _own_defaults(spec: type[BaseModel], workload: str | None) -> dict | None:
    """For a named workload, the defaults of ``spec``'s fields that it sets itself (its dataset, batch size, epochs)."""
    if workload is None or spec not in OWN_DEFAULTS:
        return None
    from tasks.workloads import with_own_defaults

    try:
        own = with_own_defaults(spec(workload=workload))
    except (UserError, ValidationError):  # an unknown name: the command refuses it when it runs
        return None
    return {field: getattr(own, field) for field in own.model_fields if getattr(own, field) != spec.model_fields[field].default}


def build_parser(workload: str | None = None) -> argparse.ArgumentParser:
    """The command line; ``workload``: the train and generate commands offer only the options it takes (their help)."""
    parser = OneLineParser(prog="python -m flows", description="Kármán Bench: neural surrogates of a vortex street, benchmarked across devices.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    sub.required = True
    for name, command in COMMANDS.items():
        p = sub.add_parser(name, help=command.help, description=command.help)
        if command.spec is DemoSpec:
            p.add_argument("--dataset", dest="dataset", default=None, help="Dataset name (default: karman-demo)")
            p.add_argument("--time-budget", dest="time_budget", default=None,
                           help=f"Wall-clock seconds of training (default: {DemoSpec().train.time_budget:g})")
        else:
            add_spec_options(p, command.spec, None, _own_defaults(command.spec, workload))
            added = set(cli_fields(command.spec))
            for model in option_models(command.spec, workload):  # the workload's own options, flags beside the shared ones
                add_spec_options(p, model, set(cli_fields(model)) - added)
                added |= set(cli_fields(model))
            p.add_argument("--spec", dest="spec_file", default=None, metavar="FILE",
                           help="A JSON or YAML file holding the whole spec, as the Prefect form's 'spec' parameter (nested fields "
                                "included); the options given beside it override its values")
        if command.spec is BenchmarkSpec:
            p.add_argument("--quick", action="store_true", help="Start from the quick CPU matrix (the demo's sizes) instead of the full one")
        p.add_argument("--json", action="store_true", help="Print a one-line JSON summary as the last line of stdout")
        p.add_argument("--verbose", action="store_true", help="Show other libraries' warnings and logs and Prefect's lifecycle lines")
    add_bench_commands(sub)
    return parser


def _demo_spec(args: argparse.Namespace) -> DemoSpec:
    """The demo's spec with the command line's dataset name and training budget (validated)."""
    demo = DemoSpec().model_dump()
    if args.dataset:
        demo["generate"]["dataset"] = demo["train"]["dataset"] = args.dataset
    if args.time_budget is not None:
        demo["train"]["time_budget"] = args.time_budget
    try:
        return DemoSpec.model_validate(demo)
    except ValidationError as exc:  # named by the demo's own flag (--time-budget), not the section it sets (train.time_budget)
        err = exc.errors()[0]
        flag = "--" + str(err["loc"][-1]).replace("_", "-") if len(err["loc"]) > 1 else None
        if flag not in ("--dataset", "--time-budget"):
            raise
        raise UserError(f"{flag}: {err['msg'].rstrip('.')} (got {err.get('input')!r})") from None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_command(build_parser(help_workload(argv)), argv)
    command = args.command
    from tasks.common.process.quiet import VERBOSE_ENV, quiet_libraries, quiet_prefect_console

    if getattr(args, "verbose", False):
        os.environ[VERBOSE_ENV] = "1"  # child processes inherit it
    # stdout holds the command's summary only (one JSON line under --json): MLflow's client would print a "View run" line
    # there for every run it ends against a server; the logs on stderr name each run's page instead (inherited by children)
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    if os.environ.get("PREFECT_API_URL") == "":
        # empty means no server, as unset does: Prefect would start its temporary API but keep "" as the
        # events' address, and log a traceback for every event it then fails to send
        del os.environ["PREFECT_API_URL"]
    quiet_libraries()
    if command in BENCH_COMMANDS:
        return run_bench(args)
    from tasks.common.process.lifetime import raise_on_sigterm

    raise_on_sigterm()  # SIGTERM unwinds the command like Ctrl-C: children stopped, runs marked KILLED
    cmd = COMMANDS[command]
    from tasks.common.process.collector import paused

    with paused():  # Prefect, MLflow and the flow's modules load without collections (tasks.common.process.collector)
        base, made = None, []
        try:
            if cmd.spec is DemoSpec:
                spec: BaseModel = _demo_spec(args)
            else:
                base = quick_benchmark() if getattr(args, "quick", False) else None
                if args.spec_file:
                    if base is not None:
                        raise UserError("--spec and --quick both give the whole matrix; give one")
                    base = spec_file(cmd.spec, args.spec_file)
                spec = spec_from_args(cmd.spec, args, base)
                if cmd.spec in OWN_DEFAULTS:  # what the request left unset, from its workload's entry (its dataset, sizes, epochs)
                    from tasks.workloads import with_own_defaults

                    spec = with_own_defaults(spec)
                if cmd.spec is BenchmarkSpec:  # another workload's option, given here, that no cell would take
                    from tasks.workloads import check_benchmark_options

                    check_benchmark_options(spec, base if getattr(args, "quick", False) else None)
            from tasks.common.tracking.credentials import Credentials
            from tasks.common.config.settings import Settings
            from tasks.common.tracking.runs import reap_orphans, tracking_ready

            os.environ.update(Credentials.from_env().env())  # MLflow's and Prefect's clients here and in every child read them
            _prefect_ready()
            settings = Settings.from_env()
            made = folders_to_make(settings.data_root)  # what a refusal removes again
            settings.require_writable()
            tracking_ready(settings, create=False)  # a tracking server that is down ends the command here, in seconds
            cmd.check(settings, spec)
            from tasks.common.process.prefect_api import temporary_api_started

            starting = temporary_api_started()  # what follows runs while Prefect's temporary API starts, where no server is named
            tracking_ready(settings)  # a new local store: its tables created under a lock
            reap_orphans(settings, logging.getLogger("karman.cli"))  # runs left RUNNING by killed commands
        except ValidationError as exc:
            message = validation_message(exc)
            print(f"python -m flows {command}: error: {message}", file=sys.stderr)
            return EXIT_USAGE
        except UserError as exc:
            remove_if_empty(made)
            print(f"python -m flows {command}: error: {exc}", file=sys.stderr)
            return EXIT_USAGE

        flow = cmd.flow()  # imports Prefect, which sets up its console logging: quiet it after that
    quiet_prefect_console()
    from tasks.common.process import lifetime
    from tasks.common.config.errors import Interrupted, RunFailed, RunStopped
    from tasks.common.process.launch import ChildFailed

    guardian = lifetime.start_guardian(settings)  # if this command is killed outright: stops what it started, closes its runs
    try:
        if starting is not None:
            starting.join()
        result = flow(spec)
        lifetime.raise_pending()  # a signal that came as the last run finished
    except UserError as exc:
        print(f"python -m flows {command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (KeyboardInterrupt, Interrupted, RunStopped) as exc:
        signum = lifetime.signal_of(exc) or lifetime.received() or signal.SIGTERM
        print(f"python -m flows {command}: {exc or 'stopped by SIGINT'}", file=sys.stderr)
        return 128 + int(signum)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(f"python -m flows {command}: failed: {first if isinstance(exc, (RunFailed, ChildFailed)) else f'{type(exc).__name__}: {first}'}",
              file=sys.stderr)
        return 1
    finally:
        guardian.terminate()
    summary = cmd.summary(result)
    print(json_line(summary, indent=None if args.json else 2))
    return 0
