"""Child side of every job: the entry `python -m tasks.common.job_main {train,rollout,probe} JOB.json RESULT.json`.

Every training or inference run executes here, in a fresh process for its framework and device:
device environment (PJRT_DEVICE, CUDA_VISIBLE_DEVICES, ...) is set by the parent before any
framework import, tensorflow and torch_xla never meet in one process, and cold-start timings are
honest. Under torchrun there is one such process per device; rank 0 writes the result. The run
reports through MLflow and the result file. Exit codes: 0 done, 3 user error (stderr line
'error: ...'), 4 the run failed for a stated reason ('failed: ...'), 5 stopped by a signal ('stopped: ...'), 1
crash ('crashed: ...', after its traceback). The same verdict is written to the result file as {"error": {...}}.
"""

import json
import logging
import os
import sys
import traceback
from pathlib import Path

USER_ERROR = 3
RUN_FAILED = 4
STOPPED = 5


def _torch_jobs() -> dict:
    from tasks.infer.job import run_rollout
    from tasks.train.job import probe_device, run_training

    return {"train": run_training, "rollout": run_rollout, "probe": probe_device}


def _tensorflow_jobs() -> dict:
    from tasks.infer.job_keras import run_rollout
    from tasks.train.job_keras import probe_device, run_training

    return {"train": run_training, "rollout": run_rollout, "probe": probe_device}


# The framework seam: each framework's job bodies (train, rollout, probe), imported only in its own child.
FRAMEWORKS = {"torch": _torch_jobs, "tensorflow": _tensorflow_jobs}


def job_body(framework: str, kind: str):
    """The function that runs a ``kind`` job of ``framework``; UserError listing the valid names otherwise."""
    from tasks.common.errors import UserError

    if framework not in FRAMEWORKS:
        raise UserError(f"unknown framework {framework!r}; choose one of {', '.join(FRAMEWORKS)}")
    return FRAMEWORKS[framework]()[kind]


def main(argv: list[str]) -> int:
    from tasks.common import lifetime

    lifetime.die_with_parent()
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    from tasks.common.quiet import quiet_libraries

    quiet_libraries()
    if len(argv) != 3 or argv[0] not in ("train", "rollout", "probe"):
        print("error: usage: python -m tasks.common.job_main {train,rollout,probe} JOB.json RESULT.json", file=sys.stderr)
        return 2
    kind, job_path, result_path = argv[0], Path(argv[1]), Path(argv[2])
    job = json.loads(job_path.read_text())
    from models.host import DeviceUnavailable
    from tasks.common.errors import RunFailed, RunStopped, UserError, signal_name

    if kind == "train":  # training stops at the end of a step and says so; other jobs stop at once
        lifetime.request_stop_on_signals()
    else:
        lifetime.raise_on_sigterm()
    try:
        result = job_body(job.get("framework", "torch"), kind)(job)
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
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=True))
    tmp.replace(path)


def _verdict(result_path: Path, kind: str, prefix: str, exc, code: int) -> int:
    """The job's end in one line on stderr and as a structured result (rank 0 or a single process)."""
    message = str(exc)
    print(f"{prefix}: {message}", file=sys.stderr)
    if os.environ.get("RANK", "0") == "0":
        _write(result_path, {"error": {"kind": kind, "type": type(exc).__name__ if not isinstance(exc, str) else kind, "message": message}})
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
