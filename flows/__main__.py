"""Entry of ``python -m flows``: the bench-… commands and compare-datasets load only the compute stack, the others the pipeline's CLI."""

import gc
import logging
import os
import sys

# No telemetry from the embedded Prefect server, nor MLflow's usage reports from this command and its jobs (MLflow 3 sends
# them unless told not to): these machines may have no internet at all. MLFLOW_DISABLE_TELEMETRY=false sends them.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
# The embedded server starts in seconds on an idle host but can take longer than Prefect's default wait when
# training or tests hold every core: a command should wait for it, not fail.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
# MLflow's database set-up chatter is not the user's business on the command line.
os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")

# A command refused before its flow starts exits while Prefect's background tasks are still pending; asyncio
# then reports each destroyed task on stderr, which would break the one-line error. Nothing is lost by it.
logging.getLogger("asyncio").setLevel(logging.CRITICAL)

if len(sys.argv) > 1 and (sys.argv[1].startswith("bench-") or sys.argv[1] == "compare-datasets"):
    from flows.bench import main  # noqa: E402  (no Prefect or MLflow on this path)
else:
    from flows.cli import main  # noqa: E402

# What the command loaded stays alive until the interpreter ends, which walks it with the cycle collector a few times as it
# tears the modules down: about 2 s of a full CPU after the command's last line. Frozen, those walks skip it (0.1 s); objects
# are still freed by their reference counts and the atexit handlers (Prefect's, MLflow's, the temporary server's stop) run
# as before (docs/architecture.md).
try:
    code = main()
finally:
    gc.freeze()
sys.exit(code)
