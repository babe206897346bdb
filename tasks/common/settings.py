"""Where things live: data root, MLflow tracking store, experiment. Resolved once from the environment."""

import os
import tempfile
from pathlib import Path

from pydantic import BaseModel, Field

from tasks.common.errors import UserError

DATA_ROOT_ENV = "KARMAN_DATA_ROOT"
EXPERIMENT_ENV = "KARMAN_EXPERIMENT"


class Settings(BaseModel):
    """Storage locations, passed explicitly from the flow entry to every task."""

    data_root: Path = Field(description="Root folder for datasets, checkpoints and reports")
    tracking_uri: str = Field(description="MLflow tracking URI")
    artifact_root: Path = Field(description="Artifact folder for experiments created on a local store")
    experiment: str = Field(description="MLflow experiment name")

    @classmethod
    def from_env(cls) -> "Settings":
        """Embedded defaults (./data, sqlite:///mlflow.db, ./mlartifacts), each overridable by environment."""
        return cls(
            data_root=Path(os.environ.get(DATA_ROOT_ENV, "data")).absolute(),
            tracking_uri=os.environ.get("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db"),
            artifact_root=Path(os.environ.get("KARMAN_ARTIFACT_ROOT", "mlartifacts")).absolute(),
            experiment=os.environ.get(EXPERIMENT_ENV, "karman-bench"),
        )

    def child_env(self) -> dict[str, str]:
        """Environment that makes a child process resolve the same settings."""
        return {
            DATA_ROOT_ENV: str(self.data_root),
            "MLFLOW_TRACKING_URI": self.tracking_uri,
            "KARMAN_ARTIFACT_ROOT": str(self.artifact_root),
            EXPERIMENT_ENV: self.experiment,
        }

    def require_writable(self) -> "Settings":
        """Raise UserError unless the data root exists or can be created, and takes files."""
        root = self.data_root
        try:
            root.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=root, prefix=".write-check-"):
                pass
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            raise UserError(f"data root {str(root)!r} is not writable ({reason}); set {DATA_ROOT_ENV} to a writable folder") from None
        return self

    def dataset_dir(self, name: str) -> Path:
        return self.data_root / "datasets" / name

    def run_dir(self, run_id: str) -> Path:
        return self.data_root / "runs" / run_id

    def report_dir(self, name: str) -> Path:
        return self.data_root / "reports" / name
