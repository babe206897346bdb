"""The calo workload: the synthetic showers follow their analytic profile, the metrics measure what they say, the dataset is written on Dask the same whatever the workers, bad ranges are refused, and the torch and Keras networks are one network."""

import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone

import numpy as np
import pytest

from tests.conftest import ROOT, run_in_process, shared_prefect_api
from tests.flows.test_cli import assert_refused


def test_the_mean_longitudinal_profile_is_the_analytic_gamma_profile():
    from models.calo.showers import analytic_longitudinal, shower_events

    for fluctuate, events, tol in ((False, 40, 0.002), (True, 150, 0.004)):
        cells = shower_events(np.full(events, 150.0), np.full(events, 90.0), 7, fluctuate=fluctuate)
        measured = cells.sum(axis=(1, 2)).mean(axis=0) / cells.sum(axis=(1, 2, 3)).mean()  # fraction per layer
        expected = analytic_longitudinal(150.0, 90.0, fluctuate=fluctuate)
        expected = expected / expected.sum()
        assert np.abs(measured - expected).max() < tol, (fluctuate, np.abs(measured - expected).max())
    # deeper at higher energy (T grows as ln E), as the parametrisation says
    assert np.argmax(analytic_longitudinal(500.0)) > np.argmax(analytic_longitudinal(10.0))


def test_the_metrics_recover_the_sampling_fraction_resolution_and_angle():
    from models.calo import physics
    from models.calo.showers import SAMPLING_FRACTION, STOCHASTIC, shower_events

    rng = np.random.default_rng(3)
    energy, angle = rng.uniform(100, 200, 240), rng.choice([65.0, 90.0, 115.0], 240)
    cells = shower_events(energy, angle, 11)
    m = physics.shower_metrics(cells, energy, angle)
    assert m["count"].sum() == 240 and m["longitudinal"].shape == (3, 3, 25) and m["x"].shape == (3, 3, 51)
    assert np.allclose(m["sampling_fraction"], SAMPLING_FRACTION * 0.987, rtol=0.01)  # 1.3 % leaks out of 25 X0
    assert np.allclose(m["resolution"], STOCHASTIC / np.sqrt(150.0), rtol=0.6)  # 1.4 %, from about 25 events a bin
    assert np.allclose(m["longitudinal"].sum(axis=2), m["x"].sum(axis=2)) and np.allclose(m["x"].sum(axis=2), m["y"].sum(axis=2))
    scaled = {k: v * 1.1 for k, v in m.items()}
    errors = physics.relative_errors(m, scaled)
    assert set(errors) == {"longitudinal", "x", "y", "sampling_fraction", "resolution"}
    assert np.nanmax(np.abs(errors["longitudinal"] - 0.1)) < 1e-9 and np.isnan(errors["x"]).any()  # empty tails left out
    measured = np.degrees(physics.barycentre_angle(cells))
    means = [measured[angle == a].mean() for a in (65.0, 90.0, 115.0)]
    assert means[0] < 85 < means[1] < 95 < means[2] and physics.barycentre_angle(np.zeros((1, 51, 51, 25)))[0] == 100.0


@pytest.mark.parametrize("args, message", [
    (["--energy", "5,200"], "--energy 5,200: the calo generator covers 10-500 GeV; give two values inside it, the lower first"),
    (["--angle", "120,60"], "--angle 120,60: the calo generator covers 60-120 degrees; give two values inside it, the lower first"),
])
def test_ranges_outside_the_generator_are_refused_and_nothing_is_written(workdir, args, message):
    assert_refused(run_in_process("generate", "--workload", "calo", "--dataset", "showers", *args, cwd=workdir), message)
    assert not (workdir / "data" / "datasets" / "showers").exists()


def test_the_dataset_is_synthetic_chunked_and_the_same_whatever_the_workers(workdir):
    from tasks.common.config.settings import Settings
    from tasks.common.specs import GenerateSpec
    from tasks.workloads import get_workload
    from tasks.workloads.calo import dataset as calo
    from models.calo.showers import shower_events

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterName, TaskRunFilterStartTime
    from prefect.settings import PREFECT_API_URL, temporary_settings

    spec = GenerateSpec(workload="calo", dataset="showers", events=150, workers=2, seed=4)
    began = datetime.now(timezone.utc)
    with temporary_settings({PREFECT_API_URL: shared_prefect_api()}):  # each chunk is a Prefect task run, reported there
        out = calo.generate(Settings.from_env(), spec)
        with get_client(sync_client=True) as client:
            for _ in range(60):  # the API records task runs from their events, a moment later
                chunks = TaskRunFilter(name=TaskRunFilterName(any_=["simulate calo chunk 0", "simulate calo chunk 1"]),
                                       start_time=TaskRunFilterStartTime(after_=began))  # this test's, not another's on the tests' server
                names = {r.name for r in client.read_task_runs(task_run_filter=chunks) if r.state and r.state.is_completed()}
                if {"simulate calo chunk 0", "simulate calo chunk 1"} <= names:
                    break
                time.sleep(0.5)
    assert {"simulate calo chunk 0", "simulate calo chunk 1"} <= names
    assert out["written"] and out["events"] == 150 and out["synthetic"] and get_workload("calo").synthetic
    manifest = calo.load_checked(workdir / "data" / "datasets" / "showers")
    assert manifest["synthetic"] and "GFlash" in manifest["model"] and manifest["chunks"] == 2 and manifest["parameters"]["energy_gev"] == [100.0, 200.0]
    assert manifest["sampling_fraction"] == pytest.approx(0.0197, rel=0.01)
    cells, energy, angle = calo.read_dataset(workdir / "data" / "datasets" / "showers", 100)
    assert cells.shape == (50, 51, 51, 25) and 100 <= energy.min() and energy.max() <= 200 and 60 <= angle.min() and angle.max() <= 120
    alone = shower_events(energy.astype(np.float64), angle.astype(np.float64), (4, 30, 1))  # chunk 1 in this process
    assert np.array_equal(cells, alone) and calo.chunk_digest(alone, energy, angle) == manifest["chunk_digests"][1]
    assert not calo.generate(Settings.from_env(), spec)["written"]  # complete: a no-op
    from tasks.common.config.errors import UserError
    with pytest.raises(UserError, match="already exists with different calo parameters"):
        calo.check_generate(Settings.from_env(), spec.model_copy(update={"options": spec.options.model_copy(update={"events": 200})}))


@pytest.fixture(scope="module")
def networks() -> dict[str, dict]:
    """The small, the published and the CPU (pooled) configuration, torch beside Keras, in one child process."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-m", "tests.workloads.calo_nets", "small=32,0.5", "published=256,1.0", "cpu=32,0.25,3"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(out) == {"small", "published", "cpu"}
    return out


def test_torch_and_keras_have_the_published_parameter_counts_and_give_the_same_outputs(networks):
    from models.calo.nets import PUBLISHED, SMALL, parameter_counts
    from tasks.workloads.calo.workload import CPU

    published = {"generator": {"trainable": 1_364_983, "total": 1_365_047}, "discriminator": {"trainable": 87_354, "total": 87_402}}
    assert networks["published"]["torch"] == networks["published"]["keras"] == parameter_counts(PUBLISHED) == published
    for name, cfg in (("small", SMALL), ("cpu", CPU)):
        small = networks[name]
        assert small["torch"] == small["keras"] == parameter_counts(cfg)
        assert small["image_mean"] > 0 and small["image_max_diff"] < 1e-4 and small["round_trip"]
        for t, k in zip(small["heads_torch"], small["heads_keras"]):  # real/fake, energy, angle, sum
            assert t == pytest.approx(k, rel=1e-4)
        profile = small["profile"]  # the generator's profile term: numpy's formula, in both frameworks, nothing for equal profiles
        assert profile["numpy"] > 0.01 and profile["same"] == 0.0
        assert profile["torch"] == pytest.approx(profile["numpy"], rel=1e-5) and profile["keras"] == pytest.approx(profile["numpy"], rel=1e-4)
        # equal energies have no slope: the level alone; the slope adds to it (the two showers' errors differ in sign)
        assert profile["level_only"] == pytest.approx(profile["numpy_level_only"], rel=1e-5) and profile["level_only"] < 0.5 * profile["numpy"]
        # showers of the right shape but the wrong sum: the sum's own level and slope (the sampling fraction per energy)
        assert profile["scaled"] == pytest.approx(profile["numpy_scaled"], rel=1e-5) and profile["scaled"] > 1e-4


def test_the_coarse_grid_keeps_the_layers_the_energy_and_the_angle():
    """pool 3: the same convolutions end at 17 x 17 x 25; pooled showers keep every layer's energy, and their
    barycentre angle, measured in published cells, stays within a degree of the fine grid's."""
    from models.calo import physics
    from models.calo.nets import SMALL, NetConfig
    from tasks.workloads.calo.workload import CPU
    from models.calo.nets import generator_convs, pool_cells
    from models.calo.showers import shower_events

    assert CPU.image == (17, 17, 25) and generator_convs(CPU)[-1].out == CPU.image
    assert [c.kernel for c in generator_convs(CPU)] == [c.kernel for c in generator_convs(SMALL)]
    energy, angle = np.array([120.0, 180.0, 150.0]), np.array([65.0, 90.0, 115.0])
    cells = shower_events(energy, angle, 3)
    coarse = pool_cells(cells, 3)
    assert coarse.shape == (3, 17, 17, 25)
    np.testing.assert_allclose(physics.longitudinal_profile(coarse), physics.longitudinal_profile(cells), rtol=1e-5)
    fine, pooled = np.degrees(physics.barycentre_angle(cells)), np.degrees(physics.barycentre_angle(coarse, CPU.cell))
    assert np.abs(pooled - fine).max() < 1.0, (fine, pooled)
    assert np.abs(np.degrees(physics.barycentre_angle(coarse)) - fine).max() > 2.0  # cells counted as unit steps would not
    with pytest.raises(ValueError, match="pool 2"):
        NetConfig(pool=2)


def test_flops_per_layer_match_torchs_flop_counter():
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from models.calo import torch as tn
    from models.calo.nets import SMALL, multiply_adds

    g, d = tn.build_networks(SMALL)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        d(g(torch.randn(1, SMALL.latent)))
    m = multiply_adds(SMALL)
    assert counter.get_total_flops() == pytest.approx(2 * (sum(m["generator"]) + sum(m["discriminator"])), rel=1e-3)


def test_the_split_is_fixed_and_the_target_scores_say_what_they_measure():
    from models.calo import physics
    from tasks.workloads.calo import workload as calo
    from models.calo.showers import shower_events

    parts = calo.split_of(100)
    assert [len(parts[r]) for r in calo.ROLES] == [60, 20, 20] and sorted(np.concatenate(list(parts.values())).tolist()) == list(range(100))
    assert parts["val"][:2].tolist() == [3, 8] and parts["test"][:2].tolist() == [4, 9]
    energy, angle = np.linspace(101.0, 199.0, 30), np.linspace(61.0, 119.0, 30)
    cells = shower_events(energy, angle, 2)
    assert np.allclose(calo.from_image(calo.to_image(cells)), cells, rtol=1e-5, atol=1e-12)
    ref = physics.shower_metrics(cells, energy, angle, angle_edges=(60.0, 120.0))
    same = calo.shower_scores(ref, ref)
    assert same["longitudinal_err"] == 0 and same["sampling_fraction_err"] == 0 and calo.target_holds(same)
    hotter = calo.shower_scores(ref, physics.shower_metrics(cells * 1.04, energy, angle, angle_edges=(60.0, 120.0)))
    assert hotter["longitudinal_err"] == pytest.approx(0.04) and hotter["sampling_fraction_err"] == pytest.approx(0.04) and calo.target_holds(hotter)
    deeper = cells.copy()
    deeper[..., 15] *= 1.2  # one layer (about 2 % of the energy at 100-200 GeV) 20 % too hot: the profile fails, the sum holds
    scores = calo.shower_scores(ref, physics.shower_metrics(deeper, energy, angle, angle_edges=(60.0, 120.0)))
    assert scores["longitudinal_err"] > 0.1 and scores["sampling_fraction_err"] < 0.05 and not calo.target_holds(scores)


def test_a_batch_carries_the_steps_randomness_from_numpy():
    from tasks.common.specs import TrainSpec
    from tasks.workloads.calo import workload as calo
    from models.calo.nets import SMALL

    rng = np.random.default_rng(0)
    n = 40
    data = calo.CaloData({r: rng.random((n, 51, 51, 25), dtype=np.float32) * 1e-3 for r in calo.ROLES}, {r: np.full(n, 150.0, np.float32) for r in calo.ROLES},
                         {r: np.full(n, 90.0, np.float32) for r in calo.ROLES}, {}, "-", 0.02)
    trainer = calo.CaloTrainer(data, TrainSpec(workload="calo", dataset="calo", seed=3), 20, SMALL)
    first, again = next(trainer.batches(1, 2)), next(trainer.batches(1, 2))
    assert all(np.array_equal(first[k], again[k]) for k in first)  # a function of (seed, epoch, step) only
    assert first["image"].shape == (20, 51, 51, 25, 1) and first["latent"].shape == (3, 20, SMALL.latent)
    assert np.allclose(first["latent"][:, :, 0], 1.5) and np.allclose(first["latent"][:, :, 1], np.pi / 2) and np.allclose(first["ecal_fit"], 3.0)
    labels = np.concatenate([first["real_label"], 1 - first["fake_label"]] + [b["real_label"] for b in trainer.batches(2, 2)])
    assert set(np.unique(labels)) <= {0.0, 1.0} and 0 < (labels == 0).sum() < 0.2 * labels.size  # a few flipped (5 %)
    assert trainer.flops_per_sample > 0 and trainer.params["generator_updates_per_step"] == 2


def test_a_benchmark_trains_calo_on_a_dataset_named_after_the_fields_it_changes():
    from tasks.common.specs import GenerateOptions
    from tasks.workloads.presets import quick_benchmark
    from tasks.workloads import benchmark_dataset, get_workload

    calo, har = get_workload("calo"), get_workload("har")
    assert benchmark_dataset(calo, GenerateOptions()) == ("calo", {})
    assert benchmark_dataset(calo, quick_benchmark().generate) == ("calo-events400", {"events": 400})
    assert benchmark_dataset(calo, GenerateOptions(energy=[120.0, 180.0])) == ("calo-energy120-180", {"energy": [120.0, 180.0]})
    assert benchmark_dataset(har, quick_benchmark().generate) == ("har", {})


def test_the_ranks_shares_of_a_batch_differ_and_together_are_the_one_device_batch():
    from tasks.common.specs import TrainSpec
    from tasks.workloads.calo import workload as calo
    from models.calo.nets import SMALL

    rng = np.random.default_rng(1)
    n = 12
    data = calo.CaloData({r: rng.random((n, 51, 51, 25), dtype=np.float32) * 1e-3 for r in calo.ROLES},
                         {r: rng.uniform(100, 200, n).astype(np.float32) for r in calo.ROLES}, {r: np.full(n, 90.0, np.float32) for r in calo.ROLES},
                         {}, "-", 0.02)
    spec = TrainSpec(workload="calo", dataset="calo", seed=3)
    whole = next(calo.CaloTrainer(data, spec, 8, SMALL).batches(1, 1))
    shares = [next(calo.CaloTrainer(data, spec, 8, SMALL, rank, 2).batches(1, 1)) for rank in (0, 1)]
    for key, value in whole.items():  # the latent (3, b, latent): the batch on its second axis
        axis = 1 if key == "latent" else 0
        assert shares[0][key].shape[axis] == 4 and np.array_equal(np.concatenate([s[key] for s in shares], axis=axis), value), key
    assert not np.allclose(shares[0]["latent"][..., 2:], shares[1]["latent"][..., 2:])  # each rank its own noise


@pytest.mark.parametrize("width, pool", [(0.25, 3), (0.25, 1)])
def test_the_calo_steps_cost_model_is_what_torch_counts_in_a_four_tape_step(width, pool):
    """MFU's numerator for calo (nets.train_flops_per_sample, from the layer shapes) against torch's FlopCounterMode over
    one real four-tape step of the torch trainer, on the coarse grid and on the published grid, within 0.1 %."""
    from dataclasses import replace

    from torch.utils.flop_counter import FlopCounterMode

    from tasks.common.specs import TrainSpec
    from tasks.workloads import framework_module, get_workload
    from models.calo.nets import SMALL, train_flops_per_sample
    from tests.workloads.calo_step import BATCH, data_of
    from tests.workloads.digits_step import runtime_of

    cfg = replace(SMALL, dropout=0.0, width=width, pool=pool)
    trainer = framework_module(get_workload("calo"), "torch").CaloTorch(
        data_of(), TrainSpec(workload="calo", dataset="calo", framework="torch", seed=0), BATCH, runtime_of("torch"), cfg)
    trainer.calibration_batches = 5
    batch = next(trainer.batches(1, 1))
    with FlopCounterMode(display=False) as counter:
        trainer.step(batch, [0.0, 0.0, 1.5], 0.0)
    counted = counter.get_total_flops() / BATCH
    assert counted > 1e8
    assert train_flops_per_sample(cfg) == pytest.approx(counted, rel=1e-3)
