"""Checkpoint files at their boundary, with real torch and npz files: plain on the way in or refused by name, earlier files still load, bad files named, the two newest kept.

What goes in is made plain or refused by name, files an earlier version wrote
with numpy scalars still load (as Python numbers), and a file that does not load is called damaged or named for the
type it holds."""

import fractions
import json
import zipfile

import numpy as np
import pytest
import torch

from tasks.common.config.errors import UserError
from tasks.common.runtimes.checkpoint import (check_checkpoint, digests_path, keep_checkpoint, load_npz, load_torch, plain, previous_path,
                                              resumable, save_npz, save_torch)
from tasks.common.runtimes.loop import History


def test_plain_turns_numpy_scalars_into_python_numbers_and_keeps_what_is_already_plain():
    state = {"validation": {"strouhal_rel_error": np.float64(0.25), "correlation_periods": np.float32(1.5)},
             "steps": np.int64(7), "done": np.bool_(True), "betas": (0.5, np.float64(0.999)), "names": ["a", None]}
    out = plain(state)
    assert out == {"validation": {"strouhal_rel_error": 0.25, "correlation_periods": 1.5}, "steps": 7, "done": True,
                   "betas": (0.5, 0.999), "names": ["a", None]}
    kinds = [type(out["validation"]["strouhal_rel_error"]), type(out["steps"]), type(out["done"]), type(out["betas"][1])]
    assert kinds == [float, int, bool, float]
    untouched = {"a": [1, 2.5, "x"], "t": torch.zeros(2)}
    assert plain(untouched, (torch.Tensor,)) is untouched  # nothing to turn: the same object


def test_plain_keeps_a_module_state_dicts_type_and_layer_versions():
    net = torch.nn.BatchNorm1d(3)
    state = net.state_dict()
    state["extra"] = np.float64(2.0)
    out = plain(state, (torch.Tensor,))
    assert type(out) is type(state) and out._metadata == state._metadata and type(out["extra"]) is float


@pytest.mark.parametrize("value, where", [
    ({"a": {"b": fractions.Fraction(1, 3)}}, "state.a.b holds a fractions.Fraction"),
    ({"a": [1, np.zeros(2)]}, "state.a[1] holds a numpy.ndarray"),
    ({"a": {(1, 2): 3}}, "state.a has a key of type tuple"),
    ({"t": torch.zeros(1)}, "state.t holds a torch.Tensor"),  # a tensor only where the caller admits one
])
def test_plain_refuses_what_a_checkpoint_does_not_take_naming_where_it_is(value, where):
    with pytest.raises(TypeError, match=where.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        plain(value)


def test_the_loops_history_is_plain_on_the_way_in():
    history = History()
    history.validation = {"strouhal_rel_error": np.float64(0.1), "horizon": np.int64(4)}
    history.last_losses = {"l1": np.float32(0.5)}
    assert [type(v) for v in history.validation.values()] == [float, int] and type(history.last_losses["l1"]) is float
    resumed = History(**{**history.as_dict(), "epoch": np.int64(3)})
    assert type(resumed.epoch) is int and resumed.validation == {"strouhal_rel_error": 0.1, "horizon": 4}
    with pytest.raises(TypeError, match="history.target.time_to_target_s holds a torch.Tensor"):
        history.target = {"time_to_target_s": torch.tensor(1.0)}


def _state(validation: dict) -> dict:
    return {"model": {"w": torch.arange(4.0), "opt": {"param_groups": [{"lr": 0.1, "betas": (0.5, 0.999)}]}},
            "history": {"epoch": 2, "validation": validation}}


def test_a_torch_checkpoint_holds_python_numbers_and_the_weights_only_loader_reads_it(tmp_path):
    path = tmp_path / "checkpoint.pt"
    save_torch(_state({"strouhal_rel_error": np.float64(0.02)}), path)
    raw = torch.load(path, weights_only=True)  # the strictest reader, nothing admitted beyond torch's own
    assert type(raw["history"]["validation"]["strouhal_rel_error"]) is float
    assert list(tmp_path.iterdir()) == [path]  # the temporary file was renamed over it
    assert load_torch(path)["history"]["validation"] == {"strouhal_rel_error": 0.02}


def test_a_torch_checkpoint_an_earlier_version_wrote_with_numpy_scalars_loads_as_python_numbers(tmp_path):
    path = tmp_path / "checkpoint.pt"
    torch.save(_state({"strouhal_rel_error": np.float64(0.02), "correlation_periods": np.float64(3.5),
                       "horizon": np.int64(12), "ok": np.bool_(False), "x": np.float32(0.25)}), path)  # as the earlier loop did
    with pytest.raises(Exception, match="numpy"):  # what the earlier loader met
        torch.load(path, weights_only=True)
    state = load_torch(path)
    validation = state["history"]["validation"]
    assert validation == {"strouhal_rel_error": 0.02, "correlation_periods": 3.5, "horizon": 12, "ok": False, "x": 0.25}
    assert [type(v) for v in validation.values()] == [float, float, int, bool, float]
    torch.testing.assert_close(state["model"]["w"], torch.arange(4.0))


def test_a_whole_torch_checkpoint_holding_another_type_is_named_for_it_not_called_damaged(tmp_path):
    path = tmp_path / "checkpoint.pt"
    torch.save({"model": {}, "history": {"share": fractions.Fraction(1, 3)}}, path)
    with pytest.raises(UserError) as caught:
        load_torch(path)
    message = str(caught.value)
    assert "is whole but holds fractions.Fraction" in message and "damaged" not in message and "afresh" not in message
    check_checkpoint(path, "torch")  # its archive is sound: the check before the child lets it through to the loader


def test_a_truncated_or_foreign_file_is_called_damaged(tmp_path):
    path = tmp_path / "checkpoint.pt"
    save_torch(_state({}), path)
    path.write_bytes(path.read_bytes()[:200])
    for check in (lambda: load_torch(path), lambda: check_checkpoint(path, "torch")):
        with pytest.raises(UserError, match=r"checkpoint .*checkpoint.pt is damaged \(\w+: it is cut short"):
            check()
    npz = tmp_path / "checkpoint.npz"
    npz.write_text("not an archive")
    for check in (lambda: load_npz(npz), lambda: check_checkpoint(npz, "npz")):
        with pytest.raises(UserError, match="is damaged"):
            check()
    with pytest.raises(UserError, match="no checkpoint at"):
        check_checkpoint(tmp_path / "missing.pt", "torch")


def test_an_npz_checkpoint_holds_arrays_and_plain_json(tmp_path):
    path = tmp_path / "checkpoint.npz"
    save_npz({"model": {"dense/kernel": np.ones((2, 2), np.float32), "step": np.int64(3)},
              "history": {"epoch": 2, "validation": {"accuracy": np.float32(0.5)}}}, path)
    state = load_npz(path)
    assert state["history"] == {"epoch": 2, "validation": {"accuracy": 0.5}} and state["model"]["dense/kernel"].shape == (2, 2)
    with zipfile.ZipFile(path) as archive:
        assert json.loads(np.load(path)["history"].item()) == state["history"] and "history.npy" in archive.namelist()
    check_checkpoint(path, "npz")
    with pytest.raises(TypeError, match="model.bad holds Python objects"):
        save_npz({"model": {"bad": np.array([{"a": 1}], dtype=object)}, "history": {}}, tmp_path / "other.npz")


def test_an_npz_checkpoint_holding_pickled_objects_is_named_for_them(tmp_path):
    path = tmp_path / "checkpoint.npz"
    np.savez(path, history=np.array("{}"), bad=np.array([{"a": 1}], dtype=object))
    with pytest.raises(UserError, match="is whole but holds pickled Python objects"):
        load_npz(path)


def _epoch(epoch: int) -> dict:
    return {"model": {"w": torch.full((64,), float(epoch))}, "history": {"epoch": epoch, "global_step": 10 * epoch, "validation": {}}}


def _flip_a_byte(path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_the_two_newest_checkpoints_are_kept_and_a_damaged_newest_falls_back_to_the_one_before(tmp_path):
    path = tmp_path / "checkpoint.pt"
    for epoch in (1, 2, 3):
        keep_checkpoint(save_torch, _epoch(epoch), path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.digests.json", "checkpoint.previous.pt", "checkpoint.pt"]
    assert [e["epoch"] for e in json.loads(digests_path(path).read_text())["checkpoints"]] == [3, 2]
    newest = resumable(path, "torch")
    assert (newest.path, newest.warning, newest.logged_epoch, newest.logged_step) == (path, None, 3, 30)
    assert load_torch(newest.path)["history"]["epoch"] == 3

    _flip_a_byte(path)  # its archive may still read: the digest tells
    fallback = resumable(path, "torch")
    assert fallback.path == previous_path(path) and load_torch(fallback.path)["history"]["epoch"] == 2
    assert (fallback.logged_epoch, fallback.logged_step) == (3, 30)
    assert fallback.warning == (f"checkpoint {path} (epoch 3) is damaged or missing; resuming from the one before, checkpoint.previous.pt "
                                "(epoch 2): epoch 3 will be trained again")
    _flip_a_byte(previous_path(path))
    with pytest.raises(UserError, match=r"checkpoint .*checkpoint.pt and .*checkpoint.previous.pt is damaged .*start the run afresh"):
        resumable(path, "torch")


def test_an_earlier_versions_single_checkpoint_resumes_and_the_next_save_keeps_it_as_the_one_before(tmp_path):
    path = tmp_path / "checkpoint.npz"
    save_npz({"model": {"w": np.ones(3)}, "history": {"epoch": 4, "global_step": 40}}, path)  # as the earlier version wrote it
    assert resumable(path, "npz").path == path and resumable(path, "npz").warning is None
    keep_checkpoint(save_npz, {"model": {"w": np.zeros(3)}, "history": {"epoch": 5, "global_step": 50}}, path)
    assert load_npz(previous_path(path))["history"]["epoch"] == 4 and load_npz(resumable(path, "npz").path)["history"]["epoch"] == 5
    path.write_text("not an archive")
    assert load_npz(resumable(path, "npz").path)["history"]["epoch"] == 4
