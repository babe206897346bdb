"""``python -m flows <command> [options] [--json]``: the pipeline from the command line.

Options are generated from the command's Spec model, so the CLI, the Prefect UI form and the
child processes validate the same fields. Bad input ends with one line on stderr and exit code 2.
"""

import argparse
import json
import logging
import os
import sys
import types
import typing
from typing import Any, Callable

from pydantic import BaseModel, ValidationError

from flows.bench import BENCH_COMMANDS, OneLineParser, add_bench_commands, run_bench
from tasks.common.errors import UserError
from tasks.common.specs import AblationSpec, AggregateSpec, BenchmarkSpec, DemoSpec, GenerateSpec, InferSpec, TrainSpec, ValidateSpec

EXIT_USAGE = 2


def _choices(annotation) -> tuple[list[str] | None, Callable[[str], Any], bool]:
    """(choices, converter, is_list) for a field annotation."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _choices(inner[0])
    if origin is list:
        choices, conv, _ = _choices(args[0])
        return choices, conv, True
    if origin is typing.Literal:
        return [str(a) for a in args], str, False
    if annotation in (int, float):
        return None, annotation, False
    return None, str, False


def _cli_fields(model: type[BaseModel]) -> dict:
    """The fields that are command-line options: nested models and mappings are set in the UI or code."""
    def nested(annotation) -> bool:
        return isinstance(annotation, type) and issubclass(annotation, BaseModel)

    return {name: field for name, field in model.model_fields.items() if not nested(field.annotation)}


def _add_spec_options(parser: argparse.ArgumentParser, model: type[BaseModel]) -> None:
    for name, field in _cli_fields(model).items():
        flag = "--" + name.replace("_", "-")
        annotation = field.annotation
        if annotation is bool:
            parser.add_argument(flag, dest=name, action="store_true", default=None, help=field.description)
            continue
        if typing.get_origin(annotation) is dict:
            parser.add_argument(flag, dest=name, default=None, metavar="KEY=VALUE,...",
                                help=f"{field.description} (default: {','.join(f'{k}={v}' for k, v in field.default.items())})")
            continue
        choices, conv, is_list = _choices(annotation)
        # Scalars stay strings here: pydantic converts and validates them with its own messages.
        help_text = f"{field.description} (default: {field.default})" if field.description else None
        if choices and not is_list:
            parser.add_argument(flag, dest=name, choices=choices, default=None, help=help_text, metavar="{" + ",".join(choices) + "}")
        else:
            parser.add_argument(flag, dest=name, default=None, help=help_text + (" — comma-separated" if is_list else "") if help_text else None)


def _spec_from_args(model: type[BaseModel], args: argparse.Namespace, base: BaseModel | None = None) -> BaseModel:
    """The spec from the command line's options, over ``base``'s values when given."""
    values = base.model_dump() if base is not None else {}
    for name, field in _cli_fields(model).items():
        value = getattr(args, name, None)
        if value is None:
            continue
        _, _, is_list = _choices(field.annotation)
        if typing.get_origin(field.annotation) is dict:
            pairs = [item.split("=", 1) for item in value.split(",") if item.strip()]
            if any(len(p) != 2 for p in pairs):
                raise UserError(f"--{name.replace('_', '-')}: {value!r} is not a list of KEY=VALUE pairs, e.g. cuda=gpu,xla=tpu")
            value = {k.strip(): v.strip() for k, v in pairs}
        elif is_list:
            value = [v.strip() for v in value.split(",") if v.strip()]
        elif isinstance(value, str) and value.lower() == "none" and type(None) in typing.get_args(field.annotation):
            value = None
        values[name] = value
    return model(**values)


def _validation_message(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"] if not isinstance(p, int))
    flag = "--" + loc.replace("_", "-") if loc else "input"
    return f"{flag}: {err['msg'].rstrip('.')} (got {err.get('input')!r})"


COMMANDS: dict[str, tuple[type[BaseModel] | None, str]] = {
    "demo": (None, "Run the quick CPU pipeline: simulate, train, roll out, report"),
    "generate": (GenerateSpec, "Simulate a parameter sweep into a zarr dataset"),
    "train": (TrainSpec, "Train Pix2Pix on a dataset"),
    "infer": (InferSpec, "Roll a trained model out against the reference solver"),
    "aggregate": (AggregateSpec, "Write comparison tables, figures and a report from MLflow runs"),
    "validate-solver": (ValidateSpec, "Check the solver against the Schäfer-Turek cylinder benchmark"),
    "ablate": (AblationSpec, "Train each recipe variant on the same data and budget and tabulate rollout quality"),
    "benchmark": (BenchmarkSpec, "Run the benchmark matrix: generate, train (devices x batch sizes), roll out (modes x workers), report"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m flows", description="Kármán Bench: neural surrogates of a vortex street, benchmarked across devices.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    sub.required = True
    for name, (model, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if model is not None:
            _add_spec_options(p, model)
        else:
            p.add_argument("--dataset", dest="dataset", default=None, help="Dataset name (default: karman-demo)")
        if model is BenchmarkSpec:
            p.add_argument("--quick", action="store_true", help="Start from the quick CPU matrix (the demo's sizes) instead of the full one")
        p.add_argument("--json", action="store_true", help="Print a one-line JSON summary as the last line of stdout")
        p.add_argument("--verbose", action="store_true", help="Show other libraries' warnings and logs and Prefect's lifecycle lines")
    add_bench_commands(sub)
    return parser


def _preflight(command: str, spec: BaseModel) -> None:
    """Checks that must fail before any flow starts, with one clear line."""
    from tasks.common.settings import Settings

    settings = Settings.from_env().require_writable()
    if isinstance(spec, (GenerateSpec, DemoSpec)):
        from tasks.generate.task import expand

        expand(spec if isinstance(spec, GenerateSpec) else spec.generate)
    if isinstance(spec, TrainSpec):
        from tasks.common import plans
        from tasks.train.plan import plan_training

        plans.hand_over("train", spec, plan_training(settings, spec, logging.getLogger("karman.cli")))
    if isinstance(spec, AblationSpec):
        from tasks.train.plan import check_training_input

        for variant in spec.variants:
            check_training_input(settings, spec.train_spec(variant), [spec.batch_size], 1)
    if isinstance(spec, InferSpec):
        from tasks.common import plans
        from tasks.infer.plan import plan_rollout

        plans.hand_over("infer", spec, plan_rollout(settings, spec, logging.getLogger("karman.cli")))
    if isinstance(spec, BenchmarkSpec):
        from flows.pipeline import check_deployments
        from tasks.generate.task import expand

        expand(spec.generate)
        check_deployments(spec)
    if isinstance(spec, AggregateSpec):
        from tasks.report.task import check_report_source

        check_report_source(settings, spec)
    if isinstance(spec, ValidateSpec):
        from tasks.validate.task import setups

        setups(spec)


def _summary(command: str, result: dict) -> dict:
    if command == "infer":  # the per-step errors stay (u, v, p, vorticity), the other per-step lists are in MLflow
        return {k: v for k, v in result.items() if k not in ("seam_errors", "vorticity_correlation", "energy_ratio")}
    if command == "validate-solver":  # the benchmark's figures; the checks and the run id are in MLflow
        return {k: v for k, v in result.items() if k not in ("run_id", "checks")}
    if command == "benchmark":
        return {k: result[k] for k in ("dataset", "cells", "report", "benchmark_run_id", "aggregate_run_id", "failed")}
    if command == "ablate":
        return {"report": result["report"], "run_id": result["run_id"], "rows": result["rows"]}
    if command == "aggregate":
        return {"report": result["report"], "run_id": result["run_id"], "train_rows": len(result["train_rows"]), "infer_rows": len(result["infer_rows"])}
    return result


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command = args.command
    from tasks.common.quiet import VERBOSE_ENV, quiet_libraries, quiet_prefect_console

    if getattr(args, "verbose", False):
        os.environ[VERBOSE_ENV] = "1"  # child processes inherit it
    quiet_libraries()
    if command in BENCH_COMMANDS:
        return run_bench(args)
    model = COMMANDS[command][0]
    try:
        if model is None:
            demo = DemoSpec()
            if args.dataset:
                demo = DemoSpec(generate=demo.generate.model_copy(update={"dataset": args.dataset}),
                                train=demo.train.model_copy(update={"dataset": args.dataset}))
                DemoSpec.model_validate(demo.model_dump())
            spec: BaseModel = demo
        else:
            base = BenchmarkSpec.quick() if getattr(args, "quick", False) else None
            spec = _spec_from_args(model, args, base)
        _preflight(command, spec)
    except ValidationError as exc:
        print(f"python -m flows {command}: error: {_validation_message(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except UserError as exc:
        print(f"python -m flows {command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE

    from flows import pipeline

    quiet_prefect_console()
    try:
        result = getattr(pipeline, command.replace("-", "_"))(spec)
    except UserError as exc:
        print(f"python -m flows {command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:
        print(f"python -m flows {command}: failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(_summary(command, result), default=str))
    else:
        print(json.dumps(_summary(command, result), indent=2, default=str))
    return 0
