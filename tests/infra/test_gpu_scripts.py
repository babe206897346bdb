"""The GPU scripts' command lines, checked on the CPU, so that a typo in a step is caught without a GPU."""

import subprocess
import sys

import pytest

from flows.bench import BENCH_COMMANDS
from flows.options import OneLineParser, spec_from_args
from models.karman.solver.benchmark import Setup
from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "infra"))
import gpu_figures  # noqa: E402


@pytest.mark.parametrize("name", sorted(gpu_figures.STEPS))
def test_every_gpu_figures_step_is_a_valid_command(name):
    command, limit = gpu_figures.STEPS[name]
    assert 0 < limit <= 600
    if command[1:3] == ["-m", "flows"]:  # a bench command: its options build its spec
        from flows.bench import add_bench_commands

        parser = OneLineParser(prog="python -m flows")
        add_bench_commands(parser.add_subparsers(dest="command"))
        args = parser.parse_args(command[3:])
        spec = spec_from_args(BENCH_COMMANDS[args.command].spec, args)
        assert spec.device == "cuda" and args.json
    elif command[2] == "--validate":  # case, dtype, nodes per diameter and lattice velocity: a benchmark Setup
        case, dtype, cells, *velocity = command[3:]
        setup = Setup(case, int(cells), float(velocity[0]) if velocity else None)
        assert dtype in ("float32", "float64") and setup.config(dtype).dtype == dtype
    else:
        assert command[2:] == ["--sweep"]


def test_the_kernel_ab_script_refuses_bad_arguments_and_a_host_without_a_gpu_in_one_line():
    script = [sys.executable, str(ROOT / "infra" / "gpu_kernel_ab.py")]
    bad = subprocess.run(script + ["--against", "missing.py"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().splitlines() == ["gpu_kernel_ab: arguments '--against missing.py' not understood; usage: python "
                                               "infra/gpu_kernel_ab.py [--against FILE] (FILE: an existing triton_backend.py)"]
    none = subprocess.run(script, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert none.returncode == 2 and none.stderr.strip() == "gpu_kernel_ab: no CUDA GPU visible; this script times the kernel on one"


import gpu_accelerator  # noqa: E402


@pytest.mark.parametrize("name", sorted(gpu_accelerator._steps(ROOT)))
def test_every_gpu_accelerator_step_is_a_valid_command(name):
    from flows.cli import build_parser
    from tasks.common.specs import BenchmarkSpec
    from tasks.workloads.presets import quick_benchmark

    command, limit = gpu_accelerator._steps(ROOT)[name]
    assert 0 < limit <= 600
    if command[1:3] == ["-m", "flows"] and command[3].startswith("bench-"):
        parser = OneLineParser(prog="python -m flows")
        from flows.bench import add_bench_commands

        add_bench_commands(parser.add_subparsers(dest="command"))
        args = parser.parse_args(command[3:])
        spec = spec_from_args(BENCH_COMMANDS[args.command].spec, args)
        assert spec.device == "cuda" and args.json
    elif command[1:3] == ["-m", "flows"]:  # the benchmark flow: its options build its spec over the quick matrix, cuda on a local pool
        args = build_parser().parse_args(command[3:])
        spec = spec_from_args(BenchmarkSpec, args, quick_benchmark())
        assert spec.devices == ["cuda"] and spec.pools == {"cuda": "local"} and args.json
    elif command[2] == "--calo":
        assert all(int(b) > 0 for b in command[3].split(",")) and set(command[4:]) <= set(gpu_accelerator.CALO_VARIANTS)
    elif command[2] in ("--pix2pix", "--graph-check"):
        assert all(int(a) > 0 for a in command[3:])
    else:
        assert command[2] == "--karman-demo" and command[3] in ("auto", "on", "off") and all(int(a) > 0 for a in command[4:])


def test_the_accelerator_script_refuses_an_unknown_step_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "infra" / "gpu_accelerator.py"), str(tmp_path / "out"), "warp_drive"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().startswith("unknown step 'warp_drive'; the steps are matmul, ")
    assert not (tmp_path / "out" / "figures.json").exists()
