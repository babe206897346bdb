"""The report's energy and cost: a run's, a cell's over its runs, why a run has none, and the cheapest device to the quality target."""

import statistics

from tasks.common.reports.reporting import fmt
from tasks.report.capabilities import target_words
from tasks.report.intervals import Interval
from tasks.report.reading import Entry

ENERGY_NOTE = ("Energy is the run's devices' over training, from their counters, and every figure names its scope and the counter's "
               "readings: GPU board (NVML's total energy of each of the run's GPUs) or CPU package (RAPL's whole CPU packages, which "
               "count every process on the host), or not measured where no counter could be read. Energies of different scopes "
               "measure different things: the report never compares or ranks them against each other, and a table that holds several "
               "says so under it. Device-hours are the "
               "training time x the devices (on a CPU, the share of the host's cores the run used), and cost is device-hours at the "
               "price table's price per device-hour (settings: KARMAN_PRICES, KARMAN_CURRENCY).\n")


def _readings(samples: list[int | None]) -> str:
    known = sorted(n for n in samples if n is not None)
    if not known:
        return "readings not counted"
    span = f"{known[0]}" if known[0] == known[-1] else f"{known[0]}–{known[-1]}"
    return f"{span} reading{'s' if known[-1] != 1 else ''}"


def run_energy(energy) -> dict:
    """A run's energy and cost as table fields: joules (NaN where not measured) with their scope and readings, the reason it was not
    measured, device-hours, cost."""
    nan = float("nan")
    if energy is None:  # a run logged before energy was measured
        return {"energy_j": nan, "energy": "–", "energy_scope": "", "energy_samples": None, "energy_unavailable": "", "device_hours": nan,
                "cost": nan, "currency": "", "cost_text": "–"}
    measured = energy.joules is not None
    return {"energy_j": energy.joules if measured else nan, "energy_scope": energy.scope, "energy_samples": energy.samples,
            "energy": f"{fmt(energy.joules)} J ({energy.scope}, {_readings([energy.samples])})" if measured else "not measured",
            "energy_unavailable": "" if measured else energy.source.removeprefix("unavailable: "),
            "device_hours": energy.device_hours, "cost": energy.cost, "currency": energy.currency, "cost_text": f"{fmt(energy.cost)} {energy.currency}"}


def money(amounts: list[tuple[float, str]]) -> str:
    """The median of (amount, currency) pairs with its currency (several currencies: named together); '–' for none."""
    if not amounts:
        return "–"
    return f"{fmt(statistics.median(a for a, _ in amounts))} {'/'.join(sorted({c for _, c in amounts}))}"


def cell_energy(members: list[dict]) -> dict:
    """A cell's energy and cost over its runs (rows of run_energy's fields): per scope, the median joules of the runs that measured
    them with its 95 % interval and n (tasks.report.intervals), and their readings (one figure per scope: never a median across
    scopes); 'not measured' where none could; the median cost."""
    by_scope: dict[str, list[dict]] = {}
    for m in members:
        if m["energy_j"] == m["energy_j"]:
            by_scope.setdefault(m["energy_scope"], []).append(m)
    intervals = {scope: Interval.of(r["energy_j"] for r in runs) for scope, runs in sorted(by_scope.items())}
    parts = [f"{scope}: {intervals[scope].text('J')}, {_readings([r['energy_samples'] for r in runs])}" for scope, runs in sorted(by_scope.items())]
    energy = "; ".join(parts) if parts else "not measured" if any(m["energy_unavailable"] for m in members) else "–"
    return {"energy": energy, "energy_scopes": sorted(by_scope), "energy_intervals": intervals,
            "cost_text": money([(m["cost"], m["currency"]) for m in members if m["cost"] == m["cost"]])}


def scopes_line(rows: list[dict]) -> str:
    """The line under a table whose energies are of several scopes, saying they are not comparable; '' where they are of one (or none)."""
    scopes = sorted({s for r in rows for s in (r.get("energy_scopes") or ([r["energy_scope"]] if r.get("energy_j") == r.get("energy_j")
                                                                         and r.get("energy_scope") else []))})
    if len(scopes) < 2:
        return ""
    return (f"The energies above are of different scopes ({', '.join(scopes)}): each is what its own counter covers, so they are "
            "not compared with one another.\n")


def energy_notes(rows: list[dict]) -> str:
    """One line per reason a run's energy is unavailable, naming its runs; '' when every run measured it."""
    reasons: dict[str, list[str]] = {}
    for r in rows:
        if r["energy_unavailable"]:
            reasons.setdefault(r["energy_unavailable"], []).append(r["run"][:8])
    return "".join(f"Energy not measured for {', '.join(runs)}: {reason}.\n" for reason, runs in reasons.items())


def cheapest_to_target(entries: list[Entry], link=lambda rid: rid[:8]) -> str:
    """Per workload and quality target, the run whose devices reached the target for the least money (price per
    device-hour x devices x time to target), or a plain statement that no run reached it."""
    best: dict[tuple[str, str], tuple[float, Entry]] = {}
    targets = set()
    for e in entries:
        s, energy = e.record.summary, e.record.energy
        if e.status != "FINISHED" or s is None:
            continue
        key = (e.record.config.workload, target_words(e.record))
        targets.add(key)
        if s.target_reached and s.time_to_target_s is not None and energy is not None:
            cost = energy.cost_of(s.time_to_target_s)
            if key not in best or cost < best[key][0]:
                best[key] = (cost, e)
    if not targets:
        return "**Cheapest device to the quality target**: no finished training run, so none is named.\n"
    lines = []
    for workload, target in sorted(targets):
        if (workload, target) not in best:
            lines.append(f"- {workload} ({target}): no run reached the target, so no device is named.")
            continue
        cost, e = best[(workload, target)]
        c, energy, s = e.record.config, e.record.energy, e.record.summary
        lines.append(f"- {workload} ({target}): **{c.device} x{c.world_size}** ({c.framework}, batch {c.batch_size}, run {link(e.run_id)}) "
                     f"for {fmt(cost)} {energy.currency}: {fmt(energy.price_per_device_hour)} {energy.currency} per device-hour x "
                     f"{fmt(energy.devices)} device(s) x {fmt(s.time_to_target_s)} s to the target.")
    return "**Cheapest device to the quality target** (at the price table's prices; among the runs that reached it):\n\n" + "\n".join(lines) + "\n"
