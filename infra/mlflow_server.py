"""MLflow's tracking server, with a UI that opens in its model-training view.

MLflow 3.17's UI shows every experiment in one of two views, "GenAI" (traces, token usage) or "Machine
learning" (runs, charts, models). It no longer reads the choice from the experiment's
``mlflow.experimentKind`` tag: a switch in the sidebar decides, kept in the browser's local storage, and
a browser that never touched it gets the GenAI view. An experiment of training runs then opens on an
empty traces page.

This is MLflow's own server, started by MLflow's own ``mlflow server`` command with the options given
here. One thing differs: its landing page sets the switch to "Machine learning" before the UI's code
loads, in a browser that has not chosen yet. A choice made in the sidebar is kept, and a link with
``?workflowType=genai`` still opens the GenAI view. The same goes for the assistant panel, which
otherwise opens by itself on a browser's first visit.

    python -m infra.mlflow_server --host 127.0.0.1 --port 5000 ...

Its store is ``MLFLOW_BACKEND_STORE_URI`` (default ``sqlite:///mlflow.db``), or with ``DATABASE=postgresql``
the database of infra/start-postgres.sh's server (infra/postgres.py); an environment variable, never an
argument, which every user of the host could read. Bound beyond loopback (or with AUTH=1) it runs behind
MLflow's basic-auth app (infra/server_auth.py).
"""
from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

# What the landing page sets in a browser that has no value yet, under the UI's storage keys (each key
# with its version suffix, as the UI's code writes them): the switch in its "Machine learning" position,
# and the assistant panel (an LLM chat) marked as already shown once, so it does not open by itself
# over the runs; it stays one click away.
BROWSER_DEFAULTS = {
    "mlflow.workflowType_v1": "machine_learning",
    "mlflow.assistant.fab.autoOpenedOnFirstLoad_v1": True,
}
DEFAULTS_SCRIPT = "<script>try{var s=window.localStorage;%s}catch(e){}</script>" % "".join(
    "if(s.getItem(%s)===null){s.setItem(%s,%s)}" % (json.dumps(key), json.dumps(key), json.dumps(json.dumps(value)))
    for key, value in BROWSER_DEFAULTS.items())

_MLFLOW_APP = "mlflow.server.fastapi_app:app"
_AUTH_APP = "mlflow.server.auth:create_app"  # what ``--app-name basic-auth`` names


def landing_page(html: str) -> str:
    """MLflow's ``index.html`` with the browser defaults set first thing in its head."""
    if "<head>" not in html:
        raise RuntimeError("MLflow's index.html has no <head>: this MLflow version's landing page cannot take the defaults")
    return html.replace("<head>", "<head>" + DEFAULTS_SCRIPT, 1)


def _serve_landing_page():
    """MLflow's Flask app, its landing page replaced by one that sets the browser defaults."""
    from flask import Response

    from mlflow.server import app as flask_app

    index = Path(flask_app.static_folder) / "index.html"
    page = landing_page(index.read_text(encoding="utf-8"))

    def serve():
        return Response(page, mimetype="text/html", headers={"Cache-Control": "no-cache"})

    flask_app.view_functions["serve"] = serve  # the route of "/" (under the static prefix, if any)
    return flask_app


def create_app():
    """MLflow's ASGI app whose landing page opens the model-training view (uvicorn's ``--factory``)."""
    from mlflow.server.fastapi_app import app

    _serve_landing_page()
    return app


def create_auth_app():
    """The same, behind MLflow's basic-auth app: every request but the health check and static files
    needs a user and password (``--app-name basic-auth``)."""
    from mlflow.server.auth import create_app as with_auth

    return with_auth(_serve_landing_page())


_OURS = {_MLFLOW_APP: "mlflow_server:create_app", _AUTH_APP: "mlflow_server:create_auth_app"}


def main(argv: list[str]) -> int:
    """``mlflow server ARGV`` on its store (:func:`infra.postgres.store_env`), its uvicorn workers serving
    :func:`create_app` instead of MLflow's app, or :func:`create_auth_app` where the server authenticates
    (infra/server_auth.py: beyond loopback, or AUTH=1); refused in one line where it must authenticate and
    has no credentials, or its store's settings are wrong."""
    from infra.postgres import store_env
    from infra.server_auth import mlflow_auth
    from tasks.common.errors import UserError

    host = argv[argv.index("--host") + 1] if "--host" in argv else "127.0.0.1"
    try:
        auth = mlflow_auth(host, dict(os.environ))
        os.environ.update(store_env("mlflow", dict(os.environ)))  # MLflow's --backend-store-uri reads it
    except UserError as exc:
        print(f"infra/start-mlflow-server.sh: error: {exc}", file=sys.stderr)
        return 2
    if auth is not None:
        os.environ.update(auth)  # MLflow's server process and its workers read them
        argv = [*argv, "--app-name", "basic-auth"]
    # What a benchmark's tracking server needs, and no more (either can be set otherwise in the environment):
    # no GenAI job execution (MLflow 3 starts a job runner and seven queue consumers for its scorers and
    # trace roll-ups, none of which this project uses), and no more uvicorn workers than the host has cores
    # (MLflow's default is 4, each importing MLflow at every start and restart).
    os.environ.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    if "--workers" not in argv and "-w" not in argv:
        os.environ.setdefault("MLFLOW_WORKERS", str(min(4, os.cpu_count() or 1)))
    port = argv[argv.index("--port") + 1] if "--port" in argv else "5000"
    print(f"MLflow UI: http://{host}:{port}/" + (" (basic-auth)" if auth else ""), file=sys.stderr)
    import mlflow.server
    from mlflow.cli import cli

    build = mlflow.server._build_uvicorn_command

    def build_ours(uvicorn_opts, host, port, workers, app_name, env_file=None, is_factory=False):
        if app_name in _OURS:
            here = shlex.quote(str(Path(__file__).resolve().parent))
            uvicorn_opts = f"--app-dir {here} {uvicorn_opts or ''}"
            app_name, is_factory = _OURS[app_name], True
        return build(uvicorn_opts, host, port, workers, app_name, env_file, is_factory)

    mlflow.server._build_uvicorn_command = build_ours
    cli(["server", *argv])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
