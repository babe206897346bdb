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

Where the project's experiment (``KARMAN_EXPERIMENT``, default ``karman-bench``) exists, the server's root
opens it, on the benchmark's view of its runs (:func:`benchmark_view`): its training runs, not nested
under their benchmark, grouped by workload and sorted by time to target, with the headline columns and a
chart section comparing them. MLflow's UI keeps a browser's view of an experiment in local storage; the
landing page writes this one there in a browser that has none for the experiment, so a view the user
changed is kept. The same view is one of the experiment's saved views (MLflow 3.17's "Views" list and
``?viewStateShareKey=karman-benchmark``), for browsers that had a view of it already.

    python -m infra.mlflow_server --host 127.0.0.1 --port 5000 ...

Its store is ``MLFLOW_BACKEND_STORE_URI`` (default ``sqlite:///mlflow.db``), or with ``DATABASE=postgresql``
the database of infra/start-postgres.sh's server (infra/postgres.py); an environment variable, never an
argument, which every user of the host could read. Bound beyond loopback (or with AUTH=1) it runs behind
MLflow's basic-auth app (infra/server_auth.py).
"""
from __future__ import annotations

import json
import logging
import os
import shlex
import sys
import time
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

# How MLflow 3.17's UI keeps a browser's view of an experiment page: one local-storage entry per set of
# experiments, the facets (filter, sort) and the UI state (columns, grouping, charts) in one JSON object.
VIEW_STORAGE_KEY = "MLflowLocalStorage-1.1-ExperimentPage-{ids}-ReactComponentState"
# A saved view of an experiment, as the UI's "Save view" writes it: an experiment tag of this prefix and the
# view's id, whose value holds its name, times and state; ``?viewStateShareKey=ID`` on the runs page opens it.
SAVED_VIEW_PREFIX = "mlflow.sharedViewState."
VIEW_ID = "karman-benchmark"
VIEW_NAME = "Benchmark: training runs"
TRAIN_FILTER = "tags.`karman.stage` = 'train'"  # tasks.common.tracking.names.Tag.STAGE of a training run
HEADLINE_TAGS = {"karman.workload": "workload", "karman.framework": "framework", "karman.device": "device",
                 "karman.batch_size": "batch"}
# The results of a finished training run, as it logs them (tasks/train); test scores (``test_*``) are the
# workload's own and are found in the experiment's training runs.
HEADLINE_METRICS = {"time_to_target_s": "time to target [s]", "samples_per_s": "samples/s",
                    "mfu_ceiling": "share of the measured ceiling"}
COST_METRICS = {"energy_j": "energy [J]", "cost": "cost"}
# Beside the energy, what it covers (GPU board, CPU package or not measured): energies of different scopes are not comparable,
# so the view charts none of them against each other (no energy chart), and the column names each one's scope.
ENERGY_SCOPE_PARAM = "energy_scope"
UNCHARTED = {"energy_j"}
MAX_TEST_METRICS = 6  # the test-score columns and charts a view shows at most


def _column(kind: str, key: str) -> str:
    return f"{kind}.`{key}`"  # the UI's column ids: attributes, params, metrics or tags, and the key


def benchmark_view(test_metrics: list[str]) -> dict:
    """The runs page's state (facets and UI state, the keys MLflow's UI persists) that shows a benchmark's
    answer: the training runs (a filter lists them flat, not under their benchmark), grouped by workload,
    sorted by time to target; columns workload, framework, device, batch, time to target, samples/s, share
    of the ceiling, ``test_metrics``, energy with its scope, and cost; charts comparing the runs on those metrics (not energy:
    its scopes may differ), one chart per metric and time to target against cost, before MLflow's own sections (collapsed)."""
    metrics = [*HEADLINE_METRICS, *test_metrics[:MAX_TEST_METRICS], *COST_METRICS]
    section = "karman-headline"
    charts = [{"uuid": f"karman-bar-{key}", "type": "BAR", "metricKey": key, "displayName": key,
               "metricSectionId": section, "runsCountToCompare": 100, "deleted": False, "isGenerated": False}
              for key in metrics if key not in UNCHARTED]
    charts.insert(2, {"uuid": "karman-scatter-target-cost", "type": "SCATTER", "metricSectionId": section,
                      "xaxis": {"key": "time_to_target_s", "type": "METRIC"}, "yaxis": {"key": "cost", "type": "METRIC"},
                      "runsCountToCompare": 100, "deleted": False, "isGenerated": False})
    sections = [{"uuid": section, "name": "Benchmark", "display": True, "isReordered": False, "deleted": False,
                 "isGenerated": False}]
    sections += [{"uuid": f"karman-{name.split()[0].lower()}", "name": name, "display": False, "isReordered": False,
                  "deleted": False, "isGenerated": True} for name in ("Model metrics", "System metrics")]
    columns = [_column("tags", key) for key in HEADLINE_TAGS]
    for key in metrics:
        columns.append(_column("metrics", key))
        if key == "energy_j":
            columns.append(_column("params", ENERGY_SCOPE_PARAM))
    return {
        "searchFilter": TRAIN_FILTER, "orderByKey": _column("metrics", "time_to_target_s"), "orderByAsc": True,
        "selectedColumns": columns, "columnOrder": columns,
        "groupBy": {"aggregateFunction": "average", "groupByKeys": [{"mode": "tag", "groupByData": "karman.workload"}]},
        "groupsExpanded": {}, "useGroupedValuesInCharts": False, "hideEmptyCharts": True,
        "compareRunCharts": charts, "compareRunSections": sections, "isAccordionReordered": False,
    }


def _js(value) -> str:
    """``value`` as a JavaScript literal that cannot end the script it stands in."""
    return json.dumps(value).replace("<", "\\u003c")


def view_script(experiment_id: str, view: dict) -> str:
    """What the landing page runs for the experiment: its view stored where the UI reads it, unless the
    browser has one already; and the server's root (no page named after ``#``) opens the experiment's runs."""
    key = VIEW_STORAGE_KEY.format(ids=json.dumps([experiment_id]))
    return ("<script>try{var s=window.localStorage,k=%s;if(s.getItem(k)===null){s.setItem(k,%s)}}catch(e){}"
            "if(!window.location.hash){window.history.replaceState(null,'',%s)}</script>"
            % (_js(key), _js(json.dumps(view)), _js(f"#/experiments/{experiment_id}/runs")))


_MLFLOW_APP = "mlflow.server.fastapi_app:app"
_AUTH_APP = "mlflow.server.auth:create_app"  # what ``--app-name basic-auth`` names


def landing_page(html: str, view: str = "") -> str:
    """MLflow's ``index.html`` with the browser defaults set first thing in its head, then ``view`` (a
    :func:`view_script`, or nothing)."""
    if "<head>" not in html:
        raise RuntimeError("MLflow's index.html has no <head>: this MLflow version's landing page cannot take the defaults")
    return html.replace("<head>", "<head>" + DEFAULTS_SCRIPT + view, 1)


def experiment_view(store, name: str) -> tuple[str, dict] | None:
    """The id of the active experiment ``name`` in ``store`` (an MLflow tracking store) and its
    :func:`benchmark_view`, with the test scores its training runs logged (the newest 200); the view is
    saved on the experiment as :data:`VIEW_NAME` where it is not already. None where there is no such experiment."""
    from mlflow.entities import ExperimentTag, ViewType

    exp = store.get_experiment_by_name(name)
    if exp is None or exp.lifecycle_stage != "active":
        return None
    runs = store.search_runs([exp.experiment_id], TRAIN_FILTER, ViewType.ACTIVE_ONLY, max_results=200,
                             order_by=["attributes.start_time DESC"])
    tests = sorted({key for run in runs for key in run.data.metrics if key.startswith("test_") and "loss" not in key})
    view = benchmark_view(tests)
    state = json.dumps(view)
    saved = exp.tags.get(SAVED_VIEW_PREFIX + VIEW_ID)
    try:
        saved = json.loads(saved) if saved else {}
    except ValueError:
        saved = {}
    if saved.get("state") != state or saved.get("name") != VIEW_NAME:
        now = int(time.time() * 1000)
        envelope = {"name": VIEW_NAME, "createdAt": saved.get("createdAt", now), "updatedAt": now, "state": state}
        store.set_experiment_tag(exp.experiment_id, ExperimentTag(SAVED_VIEW_PREFIX + VIEW_ID, json.dumps(envelope)))
    return exp.experiment_id, view


def _serve_landing_page():
    """MLflow's Flask app, its landing page replaced by one that sets the browser defaults and opens the
    project's experiment on its benchmark view (:func:`experiment_view`, looked up at each request: the
    experiment may be created after the server starts)."""
    from flask import Response

    from mlflow.server import app as flask_app
    from mlflow.server.handlers import _get_tracking_store
    from tasks.common.config.settings import Settings

    index = Path(flask_app.static_folder) / "index.html"
    html = index.read_text(encoding="utf-8")
    name = Settings.from_env().experiment

    def serve():
        try:
            found = experiment_view(_get_tracking_store(), name)
        except Exception:  # the store cannot answer: the UI, which asks it too, will say so; the page still loads
            logging.getLogger(__name__).warning("no benchmark view of experiment %r", name, exc_info=True)
            found = None
        page = landing_page(html, view_script(*found) if found else "")
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
    from tasks.common.config.errors import UserError

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
