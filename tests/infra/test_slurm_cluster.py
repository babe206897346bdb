"""The SLURM cluster settings load into dask-jobqueue and give the intended job script.

The SLURM cluster settings load into dask-jobqueue and give the intended job script. Nothing is
submitted: constructing a SLURMCluster starts only its local scheduler, so this runs without SLURM."""

import importlib.util
import sys

import pytest

from tests.conftest import ROOT


def load_script():
    spec = importlib.util.spec_from_file_location("start_slurm_cluster", ROOT / "infra" / "start-slurm-cluster.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def script(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the cluster creates its log directory relative to the working folder
    monkeypatch.setenv("KARMAN_BENCH_ROOT", str(ROOT))
    return load_script()


def test_job_script_from_the_example_settings(script, tmp_path):
    options = script.slurm_options(script.DEFAULT_CONFIG)
    assert options["cores"] == options["processes"] == 8
    cluster = script.slurm_cluster(scheduler_options={"dashboard_address": None, "host": "127.0.0.1"})
    try:
        job = cluster.job_script()
    finally:
        cluster.close()
    header = [line for line in job.splitlines() if line.startswith("#SBATCH")]
    for directive in ("-J karman-worker", "-n 1", "--cpus-per-task=8", "--mem=16G", "-t 02:00:00"):
        assert f"#SBATCH {directive}" in header, job
    assert "#SBATCH -e slurm-logs/karman-worker-%J.err" in header
    assert not any(line.startswith(("#SBATCH -p", "#SBATCH -A")) for line in header), "queue and account are left to the site"
    assert (tmp_path / "slurm-logs").is_dir()
    worker = job.strip().splitlines()[-1]
    assert worker.startswith(f"{sys.executable} -m distributed.cli.dask_worker tcp://")
    for argument in ("--nthreads 1", "--nworkers 8", "--memory-limit 2.00GiB", "--death-timeout 120",
                     "--lifetime 110m --lifetime-stagger 5m"):
        assert argument in worker, worker
    assert 'cd "${KARMAN_BENCH_ROOT:?' in job and 'export PYTHONPATH="$KARMAN_BENCH_ROOT' in job


def test_print_job_script_submits_nothing(script, capsys):
    assert script.main(["--print-job-script"]) == 0
    assert "#SBATCH --cpus-per-task=8" in capsys.readouterr().out


def test_unknown_option_is_named(script, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("jobqueue:\n  slurm:\n    cores: 4\n    memory: 8GiB\n    job-extra-directive: ['--qos=low']\n")
    with pytest.raises(SystemExit, match="unknown jobqueue.slurm option.*job-extra-directive"):
        script.slurm_options(bad)
    (tmp_path / "empty.yaml").write_text("distributed: {}\n")
    with pytest.raises(SystemExit, match="no jobqueue.slurm section"):
        script.slurm_options(tmp_path / "empty.yaml")


def test_the_scheduler_listens_on_one_address_and_the_dashboard_on_localhost(script):
    options = script.slurm_options(script.DEFAULT_CONFIG)
    assert options["scheduler_options"]["dashboard_address"].startswith("127.0.0.1:")
    address = script.default_route_address()
    assert address != "0.0.0.0" and address.count(".") == 3
    cluster = script.slurm_cluster(scheduler_options={"dashboard_address": None, "host": "127.0.0.1"})
    try:
        assert cluster.scheduler_address.startswith("tcp://127.0.0.1:")
    finally:
        cluster.close()


def test_with_tls_jobs_and_clients_need_the_certificates(script, tmp_path):
    """A TLS scheduler and worker from the script's credentials: a sweep from the command line runs on
    it with the client variables the script prints, and a plain-TCP client is turned away."""
    import json
    import os

    from distributed import Client, LocalCluster

    security, client_env = script.tls_security(tmp_path / "tls")
    assert all(oct((tmp_path / "tls" / name).stat().st_mode)[-3:] == "600" for name in ("ca.pem", "cert.pem", "key.pem"))
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, protocol="tls://", host="127.0.0.1",
                      security=security, dashboard_address=None) as cluster:
        assert cluster.scheduler_address.startswith("tls://127.0.0.1:")
        with pytest.raises(Exception):
            Client(cluster.scheduler_address.replace("tls://", "tcp://"), timeout=3)
        from tests.conftest import run_cli

        proc = run_cli("generate", "--dataset", "tls", "--reynolds", "8,10", "--nx", "48", "--ny", "24", "--size", "5",
                       "--warmup-steps", "50", "--frames", "3", "--frame-every", "10", "--scheduler", cluster.scheduler_address,
                       "--json", cwd=tmp_path, env={**client_env, "KARMAN_BENCH_ROOT": os.environ["KARMAN_BENCH_ROOT"]})
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert len(json.loads(proc.stdout.strip().splitlines()[-1])["simulations"]) == 2
