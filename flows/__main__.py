import os
import sys

# No telemetry from the embedded Prefect server: these machines may have no internet at all.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

from flows.cli import main  # noqa: E402

sys.exit(main())
