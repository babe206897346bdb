"""A sweep killed hard in the middle, then run again, ends with every simulation stored exactly once."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

from tasks.common.config.errors import UserError
from tasks.common.specs import GenerateSpec
from tasks.common.stores.store import MANIFEST, STORE, VARIABLES, content_digest, open_simulation
from tasks.workloads.karman.sweep import expand, sweep_key
from tests.conftest import ROOT, run_in_process
from tests.flows.test_cli import assert_refused
from tests.tasks.common.test_store import chunk_bytes, flip_byte

# Four tiny simulations, one worker: they finish one after another, each after about a second of
# solver steps (steady low-Reynolds flow, so nothing diverges on a 48 x 24 grid).
SPEC = GenerateSpec(dataset="killed", reynolds=[8.0, 10.0, 12.0, 14.0], nx=48, ny=24, size=[5.0], warmup_steps=150000,
                    frames=4, frame_every=50, workers=1)
ARGS = ["generate", "--dataset", "killed", "--reynolds", "8,10,12,14", "--nx", "48", "--ny", "24", "--size", "5",
        "--warmup-steps", "150000", "--frames", "4", "--frame-every", "50", "--workers", "1", "--json"]


def read_manifest(path):
    """The manifest's simulations; fails on a simulation listed twice (a JSON object with a repeated key)."""

    def no_repeats(pairs):
        keys = [k for k, _ in pairs]
        assert len(keys) == len(set(keys)), f"repeated keys in {path}: {keys}"
        return dict(pairs)

    return json.loads(path.read_text(), object_pairs_hook=no_repeats)["simulations"]


def group_files(group_dir):
    return {p.relative_to(group_dir): p.stat().st_mtime_ns for p in group_dir.rglob("*") if p.is_file()}


def kill_group_and_wait(proc: subprocess.Popen, timeout: float = 20) -> None:
    """SIGKILL the whole process group (flow, Prefect server, Dask scheduler, nanny and worker), then
    wait until none of its processes is left alive."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=timeout)
    deadline = time.monotonic() + timeout
    while True:
        alive = []
        for p in psutil.process_iter(["pid", "status"]):
            try:
                if os.getpgid(p.pid) == proc.pid and p.info["status"] != psutil.STATUS_ZOMBIE:
                    alive.append(p.pid)
            except (ProcessLookupError, psutil.NoSuchProcess):
                pass
        if not alive:
            return
        assert time.monotonic() < deadline, f"processes {alive} of the killed sweep are still running"
        time.sleep(0.1)


def test_killed_sweep_completes_on_rerun_with_every_simulation_once(workdir):
    sweep = sorted(s.sim_id for s in expand(SPEC))
    assert len(sweep) == 4
    dataset = workdir / "data" / "datasets" / "killed"
    manifest = dataset / MANIFEST

    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    with open(workdir / "first-run.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "flows", *ARGS], cwd=workdir, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while not (manifest.exists() and 1 <= len(read_manifest(manifest)) < len(sweep)):
                assert proc.poll() is None, "the sweep ended before it could be interrupted:\n" + (workdir / "first-run.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "no simulation finished in time"
                time.sleep(0.02)
        finally:
            kill_group_and_wait(proc)

    finished = read_manifest(manifest)
    assert 1 <= len(finished) < len(sweep), f"kill landed after {len(finished)} of {len(sweep)} simulations"
    store = dataset / STORE
    before = {s: group_files(store / s) for s in finished}
    # Leave what a kill in the middle of a write leaves, whether or not this kill landed there: a group
    # of an unfinished simulation with its metadata and only some chunks.
    unfinished = [s for s in sweep if s not in finished]
    partial = store / unfinished[0] / "u" / "c" / "0" / "0"
    partial.mkdir(parents=True, exist_ok=True)
    (store / unfinished[0] / "zarr.json").write_text('{"zarr_format": 3, "node_type": "group", "attributes": {}}')
    (partial / "0").write_bytes(b"cut short")

    proc = run_in_process(*ARGS, cwd=workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{len(finished)} already complete, {len(unfinished)} to run" in proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(summary["simulations"]) == sweep

    records = read_manifest(manifest)
    assert sorted(records) == sweep
    assert sorted(p.name for p in store.iterdir() if p.is_dir()) == sweep
    for sim_id in sweep:
        ds = open_simulation(dataset, sim_id).load()
        assert ds.sizes["time"] == SPEC.options.frames
        assert all(np.isfinite(ds[name].values).all() for name in VARIABLES), f"{sim_id} has missing frames"
        assert content_digest(ds) == records[sim_id]["digest"]
    for sim_id, record in finished.items():
        assert records[sim_id]["digest"] == record["digest"]
        assert group_files(store / sim_id) == before[sim_id], f"{sim_id} was written again"


def test_sweep_expands_over_every_combination_and_keeps_the_default_sweep():
    spec = GenerateSpec(reynolds=[70.0, 90.0], shapes=["circle", "square"], size=[10.0, 12.0], x_position=[0.3, 0.5],
                        y_offset=[-1.5, 0.5])
    sims = expand(spec)
    assert len(sims) == len({s.sim_id for s in sims}) == 2 * 2 * 2 * 2 * 2
    assert {(s.shape, s.reynolds, s.size, s.cx, s.cy) for s in sims} == {
        (shape, re, size, x * sweep.ny, 0.5 * (sweep.ny - 1) + y)
        for sweep in [spec.options] for shape in sweep.shapes for re in sweep.reynolds for size in sweep.size for x in sweep.x_position for y in sweep.y_offset}
    assert [s.reynolds for s in sims[:2]] == [70.0, 90.0]  # Reynolds number varies fastest

    # The default is a single-obstacle sweep of nine Reynolds numbers, recorded in the manifest as before.
    default = expand(GenerateSpec())
    assert [(s.reynolds, s.size, s.cx, s.cy) for s in default] == [(re, 16.0, 24.0, 32.0) for re in (70.0, 80.0, 90.0, 100.0, 110.0, 120.0, 130.0, 140.0, 150.0)]
    key = sweep_key(GenerateSpec())
    assert (key["size"], key["x_position"], key["y_offset"]) == (16.0, 0.375, 0.5)
    assert sweep_key(GenerateSpec(size=[8.0, 12.0]))["size"] == [8.0, 12.0]
    assert not {"events", "energy", "angle"} & set(key)  # the calo workload's fields are no part of a karman sweep


def test_a_bad_sweep_member_is_named_with_its_value():
    with pytest.raises(UserError, match=r"sweep member circle at Re 70, size 16, x position 0.375, y offset 30: .*touches or crosses a wall"):
        expand(GenerateSpec(reynolds=[70.0], y_offset=[0.5, 30.0]))


@pytest.mark.parametrize("args,fragments", [
    (("--size", "8,12,-3"), ("--size", "greater than 0", "-3")),
    (("--y-offset=-0.5,30",), ("y offset 30", "touches or crosses a wall")),
    (("--x-position", "0.3,0.3"), ("--x-position", "repeats 0.3")),
    (("--seed", "-1"), ("--seed", "greater than or equal to 0")),
    (("--frames", "1000000"), ("--frames", "less than or equal to 100000")),
])
def test_bad_sweep_lists_are_refused_on_the_command_line(workdir, args, fragments):
    assert_refused(run_in_process("generate", *args, cwd=workdir), *fragments)
    assert not (workdir / "data" / "datasets").exists()


def test_a_diverging_simulation_fails_alone_and_is_never_marked_complete(workdir):
    """A square 24 cells across at Re 240 passes the stable-range checks but diverges within 4000 steps
    (it sits at their edge: see models/karman/solver/config.py); its neighbour at Re 20 must still land."""
    args = ["generate", "--dataset", "edge", "--reynolds", "20,240", "--shapes", "square", "--nx", "288", "--ny", "96",
            "--size", "24", "--y-offset", "0", "--warmup-steps", "6000", "--frames", "2", "--frame-every", "10",
            "--workers", "1", "--json"]
    proc = run_in_process(*args, cwd=workdir)
    assert proc.returncode == 1, proc.stderr[-2000:]
    failed = [line for line in proc.stderr.splitlines() if line.startswith("python -m flows generate: failed")]
    assert len(failed) == 1, proc.stderr[-2000:]
    assert "1 of 2 simulations failed" in failed[0] and "re240" in failed[0] and "diverged (NaN/inf)" in failed[0]
    dataset = workdir / "data" / "datasets" / "edge"
    listed = read_manifest(dataset / MANIFEST)
    assert [s.split("-")[1] for s in listed] == ["re20"]
    assert sorted(p.name for p in (dataset / STORE).iterdir() if p.is_dir()) == sorted(listed)


@pytest.mark.full
def test_damaged_data_is_refused_naming_where_it_is_and_generate_verify_repairs_it(workdir):
    """A flipped byte in one frame's chunk inside its shard (it fails its checksum) and a deleted shard
    file (it reads as NaN) are each refused before any training step, in one line naming dataset,
    simulation, variable, frame and file; a sweep with --verify simulates exactly the damaged
    simulations again, and training then runs."""
    args = ["generate", "--dataset", "hurt", "--reynolds", "20,25,30", "--nx", "64", "--ny", "32", "--size", "6",
            "--warmup-steps", "300", "--frames", "12", "--frame-every", "10", "--workers", "1", "--json"]
    assert run_in_process(*args, cwd=workdir).returncode == 0
    # another sweep under that name: refused in one line by the command's check, before its flow starts
    assert_refused(run_in_process(*[a if a != "20,25,30" else "20,25" for a in args], cwd=workdir),
                   "dataset 'hurt' already exists with different sweep parameters")
    # a scheduler that is gone does not stop a rerun of a finished sweep, which runs nothing on Dask; a repair needs it
    with socket.socket() as unused:  # a port nothing listens on
        unused.bind(("127.0.0.1", 0))
        gone = f"tcp://127.0.0.1:{unused.getsockname()[1]}"
    assert run_in_process(*args[:-1], "--scheduler", gone, "--json", cwd=workdir).returncode == 0
    assert_refused(run_in_process(*args[:-1], "--scheduler", gone, "--verify", cwd=workdir), f"--scheduler {gone}: no Dask scheduler answers there")
    store = workdir / "data" / "datasets" / "hurt" / STORE
    manifest = json.loads((workdir / "data" / "datasets" / "hurt" / MANIFEST).read_text())
    first, second = sorted(manifest["simulations"])[:2]
    shard = store / first / "u" / "c" / "0" / "0" / "0"  # all 12 frames of u
    offset, length = chunk_bytes(shard, 5, 12)
    flip_byte(shard, offset + length // 2)
    (store / second / "v" / "c" / "0" / "0" / "0").unlink()
    train = ["train", "--dataset", "hurt", "--ngf", "8", "--ndf", "8", "--epochs", "1", "--batch-sizes", "2",
             "--val-simulations", "0", "--test-simulations", "0", "--threads", "1", "--validate-every", "0"]
    proc = run_in_process(*train, cwd=workdir)
    assert proc.returncode == 2, proc.stderr[-2000:]
    verdict = proc.stderr.strip().splitlines()[-1]
    assert "dataset 'hurt', simulation" in verdict and "generate --dataset hurt --verify" in verdict, verdict
    assert (f"simulation {first}, variable u, frame 5 cannot be read (ValueError: damaged chunk in file {STORE}/{first}/u/c/0/0/0)" in verdict
            or f"simulation {second}, variable v, frame 0 is missing or not finite (file {STORE}/{second}/v/c/0/0/0)" in verdict), verdict
    assert "Traceback" not in proc.stderr.split("[train]")[0]  # the verdict, not a pile of tracebacks
    repaired = run_in_process(*args[:-1], "--verify", "--json", cwd=workdir)
    assert repaired.returncode == 0, repaired.stderr[-2000:]
    assert "2 already complete" not in repaired.stderr and "1 already complete, 2 to run" in repaired.stderr, repaired.stderr[-3000:]
    assert run_in_process(*train, cwd=workdir).returncode == 0


def test_compare_datasets_measures_how_far_two_backends_sweeps_differ(workdir):
    tiny = ["--reynolds", "40", "--nx", "48", "--ny", "24", "--size", "5", "--warmup-steps", "200", "--frames", "2", "--frame-every", "10",
            "--workers", "1", "--json"]
    for name, backend in (("by-numba", "numba"), ("by-numpy", "numpy")):
        proc = run_in_process("generate", "--dataset", name, "--cpu-backend", backend, *tiny, cwd=workdir)
        assert proc.returncode == 0, proc.stderr[-2000:]
    proc = run_in_process("compare-datasets", "--first", "by-numba", "--second", "by-numpy", "--json", cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["simulations"] == 1
    assert result["per_simulation"][0]["backends"] == ["numba", "numpy"]
    for name in ("u", "v", "p", "vorticity"):
        field = result["fields"][name]
        assert 0 < field["max_abs"] < 1e-3 < field["field_rms"]  # both float32: they differ only by rounding
    other = workdir / "data" / "datasets" / "other"
    other.mkdir()
    manifest = json.loads((workdir / "data" / "datasets" / "by-numba" / MANIFEST).read_text())
    (other / MANIFEST).write_text(json.dumps({**manifest, "spec": {**manifest["spec"], "frames": 3}}))
    assert_refused(run_in_process("compare-datasets", "--first", "by-numba", "--second", "other", cwd=workdir), "are different sweeps")
