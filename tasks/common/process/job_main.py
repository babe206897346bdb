"""Child side of every job: the entry `python -m tasks.common.process.job_main KIND JOB.json RESULT.json` runs the job body its stage named.

Every training or inference run executes here, in a fresh process for its framework and device:
device environment (PJRT_DEVICE, CUDA_VISIBLE_DEVICES, ...) is set by the parent before any
framework import, tensorflow and torch_xla never meet in one process, and cold-start timings are
honest. The job file names its body as ``module:function`` (each stage registers its own; this
module imports no stage). A job of several processes has one such process per device; rank 0 writes the
result, every rank its verdict event. Exit codes: 0 done, 3 user error, 4 the run failed for a stated reason, 5 stopped by a
signal, 1 crash (after its traceback). The verdict is one line on stderr for people, a structured
event on stdout (tasks.common.process.events) and {"error": {...}} in the result file for the parent.
"""

import importlib
import json
import logging
import os
import sys
import traceback
from pathlib import Path

USER_ERROR = 3
RUN_FAILED = 4
STOPPED = 5
KINDS = ("train", "rollout", "probe", "matmul", "simulate", "validate", "bench")


def job_body(name: str):
    """The function ``module:function`` a job file names; UserError if there is no such function."""
    from tasks.common.config.errors import UserError

    module, _, function = name.partition(":")
    if not module or not function:
        raise UserError(f"job body {name!r} is not module:function")
    body = getattr(importlib.import_module(module), function, None)
    if body is None:
        raise UserError(f"job body {name!r}: module {module} has no function {function}")
    return body


def first_import(name: str | None) -> None:
    """The framework table's first import for the job's framework, where it has one (TensorFlow without the packages it
    loads only because they are installed); a job of no framework, or of one the table does not name, imports nothing here."""
    from tasks.common.config.frameworks import FRAMEWORKS, call

    fw = FRAMEWORKS.get(name or "")
    if fw is not None and fw.first_import:
        call(fw.first_import)


def load(framework: str | None, body: str | None = None):
    """What a job process loads before it runs: its framework's first import (``first_import``) and, with a name, its body
    (``job_body``), with the cycle collector off and what they loaded then frozen (tasks.common.process.collector); the body, or
    None without a name."""
    from tasks.common.process.collector import uncollected

    with uncollected():
        first_import(framework)
        return job_body(body) if body is not None else None


def main(argv: list[str]) -> int:
    from tasks.common.process import lifetime

    for stream in (sys.stdout, sys.stderr):
        # Each line whole in one write as soon as it ends: the processes of a job of several share one pipe, and an
        # unbuffered stream writes a print's text and its newline apart, letting another process's text in between.
        stream.reconfigure(line_buffering=True, write_through=False)
    lifetime.die_with_parent()
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    from tasks.common.process.quiet import quiet_libraries

    quiet_libraries()
    if len(argv) != 3 or argv[0] not in KINDS:
        print(f"error: usage: python -m tasks.common.process.job_main {{{','.join(KINDS)}}} JOB.json RESULT.json", file=sys.stderr)
        return 2
    kind, job_path, result_path = argv[0], Path(argv[1]), Path(argv[2])
    job = json.loads(job_path.read_text())
    from models.host import DeviceUnavailable
    from tasks.common.config.errors import RunFailed, RunStopped, UserError, signal_name

    if kind == "train":  # training stops at the end of a step and says so; other jobs stop at once
        lifetime.request_stop_on_signals()
    else:
        lifetime.raise_on_sigterm()
    try:
        result = load(job.get("framework"), job["body"])(job)
    except (UserError, DeviceUnavailable) as exc:
        return _verdict(result_path, "user", "error", exc, USER_ERROR)
    except RunStopped as exc:
        return _verdict(result_path, "stopped", "stopped", exc, STOPPED)
    except RunFailed as exc:
        return _verdict(result_path, "failed", "failed", exc, RUN_FAILED)
    except (KeyboardInterrupt, lifetime.Interrupted) as exc:
        signum = getattr(exc, "signum", 2)
        return _verdict(result_path, "stopped", "stopped", f"{kind} stopped by {signal_name(signum)}", STOPPED)
    except Exception as exc:
        traceback.print_exc()  # once, into the log; the verdict is one line
        return _verdict(result_path, "crash", "crashed", f"{kind} child crashed: {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}", 1)
    if result is None:  # a rank other than 0
        return 0
    _write(result_path, result)
    return 0


def _write(path: Path, payload: dict) -> None:
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    from tasks.common.process.events import strict

    tmp.write_text(json.dumps(strict(payload), indent=2, sort_keys=True, allow_nan=False))
    tmp.replace(path)


def _verdict(result_path: Path, kind: str, prefix: str, exc, code: int) -> int:
    """The job's end in one line on stderr (for people) and as a structured event and result (for the parent; rank 0 or a single process)."""
    from tasks.common.process import events

    message = str(exc)
    print(f"{prefix}: {message}", file=sys.stderr)
    rank = int(os.environ.get("RANK", "0"))
    events.emit(events.VERDICT, kind=kind, message=message, **({"rank": rank} if rank else {}))  # another rank's says which it is
    if rank == 0:
        _write(result_path, {"error": {"kind": kind, "type": type(exc).__name__ if not isinstance(exc, str) else kind, "message": message}})
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
