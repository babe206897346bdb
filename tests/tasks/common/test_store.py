"""The zarr store: simulations round-trip with their parameters, digests, the manifest's guards, and clear errors for missing datasets."""

import json

import pytest

from tasks.common.errors import UserError
from tasks.common.simulation import SimulationSpec
from tasks.common.store import Manifest, consolidate, content_digest, load_manifest, open_simulation, remove_stale_groups
from tasks.generate.simulation import run_simulation


def tiny_spec(**kw):
    base = dict(nx=48, ny=24, reynolds=40.0, u_max=0.1, size=5.0, cx=10.0, cy=12.0, warmup_steps=100, frames=3, frame_every=20)
    return SimulationSpec(**{**base, **kw})


def test_simulation_roundtrips_through_zarr_with_its_parameters(tmp_path):
    spec = tiny_spec()
    record = run_simulation(str(tmp_path), spec)
    consolidate(tmp_path)
    ds = open_simulation(tmp_path, spec.sim_id)
    assert set(ds.data_vars) == {"u", "v", "p", "vorticity", "mask"}
    assert ds["u"].shape == (3, 24, 48)
    assert ds["u"].encoding["chunks"] == (1, 24, 48)
    for key in ("reynolds", "viscosity", "tau", "u_max", "obstacle_shape", "seed", "solver_version", "frame_every"):
        assert key in ds.attrs
    assert ds.attrs["reynolds"] == 40.0
    assert content_digest(ds.load()) == record["digest"]
    assert (tmp_path / "store.zarr" / "zarr.json").exists()
    assert "consolidated_metadata" in json.loads((tmp_path / "store.zarr" / "zarr.json").read_text())


def test_same_spec_gives_same_digest_and_other_spec_another(tmp_path):
    a = run_simulation(str(tmp_path / "a"), tiny_spec())
    b = run_simulation(str(tmp_path / "b"), tiny_spec())
    c = run_simulation(str(tmp_path / "c"), tiny_spec(reynolds=45.0))
    assert a["digest"] == b["digest"] != c["digest"]


def test_manifest_refuses_a_different_sweep_and_cleans_partial_groups(tmp_path):
    m = Manifest(tmp_path, {"re": [1]})
    (tmp_path / "store.zarr" / "done").mkdir(parents=True)
    (tmp_path / "store.zarr" / "partial").mkdir()
    m.add("done", {"digest": "x"})
    assert Manifest(tmp_path, {"re": [1]}).is_complete("done")
    assert remove_stale_groups(tmp_path, {"done"}) == ["partial"]
    with pytest.raises(UserError, match="different sweep parameters"):
        Manifest(tmp_path, {"re": [2]})


def test_missing_or_empty_dataset_is_a_clear_error(tmp_path):
    with pytest.raises(UserError, match="not found"):
        load_manifest(tmp_path / "nope")
    Manifest(tmp_path, {}).save()
    with pytest.raises(UserError, match="no completed simulations"):
        load_manifest(tmp_path)
