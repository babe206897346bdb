#!/usr/bin/env python
"""A Dask cluster of SLURM jobs for the simulation sweep; prints the scheduler address to pass on.

Run on a login node, with the repository's virtual environment on a shared file system:

    .venv/bin/python infra/start-slurm-cluster.py --max-jobs 8    # prints tcp://HOST:PORT, stays up
    .venv/bin/python -m flows generate --scheduler tcp://HOST:PORT ...   # in another shell

The only line on stdout is the scheduler address. The scheduler listens on one address only (the
interface given by --interface, else this node's address on its default route) and its dashboard on
localhost; with --tls every connection is TLS with mutual certificates, written under --tls-dir
(shared with the jobs), and stderr prints the variables a client (`python -m flows generate`) sets. The cluster adapts between
--min-jobs and --max-jobs jobs to the work queued, and lives until this process is interrupted
(Ctrl-C or SIGTERM), which cancels its jobs. Job settings come from dask-jobqueue-slurm.yaml
beside this script, or from the file named by --config.
"""

import argparse
import os
import signal
import socket
import sys
import threading
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
DEFAULT_CONFIG = HERE / "dask-jobqueue-slurm.yaml"
# jobqueue.slurm options that are keyword arguments of a different name.
RENAMED = {"name": "job_name"}


def slurm_options(config_path: Path) -> dict:
    """The file's jobqueue.slurm section as SLURMCluster keyword arguments; SystemExit naming any
    option that dask-jobqueue does not define."""
    import dask.config
    import dask_jobqueue  # noqa: F401 - importing it loads its default jobqueue config

    data = yaml.safe_load(config_path.read_text()) or {}
    section = data.get("jobqueue", {}).get("slurm") if isinstance(data.get("jobqueue"), dict) else None
    if not isinstance(section, dict):
        raise SystemExit(f"{config_path}: no jobqueue.slurm section")
    known = dask.config.get("jobqueue.slurm")
    unknown = sorted(set(section) - set(known))
    if unknown:
        raise SystemExit(f"{config_path}: unknown jobqueue.slurm option(s) {', '.join(unknown)}; "
                         f"dask-jobqueue knows {', '.join(sorted(known))}")
    return {RENAMED.get(key, key.replace("-", "_")): value for key, value in section.items()}


def slurm_cluster(config_path: Path = DEFAULT_CONFIG, **overrides):
    """A SLURMCluster with the file's settings (keyword arguments override them). It starts the
    scheduler here and submits no job until scaled."""
    from dask_jobqueue import SLURMCluster

    # The job script's prologue enters the repository through this variable (see the YAML).
    os.environ.setdefault("KARMAN_BENCH_ROOT", str(HERE.parent))
    return SLURMCluster(**{**slurm_options(config_path), **overrides})


def default_route_address() -> str:
    """This node's address on its default route (the one jobs on other nodes reach it by); sends nothing."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.254.254.254", 9))
            return probe.getsockname()[0]
        except OSError:
            return "127.0.0.1"


def tls_security(folder: Path):
    """Mutual-TLS credentials for scheduler, workers and clients, kept as files (owner-only) in ``folder``
    on the shared file system; returns (Security, the client's environment variables)."""
    from distributed.security import Security

    temporary = Security.temporary()
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    files = {}
    for name, pem in (("ca.pem", temporary.tls_ca_file), ("cert.pem", temporary.tls_scheduler_cert), ("key.pem", temporary.tls_scheduler_key)):
        path = folder / name
        path.touch(mode=0o600)
        path.write_text(pem)
        files[name] = str(path)
    roles = {f"tls_{role}_{part}": files[f"{part}.pem"] for role in ("client", "scheduler", "worker") for part in ("cert", "key")}
    security = Security(tls_ca_file=files["ca.pem"], require_encryption=True, **roles)
    env = {"DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "True", "DASK_DISTRIBUTED__COMM__TLS__CA_FILE": files["ca.pem"],
           "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT": files["cert.pem"], "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY": files["key.pem"]}
    return security, env


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="YAML with a jobqueue.slurm section")
    parser.add_argument("--min-jobs", type=int, default=0, help="jobs kept running while idle (default 0)")
    parser.add_argument("--max-jobs", type=int, default=4, help="most jobs at a time (default 4)")
    parser.add_argument("--interface", default=None, help="network interface the scheduler listens on, e.g. ib0 (default: this node's address on its default route)")
    parser.add_argument("--tls", action="store_true", help="TLS with mutual certificates between scheduler, workers and clients")
    parser.add_argument("--tls-dir", type=Path, default=Path("dask-tls"), help="where --tls keeps its certificates, on the shared file system (default ./dask-tls)")
    parser.add_argument("--print-job-script", action="store_true", help="print the job script and exit; submits nothing")
    args = parser.parse_args(argv)
    if not 0 <= args.min_jobs <= args.max_jobs or args.max_jobs < 1:
        parser.error(f"need 0 <= --min-jobs <= --max-jobs and --max-jobs >= 1 (got {args.min_jobs} and {args.max_jobs})")

    options = slurm_options(args.config).get("scheduler_options") or {}
    listen = {"interface": args.interface} if args.interface else {"host": default_route_address()}
    overrides: dict = {"scheduler_options": {**options, **listen}}
    client_env: dict[str, str] = {}
    if args.tls:
        overrides["security"], client_env = tls_security(args.tls_dir.resolve())
        overrides["protocol"] = "tls://"
        overrides["shared_temp_directory"] = str(args.tls_dir.resolve())
    cluster = slurm_cluster(args.config, **overrides)
    try:
        if args.print_job_script:
            print(cluster.job_script())
            return 0
        cluster.adapt(minimum_jobs=args.min_jobs, maximum_jobs=args.max_jobs)
        print(cluster.scheduler_address, flush=True)
        print(f"dashboard: {cluster.dashboard_link}; Ctrl-C stops the cluster and cancels its jobs", file=sys.stderr)
        if client_env:
            print("a client needs: export " + " ".join(f"{k}={v}" for k, v in client_env.items()), file=sys.stderr)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            while not stop.wait(1.0):
                pass
        except KeyboardInterrupt:
            pass
        return 0
    finally:
        cluster.close()


if __name__ == "__main__":
    sys.exit(main())
