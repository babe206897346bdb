"""``python -m flows bench-…``: benchmark commands. They import no Prefect or MLflow, so they run as they
are on a machine that has only the compute stack (numpy, numba, torch); bench-quality also reads a stored
dataset (zarr, xarray, pydantic)."""

import argparse
import json
import math
import sys
import typing

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


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be a positive integer")
    return value


def positive_float(text: str) -> float:
    value = _float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value} must be a positive number")
    return value


def non_negative_float(text: str) -> float:
    value = _float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{value} must be zero or more")
    return value


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def tile_shape(text: str) -> tuple[int, int]:
    """'S' or 'HxW' -> (H, W) positive ints."""
    parts = text.lower().split("x")
    if len(parts) not in (1, 2):
        raise argparse.ArgumentTypeError(f"{text!r} is not a tile size; write S or HxW, e.g. 64 or 256x576")
    sides = tuple(positive_int(p) for p in parts)
    return (sides[0], sides[-1])


def add_bench_commands(sub) -> None:
    """Add the bench subcommands to an argparse subparsers object."""
    p = sub.add_parser("bench-solver", help=BENCH_COMMANDS["bench-solver"], description=BENCH_COMMANDS["bench-solver"])
    p.add_argument("--nx", type=positive_int, default=1024, help="Channel length in nodes (default: 1024)")
    p.add_argument("--ny", type=positive_int, default=256, help="Channel height in nodes (default: 256)")
    p.add_argument("--steps", type=positive_int, default=200, help="Steps per timed run (default: 200)")
    p.add_argument("--repeats", type=positive_int, default=5, help="Timed runs; the median is reported (default: 5)")
    p.add_argument("--backend", choices=["numba", "numpy", "torch"], default="numba", help="Solver backend (default: numba)")
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32", help="Precision (default: float32)")
    p.add_argument("--device", default="cpu", help="torch device for --backend torch, e.g. cuda (default: cpu)")
    p.add_argument("--json", action="store_true", help="Print a one-line JSON summary as the last line of stdout")

    p = sub.add_parser("bench-train", help=BENCH_COMMANDS["bench-train"], description=BENCH_COMMANDS["bench-train"])
    p.add_argument("--device", choices=["cpu", "cuda", "xla"], default="cpu", help="Device kind (default: cpu)")
    p.add_argument("--size", type=positive_int, default=256, help="Image side; sets the U-Net depth to log2(size) (default: 256)")
    p.add_argument("--batch-size", type=positive_int, default=1, help="Batch size (default: 1)")
    p.add_argument("--steps", type=positive_int, default=3, help="Training steps per timed block (default: 3)")
    p.add_argument("--repeats", type=positive_int, default=3, help="Timed blocks per side; medians are reported (default: 3)")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="fp32, or bf16 autocast (default: fp32)")
    p.add_argument("--no-baseline", dest="baseline", action="store_false", help="Skip the plain eager fp32 comparison")
    p.add_argument("--peak-tflops", type=float, default=None, help="Peak of the device in TFLOP/s for the model FLOP utilization (default: known GPUs only)")
    p.add_argument("--json", action="store_true", help="Print a one-line JSON summary as the last line of stdout")


    p = sub.add_parser("bench-infer", help=BENCH_COMMANDS["bench-infer"], description=BENCH_COMMANDS["bench-infer"])
    p.add_argument("--mode", choices=["full", "mapreduce"], default="mapreduce", help="full: the whole frame on one worker; mapreduce: tiles over the workers (default: mapreduce)")
    p.add_argument("--workers", type=positive_int, default=1, help="Compute units: CPU cores (one thread each), GPUs or XLA devices (default: 1)")
    p.add_argument("--device", choices=["cpu", "cuda", "xla"], default="cpu", help="Device kind (default: cpu)")
    p.add_argument("--size", type=positive_int, default=256, help="Frame height in cells (default: 256)")
    p.add_argument("--width", type=positive_int, default=None, help="Frame width in cells (default: 4 x size)")
    p.add_argument("--tile", type=tile_shape, default=None, help="Tile S or HxW, multiples of 2^depth (default: frame height x half the width plus the halo, rounded up)")
    p.add_argument("--halo", type=int, default=16, help="Pixels each tile reaches into its neighbours (default: 16)")
    p.add_argument("--group", type=positive_int, default=None, help="Tiles per batch (default: tiles / workers, rounded up)")
    p.add_argument("--train-size", type=positive_int, default=64, help="Side the generator was trained on; sets its depth log2(S) (default: 64)")
    p.add_argument("--ngf", type=positive_int, default=64, help="Generator base width (default: 64, the paper's)")
    p.add_argument("--frames", type=positive_int, default=3, help="Autoregressive steps per timed block (default: 3)")
    p.add_argument("--repeats", type=positive_int, default=3, help="Timed blocks per configuration; medians are reported (default: 3)")
    p.add_argument("--frame-stride", type=positive_int, default=1, help="k: the network advances k stored frames per step (default: 1)")
    p.add_argument("--frame-every", type=positive_int, default=None, help="Solver steps between stored frames (default: 50 x size / 64)")
    p.add_argument("--no-compare", dest="compare", action="store_false", help="Skip timing full-frame and map-reduce on one worker in the same run")
    p.add_argument("--json", action="store_true", help="Print a one-line JSON summary as the last line of stdout")

    add_quality_command(sub)


def add_quality_command(sub) -> None:
    p = sub.add_parser("bench-quality", help=BENCH_COMMANDS["bench-quality"], description=BENCH_COMMANDS["bench-quality"])
    p.add_argument("--dataset", default="karman-demo", help="Dataset under the data root (KARMAN_DATA_ROOT, default ./data) (default: karman-demo)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="Device kind (default: cpu)")
    p.add_argument("--batch-size", type=positive_int, default=8, help="Batch size (default: 8)")
    p.add_argument("--time-budget", type=positive_float, default=None, help="Wall-clock seconds of training, validation included")
    p.add_argument("--epochs", type=positive_int, default=None, help="Epochs at most (with no time budget, the schedule runs over them)")
    p.add_argument("--recipe", choices=["default", "paper"], default="default", help="Training recipe (default: default)")
    p.add_argument("--predict", choices=["state", "delta"], default=None, help="Override: network output")
    p.add_argument("--upsample", choices=["transpose", "resize"], default=None, help="Override: decoder upsampling")
    p.add_argument("--schedule", choices=["constant", "cosine"], default=None, help="Override: learning-rate schedule")
    p.add_argument("--noise", type=non_negative_float, default=None, help="Override: input noise std (network units)")
    p.add_argument("--unroll", type=positive_int, default=None, help="Override: steps of the loss")
    p.add_argument("--gan-weight", type=non_negative_float, default=None, help="Override: adversarial weight")
    p.add_argument("--l1-weight", type=non_negative_float, default=None, help="Override: L1 weight")
    p.add_argument("--lr", type=positive_float, default=None, help="Override: Adam learning rate")
    p.add_argument("--ngf", type=positive_int, default=None, help="Override: generator base width")
    p.add_argument("--ndf", type=positive_int, default=None, help="Override: discriminator base width")
    p.add_argument("--seed", type=int, default=0, help="First seed (default: 0)")
    p.add_argument("--repeats", type=positive_int, default=1, help="Runs, with seeds seed, seed+1, ... (default: 1)")
    p.add_argument("--target-vorticity", type=positive_float, default=0.3, help="Target: vorticity relative L2 at most this ... (default: 0.3)")
    p.add_argument("--target-steps", type=positive_int, default=40, help="... for this many steps of every validation rollout (default: 40)")
    p.add_argument("--validate-every", type=positive_int, default=2, help="Epochs between validation rollouts (default: 2)")
    p.add_argument("--validate-steps", type=positive_int, default=60, help="Steps of each validation rollout (default: 60)")
    p.add_argument("--stop-at-target", action="store_true", help="End training at the validation that first meets the target")
    p.add_argument("--test-steps", type=positive_int, default=60, help="Steps of the final rollout on the test simulation (default: 60)")
    p.add_argument("--extra-dataset", action="append", default=[], help="Also roll out on every simulation of this dataset (repeatable)")
    p.add_argument("--extra-steps", type=positive_int, default=600, help="Steps of those rollouts (default: 600)")
    p.add_argument("--threads", type=positive_int, default=None, help="CPU threads for torch (default: all cores)")
    p.add_argument("--compile", choices=["auto", "on", "off"], default="auto", help="torch.compile the networks; auto = on for cuda (default: auto)")
    p.add_argument("--json", action="store_true", help="Print a one-line JSON summary as the last line of stdout")


def _bench_quality(args: argparse.Namespace) -> dict:
    from tasks.bench_quality import QualityTarget, bench_quality
    from tasks.settings import Settings

    settings = Settings.from_env()
    folders = [settings.dataset_dir(name) for name in [args.dataset, *args.extra_dataset]]
    for folder in folders:
        if not (folder / "manifest.json").is_file():
            raise ValueError(f"no dataset at {folder} (no manifest.json); make one with python -m flows generate --dataset {folder.name}")
    overrides = {name: getattr(args, name) for name in ("predict", "upsample", "schedule", "noise", "unroll", "gan_weight",
                                                         "l1_weight", "lr", "ngf", "ndf")}
    return bench_quality(folders[0], args.device, args.batch_size, args.time_budget, args.epochs, args.recipe, overrides,
                         tuple(range(args.seed, args.seed + args.repeats)), QualityTarget(args.target_vorticity, args.target_steps),
                         args.validate_every, args.validate_steps, args.stop_at_target, args.test_steps,
                         tuple((f, args.extra_steps) for f in folders[1:]), args.threads, args.compile)


def run_bench(args: argparse.Namespace) -> int:
    """Run a parsed bench command; one line on stderr and exit 2 for bad input."""
    from tasks.bench import bench_infer, bench_solver, bench_train
    from tasks.errors import RunFailed

    try:
        if args.command == "bench-quality":
            result = _bench_quality(args)
        elif args.command == "bench-infer":
            if args.halo < 0:
                raise ValueError(f"--halo {args.halo} is negative; use 0 or more pixels")
            result = bench_infer(args.mode, args.workers, args.size, args.width, args.tile, args.halo, args.train_size,
                                 args.ngf, args.group, args.frames, args.repeats, args.frame_stride, args.frame_every,
                                 args.device, args.compare)
        elif args.command == "bench-train":
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
