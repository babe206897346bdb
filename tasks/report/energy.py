"""The report's energy and cost: a run's, a cell's over its runs, why a run has none, and the cheapest device to the quality target."""

import statistics

from tasks.common.reporting import fmt
from tasks.report.capabilities import target_words
from tasks.report.reading import Entry

ENERGY_NOTE = ("Energy is the run's devices' over training, from their counters (NVML's total energy of the GPUs; RAPL's CPU "
               "packages, which count every process on the host), or unavailable where none could be read; device-hours are the "
               "training time x the devices (on a CPU, the share of the host's cores the run used), and cost is device-hours at the "
               "price table's price per device-hour (settings: KARMAN_PRICES, KARMAN_CURRENCY).\n")


def run_energy(energy) -> dict:
    """A run's energy and cost as table fields: joules (NaN where not measured), the reason it was not, device-hours, cost."""
    nan = float("nan")
    if energy is None:  # a run logged before energy was measured
        return {"energy_j": nan, "energy": "–", "energy_unavailable": "", "device_hours": nan, "cost": nan, "currency": "", "cost_text": "–"}
    measured = energy.joules is not None
    return {"energy_j": energy.joules if measured else nan, "energy": f"{fmt(energy.joules)} J" if measured else "unavailable",
            "energy_unavailable": "" if measured else energy.source.removeprefix("unavailable: "),
            "device_hours": energy.device_hours, "cost": energy.cost, "currency": energy.currency, "cost_text": f"{fmt(energy.cost)} {energy.currency}"}


def money(amounts: list[tuple[float, str]]) -> str:
    """The median of (amount, currency) pairs with its currency (several currencies: named together); '–' for none."""
    if not amounts:
        return "–"
    return f"{fmt(statistics.median(a for a, _ in amounts))} {'/'.join(sorted({c for _, c in amounts}))}"


def cell_energy(members: list[dict]) -> dict:
    """A cell's energy and cost over its runs (rows of run_energy's fields): the median joules of the runs that measured
    them ('unavailable' where none could), the median cost."""
    joules = [m["energy_j"] for m in members if m["energy_j"] == m["energy_j"]]
    energy = f"{fmt(statistics.median(joules))} J" if joules else "unavailable" if any(m["energy_unavailable"] for m in members) else "–"
    return {"energy": energy, "cost_text": money([(m["cost"], m["currency"]) for m in members if m["cost"] == m["cost"]])}


def energy_notes(rows: list[dict]) -> str:
    """One line per reason a run's energy is unavailable, naming its runs; '' when every run measured it."""
    reasons: dict[str, list[str]] = {}
    for r in rows:
        if r["energy_unavailable"]:
            reasons.setdefault(r["energy_unavailable"], []).append(r["run"][:8])
    return "".join(f"Energy unavailable for {', '.join(runs)}: {reason}.\n" for reason, runs in reasons.items())


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
