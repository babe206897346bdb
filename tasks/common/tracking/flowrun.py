"""The Prefect flow run a process works for, as a flow process knows it (Prefect's context) and a child job learns it (the environment); no Prefect or MLflow import."""

import os
import sys

from pydantic import BaseModel, ConfigDict

from tasks.common.tracking.names import Tag

# How a child job learns the flow run it works for (it does not load Prefect): set by tasks.common.process.launch.
FLOW_RUN_ID_ENV = "KARMAN_FLOW_RUN_ID"
FLOW_RUN_URL_ENV = "KARMAN_FLOW_RUN_URL"
FLOW_RUN_NAME_ENV = "KARMAN_FLOW_RUN_NAME"


class FlowRunLink(BaseModel):
    """The Prefect flow run a process works for: its id, name and page in the Prefect UI (None where no
    server is configured: a command's temporary Prefect API has no UI, and is gone when it ends)."""

    model_config = ConfigDict(frozen=True)
    id: str
    name: str | None = None
    url: str | None = None

    def tags(self) -> dict[str, str]:
        return {Tag.FLOW_RUN_ID: self.id, **({Tag.FLOW_RUN_URL: self.url} if self.url else {})}

    def env(self) -> dict[str, str]:
        """The environment that names this flow run to a child process."""
        return {FLOW_RUN_ID_ENV: self.id, **({FLOW_RUN_URL_ENV: self.url} if self.url else {}), **({FLOW_RUN_NAME_ENV: self.name} if self.name else {})}

    def markdown(self) -> str:
        """One line for a run's description: a link to the flow run, or its id where there is no UI."""
        label = f"{self.name} ({self.id})" if self.name else self.id
        if self.url:
            return f"Prefect flow run: [{label}]({self.url})"
        return f"Prefect flow run: `{label}` (run on a command's temporary Prefect API, which has no UI; set PREFECT_API_URL to a server to get a link)"


def running_flow_run() -> FlowRunLink | None:
    """The flow run that this process runs (in the flow or one of its tasks), as Prefect's context
    says; None in a process that has not loaded Prefect (a child job) or outside any flow run."""
    if "prefect" not in sys.modules:
        return None
    from prefect.context import FlowRunContext, TaskRunContext
    from prefect.utilities.urls import url_for

    flow_ctx, task_ctx = FlowRunContext.get(), TaskRunContext.get()
    flow_run = flow_ctx.flow_run if flow_ctx else None
    run_id = flow_run.id if flow_run else (task_ctx.task_run.flow_run_id if task_ctx else None)
    if run_id is None:
        return None
    return FlowRunLink(id=str(run_id), name=flow_run.name if flow_run else None, url=url_for("flow-run", obj_id=run_id) or None)


def flow_run_link() -> FlowRunLink | None:
    """The Prefect flow run this process works for: in a flow process, the running flow run; in a child
    job, the one its parent named in the environment (tasks.common.process.launch sets it); else None."""
    link = running_flow_run()
    if link is None and os.environ.get(FLOW_RUN_ID_ENV):
        link = FlowRunLink(id=os.environ[FLOW_RUN_ID_ENV], name=os.environ.get(FLOW_RUN_NAME_ENV), url=os.environ.get(FLOW_RUN_URL_ENV))
    return link


def flow_run_env() -> dict[str, str]:
    """The environment that tells a child process which flow run it works for (empty outside one)."""
    link = flow_run_link()
    return link.env() if link else {}
