"""The zarr store: simulations round-trip with their parameters in a few shard files, digests, damaged data named, stores written before sharding still read, the manifest's guards, and clear errors for missing datasets."""

import json
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import zarr

from tasks.common.stores import store as store_module
from tasks.common.config.errors import UserError
from tasks.workloads.karman.simulation import SimulationSpec
from tasks.common.stores.store import (STORE, VARIABLES, Manifest, consolidate, content_digest, frame_store, load_manifest, open_frame_arrays,
                                open_simulation, read_frames, remove_stale_groups, verify_simulation)
from tasks.workloads.karman.simulate import run_simulation, simulate


def tiny_spec(**kw):
    base = dict(nx=48, ny=24, reynolds=40.0, u_max=0.1, size=5.0, cx=10.0, cy=12.0, warmup_steps=100, frames=3, frame_every=20)
    return SimulationSpec(**{**base, **kw})


def chunk_bytes(shard: Path, frame: int, frames_in_shard: int) -> tuple[int, int]:
    """(offset, length) of ``frame``'s chunk in a shard file of a (time, y, x) array: zarr's shard index
    is its last 16 bytes per chunk (offset, length as little-endian uint64) and a 4-byte crc32c."""
    index = np.frombuffer(shard.read_bytes()[-(16 * frames_in_shard + 4):-4], dtype="<u8").reshape(frames_in_shard, 2)
    return int(index[frame, 0]), int(index[frame, 1])


def flip_byte(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def test_simulation_roundtrips_through_zarr_in_a_few_shard_files_and_opens_in_xarray(tmp_path):
    spec = tiny_spec()
    record = run_simulation(str(tmp_path), spec)
    consolidate(tmp_path)
    ds = open_simulation(tmp_path, spec.sim_id)
    assert set(ds.data_vars) == {"u", "v", "p", "vorticity", "mask"}
    assert ds["u"].shape == (3, 24, 48)
    assert ds["u"].encoding["chunks"] == (1, 24, 48)  # each frame its own chunk...
    assert ds["u"].encoding["shards"] == (3, 24, 48)  # ...and a variable's frames in one shard file
    for key in ("reynolds", "viscosity", "tau", "u_max", "obstacle_shape", "seed", "solver_version", "frame_every"):
        assert key in ds.attrs
    assert ds.attrs["reynolds"] == 40.0
    assert content_digest(ds.load()) == record["digest"]
    assert (tmp_path / "store.zarr" / "zarr.json").exists()
    assert "consolidated_metadata" in json.loads((tmp_path / "store.zarr" / "zarr.json").read_text())
    group = tmp_path / STORE / spec.sim_id
    files = sorted(str(p.relative_to(group)) for p in group.rglob("*") if p.is_file())
    # the group's and each array's zarr.json, one shard per variable, one chunk per coordinate (time, step, y, x)
    assert len(files) == 1 + 2 * len(VARIABLES) + 2 * 4, files
    assert {f"{name}/c/0/0/0" for name in VARIABLES} <= set(files)

    # xarray users open the store as it is: the whole tree, or one simulation, with its coordinates
    tree = xr.open_datatree(tmp_path / STORE, engine="zarr", zarr_format=3)
    node = tree[spec.sim_id].to_dataset()
    assert {"time", "step", "y", "x"} <= set(node.coords) and node["u"].dims == ("time", "y", "x")
    np.testing.assert_array_equal(node["step"].values, spec.warmup_steps + spec.frame_every * np.arange(1, 4))
    one = xr.open_zarr(tmp_path / STORE, group=spec.sim_id)
    assert {"time", "step", "y", "x"} <= set(one.coords)
    assert content_digest(one.load()) == record["digest"]


def test_frames_are_read_in_any_order_across_several_shards(tmp_path, monkeypatch):
    spec = tiny_spec(frames=5)
    monkeypatch.setattr(store_module, "SHARD_BYTES", 2 * 24 * 48 * 4)  # two frames per shard: shards of 2, 2 and 1 frames
    ds, _ = simulate(spec)
    store_module.write_simulation(tmp_path, spec.sim_id, ds)
    arrays = open_frame_arrays(frame_store(tmp_path), spec.sim_id, VARIABLES)
    assert arrays["u"].shards == (2, 24, 48)
    assert sorted(p.name for p in (tmp_path / STORE / spec.sim_id / "u" / "c").iterdir()) == ["0", "1", "2"]
    for frames in ([4, 0, 1, 1, 3], [2], slice(None), [3, 2]):
        np.testing.assert_array_equal(read_frames(arrays["u"], frames, tmp_path, spec.sim_id, "u"), ds["u"].values[frames])


def test_damage_inside_a_shard_is_named_by_frame_and_file(tmp_path):
    """A flipped byte in one frame's chunk fails that chunk's crc32c alone; one in the shard's index fails
    every frame of the shard; a lost shard file reads as NaN: each named, with the file, by verify."""
    spec = tiny_spec(frames=4)
    record = run_simulation(str(tmp_path), spec)
    sim = spec.sim_id
    group = tmp_path / STORE / sim
    assert verify_simulation(tmp_path, sim, record["digest"]) is None

    u_shard = group / "u" / "c" / "0" / "0" / "0"
    offset, length = chunk_bytes(u_shard, 2, 4)
    flip_byte(u_shard, offset + length // 2)
    assert verify_simulation(tmp_path, sim, record["digest"]) == (
        f"dataset '{tmp_path.name}', simulation {sim}, variable u, frame 2 cannot be read "
        f"(ValueError: damaged chunk in file {STORE}/{sim}/u/c/0/0/0)")
    u = open_frame_arrays(frame_store(tmp_path), sim, ("u",))["u"]
    assert np.isfinite(read_frames(u, [0, 1, 3], tmp_path, sim, "u")).all()  # the other frames still read

    p_shard = group / "p" / "c" / "0" / "0" / "0"
    flip_byte(p_shard, p_shard.stat().st_size - 10)  # inside the index
    p = open_frame_arrays(frame_store(tmp_path), sim, ("p",))["p"]
    with pytest.raises(UserError, match=rf"variable p, frame 3 cannot be read \(ValueError: shard file {STORE}/{sim}/p/c/0/0/0, frames 0-3, "
                                        "is damaged as a whole: its index fails its checksum"):
        read_frames(p, [3], tmp_path, sim, "p")

    (group / "v" / "c" / "0" / "0" / "0").unlink()
    v = open_frame_arrays(frame_store(tmp_path), sim, ("v",))["v"]
    with pytest.raises(UserError, match=rf"variable v, frame 1 is missing or not finite \(file {STORE}/{sim}/v/c/0/0/0\); repair it with"):
        read_frames(v, [1, 2], tmp_path, sim, "v")


def test_a_store_written_before_sharding_reads_and_verifies_as_it_is(tmp_path):
    """The previous layout (one file per chunk, no shards) needs no migration: the reader, verify and
    xarray take it as it is, and its damage is named by frame and chunk file."""
    spec = tiny_spec()
    ds, _ = simulate(spec)
    digest = content_digest(ds)
    codecs = [zarr.codecs.BloscCodec(cname="zstd", clevel=3, shuffle="shuffle"), zarr.codecs.Crc32cCodec()]
    encoding = {name: {"chunks": (1, 24, 48), "compressors": codecs} for name in VARIABLES}
    ds.to_zarr(tmp_path / STORE, group=spec.sim_id, mode="w", zarr_format=3, consolidated=False, encoding=encoding)
    u = open_frame_arrays(frame_store(tmp_path), spec.sim_id, ("u",))["u"]
    assert u.shards is None
    np.testing.assert_array_equal(read_frames(u, [2, 0], tmp_path, spec.sim_id, "u"), ds["u"].values[[2, 0]])
    assert verify_simulation(tmp_path, spec.sim_id, digest) is None
    assert content_digest(xr.open_zarr(tmp_path / STORE, group=spec.sim_id, consolidated=False).load()) == digest
    chunk = tmp_path / STORE / spec.sim_id / "u" / "c" / "1" / "0" / "0"
    flip_byte(chunk, chunk.stat().st_size // 2)
    assert verify_simulation(tmp_path, spec.sim_id, digest).endswith(
        f"variable u, frame 1 cannot be read (ValueError: damaged chunk in file {STORE}/{spec.sim_id}/u/c/1/0/0)")


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


def test_the_writer_lock_refuses_a_second_writer_or_waits_for_it_when_asked(tmp_path):
    import threading
    import time

    from tasks.common.config.errors import UserError
    from tasks.common.stores.store import writer_lock

    folder = tmp_path / "busy"
    held, release = threading.Event(), threading.Event()

    def first_writer():
        with writer_lock(folder, "dataset 'busy'"):
            held.set()
            release.wait(10)

    thread = threading.Thread(target=first_writer)
    thread.start()
    held.wait(10)
    with pytest.raises(UserError, match=r"dataset 'busy' is being written by pid \d+ on host"):
        with writer_lock(folder, "dataset 'busy'"):
            pass
    threading.Timer(0.5, release.set).start()
    t0 = time.monotonic()
    with writer_lock(folder, "dataset 'busy'", wait_s=10):  # the first writer ends within the wait: this one goes on
        assert time.monotonic() - t0 >= 0.4
    thread.join()
