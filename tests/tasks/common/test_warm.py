"""Warm children (tasks.common.warm): a job forked from a warm server is the job process a fresh interpreter would be."""

import logging
import os
import signal

import psutil
import pytest

from tasks.common.errors import UserError
from tasks.common.launch import ChildFailed, run_child
from tasks.common.warm import WARM_ENV

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
    server = psutil.Process(first["ppid"])
    assert server.ppid() == os.getpid() and "tasks.common.job_main" in " ".join(server.cmdline())  # ps names what it serves
    assert f"[probe] line from {first['pid']}" in caplog.text  # its output relayed line by line


def test_with_warm_children_off_a_job_is_a_fresh_interpreter_and_says_the_same(workdir, monkeypatch):
    monkeypatch.setenv(WARM_ENV, "0")
    fresh = run_child("probe", DESCRIBE, {}, LOG, env={"KARMAN_TEST_VALUE": "cold", "OMP_NUM_THREADS": "1"})
    assert fresh["ppid"] == os.getpid() and not fresh["torch_preloaded"] and (fresh["value"], fresh["threads"]) == ("cold", 1)


@pytest.mark.parametrize("warm", ["1", "0"])
def test_a_job_killed_by_a_signal_and_a_refused_job_end_the_same_warm_or_fresh(workdir, monkeypatch, warm):
    monkeypatch.setenv(WARM_ENV, warm)
    with pytest.raises(ChildFailed, match="^probe child killed by SIGKILL"):
        run_child("probe", "tests.tasks.common.job_bodies:die", {"signal": int(signal.SIGKILL)}, LOG)
    with pytest.raises(UserError, match="has no function nothing"):
        run_child("probe", "tests.tasks.common.job_bodies:nothing", {}, LOG)


def test_tensorflows_cpu_jobs_fork_from_a_server_that_imported_it_in_their_environment_and_others_do_not(workdir, monkeypatch, capfd):
    from tasks.common.launch import device_env

    monkeypatch.delenv(WARM_ENV, raising=False)
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    body = "tests.tasks.common.job_bodies:describe_tensorflow"
    cpu = device_env("cpu", framework="tensorflow")
    first = run_child("probe", body, {}, LOG, env=cpu, framework="tensorflow")
    second = run_child("probe", body, {}, LOG, env=cpu, framework="tensorflow")
    assert first["tensorflow_preloaded"] and first["ppid"] == second["ppid"] and first["sum"] == second["sum"] == 45.0
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
