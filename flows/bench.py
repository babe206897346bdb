"""The bench-… commands' command line, from one option table; imports no Prefect or MLflow.

They run as they are on a machine that has only the compute stack (numpy, numba, torch);
bench-quality also reads a stored dataset (zarr, xarray, pydantic).
"""

import argparse
import json
import math
import sys
import typing

from models.tiling import DEFAULT_HALO

BENCH_COMMANDS = {
    "bench-solver": "Time the solver's full production step (MLUPS)",
    "bench-train": "Time Pix2Pix training (samples/s) against a plain eager fp32 step, in one run",
    "bench-infer": "Time a rollout step (frames/s), full-frame or map-reduce over workers, against the solver",
    "bench-quality": "Time to quality: train a recipe on a stored dataset until a rollout target holds, then score rollouts and compare with the solver",
}


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports errors in one line (exit code 2)."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _number(text: str, kind: type, minimum: float, strict: bool):
    """``text`` as ``kind`` (int or float), finite, above ``minimum`` (``strict``) or at least it; argparse's error otherwise."""
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    if strict and not value > minimum:
        raise argparse.ArgumentTypeError(f"{value} must be a positive {'integer' if kind is int else 'number'}")
    if not value >= minimum:
        raise argparse.ArgumentTypeError(f"{value} is negative; use 0 or more")
    return value


def positive_int(text: str) -> int:
    return _number(text, int, 0, strict=True)


def non_negative_int(text: str) -> int:
    return _number(text, int, 0, strict=False)


def positive_float(text: str) -> float:
    return _number(text, float, 0, strict=True)


def non_negative_float(text: str) -> float:
    return _number(text, float, 0, strict=False)


def tile_shape(text: str) -> tuple[int, int]:
    """'S' or 'H,W' (the syntax of ``infer --tile``) -> (H, W) positive ints."""
    parts = text.split(",")
    if len(parts) not in (1, 2) or not all(p.strip().isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r} is not a tile size; write S or H,W, e.g. 64 or 256,576")
    sides = tuple(positive_int(p) for p in parts)
    return (sides[0], sides[-1])


DEVICES = ("cpu", "cuda", "xla")
JSON_HELP = "Print a one-line JSON summary as the last line of stdout"
# One row per option: (flag, type or choices or action, default, help). A tuple of strings is a choice;
# "on" and "off" are flags (store_true; store_false into the name after "no-"); "many" may repeat.
# The help gets "(default: …)" appended when the default is not None.
BENCH_OPTIONS: dict[str, list[tuple]] = {
    "bench-solver": [
        ("--nx", positive_int, 1024, "Channel length in nodes"),
        ("--ny", positive_int, 256, "Channel height in nodes"),
        ("--steps", positive_int, 200, "Steps per timed run"),
        ("--repeats", positive_int, 5, "Timed runs; the median is reported"),
        ("--backend", ("numba", "numpy", "torch"), "numba", "Solver backend"),
        ("--dtype", ("float32", "float64"), "float32", "Precision"),
        ("--device", str, "cpu", "torch device for --backend torch, e.g. cuda"),
    ],
    "bench-train": [
        ("--framework", ("torch", "tensorflow"), "torch", "torch (our trainer), or tensorflow (the Keras step in its own process, timed against our torch trainer and the plain torch step in the same run)"),
        ("--device", DEVICES, "cpu", "Device kind"),
        ("--size", positive_int, 256, "Image side; sets the U-Net depth to log2(size)"),
        ("--batch-size", positive_int, 1, "Batch size"),
        ("--steps", positive_int, 3, "Training steps per timed block"),
        ("--repeats", positive_int, 3, "Timed blocks per side; medians are reported"),
        ("--precision", ("fp32", "bf16"), "fp32", "fp32, or bf16 autocast"),
        ("--no-baseline", "off", None, "Skip the plain eager fp32 comparison"),
        ("--peak-tflops", positive_float, None, "Peak of the device in TFLOP/s for the model FLOP utilization (default: known GPUs only)"),
        ("--jit-compile", "on", None, "tensorflow: XLA-compile the step (jit_compile)"),
    ],
    "bench-infer": [
        ("--mode", ("full", "mapreduce"), "mapreduce", "full: the whole frame on one worker; mapreduce: tiles over the workers"),
        ("--workers", positive_int, 1, "Compute units: CPU cores (one thread each), GPUs or XLA devices"),
        ("--device", DEVICES, "cpu", "Device kind"),
        ("--size", positive_int, 256, "Frame height in cells"),
        ("--width", positive_int, None, "Frame width in cells (default: 4 x size)"),
        ("--tile", tile_shape, None, "Tile side S, or H,W; multiples of 2^depth (default: frame height x half the width plus the halo, rounded up)"),
        ("--halo", non_negative_int, DEFAULT_HALO, "Pixels each tile reaches into its neighbours (the overlap is twice this)"),
        ("--group", positive_int, None, "Tiles per batch (default: tiles / workers, rounded up)"),
        ("--train-size", positive_int, 64, "Side the generator was trained on; sets its depth log2(S)"),
        ("--ngf", positive_int, 64, "Generator base width (the paper's 64)"),
        ("--frames", positive_int, 3, "Autoregressive steps per timed block"),
        ("--repeats", positive_int, 3, "Timed blocks per configuration; medians are reported"),
        ("--frame-stride", positive_int, 1, "k: the network advances k stored frames per step"),
        ("--frame-every", positive_int, None, "Solver steps between stored frames (default: 50 x size / 64)"),
        ("--no-compare", "off", None, "Skip timing full-frame and map-reduce on one worker in the same run"),
    ],
    "bench-quality": [
        ("--dataset", str, "karman-demo", "Dataset under the data root (KARMAN_DATA_ROOT, default ./data)"),
        ("--device", ("cpu", "cuda"), "cpu", "Device kind"),
        ("--batch-size", positive_int, 8, "Batch size"),
        ("--time-budget", positive_float, None, "Wall-clock seconds of training, validation included"),
        ("--epochs", positive_int, None, "Epochs at most (with no time budget, the schedule runs over them)"),
        ("--recipe", ("default", "paper"), "default", "Training recipe"),
        ("--predict", ("state", "delta"), None, "Override: network output"),
        ("--upsample", ("transpose", "resize"), None, "Override: decoder upsampling"),
        ("--schedule", ("constant", "cosine"), None, "Override: learning-rate schedule"),
        ("--noise", non_negative_float, None, "Override: input noise std (network units)"),
        ("--unroll", positive_int, None, "Override: steps of the loss"),
        ("--gan-weight", non_negative_float, None, "Override: adversarial weight"),
        ("--l1-weight", non_negative_float, None, "Override: L1 weight"),
        ("--lr", positive_float, None, "Override: Adam learning rate"),
        ("--ngf", positive_int, None, "Override: generator base width"),
        ("--ndf", positive_int, None, "Override: discriminator base width"),
        ("--seed", non_negative_int, 0, "First seed"),
        ("--repeats", positive_int, 1, "Runs, with seeds seed, seed+1, ..."),
        ("--target-vorticity", positive_float, 0.3, "Target: vorticity relative L2 at most this ..."),
        ("--target-steps", positive_int, 40, "... for this many steps of every validation rollout"),
        ("--validate-every", positive_int, 2, "Epochs between validation rollouts"),
        ("--validate-steps", positive_int, 60, "Steps of each validation rollout"),
        ("--stop-at-target", "on", None, "End training at the validation that first meets the target"),
        ("--test-steps", positive_int, 60, "Steps of the final rollout on the test simulation"),
        ("--extra-dataset", "many", [], "Also roll out on every simulation of this dataset (repeatable)"),
        ("--extra-steps", positive_int, 600, "Steps of those rollouts"),
        ("--threads", positive_int, None, "CPU threads for torch (default: all cores)"),
        ("--compile", ("auto", "on", "off"), "auto", "torch.compile the networks; auto = on for cuda"),
    ],
}


def add_bench_commands(sub) -> None:
    """Add the bench subcommands, from BENCH_OPTIONS, to an argparse subparsers object."""
    for command, options in BENCH_OPTIONS.items():
        p = sub.add_parser(command, help=BENCH_COMMANDS[command], description=BENCH_COMMANDS[command])
        for flag, kind, default, text in options:
            if kind == "on":
                p.add_argument(flag, action="store_true", help=text)
            elif kind == "off":
                p.add_argument(flag, dest=flag.removeprefix("--no-").replace("-", "_"), action="store_false", help=text)
            elif kind == "many":
                p.add_argument(flag, action="append", default=list(default), help=text)
            else:
                shown = text if default is None or "(default:" in text else f"{text} (default: {default})"
                choice = {"choices": list(kind)} if isinstance(kind, tuple) else {"type": kind}
                p.add_argument(flag, default=default, help=shown, **choice)
        p.add_argument("--json", action="store_true", help=JSON_HELP)


def _bench_quality(args: argparse.Namespace) -> dict:
    from pydantic import ValidationError

    from tasks.bench.quality import bench_quality
    from tasks.common.settings import Settings
    from tasks.common.specs import TrainSpec

    settings = Settings.from_env()
    folders = [settings.dataset_dir(name) for name in [args.dataset, *args.extra_dataset]]
    for folder in folders:
        if not (folder / "manifest.json").is_file():
            raise ValueError(f"no dataset at {folder} (no manifest.json); make one with python -m flows generate --dataset {folder.name}")
    fields = ("dataset", "device", "time_budget", "epochs", "recipe", "predict", "upsample", "schedule", "noise", "unroll", "gan_weight",
              "l1_weight", "lr", "ngf", "ndf", "seed", "target_vorticity", "target_steps", "validate_every", "validate_steps",
              "stop_at_target", "threads", "compile")
    try:
        spec = TrainSpec(batch_sizes=[args.batch_size], **{name: getattr(args, name) for name in fields if getattr(args, name) is not None})
    except ValidationError as exc:
        err = exc.errors()[0]
        raise ValueError(f"--{'-'.join(str(p) for p in err['loc']).replace('_', '-')}: {err['msg']}".replace("Value error, ", "")) from None
    return bench_quality(settings, spec, args.repeats, args.test_steps, tuple((f, args.extra_steps) for f in folders[1:]))


def run_bench(args: argparse.Namespace) -> int:
    """Run a parsed bench command; one line on stderr and exit 2 for bad input."""
    from tasks.bench.infer import bench_infer
    from tasks.bench.solver import bench_solver
    from tasks.bench.train import bench_train, bench_train_keras
    from tasks.common.errors import RunFailed

    try:
        if args.command == "bench-quality":
            result = _bench_quality(args)
        elif args.command == "bench-infer":
            result = bench_infer(args.mode, args.workers, args.size, args.width, args.tile, args.halo, args.train_size,
                                 args.ngf, args.group, args.frames, args.repeats, args.frame_stride, args.frame_every,
                                 args.device, args.compare)
        elif args.command == "bench-train" and args.framework == "tensorflow":
            result = bench_train_keras(args.device, args.size, args.batch_size, args.steps, args.repeats, args.precision,
                                       args.baseline, args.jit_compile)
        elif args.command == "bench-train":
            if args.jit_compile:
                raise ValueError("--jit-compile is tensorflow's; torch compiles with the trainer's speed options")
            result = bench_train(args.device, args.size, args.batch_size, args.steps, args.repeats, args.precision,
                                 args.baseline, args.peak_tflops)
        else:
            result = bench_solver(args.nx, args.ny, args.steps, args.backend, args.dtype, args.repeats, args.device)
    except ValueError as exc:
        print(f"python -m flows {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except RunFailed as exc:  # a run that started and failed (a diverging loss)
        print(f"python -m flows {args.command}: failed: {exc}", file=sys.stderr)
        return 1
    except RuntimeError as exc:  # e.g. a torch device that is not there
        print(f"python -m flows {args.command}: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry for ``python -m flows bench-…`` that loads nothing but the compute stack."""
    parser = OneLineParser(prog="python -m flows")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    sub.required = True
    add_bench_commands(sub)
    return run_bench(parser.parse_args(argv))
