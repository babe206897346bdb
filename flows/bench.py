"""The bench-… commands' and history's command line, generated from their specs as every command's is; imports no Prefect (history and bench-matmul read or write MLflow).

They run as they are on a machine that has only the compute stack (numpy, numba, torch) and pydantic;
bench-quality also reads a stored dataset (zarr, xarray), and bench-train and bench-infer load those two with the
workload's module (they reach the workload's own part through the workload table) but read no dataset.
"""

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Callable

from pydantic import BaseModel, ValidationError

from flows.jsonline import json_line
from flows.options import OneLineParser, add_spec_options, parse_command, spec_from_args, validation_message
from tasks.bench.specs import BenchFrameworksSpec, BenchInferSpec, BenchMatmulSpec, BenchQualitySpec, BenchSolverSpec, BenchTrainSpec, CompareDatasetsSpec, HistorySpec

JSON_HELP = "Print a one-line JSON summary as the last line of stdout"


def _solver(spec: BenchSolverSpec) -> dict:
    from tasks.workloads.karman.bench.solver import bench_solver

    return bench_solver(spec)


def _train(spec: BenchTrainSpec) -> dict:
    from tasks.bench.parts import bench_train

    return bench_train(spec)


def _infer(spec: BenchInferSpec) -> dict:
    from tasks.bench.parts import bench_infer

    return bench_infer(spec)


def _quality(spec: BenchQualitySpec) -> dict:
    from tasks.bench.quality import bench_quality

    return bench_quality(spec)


def _frameworks(spec: BenchFrameworksSpec) -> dict:
    from tasks.bench.frameworks import bench_frameworks

    return bench_frameworks(spec)


def _compare(spec: CompareDatasetsSpec) -> dict:
    from tasks.bench.compare import compare_datasets

    return compare_datasets(spec)


def _matmul(spec: BenchMatmulSpec) -> dict:
    from tasks.bench.matmul import bench_matmul

    return bench_matmul(spec)


def _history(spec: HistorySpec) -> dict:
    from tasks.common.config.settings import Settings
    from tasks.report.history import history_of_experiment

    out = history_of_experiment(Settings.from_env(), spec.metric, spec.min_change)
    for cell in out["cells"]:  # a line per cell on stderr: its versions' medians, and each flagged step
        steps = " -> ".join(f"{v['version']}: {v['median']:.4g} ({v['runs']} runs)" for v in cell["versions"])
        flagged = "".join(f"; FLAGGED {f['change']:+.1%} ({f['from']} -> {f['to']}, beyond {f['noise']:.0%})" for f in cell["flags"])
        print(f"{cell['cell']}: {steps}{flagged}", file=sys.stderr)
    return out


@dataclass(frozen=True)
class BenchCommand:
    """One bench command: its spec (options and help from the spec's fields), its help line, and what runs it."""

    spec: type[BaseModel]
    help: str
    run: Callable[[BaseModel], dict]


BENCH_COMMANDS: dict[str, BenchCommand] = {
    "bench-solver": BenchCommand(BenchSolverSpec, "Time the solver's full production step (MLUPS)", _solver),
    "bench-train": BenchCommand(BenchTrainSpec, "Time Pix2Pix training (samples/s) against a plain eager fp32 step, in one run", _train),
    "bench-infer": BenchCommand(BenchInferSpec, "Time a rollout step (frames/s), full-frame or map-reduce over workers, against the solver", _infer),
    "bench-quality": BenchCommand(BenchQualitySpec, "Time to quality: train a recipe on a stored dataset until a rollout target holds, "
                                  "then score rollouts and compare with the solver", _quality),
    "bench-matmul": BenchCommand(BenchMatmulSpec, "The FLOP ceiling: square matmuls (TFLOP/s, cold and warm) per framework and dtype, "
                                 "against the device's peak", _matmul),
    "bench-frameworks": BenchCommand(BenchFrameworksSpec, "Each framework's training of a workload against that framework's idiomatic "
                                     "reference (samples/s, ours / reference), in one run", _frameworks),
    "compare-datasets": BenchCommand(CompareDatasetsSpec, "How far two datasets of one sweep differ, frame by frame (a GPU sweep "
                                     "against the CPU's)", _compare),
    "history": BenchCommand(HistorySpec, "Each cell's results across code and framework versions (the experiment's training runs), "
                            "steps beyond the noise flagged", _history),
}


def add_bench_commands(sub) -> None:
    """Add the bench subcommands, from their specs, to an argparse subparsers object."""
    for name, command in BENCH_COMMANDS.items():
        p = sub.add_parser(name, help=command.help, description=command.help)
        add_spec_options(p, command.spec)
        p.add_argument("--json", action="store_true", help=JSON_HELP)


def run_bench(args: argparse.Namespace) -> int:
    """Run a parsed bench command; one line on stderr and exit 2 for bad input."""
    from tasks.common.config.errors import RunFailed
    from tasks.common.config.settings import data_root_from_env, folders_to_make, remove_if_empty

    command = BENCH_COMMANDS[args.command]
    made = folders_to_make(data_root_from_env())  # what a refusal removes again
    try:
        result = command.run(spec_from_args(command.spec, args))
    except ValidationError as exc:
        print(f"python -m flows {args.command}: error: {validation_message(exc)}", file=sys.stderr)
        return 2
    except ValueError as exc:  # UserError included
        remove_if_empty(made)
        print(f"python -m flows {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except RunFailed as exc:  # a run that started and failed (a diverging loss)
        print(f"python -m flows {args.command}: failed: {exc}", file=sys.stderr)
        return 1
    except RuntimeError as exc:  # e.g. a torch device that is not there
        remove_if_empty(made)
        print(f"python -m flows {args.command}: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    print(json_line(result, indent=None if args.json else 2))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry for ``python -m flows bench-…`` that loads nothing but the compute stack."""
    parser = OneLineParser(prog="python -m flows")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    sub.required = True
    add_bench_commands(sub)
    return run_bench(parse_command(parser, argv))
