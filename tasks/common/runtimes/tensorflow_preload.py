"""A warm server's preload for TensorFlow's cpu jobs (tasks.common.process.warm): TensorFlow imported once, quietly.

TensorFlow costs 6-8 s of CPU to import. It is imported here in the environment the framework table gives its cpu jobs,
which it reads on import (its log level, oneDNN's kernels, no GPU). The notices it writes on import before absl's
logging starts, whatever TF_CPP_MIN_LOG_LEVEL says, go nowhere: the server's stderr is the command's terminal, and a
job's own are on its own output anyway."""

import os

from tasks.common.config.frameworks import FRAMEWORKS

os.environ.update(FRAMEWORKS["tensorflow"].env("cpu", None))
_saved = (os.dup(1), os.dup(2))
_null = os.open(os.devnull, os.O_WRONLY)
try:
    os.dup2(_null, 1)
    os.dup2(_null, 2)
    from tasks.common.runtimes.tensorflow_import import import_tensorflow  # noqa: E402

    import_tensorflow()
finally:
    os.dup2(_saved[0], 1)
    os.dup2(_saved[1], 2)
    for _fd in (*_saved, _null):
        os.close(_fd)
