"""Warm children (tasks.common.process.warm): a job forked from a warm server is the job process a fresh interpreter would be, alone or as one of a job's ranks."""

import logging
import os
import re
import signal

import psutil
import pytest

from tasks.common.process import warm
from tasks.common.config.errors import RunFailed, UserError
from tasks.common.process.launch import ChildFailed, run_child
from tasks.common.process.warm import WARM_ENV

LOG = logging.getLogger("karman.test")
DESCRIBE = "tests.tasks.common.job_bodies:describe"


def test_a_forked_job_has_its_own_environment_folder_threads_and_randomness_and_the_server_is_reused(workdir, monkeypatch, caplog):
    monkeypatch.delenv(WARM_ENV, raising=False)
    (workdir / "here").mkdir()
    monkeypatch.chdir(workdir / "here")
    caplog.set_level(logging.INFO, logger="karman.test")
    first = run_child("probe", DESCRIBE, {}, LOG, env={"KARMAN_TEST_VALUE": "one", "OMP_NUM_THREADS": "1"})
    second = run_child("probe", DESCRIBE, {}, LOG, env={"KARMAN_TEST_VALUE": "two", "OMP_NUM_THREADS": "2"})
    assert (first["value"], second["value"]) == ("one", "two") and first["cwd"] == second["cwd"] == str(workdir / "here")
    assert (first["threads"], second["threads"]) == (1, 2)  # OMP_NUM_THREADS as a fresh process reads it
    assert first["torch_preloaded"] and first["ppid"] == second["ppid"] != os.getpid()  # one warm server, torch in it
    assert first["pid"] != second["pid"] and first["draw"] != second["draw"]
    # the collector runs in the job as in any process, and never walks what the server imported (torch, MLflow: frozen)
    assert first["collector"] and second["collector"] and first["frozen"] > 200_000, first
    # what a job would work out itself the first time it logs or loads a model, the server did once (tasks.common.process.job_preload)
    assert first["distributions_mapped"] and second["distributions_mapped"]
    server = psutil.Process(first["ppid"])
    assert server.ppid() == os.getpid() and "tasks.common.process.job_main" in " ".join(server.cmdline())  # ps names what it serves
    assert f"[probe] line from {first['pid']}" in caplog.text  # its output relayed line by line


def _without_server(framework: str, env: dict[str, str]):
    """The key of the warm server a ``framework`` job of environment ``env`` forks from, that server stopped where this
    test process had started it in an earlier test (the test then starts it itself)."""
    key = warm._preload(framework, env)
    if key in warm._servers:
        warm._servers.pop(key)._stop()
    return key


def test_a_torch_jobs_server_started_early_is_the_one_its_job_is_forked_from(workdir, monkeypatch):
    """``start_early`` (a training command's check) spawns the server a torch job will use, before the job; not where the
    job is not forked."""
    monkeypatch.delenv(WARM_ENV, raising=False)
    key = _without_server("torch", dict(os.environ))
    before = dict(warm._servers)
    assert not warm.start_early("torch", 2, 2, {})
    monkeypatch.setenv(WARM_ENV, "0")
    assert not warm.start_early("torch", 1, 1, {}) and not warm.start_early("tensorflow", 1, 1, {})
    assert warm._servers == before  # none of those started a server
    monkeypatch.delenv(WARM_ENV)
    assert warm.start_early("torch", 1, 1, {"OMP_NUM_THREADS": "1"})
    pid = warm._servers[key]._forkserver_pid
    assert psutil.Process(pid).ppid() == os.getpid()  # running before any job asked for it
    job = run_child("probe", DESCRIBE, {}, LOG)
    assert job["ppid"] == pid and job["torch_preloaded"]


def test_with_warm_children_off_a_job_is_a_fresh_interpreter_and_says_the_same(workdir, monkeypatch):
    monkeypatch.setenv(WARM_ENV, "0")
    fresh = run_child("probe", DESCRIBE, {}, LOG, env={"KARMAN_TEST_VALUE": "cold", "OMP_NUM_THREADS": "1"})
    assert fresh["ppid"] == os.getpid() and not fresh["torch_preloaded"] and (fresh["value"], fresh["threads"]) == ("cold", 1)
    assert fresh["collector"] and fresh["frozen"] > 0  # on, with what the job loaded before its body frozen
    assert not fresh["distributions_mapped"]  # a fresh interpreter works out MLflow's map when it first needs it


@pytest.mark.parametrize("warm", ["1", "0"])
def test_a_job_killed_by_a_signal_and_a_refused_job_end_the_same_warm_or_fresh(workdir, monkeypatch, warm):
    monkeypatch.setenv(WARM_ENV, warm)
    with pytest.raises(ChildFailed, match="^probe child killed by SIGKILL"):
        run_child("probe", "tests.tasks.common.job_bodies:die", {"signal": int(signal.SIGKILL)}, LOG)
    with pytest.raises(UserError, match="has no function nothing"):
        run_child("probe", "tests.tasks.common.job_bodies:nothing", {}, LOG)


def test_tensorflows_cpu_jobs_fork_from_a_server_that_imported_it_in_their_environment_and_others_do_not(workdir, monkeypatch, capfd):
    from tasks.common.process.launch import device_env

    monkeypatch.delenv(WARM_ENV, raising=False)
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    body = "tests.tasks.common.job_bodies:describe_tensorflow"
    cpu = device_env("cpu", framework="tensorflow")
    # the server a training command starts early (its check, with the plan's environment) is the one its jobs fork from
    key = _without_server("tensorflow", {**os.environ, **cpu})
    assert warm.start_early("tensorflow", 1, 1, cpu)
    early = warm._servers[key]._forkserver_pid
    first = run_child("probe", body, {}, LOG, env=cpu, framework="tensorflow")
    second = run_child("probe", body, {}, LOG, env=cpu, framework="tensorflow")
    assert first["tensorflow_preloaded"] and first["ppid"] == second["ppid"] == early and first["sum"] == second["sum"] == 45.0
    # a job whose import-time variables differ from the cpu environment's (another oneDNN choice, a GPU visible)
    # imports TensorFlow itself, in its own environment
    other = run_child("probe", body, {}, LOG, env={**cpu, "TF_ENABLE_ONEDNN_OPTS": "0"}, framework="tensorflow")
    assert not other["tensorflow_preloaded"] and other["onednn"] == "0" and other["ppid"] != first["ppid"] and other["sum"] == 45.0
    gpu = run_child("probe", body, {"import_later": True}, LOG, env={k: v for k, v in cpu.items() if k != "CUDA_VISIBLE_DEVICES"}, framework="tensorflow")
    assert not gpu["tensorflow_preloaded"]
    # loaded in the server or by the job itself, TensorFlow came without JAX and scikit-learn, which import afterwards
    assert all(out["skipped"] == {"jax": True, "sklearn": True} for out in (first, second, other, gpu))
    assert gpu["later"]["jax"] and gpu["later"]["sklearn"]
    err = capfd.readouterr().err
    assert "oneDNN custom operations" not in err and "absl::InitializeLog" not in err  # the server's import stays off the terminal


def test_jaxs_cpu_jobs_fork_from_a_server_that_imported_it_with_their_jax_variables_and_start_their_own_backend(workdir, monkeypatch):
    from tasks.common.process.launch import device_env

    monkeypatch.delenv(WARM_ENV, raising=False)
    body = "tests.tasks.common.job_bodies:describe_jax"
    cpu = device_env("cpu", framework="jax")
    key = _without_server("jax", {**os.environ, **cpu})
    assert warm.start_early("jax", 1, 1, cpu)  # as a training command's check starts it
    early = warm._servers[key]._forkserver_pid
    first = run_child("probe", body, {"devices": 2}, LOG, env=cpu, framework="jax")
    second = run_child("probe", body, {"devices": 3}, LOG, env=cpu, framework="jax")
    assert first["jax_preloaded"] and first["ppid"] == second["ppid"] == early != os.getpid() and first["platforms"] == "cpu"
    # XLA's flags, set by each job after the fork, are each job's own: no backend had started in the server
    assert (first["devices"], second["devices"]) == (2, 3) and first["sum"] == second["sum"] == 45.0
    # a job whose JAX variables differ (another compilation cache) imports JAX itself and reads its own
    other = run_child("probe", body, {"devices": 1}, LOG, env={**cpu, "JAX_COMPILATION_CACHE_DIR": str(workdir / "cache")}, framework="jax")
    assert not other["jax_preloaded"] and other["ppid"] != first["ppid"] and other["cache"] == str(workdir / "cache") and other["devices"] == 1


@pytest.mark.parametrize("warm", ["1", "0"])
def test_a_jobs_ranks_forked_or_under_torchrun_join_one_process_group_and_a_failed_rank_stops_the_others(workdir, monkeypatch, caplog, warm):
    import time

    import tempfile

    monkeypatch.setenv(WARM_ENV, warm)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    caplog.set_level(logging.INFO, logger="karman.test")
    (workdir / "tmp").mkdir()
    from multiprocessing import util

    util.get_temp_dir()  # this process's own folder of multiprocessing (a new warm server's socket goes there) made first, where it lies
    monkeypatch.setattr(tempfile, "tempdir", str(workdir / "tmp"))  # where the jobs' folders go
    body = "tests.tasks.common.job_bodies:all_reduce"
    out = run_child("probe", body, {"lines": 500}, LOG, procs=2)
    assert list((workdir / "tmp").iterdir()) == []  # the job's folder went, with torchrun's log folders in it
    assert (out["sum"], out["rank"], out["local_rank"], out["world"], out["threads"]) == (3.0, 0, 0, 2, 1)  # rank 0's result; torchrun's one thread each
    # both ranks' output relayed, each line whole: the ranks share one pipe, where a print's text and its newline written
    # apart let the other rank's text in between
    relayed = [r.getMessage() for r in caplog.records if r.name == LOG.name]
    assert [sum(re.fullmatch(rf"\[probe\] rank {rank} of 2 in \d+", m) is not None for m in relayed) for rank in (0, 1)] == [1, 1], relayed[:4]
    said = [m for m in relayed if " line " in m]
    assert len(said) == 1000 and all(re.fullmatch(r"\[probe\] rank [01] line \d{4} x{60}", m) for m in said), [m for m in said if not m.endswith("x" * 60)][:3]
    assert (out["ppid"] != os.getpid()) if warm == "1" else True  # forked from the warm server, not started by this process
    # a rank that fails: the other, waiting, is stopped, and the job ends with that rank's failure
    started = time.monotonic()
    with pytest.raises(RunFailed, match="^rank 1: this rank gave up$"):  # not rank 0's "stopped by SIGTERM"
        run_child("probe", body, {"fail_rank": 1}, LOG, procs=2)
    assert time.monotonic() - started < 60


def test_a_signal_to_a_group_lets_each_rank_end_in_its_own_time(workdir):
    import json

    from tasks.common.process.warm import ForkedGroup
    from tests.conftest import ROOT

    job = workdir / "job.json"
    job.write_text(json.dumps({"body": "tests.tasks.common.job_bodies:slow_stop", "linger": 3}))
    envs = [{**os.environ, "PYTHONPATH": str(ROOT), "RANK": str(rank), "WORLD_SIZE": "2"} for rank in range(2)]
    with ForkedGroup(["train", str(job), str(workdir / "result.json")], envs, str(workdir), "torch", server_env=envs[0], grace_s=1.0) as group:
        ready = 0
        for line in group.stdout:
            ready += line.strip() == "ready"
            if ready == 2:
                break
        group.send_signal(signal.SIGTERM)
        group.stdout.read()
        # rank 1 ended at once, rank 0 three seconds later: not taken for a failure that has the others killed after the grace
        assert group.wait(60) == 5 and group.failed_rank is None
        assert [child.returncode for child in group.children] == [5, 5]


def test_every_warm_server_freezes_what_it_imported_as_its_last_preload():
    """A server lives until its command ends and then ends as an interpreter does, walking what it imported with the
    cycle collector (1.4–2.2 s of CPU for torch's, TensorFlow's or JAX's): the last module it imports freezes it all."""
    import subprocess
    import sys

    from tasks.common.config.frameworks import FRAMEWORKS
    from tasks.common.process.warm import FROZEN, _preload
    from tests.conftest import ROOT

    for name, fw in FRAMEWORKS.items():
        for env in ({}, {**os.environ, **fw.env("cpu", None)}):  # a server of the framework's cpu preload, where it has one
            modules, _ = _preload(name, env)
            assert modules[-1] == FROZEN and modules.count(FROZEN) == 1, (name, modules)
    probe = "import gc; before = gc.get_freeze_count(); import tasks.common.process.collector_frozen; print(before, gc.get_freeze_count())"
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    before, after = map(int, done.stdout.split())
    assert before == 0 and after > 1000
