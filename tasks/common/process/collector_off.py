"""A warm server's second preload (tasks.common.process.warm): the cycle collector off for the rest of the server's imports.

Imported right after the job's entry module, so that numpy, MLflow and a framework load without collections
(tasks.common.process.collector says what they cost). The server only forks: each job forked from it freezes what it inherited
and turns the collector back on (tasks.common.process.warm's ``_child``)."""

import gc

gc.disable()
