"""Child side of every job: the entry `python -m tasks.common.job_main {train,rollout,probe} JOB.json RESULT.json`.

Every training or inference run executes here, in a fresh process for its framework and device:
device environment (PJRT_DEVICE, CUDA_VISIBLE_DEVICES, ...) is set by the parent before any
framework import, tensorflow and torch_xla never meet in one process, and cold-start timings are
honest. Under torchrun there is one such process per device; rank 0 writes the result. The run
reports through MLflow and the result file. Exit codes: 0 done, 3 user error (stderr line
'error: ...'), 4 the run failed for a stated reason (stderr line 'failed: ...'), 1 crash.
"""

import json
import logging
import sys
import traceback
from pathlib import Path

USER_ERROR = 3
RUN_FAILED = 4


def _torch_jobs() -> dict:
    from tasks.infer.job import run_rollout
    from tasks.train.job import probe_device, run_training

    return {"train": run_training, "rollout": run_rollout, "probe": probe_device}


# The framework seam: each framework's job bodies (train, rollout, probe), imported only in its own child.
FRAMEWORKS = {"torch": _torch_jobs}


def job_body(framework: str, kind: str):
    """The function that runs a ``kind`` job of ``framework``; UserError listing the valid names otherwise."""
    from tasks.common.errors import UserError

    if framework not in FRAMEWORKS:
        raise UserError(f"unknown framework {framework!r}; choose one of {', '.join(FRAMEWORKS)}")
    return FRAMEWORKS[framework]()[kind]


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    from tasks.common.quiet import quiet_libraries

    quiet_libraries()
    if len(argv) != 3 or argv[0] not in ("train", "rollout", "probe"):
        print("error: usage: python -m tasks.common.job_main {train,rollout,probe} JOB.json RESULT.json", file=sys.stderr)
        return 2
    kind, job_path, result_path = argv[0], Path(argv[1]), Path(argv[2])
    job = json.loads(job_path.read_text())
    from models.device import DeviceUnavailable
    from tasks.common.errors import RunFailed, UserError

    try:
        result = job_body(job.get("framework", "torch"), kind)(job)
    except (UserError, DeviceUnavailable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return USER_ERROR
    except RunFailed as exc:
        print(f"failed: {exc}", file=sys.stderr)
        return RUN_FAILED
    except Exception:
        traceback.print_exc()
        return 1
    if result is None:  # a rank other than 0
        return 0
    tmp = result_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2, sort_keys=True))
    tmp.replace(result_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
