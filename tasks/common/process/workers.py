"""Launcher of a multi-worker TensorFlow job (what torchrun is to torch): `python -m tasks.common.process.workers N CMD...`.

Starts N copies of CMD on this host, each with TF_CONFIG naming all N workers on 127.0.0.1 and its own
index (and RANK, WORLD_SIZE), their output passed through. It ends when they all have: with rank 0's
exit code, or the first failure's. A worker that fails stops the others (they would wait forever in
their next collective); SIGTERM and SIGINT are passed on to every worker, and the workers die with it.
"""

import os
import signal
import subprocess
import sys
import time

from tasks.common.config.frameworks import free_ports, worker_env
from tasks.common.process import lifetime


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not argv[0].isdigit() or int(argv[0]) < 1:
        print("error: usage: python -m tasks.common.process.workers N COMMAND...", file=sys.stderr)
        return 2
    lifetime.die_with_parent()
    n, cmd = int(argv[0]), argv[1:]
    ports = free_ports(n)
    procs: list[subprocess.Popen] = []
    received: list[int] = []

    def forward(signum, frame):
        received.append(signum)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    for rank in range(n):
        env = {**os.environ, **worker_env(rank, n, ports), lifetime.PARENT_ENV: str(os.getpid())}
        procs.append(subprocess.Popen(cmd, env=env))
    failed: int | None = None
    while any(p.poll() is None for p in procs):
        codes = [p.returncode for p in procs if p.returncode not in (None, 0)]
        if codes and failed is None:  # one worker failed: the others cannot finish without it
            failed = codes[0]
            for p in procs:
                if p.poll() is None:
                    lifetime.stop_child(p, signal.SIGTERM, grace_s=10.0)
        time.sleep(0.2)
    first = procs[0].returncode
    if first != 0:
        return first if first > 0 else 128 - first
    return next((p.returncode if p.returncode > 0 else 128 - p.returncode for p in procs if p.returncode != 0), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
