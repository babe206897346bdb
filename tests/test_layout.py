"""The rooms' import direction, read from the source with ``ast``: models below tasks below flows, a stage imports only the shared rooms and itself, a room of tasks/common only the rooms below it; and no product module past its length bound."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Imports against the grain that the layout still holds, each with why; the test fails when one goes
# away too, so the list shrinks as they do.
ALLOWED: set[tuple[str, str]] = set()

# The rooms of tasks/common, lowest first: a room imports itself and the rooms before it, never one after it.
COMMON_ROOMS = ["config", "tracking", "stores", "reports", "measures", "process", "runtimes"]
# Modules still at tasks/common's top level, each checked as part of the room it is to move into.
COMMON_LOOSE = {"specs": "config", "records": "tracking"}


def imports_of(path: Path) -> list[str]:
    """Every module ``path`` imports, at the top or inside a function (``from a import b`` gives ``a.b``
    as well as ``a``, so that ``from tasks import report`` counts as importing the stage)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append(node.module)
            found += [f"{node.module}.{alias.name}" for alias in node.names]
    return found


def sources(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def stage_of(path: Path) -> str:
    """'tasks.X' for a file under tasks/X/."""
    return "tasks." + path.relative_to(ROOT / "tasks").parts[0]


def common_room(module: str) -> str | None:
    """The room of a tasks.common module (``tasks.common.process.launch`` -> ``process``); None for the package itself."""
    parts = module.split(".")
    return COMMON_LOOSE.get(parts[2], parts[2]) if len(parts) > 2 else None


def room_refused(importer: str, module: str) -> str | None:
    """Why tasks.common's module ``importer`` may not import tasks.common's ``module``, or None where it may."""
    mine, theirs = common_room(importer), common_room(module)
    for room in (mine, theirs):
        if room is not None and room not in COMMON_ROOMS:
            return f"tasks/common/{room} is in no room: move it into one of {COMMON_ROOMS} (or add a room to COMMON_ROOMS)"
    if mine is None or theirs is None or COMMON_ROOMS.index(theirs) <= COMMON_ROOMS.index(mine):
        return None
    return f"room {mine} of tasks/common imports only the rooms below it ({', '.join(COMMON_ROOMS[:COMMON_ROOMS.index(mine)]) or 'none'})"


def module_of(path: Path) -> str:
    """The dotted module of a file under ROOT (``tasks/common/process/launch.py`` -> ``tasks.common.process.launch``)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def refused(path: Path, module: str) -> str | None:
    """Why the file at ``path`` may not import ``module``, or None where it may."""
    rel = path.relative_to(ROOT).as_posix()
    if rel.startswith("models/"):
        banned = ("tasks", "flows", "prefect", "mlflow", "zarr")
        return "models/ is pure computation" if any(within(module, b) for b in banned) else None
    if rel.startswith("tasks/"):
        if within(module, "flows"):
            return "tasks/ imports no flows"
        if not within(module, "tasks") or module == "tasks":
            return None
        stage = stage_of(path)
        if stage == "tasks.common":
            return room_refused(module_of(path), module) if within(module, "tasks.common") else "tasks/common imports no stage"
        if stage == "tasks.workloads":  # shared by the stages, as common is: it builds on common only
            return None if within(module, "tasks.common") or within(module, stage) else "tasks/workloads imports only tasks.common, models and itself"
        if within(module, "tasks.common") or within(module, "tasks.workloads") or within(module, stage):
            return None
        return f"stage {stage} imports only tasks.common, tasks.workloads, models and itself"
    return None


def violations() -> set[tuple[str, str]]:
    found = set()
    for path in sources("models") + sources("tasks"):
        for module in imports_of(path):
            if refused(path, module):
                found.add((path.relative_to(ROOT).as_posix(), module))
    # ``from tasks.infer.scoring import Validation`` names the module and the symbol: keep the module.
    return {(rel, module) for rel, module in found if (rel, module.rsplit(".", 1)[0]) not in found}


def test_every_import_goes_with_the_grain():
    unexpected = sorted(violations() - ALLOWED)
    assert not unexpected, "imports against the layout (STYLE.md, 'Where code lives'):\n" + "\n".join(
        f"  {rel} imports {module}: {refused(ROOT / rel, module)}" for rel, module in unexpected)


def test_each_allowed_exception_is_still_needed():
    gone = sorted(ALLOWED - violations())
    assert not gone, f"these imports are gone; take them off ALLOWED: {gone}"


@pytest.mark.parametrize("rel, module, allowed", [
    ("models/karman/solver/solver.py", "mlflow", False),
    ("models/karman/solver/solver.py", "tasks.common.stores.store", False),
    ("models/karman/solver/solver.py", "numba", True),
    ("tasks/common/stores/store.py", "tasks.train.plan", False),
    ("tasks/common/stores/store.py", "tasks.common.config.errors", True),
    ("tasks/common/process/launch.py", "tasks.common.tracking.flowrun", True),
    ("tasks/common/process/launch.py", "tasks.common.process.warm", True),
    ("tasks/common/process/launch.py", "tasks.common.runtimes.loop", False),
    ("tasks/common/config/frameworks.py", "tasks.common.process.workers", False),
    ("tasks/common/records.py", "tasks.common.specs", True),
    ("tasks/common/specs.py", "tasks.common.records", False),
    ("tasks/common/runtimes/loop.py", "tasks.common.records.TrainSummary", True),
    ("tasks/common/process/lifetime.py", "tasks.common.roomless", False),
    ("tasks/train/task.py", "tasks.report.task", False),
    ("tasks/train/task.py", "tasks.train.plan", True),
    ("tasks/workloads/karman/infer/rollout.py", "tasks.generate", False),
    ("tasks/workloads/karman/infer/rollout.py", "models.karman.solver", True),
    ("tasks/report/task.py", "flows.pipeline", False),
    ("tasks/report/task.py", "prefect", True),
])
def test_the_rules_tell_apart_what_they_should(rel, module, allowed):
    assert (refused(ROOT / rel, module) is None) == allowed


def test_imports_are_found_at_the_top_and_inside_functions(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("import os\nfrom tasks.common.tracking import names\n\ndef f():\n    from tasks.report.task import fmt\n    import flows.cli\n")
    assert set(imports_of(path)) == {"os", "tasks.common.tracking", "tasks.common.tracking.names", "tasks.report.task", "tasks.report.task.fmt", "flows.cli"}


MAX_LINES = 450  # a product module longer than this holds more than one idea: split it where the ideas part


def test_no_product_module_is_longer_than_the_bound():
    long = {str(p.relative_to(ROOT)): n for folder in ("flows", "tasks", "models") for p in sorted((ROOT / folder).rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"over {MAX_LINES} lines: {long}"
