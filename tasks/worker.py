"""Child-process entry: ``python -m tasks.worker {train,rollout,probe} JOB.json RESULT.json``.

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


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    from tasks.quiet import quiet_libraries

    quiet_libraries()
    if len(argv) != 3 or argv[0] not in ("train", "rollout", "probe"):
        print("error: usage: python -m tasks.worker {train,rollout,probe} JOB.json RESULT.json", file=sys.stderr)
        return 2
    kind, job_path, result_path = argv[0], Path(argv[1]), Path(argv[2])
    job = json.loads(job_path.read_text())
    from models.device import DeviceUnavailable
    from tasks.errors import RunFailed, UserError

    try:
        if kind == "train":
            from tasks.training import run_training as run
        elif kind == "rollout":
            from tasks.rollout import run_rollout as run
        else:
            from tasks.training import probe_device as run
        result = run(job)
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
