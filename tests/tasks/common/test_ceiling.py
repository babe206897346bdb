"""The FLOP ceiling's arithmetic: TFLOP/s of a product, a CPU's derived peak from its cpuinfo, datasheet peaks, and the ceiling cache."""

import json

import pytest

from tasks.common.measures.ceiling import BANDWIDTHS, BENCH, PEAKS, QUICK, cpu_name, datasheet_bandwidth, cpu_peak, host_key, parse_cpuinfo, peak_tflops, read_ceiling, write_ceiling
from tasks.common.config.errors import UserError
from tasks.common.measures.matmul import check, measure, quick_ceiling, tflops
from tasks.common.config.settings import CEILINGS_ENV, CEILINGS_FILE, Settings


def cpuinfo(model: str, vendor: str, family: int, flags: str, cores: int, sockets: int = 1, mhz: float = 2000.0) -> str:
    """A /proc/cpuinfo text: one block per logical processor, ``cores`` physical cores per socket."""
    blocks = [f"processor\t: {i}\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: 17\nmodel name\t: {model}\n"
              f"physical id\t: {i // cores}\ncpu MHz\t\t: {mhz}\ncpu cores\t: {cores}\nflags\t\t: fpu sse sse2 avx {flags}\n"
              for i in range(cores * sockets)]
    return "\n".join(blocks) + "\n"


AVX2_XEON = cpuinfo("Intel(R) Xeon(R) CPU E5-2680 v3 @ 2.50GHz", "GenuineIntel", 6, "fma avx2", cores=12, sockets=2, mhz=1200.0)
ZEN4 = cpuinfo("AMD EPYC 9454 48-Core Processor", "AuthenticAMD", 25, "fma avx2 avx512f avx512bw avx512_bf16", cores=4, mhz=2750.0)
SAPPHIRE = cpuinfo("Intel(R) Xeon(R) Platinum 8480+", "GenuineIntel", 6, "fma avx2 avx512f avx512_bf16 amx_bf16 amx_tile", cores=2, mhz=2000.0)


def test_a_product_counts_two_flops_per_term():
    assert tflops(1000, 2.0) == pytest.approx(1e-3)  # 2e9 FLOPs in 2 s
    assert tflops(4096, 1.0) == pytest.approx(2 * 4096**3 / 1e12)


def test_measure_reports_the_median_warm_product_and_its_rate():
    result = measure("torch", "cpu", "fp32", 64, 3)
    runs = sorted(result["warm_runs_s"])
    assert len(runs) == 3 and result["warm_s"] == runs[1]
    assert result["warm_tflops"] == pytest.approx(2 * 64**3 / result["warm_s"] / 1e12)
    assert result["cold_tflops"] == pytest.approx(2 * 64**3 / result["cold_s"] / 1e12)
    assert result["device_name"] == cpu_name()


def test_a_quick_ceiling_stops_its_warm_products_when_its_budget_is_spent():
    result = quick_ceiling("torch", "cpu", "fp32", repeats=5, budget_s=0.0)
    assert (result["n"], result["repeats"], len(result["warm_runs_s"])) == (2048, 1, 1)
    assert result["warm_tflops"] == pytest.approx(2 * 2048**3 / result["warm_s"] / 1e12)


@pytest.mark.parametrize("text, fp32, bf16, cores, ghz, clock", [
    (AVX2_XEON, 32, 32, 24, 2.5, "nominal clock in the model name"),  # 2 FMA x 8 lanes x 2; no native bf16: the fp32 rate
    (ZEN4, 32, 64, 4, 2.75, "cpuinfo MHz"),  # AVX-512 on two 256-bit pipes; vdpbf16ps twice the fp32 rate
    (SAPPHIRE, 64, 1024, 2, 2.0, "cpuinfo MHz"),  # two 512-bit FMA units; AMX tiles
])
def test_a_cpu_peak_is_cores_times_clock_times_flops_per_cycle(text, fp32, bf16, cores, ghz, clock):
    info = parse_cpuinfo(text)
    peak = cpu_peak(info)
    assert (peak.cores, peak.ghz, peak.clock) == (cores, ghz, clock)
    assert peak.flops_per_cycle == {"fp32": fp32, "bf16": bf16}
    value, source = peak_tflops("cpu", None, "fp32", cpu=info)
    assert value == pytest.approx(cores * ghz * fp32 / 1e3)
    assert source.startswith(f"derived: {cores} cores x {ghz:.3f} GHz")
    assert peak_tflops("cpu", None, "bf16", cpu=info)[0] == pytest.approx(cores * ghz * bf16 / 1e3)
    assert peak_tflops("cpu", None, "tf32", cpu=info) is None


def test_the_cpu_name_and_host_key_name_the_instruction_sets():
    assert cpu_name(parse_cpuinfo(AVX2_XEON)) == "Intel(R) Xeon(R) CPU E5-2680 v3 @ 2.50GHz (avx2)"
    assert cpu_name(parse_cpuinfo(SAPPHIRE)) == "Intel(R) Xeon(R) Platinum 8480+ (avx2, avx512f, avx512_bf16, amx)"
    assert host_key(parse_cpuinfo(ZEN4)) == "AMD EPYC 9454 48-Core Processor|avx2+avx512f+avx512_bf16|4c"


def test_datasheet_peaks_are_dense_and_sourced():
    assert peak_tflops("cuda", "NVIDIA H100 80GB HBM3", "bf16")[0] == 989.4
    assert peak_tflops("cuda", "NVIDIA A100-SXM4-80GB", "tf32") == (156.0, peak_tflops("cuda", "NVIDIA A100-SXM4-80GB", "fp32")[1])
    assert "datasheet" in peak_tflops("cuda", "NVIDIA RTX A6000", "fp16")[1]
    assert peak_tflops("xla", "TPU v4", "bf16")[0] == 275.0
    assert peak_tflops("xla", "TPU v4", "fp32") is None and peak_tflops("cuda", "NVIDIA GeForce GTX 1080", "fp32") is None


def test_every_gpu_with_a_known_peak_has_a_sourced_memory_bandwidth():
    gpus = {name for name in PEAKS if name.startswith("NVIDIA")}
    assert gpus == set(BANDWIDTHS)
    assert datasheet_bandwidth("NVIDIA H100 80GB HBM3")[0] == 3350.0 and datasheet_bandwidth("NVIDIA H200")[0] == 4800.0
    assert all("datasheet" in datasheet_bandwidth(name)[1] for name in gpus)
    assert datasheet_bandwidth("NVIDIA GeForce GTX 1080") is None


def test_a_dtype_the_device_lacks_is_refused_naming_what_it_offers():
    with pytest.raises(UserError, match=r"dtype 'tf32' is not offered by torch on cpu; it offers fp32, bf16, fp16"):
        check("torch", "cpu", "tf32")
    with pytest.raises(UserError, match=r"tensorflow does not run matmuls on device 'xla'"):
        check("tensorflow", "xla", "bf16")


def test_a_bench_ceiling_replaces_a_quick_one_and_is_never_replaced_by_one(workdir, own_ceilings):
    settings = Settings.from_env()
    assert read_ceiling(settings, "cpu", "torch", "fp32") is None
    assert write_ceiling(settings, "cpu", "torch", "fp32", 0.05, 2048, QUICK)
    assert read_ceiling(settings, "cpu", "torch", "fp32")["source"] == QUICK
    assert write_ceiling(settings, "cpu", "torch", "fp32", 0.08, 4096, BENCH)
    assert not write_ceiling(settings, "cpu", "torch", "fp32", 0.09, 2048, QUICK)
    entry = read_ceiling(settings, "cpu", "torch", "fp32")
    assert (entry["tflops"], entry["n"], entry["source"]) == (0.08, 4096, BENCH)
    write_ceiling(settings, "cuda", "jax", "bf16", 700.0, 8192, BENCH, device_name="NVIDIA H100 80GB HBM3")
    stored = json.loads((settings.data_root / CEILINGS_FILE).read_text())["ceilings"]  # the default: the data root's own
    assert set(stored) == {f"{host_key()}|cpu|torch|fp32", "NVIDIA H100 80GB HBM3|cuda|jax|bf16"}
    with pytest.raises(UserError, match="needs the device's name"):
        read_ceiling(settings, "cuda", "jax", "bf16")


def test_data_roots_of_one_host_share_the_ceilings_file_the_environment_names(workdir, monkeypatch):
    shared = workdir / "host" / "ceilings.json"
    monkeypatch.setenv(CEILINGS_ENV, str(shared))
    first = Settings.from_env()
    assert first.ceilings_path() == shared and first.child_env()[CEILINGS_ENV] == str(shared)
    assert write_ceiling(first, "cpu", "torch", "fp32", 0.05, 2048, QUICK)
    monkeypatch.setenv("KARMAN_DATA_ROOT", str(workdir / "other-data"))
    second = Settings.from_env()
    assert second.data_root != first.data_root and read_ceiling(second, "cpu", "torch", "fp32")["tflops"] == 0.05
    assert not (first.data_root / CEILINGS_FILE).exists() and not (second.data_root / CEILINGS_FILE).exists()
    monkeypatch.delenv(CEILINGS_ENV)
    assert Settings.from_env().ceilings_path() == workdir / "other-data" / CEILINGS_FILE
    assert CEILINGS_ENV not in Settings.from_env().child_env()
