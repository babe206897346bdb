"""The har workload's real data (UCI HAPT): the reader's refusals, UCI HAR's filters and windows, the split by person, both sources' stores.

The reader refuses every pickle global but its allowlist before anything runs, and a file whose SHA-256 is not the
pinned one; the filters and windows are tested on signals of known content; a store of either source opens, an old
synthetic one (no ``source``) as synthetic; a refused package writes nothing."""

import gzip
import json
import os
import pickle
import pickletools

import numpy as np
import pytest

from tasks.common.config.errors import UserError
from tasks.workloads.har import hapt, processing
from tests.conftest import run_in_process
from tests.flows.test_cli import assert_refused


class _Runs:
    """Pickles as a call of os.system (its ``__reduce__``): what a hostile pickle would run."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def _refused(raw: bytes, *fragments: str) -> str:
    with pytest.raises(UserError) as caught:
        hapt.unpickle(raw)
    words = str(caught.value)
    assert "\n" not in words and all(f in words for f in fragments), words
    return words


@pytest.mark.parametrize("protocol", [0, 2, 5])
def test_a_pickle_that_asks_for_os_system_is_refused_and_nothing_runs(tmp_path, protocol):
    touched = tmp_path / "ran"
    raw = pickle.dumps({1: [_Runs(f"touch {touched}")]}, protocol=protocol)
    assert b"system" in raw
    _refused(raw, "refused global", "system")  # posix.system (os.system's own module)
    assert not touched.exists()


def test_a_pickle_that_asks_for_an_unknown_pandas_class_is_refused_before_a_later_call_runs(tmp_path):
    touched = tmp_path / "ran"
    # Series (not one of the four frame records) made with NEWOBJ, then os.system("touch ...") after it in the same list
    unknown = b"\x80\x02](cpandas.core.series\nSeries\n)\x81"
    call = pickletools.optimize(pickle.dumps(_Runs(f"touch {touched}"), protocol=2))[2:-1]  # its opcodes without PROTO and STOP
    raw = unknown + call + b"e."
    with open(os.devnull, "w") as sink:
        pickletools.dis(raw, out=sink)  # a well-formed pickle: refused by its global, not by its syntax
    _refused(raw, "refused global pandas.core.series.Series")
    assert not touched.exists()
    for module, name in [("builtins", "eval"), ("__builtin__", "getattr"), ("numpy", "load"), ("pandas.core.frame", "DataFrame.from_dict")]:
        _refused(f"c{module}\n{name}\n.".encode(), f"refused global {module}.{name}")


def test_the_allowlisted_constructors_refuse_arguments_outside_the_old_pandas_frames():
    with pytest.raises(UserError, match="not one of the pandas records"):
        hapt._reconstructor(dict, object, None)  # copy_reg._reconstructor would call dict's __new__, or any class's
    with pytest.raises(UserError, match="not an index"):
        hapt._new_index(dict, {})
    with pytest.raises(UserError, match="latin-1"):
        hapt._encode("x", "rot13")
    with pytest.raises(UserError, match="not numpy.ndarray"):
        hapt._array(np.ma.MaskedArray, (0,), "b")


def test_a_file_whose_digest_is_not_the_pinned_one_is_refused_before_it_is_unpickled(tmp_path):
    touched = tmp_path / "ran"
    altered = tmp_path / "HAPT.pkl.gz"
    altered.write_bytes(gzip.compress(pickle.dumps(_Runs(f"touch {touched}"))))
    with pytest.raises(UserError, match=r"SHA-256 [0-9a-f]{16}\.\.\., not the pinned 231bf6d5069671f2\.\.\. .*damaged or altered"):
        hapt.recordings(altered)
    assert not touched.exists()
    with pytest.raises(UserError, match="refused global posix.system"):  # and with its own digest pinned, the reader still refuses it
        hapt.recordings(altered, digest=__import__("hashlib").sha256(altered.read_bytes()).hexdigest())
    assert not touched.exists()


def test_a_missing_package_is_one_line_naming_it(monkeypatch):
    monkeypatch.setattr(hapt, "DISTRIBUTION", "no-such-har-package")
    with pytest.raises(UserError, match=r"^no-such-har-package is not installed: pip install .* or generate with --source synthetic$"):
        hapt.locate()


def _amplitude(signal: np.ndarray, hz: float) -> float:
    """The amplitude of ``signal``'s sinusoid at ``hz`` (50 Hz samples; Hann window, the peak's bin)."""
    window = np.hanning(len(signal))
    spectrum = np.abs(np.fft.rfft(signal * window)) * 2 / window.sum()
    at = np.argmin(np.abs(np.fft.rfftfreq(len(signal), 1 / processing.SAMPLE_HZ) - hz))
    return float(spectrum[at - 1: at + 2].max())


def test_the_filters_split_a_mix_of_known_frequencies_as_uci_har_does():
    """0.1 Hz (posture: gravity) + 5 Hz (gait: body) + 22 Hz (above the 20 Hz noise corner), 60 s on every axis."""
    t = np.arange(60 * processing.SAMPLE_HZ) / processing.SAMPLE_HZ
    mix = np.sin(2 * np.pi * 0.1 * t) + 0.5 * np.sin(2 * np.pi * 5 * t) + 0.3 * np.sin(2 * np.pi * 22 * t)
    out = processing.inertial_signals(np.stack([mix] * 6, axis=1))  # (T, 9)
    assert out.shape == (len(t), 9)
    inner = slice(500, -500)  # away from the ends' transients
    body, gyro, total = out[inner, 0], out[inner, 3], out[inner, 6]
    gravity = total - body
    assert np.array_equal(out[:, :3], out[:, [0, 0, 0]]) and np.array_equal(out[:, 6:], out[:, [6, 6, 6]])  # per axis alike
    assert _amplitude(gravity, 0.1) == pytest.approx(1.0, abs=0.01) and _amplitude(gravity, 5) < 0.001
    assert _amplitude(body, 5) > 0.4 and _amplitude(body, 0.1) < 0.01  # (the median filter takes 16 % of 5 Hz beside 22 Hz)
    assert _amplitude(total, 22) < 0.01 * 0.3 and _amplitude(gyro, 22) < 0.01 * 0.3  # median + low-pass: 22 Hz down to < 1 %
    np.testing.assert_array_equal(out[:, 3], processing.denoise(mix[:, None])[:, 0])  # body gyro: the noise filters only
    # the 20 Hz low-pass alone: 5 Hz passes, 22 Hz keeps under 5 % (zero phase: the 3rd-order response squared)
    assert _amplitude(processing._lowpass(np.sin(2 * np.pi * 5 * t)[:, None], 20)[inner, 0], 5) == pytest.approx(1.0, abs=0.005)
    assert _amplitude(processing._lowpass(np.sin(2 * np.pi * 22 * t)[:, None], 20)[inner, 0], 22) < 0.05


def test_windows_overlap_by_half_keep_one_activity_and_drop_a_transition_and_unlabelled_stretches():
    # walking 300 samples, a sit-to-stand transition (HAPT 7) 40, standing 300, unlabelled 100, lying 200
    labels = np.concatenate([np.full(300, 1), np.full(40, 7), np.full(300, 5), np.full(100, -1), np.full(200, 6)])
    signals = np.arange(len(labels), dtype=np.float64)[:, None] * np.ones(9)  # each sample its index
    windows, activities = processing.windows_of(signals, labels)
    starts = windows[:, 0, 0].astype(int).tolist()
    # starts every 64: 0, 64, 128 walking; 192, 256 cross the transition; 320 ends at 447 (transition till 339): dropped;
    # 384, 448, 512 standing (340-639); 576 crosses into the unlabelled (640-739), 640 and 704 in or across it;
    # 768 lying (740-939); 832 would end past the recording's end
    assert starts == [0, 64, 128, 384, 448, 512, 768]
    assert activities.tolist() == [0, 0, 0, 4, 4, 4, 5] and activities.dtype == np.uint8
    assert windows.shape == (7, 128, 9) and windows.dtype == np.float32
    assert np.array_equal(windows[1, :64], windows[0, 64:])  # 50 % overlap
    assert (np.diff(windows[..., 0], axis=1) == 1).all()  # 128 consecutive samples
    assert processing.windows_of(signals[:100], labels[:100])[0].shape == (0, 128, 9)


def test_the_split_is_by_person_with_uci_hars_test_volunteers():
    volunteers = np.repeat(np.arange(1, 31), 5).astype(np.uint8)
    split = processing.person_split(volunteers)
    assert split["test"].tolist() == [2, 4, 9, 10, 12, 13, 18, 20, 24] and split["val"].tolist() == [7, 14, 21, 28]
    assert len(split["train"]) == 17 and sorted(np.concatenate(list(split.values())).tolist()) == list(range(1, 31))
    assert {role: v.tolist() for role, v in processing.person_split(np.array([1, 2, 7], np.uint8)).items()} == {"train": [1], "val": [7], "test": [2]}


class _Settings:
    def __init__(self, root):
        self.root = root

    def dataset_dir(self, name):
        return self.root / name


def test_an_old_synthetic_store_without_a_source_still_opens_as_synthetic(tmp_path):
    from tasks.workloads.har import workload as har

    folder = tmp_path / "old"
    manifest = har.write_dataset(folder, "synthetic")
    assert (manifest["source"], manifest["data"], manifest["synthetic"]) == ("synthetic", "synthetic", True)
    old = {k: v for k, v in manifest.items() if k not in ("source", "data", "description")}  # as stores before the real data
    (folder / "manifest.json").write_text(json.dumps(old))
    assert har.source_of(old) == "synthetic" == har.source_of(old | {"source": har.SOURCE})  # absent, or the old sentence
    digest, facts = har.dataset_info(_Settings(tmp_path), "old")
    assert digest == manifest["digest"] and facts == {"windows": 2880, "synthetic": True, "data": "synthetic"}
    data = har.prepare(_Settings(tmp_path), type("Spec", (), {"dataset": "old"})())
    assert data.source == "synthetic" and data.target == har.TARGET_F1 and data.split["test"][0].startswith("synthetic subjects")


@pytest.fixture(scope="module")
def real():
    """The installed package's recordings, processed (about 5 s)."""
    return hapt.recordings(), processing


def test_the_installed_package_holds_uci_hapts_recordings(real):
    recordings, _ = real
    assert len(recordings) == 61 and sum(len(r.labels) for r in recordings) == 1_122_772
    assert sorted({r.volunteer for r in recordings}) == list(range(1, 31))
    assert set(np.unique(np.concatenate([r.labels for r in recordings])).tolist()) == {-1, *range(1, 13)}
    r = recordings[0]
    assert r.signals.shape == (len(r.labels), 6) and r.signals.dtype == np.float64 and np.isfinite(r.signals).all()
    assert np.linalg.norm(r.signals[:, :3], axis=1).mean() == pytest.approx(1.0, abs=0.05)  # acceleration in g
    assert (r.sequence == np.arange(len(r.labels))).all()


def test_generate_builds_the_real_dataset_refuses_the_other_source_and_a_refused_package_writes_nothing(module_workdir, monkeypatch):
    def generate(*args):
        return run_in_process("generate", "--workload", "har", "--dataset", "har", *args, "--json", cwd=module_workdir)

    folder = module_workdir / "data" / "datasets" / "har"
    monkeypatch.setattr(hapt, "DIGEST", "0" * 64)  # as if the installed file were altered
    assert_refused(generate(), "SHA-256", "damaged or altered")
    monkeypatch.setattr(hapt, "DISTRIBUTION", "no-such-har-package")
    assert_refused(generate(), "no-such-har-package is not installed")
    assert not folder.exists()
    monkeypatch.undo()

    proc = generate()
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    manifest = json.loads((folder / "manifest.json").read_text())
    assert out["windows"] == manifest["count"] == 10_017 and manifest["split"] == {"train": 5766, "val": 1377, "test": 2874}
    assert (manifest["source"], manifest["data"], manifest["synthetic"]) == ("hapt", "real (UCI HAPT)", False)
    assert (manifest["package"], manifest["version"], manifest["file_sha256"]) == (hapt.DISTRIBUTION, hapt.VERSION, hapt.DIGEST)
    assert manifest["licence"] == "CC BY 4.0" and "Neurocomputing 171" in manifest["citation"]
    assert manifest["split_subjects"]["test"] == list(processing.TEST_VOLUNTEERS) and manifest["processing"]["gravity_lowpass_hz"] == 0.3
    assert manifest["uci_har_windows"] == {"train": 7352, "test": 2947} and manifest["uci_har_split_windows"] == {"train": 7143, "test": 2874}
    assert_refused(generate("--source", "synthetic"), "already holds real (UCI HAPT) har windows, not --source synthetic")


def test_the_reports_setting_of_a_har_run_names_its_data():
    from tasks.common.records import TrainRecord
    from tasks.report.capabilities import setting_label

    params = {"workload": "har", "epochs": "12", "time_budget": "None", "max_steps": "None"}
    assert setting_label(TrainRecord.from_mlflow(params | {"data": "real (UCI HAPT)"}, {}, finished=False)).endswith(", real (UCI HAPT) data")
    assert setting_label(TrainRecord.from_mlflow(params | {"data": "synthetic"}, {}, finished=False)).endswith(", synthetic data")
    assert "data" not in setting_label(TrainRecord.from_mlflow(params, {}, finished=False)).split("budget")[1]  # runs before: as they were
