"""Where things live and what a device-hour costs: data root, MLflow tracking store, experiment, registered model, price table. Resolved once from the environment."""

import os
import tempfile
from pathlib import Path

from pydantic import BaseModel, Field, field_validator

from tasks.common.config.errors import UserError

DATA_ROOT_ENV = "KARMAN_DATA_ROOT"
EXPERIMENT_ENV = "KARMAN_EXPERIMENT"
PRICES_ENV = "KARMAN_PRICES"
CURRENCY_ENV = "KARMAN_CURRENCY"
REGISTERED_MODEL_ENV = "KARMAN_REGISTERED_MODEL"
CEILINGS_ENV = "KARMAN_CEILINGS_FILE"
CEILINGS_FILE = "ceilings.json"
# Illustrative prices per device-hour (one GPU, one TPU chip, or a whole CPU host), not anyone's offer:
# set KARMAN_PRICES and KARMAN_CURRENCY to what your devices cost.
DEFAULT_PRICES = "cpu=0.10,cuda=3.00,xla=1.50"
DEFAULT_CURRENCY = "USD"
DEVICE_KINDS = ("cpu", "cuda", "xla")


def parse_prices(text: str) -> dict[str, float]:
    """A price table ``cpu=0.10,cuda=3.00,xla=1.50`` (per device-hour) as {device: price}, devices left out
    at their default price; UserError names the entry that is not DEVICE=PRICE with a known device and a
    finite price of at least 0."""
    return _price_entries(DEFAULT_PRICES) | _price_entries(text)


def _price_entries(text: str) -> dict[str, float]:
    prices = {}
    for entry in filter(None, (part.strip() for part in text.split(","))):
        device, _, value = (part.strip() for part in entry.partition("="))
        try:
            price = float(value)
        except ValueError:
            price = float("nan")
        if device not in DEVICE_KINDS or not 0 <= price < float("inf"):
            raise UserError(f"{PRICES_ENV} entry {entry!r} is not DEVICE=PRICE with DEVICE one of {', '.join(DEVICE_KINDS)} "
                            f"and PRICE a number >= 0 per device-hour (e.g. {DEFAULT_PRICES})")
        prices[device] = price
    return prices


def data_root_from_env() -> Path:
    """The data root this process's environment names (``KARMAN_DATA_ROOT``, else ./data), absolute."""
    return Path(os.environ.get(DATA_ROOT_ENV, "data")).absolute()


def folders_to_make(path: Path) -> list[Path]:
    """``path`` and those of its parents that do not exist yet, deepest first: what making it creates."""
    return [p for p in (path, *path.parents) if not p.exists()]


def remove_if_empty(folders: list[Path]) -> None:
    """``folders`` (deepest first: what a command made for its data root) removed where they are still empty, as a
    refused command leaves them; only those, so a folder another command has made inside meanwhile keeps them."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:  # gone, or holding something
            pass


class Settings(BaseModel):
    """Storage locations, prices and the registered model's name, passed explicitly from the flow entry to every task."""

    data_root: Path = Field(description="Root folder for datasets, checkpoints and reports")
    tracking_uri: str = Field(description="MLflow tracking URI")
    artifact_root: Path = Field(description="Artifact folder for experiments created on a local store")
    experiment: str = Field(description="MLflow experiment name")
    prices: dict[str, float] = Field(default_factory=lambda: parse_prices(DEFAULT_PRICES),
                                     description="Price of one device-hour per device kind (cpu: the whole host; cuda: one GPU; xla: one chip)")
    currency: str = Field(default=DEFAULT_CURRENCY, min_length=1, max_length=12, description="Currency of the prices")
    registered_model: str = Field(default="karman-surrogate", min_length=1, description="MLflow registered-model name of the benchmark's champion surrogate")
    # A host's FLOP ceilings belong to the host, not to a data root: several data roots on one host (a team's, a test
    # session's folders) can share one cache, so that only the first training run of a (device, framework, dtype) measures
    ceilings_file: Path | None = Field(default=None, description="The cache of measured matmul ceilings; None: <data root>/ceilings.json")

    @field_validator("prices")
    @classmethod
    def _known_devices(cls, value: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(value) - set(DEVICE_KINDS))
        if unknown or any(not 0 <= v < float("inf") for v in value.values()):
            raise ValueError(f"prices must map {', '.join(DEVICE_KINDS)} to numbers >= 0, got {value}")
        return value

    @classmethod
    def from_env(cls) -> "Settings":
        """Embedded defaults (./data, sqlite:///mlflow.db, ./mlartifacts, the illustrative prices in USD,
        model karman-surrogate), each overridable by environment."""
        return cls(
            data_root=data_root_from_env(),
            tracking_uri=os.environ.get("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db"),
            artifact_root=Path(os.environ.get("KARMAN_ARTIFACT_ROOT", "mlartifacts")).absolute(),
            experiment=os.environ.get(EXPERIMENT_ENV, "karman-bench"),
            prices=parse_prices(os.environ.get(PRICES_ENV, DEFAULT_PRICES)),
            currency=os.environ.get(CURRENCY_ENV, "").strip() or DEFAULT_CURRENCY,
            registered_model=os.environ.get(REGISTERED_MODEL_ENV, "").strip() or "karman-surrogate",
            ceilings_file=Path(os.environ[CEILINGS_ENV]).absolute() if os.environ.get(CEILINGS_ENV, "").strip() else None,
        )

    def child_env(self) -> dict[str, str]:
        """Environment that makes a child process resolve the same settings."""
        return {
            DATA_ROOT_ENV: str(self.data_root),
            "MLFLOW_TRACKING_URI": self.tracking_uri,
            "KARMAN_ARTIFACT_ROOT": str(self.artifact_root),
            EXPERIMENT_ENV: self.experiment,
            PRICES_ENV: ",".join(f"{k}={v!r}" for k, v in self.prices.items()),
            CURRENCY_ENV: self.currency,
            REGISTERED_MODEL_ENV: self.registered_model,
            **({CEILINGS_ENV: str(self.ceilings_file)} if self.ceilings_file else {}),
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

    def ceilings_path(self) -> Path:
        """The ceilings cache this process reads and writes: ``ceilings_file`` where set, else the data root's."""
        return self.ceilings_file or self.data_root / CEILINGS_FILE

    def dataset_dir(self, name: str) -> Path:
        return self.data_root / "datasets" / name

    def run_dir(self, run_id: str) -> Path:
        return self.data_root / "runs" / run_id

    def report_dir(self, name: str) -> Path:
        return self.data_root / "reports" / name
