"""The last preload of a fork server (a warm server's, tasks.common.process.warm; a sweep's Dask workers', tasks.common.process.cluster): what it imported frozen.

A fork server lives until its command ends, then ends as any interpreter does, and an interpreter's end walks every
object still alive with the cycle collector a few times while it tears the modules down, collector on or off: 1.4–2.2 s
of CPU for a warm server of torch, TensorFlow or JAX, after the command's last line. Frozen (``gc.freeze``), those
objects are skipped (0.1–0.4 s; docs/architecture.md). Each process forked from the server inherits them frozen, as
its own ``settle`` would make them, and its collections still find the cycles it makes itself."""

import gc

gc.freeze()
