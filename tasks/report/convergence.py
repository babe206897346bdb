"""Reference convergence points: per workload, framework and batch size, the epochs measured runs took to the quality target, and each cell's runs tested against them as MLPerf's RCP checker tests a submission.

A workload's references live in its own folder as ``convergence.json`` (found through the workload table, so a
workload needs no code for them), written by ``python -m flows rcp``, which trains the runs through the benchmark
and records its own command line, the runs, their code and framework versions in the file; a later command that
measures other (framework, batch size) pairs adds its points beside the earlier ones, each naming its command.

The test is MLPerf's (mlperf-logging's rcp_checker), in this project's terms:

- a reference point is the olympic mean of its runs' epochs to the target (the fastest and the slowest dropped)
  and the standard deviation of all of them;
- a cell's runs give their olympic mean the same way (a plain mean under three runs); a run that missed the
  target counts as never reaching it (MLPerf's infinite), so one such run is dropped as the slowest and two fail;
- the cell converges abnormally fast when its mean is below the smallest mean a one-sided t-test at p = 0.05
  (equal variances) still accepts: mean_ref - t(0.95, n_ref + n_cell - 2) * sd * sqrt(1 / n_ref + 1 / n_cell);
  MLPerf rejects such a submission. This report also flags the mirror image, a cell slower than the largest
  mean the same test accepts, as abnormally slow (MLPerf only costs such a submission time);
- a batch size between two references is judged against their linear interpolation (mean and deviation), over
  the references pruned as MLPerf prunes them (those at batch sizes below the fastest-converging one, and any
  that converges slower than its neighbours' interpolation); one below every reference is judged on the fast side
  only, against the smallest; one above every reference is not judged.

Two differences from MLPerf, both because this benchmark's measure is coarser: n_cell is the cell's own number of
runs (MLPerf's submissions always have their benchmark's count), and the deviation is at least that of the
measure's own resolution, k / sqrt(12) for a validation every k epochs (otherwise references that all land on the
same epoch would accept nothing else). References are measured validating every epoch; a cell that validates every
k epochs is compared with each reference run's first validation at or after the epoch it reached the target
(ceil(e / k) * k), the earliest such a run could have shown it.
"""

import datetime as dt
import importlib.util
import math
import statistics
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from tasks.common.config.errors import UserError
from tasks.workloads import get_workload, table

FILE = "convergence.json"
ALPHA = 0.05
VERDICTS = ("within", "fast", "slow", "not judged")


class ConvergenceSpec(BaseModel):
    """Measure a workload's reference convergence points: every (framework, batch size) cell trained ``seeds`` times to its quality
    target through the benchmark, validating every epoch, and the epochs each run took written into the workload's convergence.json."""

    model_config = ConfigDict(extra="forbid")
    workload: str = Field(description="Workload, by name from the workload table")
    frameworks: list[Literal["torch", "tensorflow", "jax"]] | None = Field(default=None, min_length=1, description="Frameworks; None = every one the workload has")
    device: Literal["cpu", "cuda", "xla"] = Field(default="cpu", description="Device the reference runs train on")
    batch_sizes: list[PositiveInt] | None = Field(default=None, min_length=1, description="Global batch sizes; None = the workload's benchmark batch sizes")
    seeds: int = Field(default=6, ge=4, le=100, description="Runs per cell, seeds seed, seed + 1, ...; at least 4, so that the olympic mean keeps two")
    seed: int = Field(default=0, ge=0, description="The first seed")
    epochs: PositiveInt | None = Field(default=None, le=10_000, description="Epoch limit of each run (it stops at the target); None = twice the workload's benchmark epochs")
    out: str | None = Field(default=None, description="Folder to write convergence.json into; None = the workload's own folder")

    def benchmark_spec(self):
        """The benchmark that trains the reference runs: each (framework, batch size) cell ``seeds`` times, validating every epoch and
        stopping at the target."""
        from tasks.common.specs import BenchmarkSpec

        workload = get_workload(self.workload)
        return BenchmarkSpec(workloads=[self.workload], frameworks=self.frameworks or list(workload.frameworks), devices=[self.device],
                             batch_sizes=self.batch_sizes or list(workload.batch_sizes), repeats=self.seeds,
                             train={"seed": self.seed, "validate_every": 1, "stop_at_target": True, "epochs": self.epochs or 2 * workload.epochs},
                             aggregate={"name": f"rcp-{self.workload}"})

    def command(self) -> str:
        """The command line that makes these references."""
        parts = ["python -m flows rcp", f"--workload {self.workload}"]
        if self.frameworks:
            parts.append(f"--frameworks {','.join(self.frameworks)}")
        if self.device != "cpu":
            parts.append(f"--device {self.device}")
        if self.batch_sizes:
            parts.append(f"--batch-sizes {','.join(map(str, self.batch_sizes))}")
        parts.append(f"--seeds {self.seeds}")
        if self.seed:
            parts.append(f"--seed {self.seed}")
        if self.epochs:
            parts.append(f"--epochs {self.epochs}")
        return " ".join(parts)


class ReferenceRuns(BaseModel):
    """One reference point's runs: their epochs to the target, by seed."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    framework: str
    batch_size: int
    framework_version: str
    epochs_to_target: list[int] = Field(description="Epochs to the target of the runs that reached it, in seed order")
    seeds: list[int] = Field(description="Their seeds")
    missed: list[int] = Field(default_factory=list, description="Seeds of the runs that did not reach the target within the epoch limit")
    runs: list[str] = Field(default_factory=list, description="Their MLflow run ids")
    made_by: str = Field(description="The command that measured them")
    benchmark_run: str = Field(description="The benchmark run (MLflow) whose training runs they are")
    code_version: str


class References(BaseModel):
    """A workload's reference convergence points (its folder's convergence.json)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    workload: str
    target: str = Field(description="The quality target the runs trained to, in words")
    measure: Literal["epochs to target"] = "epochs to target"
    validate_every: int = Field(default=1, description="Epochs between the reference runs' validations")
    epoch_limit: int
    device: str
    made_by: list[str] = Field(description="The commands that measured them (each point names its own)")
    made_at: str
    host: str
    references: list[ReferenceRuns]


# ---- the statistics -------------------------------------------------------------------------------------------------


def olympic(values: list[float]) -> list[float]:
    """``values`` sorted, the fastest and the slowest dropped from three on (MLPerf's olympic scoring)."""
    ordered = sorted(values)
    return ordered[1:-1] if len(ordered) >= 3 else ordered


def at_cadence(epochs: int, every: int) -> int:
    """The first validation at or after ``epochs`` of a run that validates every ``every`` epochs."""
    return math.ceil(epochs / every) * every


class Point(BaseModel):
    """A reference point at one batch size, as a cell validating every ``every`` epochs sees it."""

    batch_size: int
    mean: float
    sd: float
    n: int
    basis: str


def point(runs: ReferenceRuns, every: int) -> Point | None:
    """The reference point of ``runs`` at validation cadence ``every``; None with fewer than two runs left after the olympic drop."""
    values = [at_cadence(e, every) for e in runs.epochs_to_target]
    kept = olympic(values)
    if len(kept) < 2:
        return None
    sd = max(statistics.pstdev(values), every / math.sqrt(12))  # MLPerf's np.std of every run, at least the measure's resolution
    return Point(batch_size=runs.batch_size, mean=statistics.fmean(kept), sd=sd, n=len(kept), basis=f"batch {runs.batch_size}")


def interpolate(batch: int, low: Point, high: Point) -> Point:
    """The point at ``batch`` between ``low`` and ``high``: mean and deviation linear in the batch size (MLPerf's interpolation)."""
    w = (batch - low.batch_size) / (high.batch_size - low.batch_size)
    return Point(batch_size=batch, mean=low.mean + w * (high.mean - low.mean), sd=low.sd + w * (high.sd - low.sd), n=min(low.n, high.n),
                 basis=f"interpolated between batch {low.batch_size} and {high.batch_size}")


def pruned(points: list[Point]) -> list[Point]:
    """MLPerf's pruning: drop the points at batch sizes below the fastest-converging one, then each point slower than the
    interpolation of its neighbours."""
    if not points:
        return []
    ordered = sorted(points, key=lambda p: p.batch_size)
    fastest = min(ordered, key=lambda p: p.mean)
    kept = [p for p in ordered if p.batch_size >= fastest.batch_size]
    i = 1
    while i < len(kept) - 1:
        if kept[i].mean > interpolate(kept[i].batch_size, kept[i - 1], kept[i + 1]).mean:
            del kept[i]
            i -= 1
        i += 1
    return kept


def half_width(ref: Point, n_cell: int) -> float:
    """How far a mean of ``n_cell`` runs may lie from the reference's before a one-sided t-test at ALPHA (equal variances) rejects it."""
    from scipy.stats import t

    return float(t.ppf(1 - ALPHA, ref.n + n_cell - 2)) * ref.sd * math.sqrt(1 / ref.n + 1 / n_cell)


def reference_for(refs: References, framework: str, batch: int, every: int) -> tuple[Point | None, bool, str]:
    """(the point a cell of ``framework`` at ``batch`` validating every ``every`` epochs is judged against, whether its slow side
    is judged too, why there is none)."""
    own = [p for r in refs.references if r.framework == framework and (p := point(r, every)) is not None]
    if not own:
        return None, False, f"no reference points for {framework}"
    exact = next((p for p in own if p.batch_size == batch), None)
    if exact is not None:
        return exact, True, ""
    kept = pruned(own)
    below = [p for p in kept if p.batch_size < batch]
    above = [p for p in kept if p.batch_size > batch]
    covered = ", ".join(str(p.batch_size) for p in sorted(own, key=lambda p: p.batch_size))
    if below and above:
        return interpolate(batch, below[-1], above[0]), True, ""
    if above:  # a smaller batch than any reference: only converging faster than the smallest is abnormal (MLPerf)
        smallest = min(own, key=lambda p: p.batch_size)
        return smallest.model_copy(update={"basis": f"batch {smallest.batch_size}, the smallest referenced (fast side only)"}), False, ""
    return None, False, f"batch {batch} is above the referenced batch sizes ({covered})"


# ---- the references on disk ---------------------------------------------------------------------------------------


def reference_file(workload: str) -> Path:
    """Where ``workload``'s references live: convergence.json in its own folder (its package in the workload table)."""
    found = importlib.util.find_spec(table()[workload])
    if found is None or not found.submodule_search_locations:
        raise UserError(f"workload {workload}: its package {table()[workload]} is not a folder")
    return Path(list(found.submodule_search_locations)[0]) / FILE


def load_references(workload: str) -> References | None:
    """``workload``'s references, or None where it has none (or this process does not know it); UserError naming the file where it does not read."""
    from pydantic import ValidationError

    try:
        path = reference_file(workload)
    except (UserError, KeyError, ModuleNotFoundError):
        return None
    if not path.is_file():
        return None
    try:
        return References.model_validate_json(path.read_text())
    except ValidationError as exc:
        err = exc.errors()[0]
        raise UserError(f"{path.name} of workload {workload} does not read: {'.'.join(map(str, err['loc']))}: {err['msg']}") from None


# ---- a cell's runs against them -----------------------------------------------------------------------------------


def judge(runs: list[dict], refs: References | None, framework: str, batch: int) -> dict:
    """The verdict on one cell's finished runs (rows with epochs_to_target, epochs, validate_every, target): ``verdict`` (one of
    VERDICTS), ``why`` in words, the cell's mean epochs, the reference's mean and the accepted range."""
    nan = math.nan
    out = {"verdict": "not judged", "why": "", "epochs_mean": nan, "judged_runs": 0, "reference_mean": nan, "low": nan, "high": nan, "basis": ""}
    if refs is None:
        return out | {"why": "no reference convergence points for this workload"}
    if {r["target"] for r in runs} != {refs.target}:
        return out | {"why": f"its target is not the references' ({refs.target})"}
    cadences = {r["validate_every"] for r in runs}
    if len(cadences) != 1 or 0 in cadences:
        return out | {"why": "its runs validate at different intervals" if len(cadences) > 1 else "its runs did not validate"}
    every = cadences.pop()
    ref, slow_side, why = reference_for(refs, framework, batch, every)
    if ref is None:
        return out | {"why": why}
    reached = [r["epochs_to_target"] for r in runs if r["epochs_to_target"] is not None]
    n = len(olympic([0.0] * len(runs))) if len(runs) else 0
    # a run that missed counts as never reaching the target only where it trained past any mean the test could accept
    reach = ref.mean + half_width(ref, max(n, 1))
    missed = [r for r in runs if r["epochs_to_target"] is None]
    short = [r for r in missed if r["epochs"] <= reach]
    judged = reached + [math.inf] * (len(missed) - len(short))
    out |= {"reference_mean": ref.mean, "basis": ref.basis, "validate_every": every}
    if not judged:
        longest = max((r["epochs"] for r in short), default=0)
        return out | {"why": f"too short to judge: its runs ended by epoch {longest:g} without reaching the target, within the "
                             f"{reach:.3g} epochs the reference allows"}
    kept = olympic(judged)
    width = half_width(ref, len(kept))
    low, high = ref.mean - width, (ref.mean + width if slow_side else math.inf)
    mean = statistics.fmean(kept)
    out |= {"epochs_mean": mean, "judged_runs": len(judged), "low": low, "high": high}
    ref_words = f"the references' {ref.mean:.3g} ± {ref.sd:.2g} epochs ({ref.basis}; accepted {low:.3g}–{high:.3g})"
    if math.isinf(mean) and slow_side:
        never = len(judged) - len(reached)
        return out | {"verdict": "slow", "why": f"{never} of {len(judged)} runs never reached the target, against {ref_words}"}
    if mean < low:
        return out | {"verdict": "fast", "why": f"{mean:.3g} epochs to the target against {ref_words}"}
    if mean > high:
        return out | {"verdict": "slow", "why": f"{mean:.3g} epochs to the target against {ref_words}"}
    return out | {"verdict": "within", "why": f"{mean:.3g} epochs against {ref_words}" + ("" if slow_side else " (slower is not judged here)")}


def cell_of(row: dict) -> tuple:
    """The cell of a training row, as the ranking groups them: workload, framework, device, batch size, setting."""
    return row["workload"], row["framework"], row["device"], row["batch_size"], row["shared_setting"]


def check(rows: list[dict]) -> list[dict]:
    """The verdict on every cell of the finished training ``rows`` whose workload has references, in the rows' order."""
    cells: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["status"] == "FINISHED" and r.get("validate_every") is not None:
            cells.setdefault(cell_of(r), []).append(r)
    loaded: dict[str, References | None] = {}
    out = []
    for key, members in cells.items():
        workload, framework, device, batch, _ = key
        if workload not in loaded:
            loaded[workload] = load_references(workload)
        if loaded[workload] is None:
            continue
        verdict = judge(members, loaded[workload], framework, batch)
        out.append({"workload": workload, "framework": framework, "device": device, "batch_size": batch, "runs": len(members),
                    "setting": key[4], **verdict})
    return out


def without_references(rows: list[dict]) -> list[str]:
    """The workloads of the finished ``rows`` that have no references."""
    return sorted({r["workload"] for r in rows if r["status"] == "FINISHED" and load_references(r["workload"]) is None})


def mark(verdict: dict | None) -> str:
    """A verdict in a table cell: 'within', '**too fast**', '**too slow**', or 'not judged'."""
    if verdict is None:
        return "–"
    return {"within": "within", "fast": "**too fast**", "slow": "**too slow**"}.get(verdict["verdict"], "not judged")


CONVERGENCE_COLUMNS = {"workload": "workload", "framework": "framework", "device": "device", "batch_size": "batch", "runs": "runs",
                       "epochs_mean": "epochs to target", "reference_mean": "reference", "low": "accepted from", "high": "to",
                       "mark": "convergence", "why": "why"}


def section(rows: list[dict], verdicts: list[dict]) -> list[str]:
    """The report's blocks on convergence: a table of every judged cell, and the workloads without references."""
    from tasks.common.reports.reporting import table_markdown

    missing = without_references(rows)
    if not verdicts and not missing:
        return []
    blocks = ["## Convergence against the reference points\n",
              "Each cell's epochs to its target (the olympic mean of its runs; a run that missed the target counts as never reaching "
              "it) against its workload's reference convergence points (its folder's convergence.json, made by `python -m flows rcp`), "
              "as MLPerf's RCP checker tests a submission: outside the range a one-sided t-test at p = 0.05 accepts, a cell converged "
              "abnormally fast (MLPerf rejects it: an unusual hyper-parameter or a bug) or abnormally slow.\n"]
    if verdicts:
        blocks.append(table_markdown([v | {"mark": mark(v)} for v in verdicts], CONVERGENCE_COLUMNS))
        flagged = [v for v in verdicts if v["verdict"] in ("fast", "slow")]
        if flagged:
            blocks.append("Flagged: " + "; ".join(f"{v['workload']} {v['framework']} {v['device']} b{v['batch_size']} converged abnormally "
                                                   f"{v['verdict']} ({v['why']})" for v in flagged) + ".\n")
    if missing:
        blocks.append(f"No reference convergence points (not measured) for: {', '.join(missing)}.\n")
    return blocks


# ---- making them ----------------------------------------------------------------------------------------------------


def references_from(entries, spec: ConvergenceSpec, benchmark_run: str) -> References:
    """The references of ``spec.workload`` from the training runs ``entries`` (TrainRecord entries) of one benchmark; UserError where
    they cannot make any (none finished, several targets or cadences)."""
    from tasks.report.capabilities import target_words

    mine = [e for e in entries if e.status == "FINISHED" and e.record.summary is not None and e.record.config.workload == spec.workload]
    if not mine:
        raise UserError(f"no finished training run of workload {spec.workload} to make references from")
    targets = {target_words(e.record) for e in mine}
    cadences = {e.record.config.spec.validate_every for e in mine}
    if len(targets) != 1 or cadences != {1}:
        raise UserError(f"the runs of workload {spec.workload} train to {len(targets)} targets at validation intervals {sorted(cadences)}; "
                        "references need one target and a validation every epoch")
    groups: dict[tuple[str, int], list] = {}
    for e in sorted(mine, key=lambda e: e.record.config.spec.seed):
        groups.setdefault((e.record.config.framework, e.record.config.batch_size), []).append(e)
    points = []
    for (framework, batch), members in sorted(groups.items()):
        hit = [m for m in members if m.record.summary.epochs_to_target is not None]
        points.append(ReferenceRuns(framework=framework, batch_size=batch, framework_version=members[0].record.config.framework_version,
                                    epochs_to_target=[m.record.summary.epochs_to_target for m in hit],
                                    seeds=[m.record.config.spec.seed for m in hit],
                                    missed=[m.record.config.spec.seed for m in members if m not in hit], runs=[m.run_id for m in members],
                                    made_by=spec.command(), benchmark_run=benchmark_run, code_version=members[0].record.config.code_version))
    first = mine[0].record.config
    return References(workload=spec.workload, target=targets.pop(), epoch_limit=first.spec.epoch_limit, device=first.device,
                      made_by=[spec.command()], made_at=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                      host=first.host, references=points)


def merged(old: References | None, new: References) -> References:
    """``new``'s points, with those of ``old`` at the (framework, batch size) pairs ``new`` did not measure kept where both are
    references of one target, cadence and device (so that a workload's points can be measured a command at a time); else ``new``."""
    if old is None or (old.workload, old.target, old.validate_every, old.device) != (new.workload, new.target, new.validate_every, new.device):
        return new
    measured = {(r.framework, r.batch_size) for r in new.references}
    points = sorted([r for r in old.references if (r.framework, r.batch_size) not in measured] + list(new.references),
                    key=lambda r: (r.framework, r.batch_size))
    commands = list(dict.fromkeys(r.made_by for r in points))
    return new.model_copy(update={"references": points, "made_by": commands, "epoch_limit": max(old.epoch_limit, new.epoch_limit)})


def check_spec(spec: ConvergenceSpec) -> None:
    """UserError, before anything trains, for a workload or framework the table does not have or an output folder that cannot be written."""
    workload = get_workload(spec.workload)
    for framework in spec.frameworks or []:
        if framework not in workload.frameworks:
            raise UserError(f"workload {workload.name} has no {framework} version; it runs in {', '.join(workload.frameworks)}")
    folder = Path(spec.out) if spec.out else reference_file(spec.workload).parent
    if not folder.is_dir():
        raise UserError(f"--out {str(folder)!r} is not a folder")


def write_references(settings, spec: ConvergenceSpec, benchmark: dict) -> dict:
    """convergence.json from the training runs of the finished ``benchmark`` (the benchmark flow's result), written whole (atomically)
    into ``spec.out`` or the workload's folder; returns where, and each point's mean and deviation."""
    from tasks.common.stores.store import write_json_atomic
    from tasks.common.tracking.runs import client_for
    from tasks.report.reading import training_records

    client = client_for(settings)
    ids = [c["run_id"] for c in benchmark["cells"] if c.get("kind") == "train" and c.get("run_id") and c["status"] in ("FINISHED", "SKIPPED")]
    entries, _ = training_records(client, [client.get_run(i) for i in ids])
    path = (Path(spec.out) if spec.out else reference_file(spec.workload).parent) / FILE
    try:
        before = References.model_validate_json(path.read_text()) if path.is_file() else None
    except ValueError:  # a file of another version: replaced whole
        before = None
    refs = merged(before, references_from(entries, spec, benchmark["benchmark_run_id"]))
    write_json_atomic(path, refs.model_dump(mode="json"))
    summary = []
    for r in refs.references:
        p = point(r, refs.validate_every)
        summary.append({"framework": r.framework, "batch_size": r.batch_size, "epochs_to_target": r.epochs_to_target, "missed": r.missed,
                        "mean": p.mean if p else None, "sd": p.sd if p else None})
    return {"file": str(path), "made_by": spec.command(), "benchmark_run_id": benchmark["benchmark_run_id"], "references": summary}
