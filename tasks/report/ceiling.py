"""The report's FLOP-ceiling section: bench-matmul's runs (stage ceiling) as one table per framework, device and dtype."""

from tasks.common.tracking.names import Tag
from tasks.common.reports.tables import markdown_table

STAGE = "ceiling"


def _cell(value: float | None, digits: str = ".3g") -> str:
    return "–" if value is None else format(value, digits)


def ceiling_rows(runs) -> list[dict]:
    """One row per (framework, device, device name, dtype) from finished ceiling runs, the newest run
    of each: best warm TFLOP/s over its sizes, cold TFLOP/s at its largest size, peak and the warm fraction of it."""
    newest: dict[tuple, object] = {}
    for run in sorted(runs, key=lambda r: r.info.start_time):
        if run.data.tags.get(Tag.STAGE) == STAGE and run.info.status == "FINISHED":
            p = run.data.params
            newest[(p["framework"], p["device"], p["device_name"], p["dtype"])] = run
    rows = []
    for (framework, device, name, dtype), run in sorted(newest.items()):
        p, m = run.data.params, run.data.metrics
        largest = max(int(n) for n in p["sizes"].split(","))
        fraction = m.get("warm_fraction_of_peak")
        rows.append({"framework": framework, "device": f"{device}: {name}", "dtype": dtype, "sizes": p["sizes"],
                     "best warm TFLOP/s": _cell(m["best_warm_tflops"]), "at n": int(m["best_n"]),
                     "cold TFLOP/s (largest n)": f"{_cell(m.get(f'cold_tflops_n{largest}'))} (n={largest})",
                     "peak TFLOP/s": _cell(m.get("peak_tflops")), "warm / peak": "–" if fraction is None else f"{fraction:.0%}",
                     "peak source": p.get("peak_source") if p.get("peak_source") not in (None, "None") else "unknown",
                     "run": run.info.run_id[:8]})
    return rows


def ceiling_section(client, exp_id: str) -> str:
    """The markdown section over the experiment's ceiling runs; '' when there are none."""
    runs = client.search_runs([exp_id], f"tags.`{Tag.STAGE}` = '{STAGE}'", order_by=["attributes.start_time ASC"], max_results=1000)
    rows = ceiling_rows(runs)
    if not rows:
        return ""
    return ("## FLOP ceiling: square matmuls\n\n"
            "`python -m flows bench-matmul`, the newest run per framework, device and dtype: the best warm rate over the sizes "
            "(median of the repeated products), the first product at the largest size (cold: allocation, tracing or compilation), "
            "and the device's dense peak (datasheet, or derived for a CPU from cores x clock x FLOPs per cycle).\n\n"
            + markdown_table(rows))
