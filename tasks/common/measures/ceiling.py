"""The FLOP ceiling of a device: its name, its datasheet or derived peak per dtype (and a GPU's memory bandwidth), and the cache of measured matmul ceilings (no framework imports)."""

import datetime as dt
import fcntl
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from tasks.common.config.errors import UserError
from tasks.common.config.settings import Settings

BENCH = "bench-matmul"
QUICK = "quick ceiling of a training run"
SOURCES = (BENCH, QUICK)

# The cpuinfo flags that set a CPU's matrix-multiply peak, in the order they are named.
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16")


@dataclass(frozen=True)
class Peak:
    """A dense peak in TFLOP/s and where it comes from."""

    tflops: float
    source: str


# Dense (no structured sparsity) peaks per chip in TFLOP/s, from the vendors' datasheets; fp32 is the
# plain (non-tensor-core) rate, tf32/bf16/fp16 the tensor-core rate. Datasheets quote tensor-core
# figures "with sparsity" for Hopper: the dense rate is half of that.
H100_SXM = "NVIDIA H100 Tensor Core GPU datasheet (SXM; tensor-core figures with sparsity halved)"
H200_SXM = "NVIDIA H200 Tensor Core GPU datasheet (SXM; tensor-core figures with sparsity halved)"
A100 = "NVIDIA A100 Tensor Core GPU datasheet (SXM, dense)"
GA102 = "NVIDIA RTX A6000 datasheet (fp32) and NVIDIA Ampere GA102 GPU architecture whitepaper (dense tensor rates, FP32 accumulate)"
TPU = "Google Cloud TPU documentation, system architecture (bf16 peak per chip)"
PEAKS: dict[str, dict[str, Peak]] = {
    "NVIDIA H100 80GB HBM3": {"fp32": Peak(67.0, H100_SXM), "tf32": Peak(494.7, H100_SXM),  # 989 with sparsity
                              "bf16": Peak(989.4, H100_SXM), "fp16": Peak(989.4, H100_SXM)},  # 1,979 with sparsity
    "NVIDIA H200": {"fp32": Peak(67.0, H200_SXM), "tf32": Peak(494.7, H200_SXM),  # same SXM compute as H100
                    "bf16": Peak(989.4, H200_SXM), "fp16": Peak(989.4, H200_SXM)},
    "NVIDIA A100-SXM4-80GB": {"fp32": Peak(19.5, A100), "tf32": Peak(156.0, A100), "bf16": Peak(312.0, A100), "fp16": Peak(312.0, A100)},
    "NVIDIA A100-SXM4-40GB": {"fp32": Peak(19.5, A100), "tf32": Peak(156.0, A100), "bf16": Peak(312.0, A100), "fp16": Peak(312.0, A100)},
    "NVIDIA RTX A6000": {"fp32": Peak(38.7, GA102), "tf32": Peak(77.4, GA102), "bf16": Peak(154.8, GA102), "fp16": Peak(154.8, GA102)},
    # Parts whose bf16 rate bench-train has always known (the datasheets' sparse figures halved).
    "NVIDIA H100 PCIe": {"bf16": Peak(756.0, "NVIDIA H100 Tensor Core GPU datasheet (PCIe; tensor-core figures with sparsity halved)")},
    "NVIDIA H100 NVL": {"bf16": Peak(835.0, "NVIDIA H100 Tensor Core GPU datasheet (NVL; tensor-core figures with sparsity halved)")},
    "NVIDIA L40S": {"bf16": Peak(362.0, "NVIDIA L40S datasheet (tensor-core figures with sparsity halved)")},
    "NVIDIA L4": {"bf16": Peak(121.0, "NVIDIA L4 datasheet (tensor-core figures with sparsity halved)")},
    # TPUs: the matrix units multiply bf16; fp32 matmuls are done in several bf16 passes, with no quoted peak.
    "TPU v2": {"bf16": Peak(45.0, TPU)},
    "TPU v3": {"bf16": Peak(123.0, TPU)},
    "TPU v4": {"bf16": Peak(275.0, TPU)},
}


@dataclass(frozen=True)
class Bandwidth:
    """A memory bandwidth in GB/s (10^9 bytes per second) and where it comes from."""

    gbs: float
    source: str


# Peak memory bandwidth per GPU, keyed like PEAKS by the name torch reports, from the vendors' datasheets.
BANDWIDTHS: dict[str, Bandwidth] = {
    "NVIDIA H100 80GB HBM3": Bandwidth(3350.0, "NVIDIA H100 Tensor Core GPU datasheet (SXM: 3.35 TB/s)"),
    "NVIDIA H100 PCIe": Bandwidth(2000.0, "NVIDIA H100 Tensor Core GPU datasheet (PCIe: 2 TB/s)"),
    "NVIDIA H100 NVL": Bandwidth(3900.0, "NVIDIA H100 Tensor Core GPU datasheet (NVL: 3.9 TB/s)"),
    "NVIDIA H200": Bandwidth(4800.0, "NVIDIA H200 Tensor Core GPU datasheet (SXM: 4.8 TB/s)"),
    "NVIDIA A100-SXM4-80GB": Bandwidth(2039.0, "NVIDIA A100 Tensor Core GPU datasheet (80GB SXM: 2,039 GB/s)"),
    "NVIDIA A100-SXM4-40GB": Bandwidth(1555.0, "NVIDIA A100 Tensor Core GPU datasheet (40GB SXM: 1,555 GB/s)"),
    "NVIDIA RTX A6000": Bandwidth(768.0, "NVIDIA RTX A6000 datasheet (768 GB/s)"),
    "NVIDIA L40S": Bandwidth(864.0, "NVIDIA L40S datasheet (864 GB/s)"),
    "NVIDIA L4": Bandwidth(300.0, "NVIDIA L4 datasheet (300 GB/s)"),
}


def datasheet_bandwidth(device_name: str) -> tuple[float, str] | None:
    """(peak memory bandwidth in GB/s, its source) of a GPU by the exact name torch reports, or None."""
    known = BANDWIDTHS.get(device_name)
    return None if known is None else (known.gbs, known.source)


@dataclass(frozen=True)
class CpuInfo:
    """What /proc/cpuinfo says about the processor: vendor, model name, family and model numbers, the
    ISA flags that matter for GEMM, physical cores and the clock it reports (MHz)."""

    vendor: str
    model_name: str
    family: int
    model: int
    flags: frozenset
    cores: int
    mhz: float | None

    @property
    def isa(self) -> tuple[str, ...]:
        """The GEMM-relevant instruction sets it has: avx2, avx512f, avx512_bf16, amx (fma is implied by the rest)."""
        named = [f for f in ISA_FLAGS if f in self.flags and f != "fma"]
        return tuple("amx" if f == "amx_bf16" else f for f in named)


def parse_cpuinfo(text: str) -> CpuInfo:
    """The processor described by a /proc/cpuinfo text; cores are physical cores (``cpu cores`` per
    ``physical id``), or the processors listed where those fields are missing."""
    blocks = [dict(re.findall(r"^([^:\n]+?)\s*:\s?(.*)$", block, re.M)) for block in text.strip().split("\n\n") if block.strip()]
    if not blocks or "model name" not in blocks[0]:
        raise UserError("cannot read the CPU from /proc/cpuinfo (no 'model name' line)")
    first = blocks[0]
    sockets = {b.get("physical id", "0") for b in blocks}
    cores = int(first["cpu cores"]) * len(sockets) if "cpu cores" in first else len(blocks)
    mhz = float(first["cpu MHz"]) if "cpu MHz" in first else None
    return CpuInfo(vendor=first.get("vendor_id", ""), model_name=" ".join(first["model name"].split()),
                   family=int(first.get("cpu family", "0")), model=int(first.get("model", "0")),
                   flags=frozenset(first.get("flags", "").split()), cores=cores, mhz=mhz)


def this_cpu() -> CpuInfo:
    """This host's processor, its cores capped by those this process may run on."""
    from models.host import cpu_cores

    info = parse_cpuinfo(Path("/proc/cpuinfo").read_text())
    return CpuInfo(**{**info.__dict__, "cores": min(info.cores, cpu_cores())})


def cpu_name(info: CpuInfo | None = None) -> str:
    """The CPU's model name and the instruction sets it multiplies with: ``AMD EPYC (avx2, avx512f, avx512_bf16)``."""
    info = info or this_cpu()
    return f"{info.model_name} ({', '.join(info.isa) or 'no avx2'})"


def host_key(info: CpuInfo | None = None) -> str:
    """What a CPU's measured ceiling is cached under: model name, ISA and cores, ``AMD EPYC|avx2+avx512f|2c``."""
    info = info or this_cpu()
    return f"{info.model_name}|{'+'.join(info.isa) or 'none'}|{info.cores}c"


@dataclass(frozen=True)
class CpuPeak:
    """A CPU's derived peak: cores × clock × FLOPs per cycle per core, and the assumptions behind each factor."""

    cores: int
    ghz: float
    clock: str  # which clock, and where it was read
    family: str  # the microarchitecture family assumed
    flops_per_cycle: dict  # dtype -> FLOPs per cycle per core
    assumption: str

    def tflops(self, dtype: str) -> float | None:
        per_cycle = self.flops_per_cycle.get(dtype)
        return None if per_cycle is None else self.cores * self.ghz * per_cycle / 1e3

    def source(self, dtype: str) -> str:
        return (f"derived: {self.cores} cores x {self.ghz:.3f} GHz ({self.clock}) x {self.flops_per_cycle[dtype]} {dtype} "
                f"FLOP/cycle/core ({self.family}: {self.assumption})")


def _family(info: CpuInfo) -> tuple[str, int, int | None, str]:
    """(family, fp32 FLOPs/cycle/core, bf16 FLOPs/cycle/core or None for no native bf16 FMA, why).

    One FMA is 2 FLOPs per lane; a 256-bit vector holds 8 fp32 lanes. bf16 dot-product instructions
    (vdpbf16ps) do 2 multiply-adds per fp32 lane, twice the fp32 rate on the same units; AMX's tiles
    do 1024 bf16 FLOPs per cycle per core (Intel's figure for Sapphire Rapids)."""
    f = info.flags
    if info.vendor == "AuthenticAMD":
        if info.family >= 26 and "avx512f" in f:
            return "AMD Zen 5", 64, 128, "two 512-bit FMA pipes (server parts' full-width AVX-512)"
        if info.family == 25 and "avx512f" in f:
            return "AMD Zen 4", 32, 64, "AVX-512 executed as 2x256-bit on two 256-bit FMA pipes"
        if info.family == 23 and info.model < 0x30:
            return "AMD Zen/Zen+", 16, None, "two 128-bit FMA pipes"
        if "avx2" in f and "fma" in f:
            return "AMD Zen 2/3", 32, None, "two 256-bit FMA pipes"
    elif "avx512f" in f:
        bf16 = 1024 if "amx_bf16" in f else 128 if "avx512_bf16" in f else None
        return ("Intel AVX-512 server" + (" with AMX" if "amx_bf16" in f else ""), 64, bf16,
                "two 512-bit FMA units (Xeon Gold/Platinum; parts with one unit reach half)")
    if "avx2" in f and "fma" in f:
        return "AVX2 with FMA", 32, None, "two 256-bit FMA units (Intel Haswell and later client/server cores)"
    if "avx" in f:
        return "AVX without FMA", 16, None, "one 256-bit multiply and one 256-bit add per cycle"
    return "SSE", 8, None, "one 128-bit multiply and one 128-bit add per cycle"


def cpu_peak(info: CpuInfo | None = None) -> CpuPeak:
    """The derived peak of a CPU. The clock is the nominal one in the model name (``@ 2.60GHz``) where
    there is one, else the MHz that cpuinfo reports (on a VM, the host's base/TSC clock; boost clocks
    are not counted). bf16 without a native bf16 FMA counts at the fp32 rate (converted, then fp32 FMAs)."""
    info = info or this_cpu()
    named = re.search(r"@\s*([\d.]+)\s*GHz", info.model_name)
    if named:
        ghz, clock = float(named.group(1)), "nominal clock in the model name"
    elif info.mhz:
        ghz, clock = info.mhz / 1e3, "cpuinfo MHz"
    else:
        raise UserError(f"cannot derive a peak for {info.model_name!r}: neither its name nor /proc/cpuinfo gives a clock")
    family, fp32, bf16, why = _family(info)
    if bf16 is None:
        why += "; no native bf16 FMA: bf16 counted at the fp32 rate"
    return CpuPeak(cores=info.cores, ghz=ghz, clock=clock, family=family, flops_per_cycle={"fp32": fp32, "bf16": bf16 or fp32}, assumption=why)


def on_host_cpu(device_kind: str, device_name: str | None) -> bool:
    """Whether the device is this host's CPU: device cpu, or an XLA device on the CPU runtime (PJRT_DEVICE=CPU)."""
    return device_kind == "cpu" or (device_kind == "xla" and device_name == "CPU")


def peak_tflops(device_kind: str, device_name: str | None, dtype: str, cpu: CpuInfo | None = None) -> tuple[float, str] | None:
    """(dense peak TFLOP/s, its source) of a device for a dtype (fp32, tf32, bf16, fp16), or None where
    none is known. A cpu's (or an XLA device's named "CPU") is derived from ``cpu`` (default: this host's
    /proc/cpuinfo); a GPU's or TPU's is the datasheet's, looked up by its exact name."""
    if on_host_cpu(device_kind, device_name):
        derived = cpu_peak(cpu)
        value = derived.tflops(dtype)
        return None if value is None else (value, derived.source(dtype))
    peak = PEAKS.get(device_name or "", {}).get(dtype)
    return None if peak is None else (peak.tflops, peak.source)


# ---- the cache of measured ceilings: <data root>/ceilings.json, or the file KARMAN_CEILINGS_FILE names ----

def _key(device_kind: str, device_name: str | None, framework: str, dtype: str) -> str:
    if on_host_cpu(device_kind, device_name):
        device_name = host_key()
    elif not device_name:
        raise UserError(f"a {device_kind} ceiling needs the device's name (e.g. NVIDIA H100 80GB HBM3)")
    return "|".join([device_name, device_kind, framework, dtype])


def _load(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text()).get("ceilings", {})
    except (ValueError, AttributeError) as exc:
        raise UserError(f"{path} is not a ceilings file ({type(exc).__name__}); move it away to start a new one") from None


def read_ceiling(settings: Settings, device_kind: str, framework: str, dtype: str, device_name: str | None = None) -> dict | None:
    """The cached ceiling of (device, framework, dtype): {"tflops", "n", "when", "source", ...}, or None.
    ``device_name``: a GPU's or TPU's name; a CPU (device cpu, or xla named "CPU") is keyed by this host's ``host_key()``."""
    return _load(settings.ceilings_path()).get(_key(device_kind, device_name, framework, dtype))


def write_ceiling(settings: Settings, device_kind: str, framework: str, dtype: str, tflops: float, n: int, source: str,
                  device_name: str | None = None) -> bool:
    """Cache a measured warm ceiling (TFLOP/s at size ``n``) from ``source`` (BENCH or QUICK); atomic, under a
    file lock. A bench-matmul figure replaces any earlier one; a quick one never replaces a bench-matmul
    figure. Returns whether it was written."""
    if source not in SOURCES:
        raise UserError(f"unknown ceiling source {source!r}; choose one of {', '.join(SOURCES)}")
    key = _key(device_kind, device_name, framework, dtype)
    path = settings.ceilings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ceilings = _load(path)
        if source == QUICK and ceilings.get(key, {}).get("source") == BENCH:
            return False
        ceilings[key] = {"tflops": float(tflops), "n": int(n), "source": source, "device": device_kind, "framework": framework,
                         "dtype": dtype, "when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"version": 1, "ceilings": ceilings}, indent=2, sort_keys=True))
        tmp.replace(path)
    return True
