"""Deployments that run anywhere: infra/deploy.sh with KARMAN_REPO_URL gives every deployment pull steps.

A bare git repository in a temporary folder stands for the project's remote: a clone of this checkout's
committed HEAD with one later commit on top. Deployed against it at HEAD, a flow run on a process worker
started in an empty folder clones the repository there at that commit (not the later one), runs from the
clone and writes its data under it. A URL git cannot reach, or a commit the repository does not hold, ends
infra/deploy.sh before it deploys anything, in one line naming the value, exit 2."""

import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from infra.pull_steps import CLONE_FOLDER, pull_steps
from tests.conftest import ROOT
from tests.servers import Services, free_port, wait_http

AUTHOR = {"GIT_AUTHOR_NAME": "test", "GIT_AUTHOR_EMAIL": "test@example.invalid",
          "GIT_COMMITTER_NAME": "test", "GIT_COMMITTER_EMAIL": "test@example.invalid"}


def git(*args: str, cwd: Path) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, env={**os.environ, **AUTHOR}, capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.fixture(scope="module")
def remote(tmp_path_factory) -> tuple[str, str, str]:
    """(file:// URL of a bare clone of this checkout, the checkout's HEAD, a later commit at the clone's HEAD)."""
    folder = tmp_path_factory.mktemp("remote")
    git("clone", "--quiet", "--bare", str(ROOT), str(folder / "karman.git"), cwd=folder)
    bare = folder / "karman.git"
    head = git("rev-parse", "HEAD", cwd=ROOT)
    later = git("commit-tree", f"{head}^{{tree}}", "-p", head, "-m", "a later commit", cwd=bare)
    git("update-ref", "HEAD", later, cwd=bare)
    return f"file://{bare}", head, later


def base_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KARMAN_DATA_ROOT", "KARMAN_REPO_URL", "KARMAN_REPO_COMMIT")}
    return {**env, "PREFECT_HOME": str(tmp_path / "prefect-home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}


def deploy(env: dict[str, str], *names: str, **repo: str) -> subprocess.CompletedProcess:
    """infra/deploy.sh: every deployment, or those ``names`` (flow/deployment)."""
    args = [arg for name in names for arg in ("--name", name)]
    return subprocess.run(["infra/deploy.sh", *args], cwd=ROOT, env={**env, **repo}, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("case", ["unreachable url", "commit not in the repository", "unknown name", "password in the url"])
def test_a_bad_url_or_commit_ends_the_deploy_at_once(case, remote, tmp_path):
    url, head, _ = remote
    missing = "0123456789abcdef" * 2 + "01234567"
    repo = {"unreachable url": {"KARMAN_REPO_URL": f"file://{tmp_path}/nowhere.git"},
            "commit not in the repository": {"KARMAN_REPO_URL": url, "KARMAN_REPO_COMMIT": missing},
            "unknown name": {"KARMAN_REPO_URL": url, "KARMAN_REPO_COMMIT": "no-such-tag"},
            "password in the url": {"KARMAN_REPO_URL": "https://bench:s3cret@git.example.invalid/karman.git"}}[case]
    # nothing listens at this API: a deploy that got as far as Prefect would fail otherwise
    env = {**base_env(tmp_path), "PREFECT_API_URL": f"http://127.0.0.1:{free_port()}/api"}
    done = deploy(env, **repo)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1, done.stderr
    named = repo.get("KARMAN_REPO_COMMIT", repo["KARMAN_REPO_URL"]).replace("bench:s3cret@", "")
    assert "s3cret" not in done.stderr
    assert done.stderr.startswith("infra/deploy.sh: error: ") and repr(named) in done.stderr, done.stderr


def write_pulled(source: Path, out: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """``python -m infra.pull_steps SOURCE OUT``, as infra/deploy.sh runs it."""
    return subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-m", "infra.pull_steps", str(source), str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_every_deployment_gets_the_pull_steps_of_its_pool_and_nothing_else_changes(remote, tmp_path):
    url, head, _ = remote
    out = tmp_path / "prefect.yaml"
    env = {**base_env(tmp_path), "KARMAN_REPO_URL": url, "KARMAN_REPO_COMMIT": head}
    done = write_pulled(ROOT / "prefect.yaml", out, env)
    assert done.returncode == 0, done.stderr
    source, pulled = yaml.safe_load((ROOT / "prefect.yaml").read_text()), yaml.safe_load(out.read_text())
    assert len(pulled["deployments"]) == len(source["deployments"]) > 10
    for before, after in zip(source["deployments"], pulled["deployments"]):
        assert after.pop("pull") == pull_steps(url, head, before["work_pool"]["requirements"])
        assert after == {**before, "work_pool": {k: v for k, v in before["work_pool"].items() if k != "requirements"}}

    # a pool whose requirements file the commit lacks: refused, naming the file, nothing written
    broken = tmp_path / "broken.yaml"
    broken.write_text((ROOT / "prefect.yaml").read_text().replace("requirements: requirements.txt", "requirements: envs/nope.txt", 1))
    out.unlink()
    done = write_pulled(broken, out, env)
    assert done.returncode == 2 and "envs/nope.txt" in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
    assert not out.exists()


@pytest.mark.full  # a server, prefect deploy --all and a flow run: about a minute, two on a busy machine
@pytest.mark.timeout(600)
def test_a_worker_in_an_empty_folder_runs_a_deployment_from_a_clone_at_the_deployed_commit(remote, tmp_path):
    url, head, later = remote
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {**base_env(tmp_path), "PREFECT_API_URL": api}
    services = Services(tmp_path, env)
    try:
        server, server_log = services.start("prefect-server", ["infra/start-prefect-server.sh"], {"PORT": str(port)})
        wait_http(f"{api}/health", 180, server, server_log)
        # two deployments on different pools, not all of them: each costs seconds
        done = deploy(env, "generate/default", "train/gpu", KARMAN_REPO_URL=url, KARMAN_REPO_COMMIT=head)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

        # the worker knows nothing of the project: an empty folder, no PYTHONPATH, only a Python with
        # everything installed (PIP_NO_INDEX: the pull's pip install must find every requirement satisfied)
        folder = tmp_path / "worker"
        folder.mkdir()
        worker, worker_log = services.start("worker", ["env", f"--chdir={folder}", str(ROOT / ".venv" / "bin" / "python"), "-m", "prefect",
                                                       "worker", "start", "--pool", "cpu", "--type", "process", "--name", "pulled"], {
            "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}", "KARMAN_ARTIFACT_ROOT": str(tmp_path / "mlartifacts"),
            "KARMAN_EXPERIMENT": "pulled", "PIP_NO_INDEX": "1", "PREFECT_WORKER_QUERY_SECONDS": "1"})

        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:
            deployment = client.read_deployment_by_name("generate/default")
            assert deployment.pull_steps == pull_steps(url, head, "requirements.txt")
            assert client.read_deployment_by_name("train/gpu").pull_steps == pull_steps(url, head, "requirements.txt")
            # the job variable working_dir keeps the clone in the worker's folder (else a temporary one per run)
            run = client.create_flow_run_from_deployment(deployment.id, parameters={"spec": {"workload": "digits", "dataset": "pulled"}},
                                                         job_variables={"working_dir": str(folder)})
            deadline = time.monotonic() + 420
            while not (state := client.read_flow_run(run.id).state).is_final():
                assert worker.poll() is None and time.monotonic() < deadline, worker_log.read_text()[-5000:]
                time.sleep(1)
            assert state.is_completed(), f"{state}\n{worker_log.read_text()[-5000:]}"
            logs = [log.message for log in client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])))]
        assert "Running 3 deployment pull step(s)" in logs, logs

        clone = folder / CLONE_FOLDER
        assert git("rev-parse", "HEAD", cwd=clone) == head != later
        assert git("config", "--get", "remote.origin.url", cwd=clone) == url
        # the flow ran in the clone: its data root (./data, KARMAN_DATA_ROOT unset) is the clone's
        assert (clone / "data" / "datasets" / "pulled").is_dir()
        assert sorted(p.name for p in folder.iterdir() if not p.name.endswith(".lock")) == [CLONE_FOLDER]
    finally:
        services.stop()
