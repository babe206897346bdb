"""A warm server's last preload (tasks.common.process.warm): what every job forked from it would otherwise load or work out itself.

MLflow checks a logged or loaded model's requirements against a map of every installed distribution's top-level modules,
which it builds on first use by reading each distribution's file list: 0.5-1.3 s of CPU in each job that logs a model (a
third of a short training job's CPU once the libraries are preloaded). Built here once, each forked job inherits it. The
packages installed do not change while a command runs. Beside it, the modules a job loads only when it logs or loads a
model (``mlflow.pyfunc``) and when it draws its first figure (``matplotlib.pyplot``, on the Agg backend every figure of
the project uses): neither reads the job's environment on import."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot  # noqa: E402,F401
import mlflow.pyfunc  # noqa: E402,F401
from mlflow.utils.requirements_utils import _init_packages_to_modules_map  # noqa: E402

_init_packages_to_modules_map()
