"""One training over the hosts of a SLURM allocation: `srun ... python -m tasks.common.process.hosts FRAMEWORK PER_HOST PORT -m MODULE ARGS...`.

srun starts this module as every task of the job step; it reads SLURM's environment and starts the
training command of its task:

How a framework spreads over hosts is its entry's ``hosts`` in the framework table:

- rendezvous (torch): one task per host, each running torchrun with PER_HOST processes; the hosts meet at a c10d
  rendezvous on the step's first host at PORT, its id the SLURM job id (the rendezvous numbers the
  ranks: global rank 0 need not be on the first host);
- workers (tensorflow): one task per MultiWorkerMirrored worker (PER_HOST tasks per host); TF_CONFIG names every
  task's host and port (PORT + the task's number, so that tasks on one host never share a port) and
  this task's index, SLURM_PROCID; LOCAL_RANK (SLURM_LOCALID) picks a worker's GPU on its host.

The flow process (tasks.common.process.launch.run_child with hosts > 1) builds the srun line; this module is
what runs on the hosts.
"""

import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from tasks.common.config.frameworks import FRAMEWORKS as TABLE

FRAMEWORKS = tuple(name for name, fw in TABLE.items() if fw.hosts)  # those that spread over hosts


def expand_nodelist(text: str) -> list[str]:
    """SLURM's compressed host list ("gpu[01-03,07],login1") as host names, in order; ValueError for a malformed one."""
    items = re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", text)
    if not items or ",".join(items) != text:
        raise ValueError(f"host list {text!r} is not SLURM's form (host, host[01-04,07], ...)")
    return [host for item in items for host in _expand_one(item)]


def _expand_one(item: str) -> list[str]:
    """One host expression, which may hold several bracketed ranges ("rack[1-2]-n[01-02]")."""
    match = re.match(r"([^\[]*)\[([^\]]*)\](.*)", item)
    if match is None:
        if "[" in item or "]" in item:
            raise ValueError(f"host {item!r} is not SLURM's form (host, host[01-04,07], ...)")
        return [item]
    prefix, ranges, rest = match.groups()
    numbers = []
    for part in ranges.split(","):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(f"host range {part!r} in {item!r} is not SLURM's form (01-04)")
        numbers += [str(n).zfill(len(lo)) for n in range(int(lo), int(hi or lo) + 1)]
    return [prefix + n + tail for n in numbers for tail in _expand_one(rest)]


def expand_tasks_per_node(text: str) -> list[int]:
    """SLURM's tasks per node ("2(x3),1") as one count per host ([2, 2, 2, 1])."""
    counts: list[int] = []
    for part in text.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if match is None:
            raise ValueError(f"tasks per node {text!r} is not SLURM's form (2(x3),1)")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


@dataclass(frozen=True)
class SlurmStep:
    """Where this task sits in its job step, from SLURM's environment."""

    job_id: str
    hosts: list[str]  # the step's hosts, in SLURM's order
    tasks_per_host: list[int]
    task: int  # SLURM_PROCID: this task's number in the step
    local: int  # SLURM_LOCALID: its number on its host

    @property
    def task_hosts(self) -> list[str]:
        """Each task's host (SLURM's default block distribution: a host's tasks are numbered together)."""
        return [host for host, n in zip(self.hosts, self.tasks_per_host) for _ in range(n)]


def slurm_step(env: dict[str, str]) -> SlurmStep:
    """This task's place in its job step; ValueError naming what is missing where SLURM did not start it."""
    missing = [k for k in ("SLURM_JOB_ID", "SLURM_PROCID") if k not in env]
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    missing += [] if nodelist else ["SLURM_STEP_NODELIST"]
    missing += [] if per_node else ["SLURM_STEP_TASKS_PER_NODE"]
    if missing:
        raise ValueError(f"not a task of a SLURM job step ({', '.join(missing)} unset): start it with srun inside an allocation")
    hosts, counts = expand_nodelist(nodelist), expand_tasks_per_node(per_node)
    if len(counts) != len(hosts):
        raise ValueError(f"{len(hosts)} hosts ({nodelist}) but tasks per node for {len(counts)} ({per_node})")
    return SlurmStep(env["SLURM_JOB_ID"], hosts, counts, int(env["SLURM_PROCID"]), int(env.get("SLURM_LOCALID", 0)))


def tf_config(step: SlurmStep, port: int) -> dict:
    """TF_CONFIG of this task: every task a worker at its host and PORT + its number, this one by SLURM_PROCID."""
    workers = [f"{host}:{port + t}" for t, host in enumerate(step.task_hosts)]
    return {"cluster": {"worker": workers}, "task": {"type": "worker", "index": step.task}}


def torchrun_command(step: SlurmStep, per_host: int, port: int, args: list[str], folder: str) -> list[str]:
    """torchrun on this host: PER_HOST processes, the hosts joining one c10d rendezvous on the step's first host; its log
    folders in the job's ``folder`` (each torchrun its own inside; without it, torchrun leaves a folder in the host's /tmp)."""
    return [sys.executable, "-m", "torch.distributed.run", f"--nnodes={len(step.hosts)}", f"--nproc-per-node={per_host}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={step.hosts[0]}:{port}", f"--rdzv-id=karman-{step.job_id}",
            f"--log-dir={folder}/torchrun", *args]


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[0] not in FRAMEWORKS or not argv[1].isdigit() or not argv[2].isdigit() or int(argv[1]) < 1:
        print(f"error: usage: python -m tasks.common.process.hosts {'|'.join(FRAMEWORKS)} PER_HOST PORT -m MODULE ARGS...", file=sys.stderr)
        return 2
    framework, per_host, port, args = argv[0], int(argv[1]), int(argv[2]), argv[3:]
    try:
        step = slurm_step(dict(os.environ))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if TABLE[framework].hosts == "rendezvous":
        # the job's result file, the last argument, lies in the job's folder: the hosts share it, the submitting command removes it
        cmd, env = torchrun_command(step, per_host, port, args, str(Path(args[-1]).parent)), dict(os.environ)
    else:
        workers = len(step.task_hosts)
        env = {**os.environ, "TF_CONFIG": json.dumps(tf_config(step, port)), "RANK": str(step.task), "WORLD_SIZE": str(workers),
               "LOCAL_RANK": str(step.local)}
        cmd = [sys.executable, *args]
    os.execve(cmd[0], cmd, env)  # this task becomes the training: srun's signals and exit code are its own


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
