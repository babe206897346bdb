"""Where the test suite's CPU goes, process by process: an exit hook in every Python process of the virtual environment.

``python -m tests.process_audit on`` writes a ``sitecustomize.py`` into this environment's site-packages; from then on
every Python process started with ``KARMAN_PROCESS_AUDIT=FOLDER`` in its environment (a test run's workers, the commands
and jobs they start, their servers) writes one JSON file into FOLDER as it exits: its command line, its own CPU seconds,
its wall time, the CPU seconds its cycle collector took (gc.callbacks), which framework and tracking libraries it had
imported, and the test named in its environment at its
end (pytest's ``PYTEST_CURRENT_TEST``; a job forked from a warm server has its command's, and its own wall time and
CPU). ``report FOLDER`` sums them by kind of process and by test module; ``off`` removes the hook. A process killed
outright (SIGKILL, or SIGTERM without a handler) writes nothing, nor do programs that are not Python (PostgreSQL):
compare the total with the machine's CPU over the same run.

    python -m tests.process_audit on
    mkdir audit && KARMAN_PROCESS_AUDIT=$PWD/audit make test
    python -m tests.process_audit report audit
    python -m tests.process_audit off
"""

import json
import sys
import sysconfig
from collections import defaultdict
from pathlib import Path

ENV = "KARMAN_PROCESS_AUDIT"
MARK = "# karman process audit"
HOOK = MARK + '''
import os
if os.environ.get("KARMAN_PROCESS_AUDIT"):
    import atexit, gc, json, resource, sys, time
    _karman_started = [time.time()]
    _karman_gc = [0.0, 0.0]  # the cycle collector's CPU seconds so far, the start of the collection under way
    os.register_at_fork(after_in_child=lambda: (_karman_started.__setitem__(0, time.time()), _karman_gc.__setitem__(0, 0.0)))

    def _karman_collected(phase, info):
        if phase == "start":
            _karman_gc[1] = time.process_time()
        else:
            _karman_gc[0] += time.process_time() - _karman_gc[1]

    gc.callbacks.append(_karman_collected)

    def _karman_audit():
        try:
            used = resource.getrusage(resource.RUSAGE_SELF)
            record = {"argv": sys.argv[:6], "cpu_s": used.ru_utime + used.ru_stime, "wall_s": time.time() - _karman_started[0],
                      "gc_s": _karman_gc[0],  # a forked job's own, as its wall time
                      "test": os.environ.get("PYTEST_CURRENT_TEST", ""),  # at the end: a forked job has its command's by then
                      "libraries": [m for m in ("torch", "tensorflow", "jax", "prefect", "mlflow") if m in sys.modules]}
            with open(os.path.join(os.environ["KARMAN_PROCESS_AUDIT"], f"{os.getpid()}-{int(_karman_started[0] * 1e6)}.json"), "w") as f:
                json.dump(record, f)
        except Exception:
            pass

    atexit.register(_karman_audit)
'''


def hook_path() -> Path:
    return Path(sysconfig.get_paths()["purelib"]) / "sitecustomize.py"


def switch(on: bool) -> str:
    """Install or remove the hook; refuses outside a virtual environment and beside another sitecustomize."""
    if sys.prefix == sys.base_prefix:
        raise SystemExit("python -m tests.process_audit: error: run it with the project's .venv/bin/python (a virtual environment's site-packages)")
    path = hook_path()
    if path.exists() and not path.read_text().startswith(MARK):
        raise SystemExit(f"python -m tests.process_audit: error: {path} exists and is not this hook; left as it is")
    if on:
        path.write_text(HOOK)
        return f"installed {path}; processes started with {ENV}=FOLDER record their CPU there"
    path.unlink(missing_ok=True)
    return f"removed {path}"


def kind(argv: list[str]) -> str:
    """A short name for what a process was: a pytest worker, a command, a job, a warm server, a Dask worker..."""
    if not argv:
        return "?"
    first = Path(argv[0]).name
    if argv == ["-c"]:
        return "python -c (pytest workers, warm servers, spawned pool processes)"
    if first == "-c":
        return f"forked job: {argv[1]}" if len(argv) > 1 else "python -c"
    if first == "__main__.py":
        return f"python -m flows {argv[1]}" if len(argv) > 1 else "python -m (a package)"
    return first


def report(folder: Path, top: int = 25) -> str:
    records = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    if not records:
        raise SystemExit(f"python -m tests.process_audit: error: no records in {folder}")
    by_kind: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    by_module: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for r in records:
        for table, key in ((by_kind, kind(r["argv"])), (by_module, r["test"].split("::")[0] or "(outside any test)")):
            table[key][0] += 1
            table[key][1] += r["cpu_s"]
            table[key][2] += r.get("gc_s", 0.0)  # records of an older hook have none
    total, collecting = sum(r["cpu_s"] for r in records), sum(r.get("gc_s", 0.0) for r in records)
    lines = [f"{len(records)} processes, {total:,.0f} s of CPU recorded, {collecting:,.0f} s of it in the cycle collector "
             f"({collecting / total if total else 0:.1%})", "", "processes  CPU s   GC s  kind"]
    lines += [f"{n:9d} {s:6.0f} {g:6.1f}  {k}" for k, (n, s, g) in sorted(by_kind.items(), key=lambda kv: -kv[1][1])[:top]]
    lines += ["", "processes  CPU s   GC s  test module (the test in its environment at its end)"]
    lines += [f"{n:9d} {s:6.0f} {g:6.1f}  {k}" for k, (n, s, g) in sorted(by_module.items(), key=lambda kv: -kv[1][1])[:top]]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv[:1] in (["on"], ["off"]) and len(argv) == 1:
        print(switch(argv[0] == "on"))
    elif argv[:1] == ["report"] and len(argv) == 2:
        print(report(Path(argv[1])))
    else:
        print("python -m tests.process_audit: error: usage: on | off | report FOLDER", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
