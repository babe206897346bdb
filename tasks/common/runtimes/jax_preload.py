"""A warm server's preload for JAX's cpu jobs (tasks.common.process.warm): jax and optax imported once.

They cost about 2.5 s of CPU to import, which every JAX job paid (a benchmark's JAX cells, each in a process of its own).
JAX reads its ``JAX_`` variables on import (the platform, the compilation cache), so it is imported here in the
environment the framework table gives its cpu jobs, and a server serves only jobs whose ``JAX_`` variables are those. XLA's
own flags (``XLA_FLAGS``: a job's host devices, its threads) are read when the first backend starts, which happens in the
job, after its runtime has set them: no backend starts here, so a job forked from this server starts its own, as a fresh
interpreter would."""

import os

from tasks.common.config.frameworks import FRAMEWORKS

os.environ.update(FRAMEWORKS["jax"].env("cpu", None))
import jax  # noqa: E402,F401
import jax.numpy  # noqa: E402,F401
import optax  # noqa: E402,F401
