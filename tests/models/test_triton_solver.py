"""The fused Triton backend: equal to the NumPy reference under Triton's CPU interpreter, conservation, and its refusals."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from models.karman.solver import ChannelSolver, FlowConfig, Obstacle

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict:
    """The interpreter's results (tests/models/triton_cases.py), run once in a child process."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    store = tmp_path_factory.mktemp("gpu-sweep")
    done = subprocess.run([sys.executable, "-W", "ignore", "-m", "tests.models.triton_cases", str(store)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_batch_of_two_simulations_equals_the_reference_through_an_inflow_change(cases):
    # circle at Re 40 and rectangle at Re 30 in one launch, fp64: obstacle links, walls, inlet, outlet
    batch = cases["batch"]
    assert batch["force_scale"] > 1e-2  # the obstacles feel a force
    assert batch["state"] < 1e-12
    assert batch["forces"] < 1e-12
    assert batch["probes"] < 1e-12


def test_float32_through_the_channel_solver_equals_the_reference(cases):
    result = cases["float32"]
    assert result["dtype"] == "float32"
    assert result["state"] < 3e-6 and result["forces"] < 1e-5 and result["probes"] < 3e-6


def test_periodic_box_conserves_mass_and_momentum_and_equals_the_reference(cases):
    box = cases["periodic"]
    before, after = box["before"], box["after"]
    assert after[0] == pytest.approx(before[0], rel=1e-13)
    assert after[1] == pytest.approx(before[1], abs=1e-11)
    assert after[2] == pytest.approx(before[2], abs=1e-11)
    assert box["state"] < 1e-12


def test_generate_gpu_job_writes_the_cpu_paths_frames_into_the_store(cases):
    # two sweep members batched in one launch per step, written as zarr groups, read back, against the numpy reference's
    sweep = cases["sweep"]
    assert sweep["records"] == 2 and sweep["same_ids"]
    assert sweep["frames"] == 2
    assert sweep["fields"] < 1e-4


def small(dtype="float32"):
    return FlowConfig(nx=32, ny=24, reynolds=40.0, u_max=0.1, dtype=dtype, obstacle=Obstacle(cx=9.3, cy=12.2, size=5.5))


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"), reason="the interpreter runs on a CPU")
def test_triton_on_a_cpu_without_the_interpreter_is_refused():
    with pytest.raises(ValueError, match=r"device 'cpu' is not offered by the triton backend; use cuda"):
        ChannelSolver(small(), backend="triton", device="cpu")


def test_cuda_without_a_gpu_is_refused():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    with pytest.raises(ValueError, match=r"device 'cuda': no CUDA GPU is visible here"):
        ChannelSolver(small(), backend="triton", device="cuda")


def test_on_a_gpu_advances_of_every_length_in_graphs_equal_the_reference():
    # needs CUDA hardware (skipped elsewhere): advances of 1, 50, 7, 200 and 13 steps replay graphs of every
    # length from different launch counts; fp64, so the graphs' steps must equal the reference's to rounding. The
    # GPU's fused multiply-adds round differently from NumPy, and the difference grows with the steps (on an H100
    # 5e-10 in the forces after 258 steps); a step replayed wrong or skipped would move them by 1e-4 or more
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU visible")
    config = FlowConfig(nx=64, ny=32, reynolds=60.0, u_max=0.1, dtype="float64", obstacle=Obstacle(shape="circle", cx=16.3, cy=16.2, size=8.0))
    fused = ChannelSolver(config, backend="triton", device="cuda")
    ref = ChannelSolver(config, backend="numpy")
    fused.perturb(seed=5)
    ref.perturb(seed=5)
    probes = np.array([[8, 30], [20, 50]])
    for steps in (1, 50, 7, 200, 13):
        forces, rho = fused.advance(steps, probes)
        expected_forces, expected_rho = ref.advance(steps, probes)
        assert np.abs(forces - expected_forces).max() < 1e-8 and np.abs(rho - expected_rho).max() < 1e-8, steps
    assert np.abs(fused.f - ref.f).max() < 1e-8


@pytest.mark.parametrize("backend", ["numpy", "numba", "torch", "triton"])
def test_fp16_storage_is_not_offered(backend):
    # fp16 storage missed Schäfer–Turek on a GPU (c_L,max 0.65 against 0.99-1.01) and was dropped
    with pytest.raises(ValueError, match=r"unknown dtype 'float16s'; choose one of float32, float64"):
        ChannelSolver(small("float16s"), backend=backend, device="cpu")


def test_probes_must_be_interior_nodes():
    from models.karman.solver.triton_plan import interior_probes

    with pytest.raises(ValueError, match=r"probe nodes \[\[0, 5\]\] must be interior: rows 1..22, columns 1..30"):
        interior_probes(np.array([[0, 5]]), 24, 32)
    assert interior_probes(np.array([[1, 1], [22, 30]]), 24, 32).shape == (2, 2)


def test_a_gpu_advance_of_any_length_runs_all_but_a_few_steps_in_graphs_that_end_where_they_start():
    from models.karman.solver.triton_plan import GRAPH_LENGTHS, graph_plan

    assert all(length % 6 == 0 for length in GRAPH_LENGTHS)  # buffer parity 2 x the outlet's slot cycle 3
    assert graph_plan(50, 1) == (5, [24, 12, 6])  # a 50-step frame after the first step: 8 steps eager
    assert graph_plan(200, 1) == (5, [120, 48, 24]) and graph_plan(120, 0) == (0, [120]) and graph_plan(4, 3) == (3, [])
    for launches in range(7):
        for steps in range(400):
            align, lengths = graph_plan(steps, launches)
            assert (launches + align) % 6 == 0 or align == steps  # every graph starts at parity 0
            assert steps - align - sum(lengths) < 6 and align + sum(lengths) <= steps
            assert align < 6 and len(lengths) <= steps // 120 + 5 and lengths == sorted(lengths, reverse=True)
    with pytest.raises(ValueError, match="steps -1 and launches 0 must not be negative"):
        graph_plan(-1, 0)


@pytest.mark.parametrize("storage,fold,periodic,shape", [("float32", True, False, (256, 4)), ("float32", False, True, (16, 1)),
                                                          ("float64", True, False, (64, 2))])
def test_the_kernel_compiles_for_an_h100(storage, fold, periodic, shape):
    # Triton's compiler and ptxas need no GPU: the compiled (not interpreted) kernel is built for sm_90 here
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from models.karman.solver.triton_backend import step_kernel

    store = compute = {"float32": "fp32", "float64": "fp64"}[storage]
    pointers = {"fa": store, "fb": store, "flags": "u8", "block_links": "u8", "link_row": "i32", "link_kind": "u8", "link_coef": compute,
                "inlet_u": compute, "rates": compute, "u_convect": compute, "outlet_sum": compute, "forces": compute}
    signature = {**{k: f"*{v}" for k, v in pointers.items()}, **dict.fromkeys(("ny", "nx", "read_slot", "add_slot", "zero_slot", "force_row"), "i32"),
                 "anchor": "fp32", **dict.fromkeys(("FOLD", "PERIODIC", "CDT", "BLOCK"), "constexpr")}
    source = ASTSource(fn=step_kernel, signature=signature, constexprs={
        "FOLD": fold, "PERIODIC": periodic, "CDT": tl.float64 if compute == "fp64" else tl.float32, "BLOCK": shape[0]})
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": shape[1]})  # shapes launch_shape gives
    ptx = kernel.asm["ptx"]
    assert ".target sm_90" in ptx
    assert ptx.count("ld.global") >= 9 and ptx.count("st.global") >= 9  # nine populations pulled and written
    assert "cubin" in kernel.asm  # ptxas assembled it


def test_launch_shapes_cover_each_row_with_aligned_blocks_of_one_or_two_cells_a_thread():
    from models.karman.solver.triton_backend import launch_shape

    assert [launch_shape(nx) for nx in (64, 128, 1024, 4096)] == [(32, 1), (64, 2), (256, 4), (256, 4)]  # as measured on an H100
    for nx in range(4, 5000, 7):
        block, warps = launch_shape(nx)
        assert block & (block - 1) == 0 and 16 <= block <= 256 and 1 <= warps <= 4
        assert 2 * block >= nx - 1 or block == 256  # at most two blocks a row below 512 columns
        assert block // (32 * warps) in (0, 1, 2)  # one cell a thread, or two in the largest blocks
