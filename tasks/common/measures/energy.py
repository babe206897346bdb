"""Energy a training run's devices drew, its device-hours and their cost: NVML's total-energy counter of the run's GPUs, RAPL's package counters of a CPU host, or 'unavailable' with the reason.

Runs in the training child on rank 0, around the training loop. On cuda the counters are the run's
GPUs' (the first world-size devices of CUDA_VISIBLE_DEVICES, by index or UUID, else NVML's first
ones), in millijoules since the driver loaded, summed. On a CPU they are RAPL's top-level zones
(``intel-rapl:N`` under /sys/class/powercap; a ``psys`` zone is left out, it contains the packages):
whole packages, so every process on the host counts, not only the run's cores. RAPL counters wrap
at ``max_energy_range_uj`` (minutes at full load on large CPUs), so they are read every few seconds
on a thread and each step's increase is added, a wrap adding the range. No energy is ever reported
as 0 for want of a counter: the record says 'unavailable: <reason>'.
"""

import os
import re
import threading
from pathlib import Path

from tasks.common.records import Energy, TrainSummary
from tasks.common.config.settings import Settings

POWERCAP = Path("/sys/class/powercap")
RAPL_EVERY_S = 5.0


class Unavailable(Exception):
    """No energy counter can be read here; the message says why."""


class RaplCounter:
    """The energy of the host's top-level RAPL zones, in joules since ``start``, wraparounds included."""

    def __init__(self, root: Path = POWERCAP):
        if not root.is_dir():
            raise Unavailable(f"no {root} on this host (no RAPL powercap driver: a virtual machine, a container without it, or a CPU without RAPL)")
        self.zones = [z for z in sorted(root.glob("intel-rapl:*"), key=lambda p: p.name)
                      if re.fullmatch(r"intel-rapl:\d+", z.name) and _text(z / "name", "") != "psys"]
        if not self.zones:
            raise Unavailable(f"{root} has no RAPL zone (intel-rapl:N)")
        self.names = [_text(z / "name", z.name) for z in self.zones]
        self.ranges = [self._read(z / "max_energy_range_uj") for z in self.zones]
        self.start()

    @staticmethod
    def _read(path: Path) -> int:
        try:
            return int(path.read_text().strip())
        except PermissionError:
            raise Unavailable(f"{path} is not readable by this user (RAPL energy counters are readable by root only on most kernels)") from None
        except (OSError, ValueError) as exc:
            raise Unavailable(f"{path} does not read as a counter ({type(exc).__name__}: {exc})") from None

    def start(self) -> None:
        self.last = [self._read(z / "energy_uj") for z in self.zones]
        self.total_uj = 0

    def sample(self) -> None:
        """Add each zone's increase since the last reading (a counter below its last reading has wrapped once)."""
        now = [self._read(z / "energy_uj") for z in self.zones]
        for before, after, wrap in zip(self.last, now, self.ranges):
            self.total_uj += after - before if after >= before else after + wrap - before
        self.last = now

    @property
    def joules(self) -> float:
        return self.total_uj / 1e6

    @property
    def source(self) -> str:
        return f"rapl: {', '.join(self.names)} (whole CPU packages: every process on the host counts)"

    def close(self) -> None:
        pass


class NvmlCounter:
    """The total-energy counters of the run's GPUs (NVML, millijoules since the driver loaded), summed, since ``start``."""

    def __init__(self, count: int):
        try:
            import pynvml
        except ImportError:
            raise Unavailable("nvidia-ml-py (pynvml) is not installed") from None
        self.nvml = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise Unavailable(f"NVML does not start ({exc})") from None
        try:
            self.handles, self.ids = _gpus(pynvml, count)
            self.start()
        except pynvml.NVMLError as exc:
            pynvml.nvmlShutdown()
            raise Unavailable(f"NVML gives no total-energy counter for GPU(s) {getattr(self, 'ids', '?')} ({exc})") from None

    def _read(self) -> list[int]:
        return [self.nvml.nvmlDeviceGetTotalEnergyConsumption(h) for h in self.handles]  # mJ

    def start(self) -> None:
        self.first = self.last = self._read()

    def sample(self) -> None:
        self.last = self._read()

    @property
    def joules(self) -> float:
        return sum(after - before for before, after in zip(self.first, self.last)) / 1e3

    @property
    def source(self) -> str:
        return f"nvml: total energy of GPU(s) {', '.join(self.ids)}"

    def close(self) -> None:
        self.nvml.nvmlShutdown()


def _gpus(nvml, count: int) -> tuple[list, list[str]]:
    """NVML handles of the run's ``count`` GPUs: the first of CUDA_VISIBLE_DEVICES (indices or UUIDs), else NVML's first."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in visible.split(",") if v.strip()] if visible else [str(i) for i in range(nvml.nvmlDeviceGetCount())]
    ids = ids[:count]
    if not ids:
        raise Unavailable("no GPU is visible to the run (CUDA_VISIBLE_DEVICES is empty)")
    return [nvml.nvmlDeviceGetHandleByUUID(i) if not i.isdigit() else nvml.nvmlDeviceGetHandleByIndex(int(i)) for i in ids], ids


class EnergyMeter:
    """Energy of a block's run on ``devices`` of kind ``device``: ``with meter: ...``, then ``meter.joules``
    (None where unavailable), ``meter.source`` (the counter, or 'unavailable: <reason>'), which is known
    as soon as the meter is made, and ``meter.samples``, the counter's readings (the first, every few seconds, the last)."""

    def __init__(self, device: str, devices: int, powercap: Path = POWERCAP, every_s: float = RAPL_EVERY_S):
        self.counter, self.every_s, self.joules, self.samples = None, every_s, None, 0
        try:
            if device == "cuda":
                self.counter = NvmlCounter(devices)
            elif device == "cpu":
                self.counter = RaplCounter(powercap)
            else:
                raise Unavailable(f"{device} devices expose no energy counter to the training process")
        except Unavailable as exc:
            self.source = f"unavailable: {exc}"
        else:
            self.source = self.counter.source

    def __enter__(self) -> "EnergyMeter":
        if self.counter is not None:
            self.counter.start()
            self.samples = 1
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._poll, name="energy-meter", daemon=True)
            self._thread.start()
        return self

    def _poll(self) -> None:
        while not self._stop.wait(self.every_s) and self._sample():
            pass

    def _sample(self) -> bool:
        """Read the counter once; False (and the source says why) when it no longer reads."""
        try:
            self.counter.sample()
            self.samples += 1
            return True
        except Exception as exc:  # a counter that stops reading mid-run: say so rather than report a part
            self.source = f"unavailable: the counter stopped reading during training ({exc})"
            return False

    def __exit__(self, *exc) -> None:
        if self.counter is None:
            return
        self._stop.set()
        self._thread.join()
        if not self.source.startswith("unavailable") and self._sample():
            self.joules = self.counter.joules
        self.counter.close()


def energy_record(meter: EnergyMeter, summary: TrainSummary, device: str, devices: float, settings: Settings) -> Energy:
    """The run's Energy: the meter's joules, source and readings (its scope follows from the source), ``devices`` (GPUs, chips, or a CPU host's share) times
    the training time in hours, at the settings' price of ``device``."""
    hours = devices * summary.train_time_s / 3600
    return Energy(joules=meter.joules, source=meter.source, samples=meter.samples, devices=devices, device_hours=hours,
                  price_per_device_hour=settings.prices[device], currency=settings.currency)


def _text(path: Path, default: str) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return default
