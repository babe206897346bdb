"""Authenticated servers: no network without credentials, and no API request served without them.

The infra scripts refuse to bind beyond loopback without credentials, and real servers started in their
authenticated mode refuse every API request that does not carry them."""

import base64
import json
import os
import subprocess
import urllib.error
import urllib.request

import pytest

from infra.mlflow_server import DEFAULTS_SCRIPT
from infra.server_auth import beyond_loopback
from tasks.common.tracking.credentials import Credentials
from tasks.common.config.errors import UserError
from tests.conftest import ROOT
from tests.servers import AUTH_PASSWORD as PASSWORD
from tests.servers import AUTH_USER as USER
from tests.servers import Services, authenticated, free_port, wait_http


def secret_file(folder, name: str, text: str, mode: int = 0o600):
    path = folder / name
    path.write_text(text)
    path.chmod(mode)
    return path


def script(name: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_TRACKING_", "MLFLOW_AUTH", "PREFECT_", "KARMAN_"))}
    return subprocess.run([f"infra/{name}", *(["cpu"] if name == "start-worker.sh" else [])], cwd=ROOT, env={**clean, **env},
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("host, beyond", [("127.0.0.1", False), ("127.3.0.1", False), ("localhost", False), ("::1", False),
                                          ("0.0.0.0", True), ("::", True), ("10.0.0.5", True), ("gpu-node-3", True)])
def test_only_loopback_addresses_stay_on_this_host(host, beyond):
    assert beyond_loopback(host) is beyond


def test_credentials_come_from_the_environment_or_an_owner_only_file(tmp_path):
    good = secret_file(tmp_path, "mlflow", f"{USER}:{PASSWORD}\n")
    creds = Credentials.from_env({"KARMAN_MLFLOW_AUTH_FILE": str(good), "KARMAN_PREFECT_AUTH_FILE": str(good)})
    assert creds.env() == {"MLFLOW_TRACKING_USERNAME": USER, "MLFLOW_TRACKING_PASSWORD": PASSWORD, "PREFECT_API_AUTH_STRING": f"{USER}:{PASSWORD}"}
    assert PASSWORD not in repr(creds)
    env = {"MLFLOW_TRACKING_USERNAME": "u", "MLFLOW_TRACKING_PASSWORD": "p", "KARMAN_MLFLOW_AUTH_FILE": str(good)}
    assert Credentials.from_env(env).env() == {"MLFLOW_TRACKING_USERNAME": "u", "MLFLOW_TRACKING_PASSWORD": "p"}  # the variables win
    shared = secret_file(tmp_path, "shared", f"{USER}:{PASSWORD}\n", 0o640)
    with pytest.raises(UserError) as refused:
        Credentials.from_env({"KARMAN_PREFECT_AUTH_FILE": str(shared)})
    assert str(refused.value) == (f"KARMAN_PREFECT_AUTH_FILE '{shared}' is open to its group or others (mode 0640); "
                                  f"make it owner-only: chmod 600 {shared}")
    with pytest.raises(UserError, match="must hold one line 'user:password'"):
        Credentials.from_env({"KARMAN_MLFLOW_AUTH_FILE": str(secret_file(tmp_path, "bare", PASSWORD))})
    with pytest.raises(UserError) as refused:  # Prefect's server would fail on it with an error 500 on every request
        Credentials.from_env({"PREFECT_API_AUTH_STRING": "admin:Kármán"})
    assert str(refused.value) == ("the Prefect auth string (PREFECT_API_AUTH_STRING or KARMAN_PREFECT_AUTH_FILE) must be printable ASCII "
                                  "(letters, digits, punctuation)")
    with pytest.raises(UserError, match=r"cannot be read \(No such file or directory\)"):
        Credentials.from_env({"KARMAN_MLFLOW_AUTH_FILE": str(tmp_path / "none")})


def test_the_scripts_refuse_a_network_without_credentials_in_one_line(tmp_path):
    shared = secret_file(tmp_path, "shared", f"{USER}:{PASSWORD}\n", 0o644)
    for name, env, line in [
        ("start-mlflow-server.sh", {"HOST": "0.0.0.0"},
         "HOST=0.0.0.0 is beyond loopback and no credentials are set: set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, "
         "or KARMAN_MLFLOW_AUTH_FILE to an owner-only file holding user:password"),
        ("start-prefect-server.sh", {"HOST": "10.1.2.3"},
         "HOST=10.1.2.3 is beyond loopback and no auth string is set: set PREFECT_SERVER_API_AUTH_STRING, "
         "or KARMAN_PREFECT_AUTH_FILE to an owner-only file holding user:password"),
        ("start-mlflow-server.sh", {"AUTH": "1", "MLFLOW_TRACKING_USERNAME": USER},
         "AUTH=1 asks for authentication and no credentials are set: set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, "
         "or KARMAN_MLFLOW_AUTH_FILE to an owner-only file holding user:password"),
        ("start-prefect-server.sh", {"HOST": "0.0.0.0", "KARMAN_PREFECT_AUTH_FILE": str(shared)},
         f"KARMAN_PREFECT_AUTH_FILE '{shared}' is open to its group or others (mode 0644); make it owner-only: chmod 600 {shared}"),
        ("start-worker.sh", {"KARMAN_MLFLOW_AUTH_FILE": str(shared)},
         f"KARMAN_MLFLOW_AUTH_FILE '{shared}' is open to its group or others (mode 0644); make it owner-only: chmod 600 {shared}"),
        ("start-prefect-server.sh", {"AUTH": "yes"}, "AUTH must be 0 or 1 (got 'yes')"),
    ]:
        proc = script(name, **env)
        assert (proc.returncode, proc.stderr.splitlines()) == (2, [f"infra/{name}: error: {line}"]), (name, proc.stderr[-2000:])


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Both servers on 127.0.0.1, started by the infra scripts in their authenticated mode (AUTH=1) with
    credentials from an owner-only file: (MLflow's URI, Prefect's API URL, the credentials file)."""
    folder = tmp_path_factory.mktemp("auth-servers")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_TRACKING_", "PREFECT_API_"))}
    auth = authenticated(folder)
    services = Services(folder, {**env, **auth, "PREFECT_HOME": str(folder / "prefect-home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"})
    mlflow_port, prefect_port = free_port(), free_port()
    try:
        tracking, tracking_log = services.start("mlflow-server", ["infra/start-mlflow-server.sh"], {
            "PORT": str(mlflow_port), "MLFLOW_BACKEND_STORE_URI": f"sqlite:///{folder / 'mlflow.db'}",
            "KARMAN_ARTIFACT_ROOT": str(folder / "mlartifacts")})
        prefect, prefect_log = services.start("prefect-server", ["infra/start-prefect-server.sh"], {"PORT": str(prefect_port)})
        uri, api = f"http://127.0.0.1:{mlflow_port}", f"http://127.0.0.1:{prefect_port}/api"
        wait_http(f"{uri}/health", 400, tracking, tracking_log)  # the health checks answer without credentials
        wait_http(f"{api}/health", 400, prefect, prefect_log)
        yield uri, api, auth["KARMAN_MLFLOW_AUTH_FILE"]
    finally:
        services.stop()


def status(url: str, auth: str | None = None, body: dict | None = None) -> int:
    request = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.full
def test_each_server_refuses_a_request_without_its_credentials_and_serves_one_with_them(servers, workdir, monkeypatch):
    uri, api, _ = servers
    search = f"{uri}/api/2.0/mlflow/experiments/search?max_results=1"
    assert [status(search), status(search, f"{USER}:wrong"), status(search, f"{USER}:{PASSWORD}")] == [401, 401, 200]
    assert status(f"{uri}/", f"{USER}:{PASSWORD}") == 200 and status(f"{uri}/") == 401
    with urllib.request.urlopen(urllib.request.Request(f"{uri}/", headers={
            "Authorization": "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()}), timeout=30) as response:
        assert DEFAULTS_SCRIPT in response.read().decode()  # the landing page is still the project's
    flows = f"{api}/flows/filter"
    assert [status(flows, body={}), status(flows, f"{USER}:wrong", {}), status(flows, f"{USER}:{PASSWORD}", {})] == [401, 401, 200]


@pytest.mark.full
def test_the_cli_checks_its_credentials_before_any_work_and_logs_with_them(servers, workdir, monkeypatch):
    from mlflow.tracking import MlflowClient

    from flows.cli import _prefect_ready
    from tasks.common.config.settings import Settings
    from tasks.common.tracking.runs import tracking_ready

    uri, api, creds = servers
    monkeypatch.setenv("PREFECT_API_URL", api)
    monkeypatch.delenv("PREFECT_API_AUTH_STRING", raising=False)
    with pytest.raises(UserError) as refused:
        _prefect_ready()
    assert str(refused.value) == (f"the Prefect server {api} asks for an auth string (HTTP 401); set PREFECT_API_AUTH_STRING, "
                                  "or KARMAN_PREFECT_AUTH_FILE, to the server's")
    monkeypatch.setenv("PREFECT_API_AUTH_STRING", f"{USER}:{PASSWORD}")
    _prefect_ready()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    settings = Settings.from_env()
    with pytest.raises(UserError) as refused:
        tracking_ready(settings)
    assert str(refused.value) == (f"the MLflow tracking server {uri} asks for a user and password (HTTP 401); set MLFLOW_TRACKING_USERNAME "
                                  "and MLFLOW_TRACKING_PASSWORD, or KARMAN_MLFLOW_AUTH_FILE, to an account of that server")
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", USER)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "wrong")
    with pytest.raises(UserError, match=f"refuses the user '{USER}' \\(HTTP 401\\)"):
        tracking_ready(settings)
    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME")
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD")
    monkeypatch.setenv("KARMAN_MLFLOW_AUTH_FILE", str(creds))
    for key, value in Credentials.from_env().env().items():  # as the CLI does first thing
        monkeypatch.setenv(key, value)
    tracking_ready(settings)
    client = MlflowClient(uri)
    run = client.create_run(client.create_experiment("authenticated"), run_name="with-credentials")
    client.log_metric(run.info.run_id, "loss", 0.5)
    assert client.get_run(run.info.run_id).data.metrics == {"loss": 0.5}
