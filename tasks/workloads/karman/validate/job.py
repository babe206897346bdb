"""The validation job (child process): one resolution of the Schäfer–Turek benchmark on the chosen solver backend and device."""

import numpy as np

from models.karman.solver.benchmark import Setup, run

BODY = "tasks.workloads.karman.validate.job:validate_job"


def validate_job(job: dict) -> dict:
    """Run ``job["case"]`` at ``job["cells_per_diameter"]`` (and ``job["lattice_velocity"]``, None: the case's default); the drag/lift history goes to ``job["history"]`` (npz),
    the benchmark's quantities and the run's statistics come back."""
    setup = Setup(job["case"], job["cells_per_diameter"], job.get("lattice_velocity"))
    quantities, history, stats = run(setup, backend=job["backend"], dtype=job["dtype"], max_time=job["max_time"], device=job["device"])
    np.savez_compressed(job["history"], time=history.time, cd=history.cd, cl=history.cl, dp=history.dp)
    return {"quantities": quantities, "stats": stats}
