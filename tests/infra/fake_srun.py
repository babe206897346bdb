"""SLURM's srun as the tests stand it in on one machine: `fake_srun.py --nodes=N --ntasks=T --ntasks-per-node=P [...] CMD...` starts the step's T tasks here, each with the environment srun gives a task.

The allocation's "hosts" are the names in SLURM_JOB_NODELIST, which the test sets (names of this machine,
such as localhost and 127.0.0.1); tasks are numbered block by block over them, as SLURM does by default.
It ends with the first failing task's exit code, else 0.
"""

import os
import subprocess
import sys


def main(argv: list[str]) -> int:
    options = {}
    while argv and argv[0].startswith("--"):
        key, _, value = argv.pop(0)[2:].partition("=")
        options[key] = value
    nodes, tasks, per_node = int(options["nodes"]), int(options["ntasks"]), int(options["ntasks-per-node"])
    step = {"SLURM_STEP_NODELIST": os.environ["SLURM_JOB_NODELIST"], "SLURM_STEP_TASKS_PER_NODE": f"{per_node}(x{nodes})",
            "SLURM_STEP_NUM_TASKS": str(tasks), "SLURM_STEP_NUM_NODES": str(nodes)}
    procs = [subprocess.Popen(argv, env={**os.environ, **step, "SLURM_PROCID": str(t), "SLURM_NODEID": str(t // per_node),
                                         "SLURM_LOCALID": str(t % per_node)}) for t in range(tasks)]
    codes = [p.wait() for p in procs]
    return next((c for c in codes if c), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
