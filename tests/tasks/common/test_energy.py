"""Energy and cost of a training run: RAPL on a powercap tree (with a wrap), NVML's counters (a stand-in library where no GPU is), the reason when none reads, the price table."""

import sys
import types
from pathlib import Path

import pytest

from tasks.common.config.errors import UserError
from tasks.common.records import TrainSummary
from tasks.common.config.settings import Settings, parse_prices
from tasks.common.measures.energy import POWERCAP, EnergyMeter, energy_record

SUMMARY = TrainSummary(epochs=1, steps=10, warmup_s=0.1, time_per_epoch_s=1.0, samples_per_s=10.0, train_time_s=1800.0,
                       samples_seen=100, final_losses={}, target_reached=False)


def zone(root: Path, name: str, label: str, energy_uj: int, max_uj: int) -> Path:
    path = root / name
    path.mkdir(parents=True)
    (path / "name").write_text(label + "\n")
    (path / "energy_uj").write_text(f"{energy_uj}\n")
    (path / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return path


def test_rapl_sums_the_packages_across_a_wraparound_and_leaves_subzones_and_psys_out(tmp_path):
    root = tmp_path / "powercap"
    p0 = zone(root, "intel-rapl:0", "package-0", 999_000_000, 1_000_000_000)  # 1 J below its wrap
    p1 = zone(root, "intel-rapl:1", "package-1", 5_000_000, 1_000_000_000)
    core = zone(root, "intel-rapl:0:0", "core", 0, 1_000_000_000)  # inside package-0: not counted twice
    psys = zone(root, "intel-rapl:2", "psys", 0, 1_000_000_000)  # the whole platform: contains the packages
    (root / "intel-rapl").mkdir()  # the control type's own folder, no counter
    meter = EnergyMeter("cpu", 1, powercap=root, every_s=3600)
    assert meter.source.startswith("rapl: package-0, package-1")
    with meter:
        (p0 / "energy_uj").write_text("500000000\n")  # wrapped: 1 J to the wrap, then 500 J
        meter.counter.sample()
        (p0 / "energy_uj").write_text("502000000\n")  # +2 J
        for other in (core, psys):
            (other / "energy_uj").write_text("900000000\n")
        (p1 / "energy_uj").write_text("15000000\n")  # +10 J
    assert meter.joules == pytest.approx(1 + 500 + 2 + 10)
    assert meter.samples == 2  # the meter's own readings: the first and the last (its hourly poll never came)
    energy = energy_record(meter, SUMMARY, "cpu", 1.0, Settings.from_env())
    assert (energy.scope, energy.samples, energy.mlflow_params()["energy_scope"]) == ("CPU package", 2, "CPU package")


def test_a_counter_this_user_may_not_read_makes_energy_unavailable_with_the_reason(tmp_path, monkeypatch):
    root = tmp_path / "powercap"
    p0 = zone(root, "intel-rapl:0", "package-0", 1, 10)
    read = Path.read_text

    def root_only(path, *args, **kwargs):  # as the kernel answers a user other than root (this test may run as root)
        if path == p0 / "energy_uj":
            raise PermissionError(13, "Permission denied")
        return read(path, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", root_only)
    meter = EnergyMeter("cpu", 1, powercap=root)
    assert meter.source == f"unavailable: {p0 / 'energy_uj'} is not readable by this user (RAPL energy counters are readable by root only on most kernels)"


def _gpu_here() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return False


@pytest.mark.skipif(POWERCAP.is_dir(), reason="this host has a powercap tree")
def test_on_a_host_without_powercap_energy_is_unavailable_with_the_reason_never_zero():
    meter = EnergyMeter("cpu", 1)
    with meter:
        pass
    assert meter.joules is None and meter.source.startswith("unavailable: no /sys/class/powercap on this host")
    energy = energy_record(meter, SUMMARY, "cpu", 0.5, Settings.from_env())
    assert energy.joules is None and "energy_j" not in energy.mlflow_metrics() and energy.scope == "not measured"
    assert energy.mlflow_params()["energy_source"].startswith("unavailable: no /sys/class/powercap")


def test_xla_runs_say_why_they_have_no_energy():
    assert EnergyMeter("xla", 4).source == "unavailable: xla devices expose no energy counter to the training process"


class FakeNvml(types.ModuleType):
    """pynvml's calls the meter makes, on two GPUs whose counters (mJ) the test moves; only where no GPU is."""

    class NVMLError(Exception):
        pass

    def __init__(self):
        super().__init__("pynvml")
        self.mj = {"0": 1_000_000, "1": 2_000_000, "GPU-b": 7_000}
        self.shut = False

    def nvmlInit(self): pass
    def nvmlShutdown(self): self.shut = True
    def nvmlDeviceGetCount(self): return 2
    def nvmlDeviceGetHandleByIndex(self, i): return str(i)
    def nvmlDeviceGetHandleByUUID(self, uuid): return uuid
    def nvmlDeviceGetTotalEnergyConsumption(self, handle): return self.mj[handle]


@pytest.mark.parametrize("visible, world, moved, joules", [(None, 2, {"0": 5_000, "1": 2_500}, 7.5),
                                                           ("1,0", 1, {"1": 4_000, "0": 99_000}, 4.0),
                                                           ("GPU-b", 1, {"GPU-b": 1_500}, 1.5)])
@pytest.mark.skipif(_gpu_here(), reason="a GPU is here: its real counters are read")
def test_nvml_sums_the_total_energy_of_the_runs_gpus(monkeypatch, visible, world, moved, joules):
    fake = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    meter = EnergyMeter("cuda", world, every_s=3600)
    assert meter.source.startswith("nvml: total energy of GPU(s)")
    with meter:
        for gpu, added in moved.items():
            fake.mj[gpu] += added
    assert meter.joules == pytest.approx(joules) and fake.shut
    energy = energy_record(meter, SUMMARY, "cuda", float(world), Settings.from_env().model_copy(update={"prices": parse_prices("cuda=2.5")}))
    assert energy.device_hours == pytest.approx(0.5 * world) and energy.cost == pytest.approx(1.25 * world)
    assert energy.mlflow_metrics() == {"energy_j": pytest.approx(joules), "device_hours": pytest.approx(0.5 * world), "cost": pytest.approx(1.25 * world),
                                       "energy_samples": 2}
    assert energy.scope == "GPU board"


def test_without_the_nvml_library_energy_is_unavailable_with_the_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    assert EnergyMeter("cuda", 1).source == "unavailable: nvidia-ml-py (pynvml) is not installed"


def test_the_price_table_has_defaults_takes_the_users_and_refuses_bad_entries(monkeypatch):
    monkeypatch.delenv("KARMAN_PRICES", raising=False)
    monkeypatch.delenv("KARMAN_CURRENCY", raising=False)
    assert (Settings.from_env().prices, Settings.from_env().currency) == ({"cpu": 0.10, "cuda": 3.00, "xla": 1.50}, "USD")
    monkeypatch.setenv("KARMAN_PRICES", "cuda=2.2, cpu=0.05")
    monkeypatch.setenv("KARMAN_CURRENCY", "EUR")
    settings = Settings.from_env()
    assert (settings.prices, settings.currency) == ({"cpu": 0.05, "cuda": 2.2, "xla": 1.50}, "EUR")
    assert Settings(**settings.model_dump()).prices == settings.prices  # as the child receives them
    for bad in ("gpu=1", "cuda=-1", "cuda", "cpu=cheap", "xla=inf"):
        with pytest.raises(UserError, match=rf"KARMAN_PRICES entry '{bad}' is not DEVICE=PRICE"):
            parse_prices(bad)
