"""Typed records of a training run and of a rollout: the resolved configuration and the summary, as the child returns them, MLflow logs them and the report reads them.

One record is the truth about a run. The child writes it when the run starts (configuration only)
and when it ends (with the summary) as the run's ``record.json`` artifact; MLflow's params and
metrics are flat views of it, named as the runs of every earlier version named them, so the UI's
columns and filters keep working. Runs logged before records existed (params only) are read back
through :func:`TrainRecord.from_mlflow`.
"""

import json
import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tasks.common.config.errors import UserError
from tasks.common.specs import DEFAULT_WORKLOAD, InferSpec, TrainSpec

RECORD_FILE = "record.json"  # the run's record, an artifact at the root of its MLflow run
Scalar = str | int | float | bool | None


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TrainConfig(Record):
    """What a training run was, resolved on the host that ran it."""

    workload: str = Field(description="Workload name (tasks.workloads' table)")
    framework: str
    framework_version: str
    device: str = Field(description="Device kind: cpu, cuda or xla")
    device_name: str = Field(description="The device as the framework names it")
    world_size: int = Field(description="Devices the global batch is spread over")
    strategy: str = Field(description="How: single, ddp, spmd (torch) or a tf.distribute strategy")
    threads: int | None = Field(description="CPU threads per process (cpu runs)")
    batch_size: int = Field(description="Global batch size")
    dataset: str
    dataset_digest: str
    train_samples: int = Field(description="Training samples of one epoch")
    data_in_memory: bool
    split: dict[str, list[str]] = Field(description="Dataset items per role: train, val, test")
    host: str
    code_version: str
    spec: TrainSpec = Field(description="The request as resolved (a resumed run's own)")
    workload_params: dict[str, Scalar] = Field(default_factory=dict, description="The workload's own settings: network sizes, recipe")
    speed: dict[str, Any] = Field(default_factory=dict, description="Speed options in effect")

    @property
    def per_device_batch(self) -> int:
        return self.batch_size // self.world_size


class TrainSummary(Record):
    """How a finished training run went."""

    epochs: int
    steps: int
    warmup_s: float | None = Field(description="Seconds of the first steps of each process (tracing, compilation, warm-up)")
    time_per_epoch_s: float = Field(description="Median seconds of a whole epoch, the first left out when there are more; where none "
                                    "of those ran whole (a step limit or time budget), a whole epoch at their samples per second")
    samples_per_s: float = Field(description="An epoch's samples over time_per_epoch_s")
    train_time_s: float
    samples_seen: int
    final_losses: dict[str, float | None] = Field(description="The last epoch's mean of each loss (loss_l1, loss_d, ...)")
    target_reached: bool
    time_to_target_s: float | None = None
    epochs_to_target: int | None = None
    samples_to_target: int | None = None
    validation: dict[str, float | None] = Field(default_factory=dict, description="The last validation's scores")
    ended_by: Literal["epoch limit", "step limit", "time budget", "target reached", "?"] = Field(default="?", description="Why training ended")
    resumes: int = Field(default=0, description="Times the run was resumed from a checkpoint: a resumed run's clock stopped while it was "
                                                "down, so its time to target is no time-to-train (MLPerf's rule); the report leaves it out")


class Utilisation(Record):
    """How much of its devices a finished run used: the network's FLOPs at the run's speed, against
    what a matrix product reaches on the same devices, framework and dtype, and against the datasheet."""

    flops_per_sample: float = Field(description="Training FLOPs of one sample (forward and backward, a multiply-add counts 2), from the network's layer shapes")
    achieved_tflops: float = Field(description="flops_per_sample x samples_per_s / 1e12, over all the run's devices")
    dtype: str = Field(description="The matmul dtype of the ceiling and peak: fp32 or bf16, as the run trained")
    ceiling_tflops: float | None = Field(default=None, description="Warm matmul TFLOPS of the run's devices in its framework and dtype (bench-matmul's, else a quick one of this run)")
    ceiling_source: str | None = None
    peak_tflops: float | None = Field(default=None, description="Datasheet (GPU, TPU) or derived (CPU: cores x clock x FLOPs per cycle) peak of the run's devices")
    peak_source: str | None = None

    @property
    def of_ceiling(self) -> float | None:
        return self.achieved_tflops / self.ceiling_tflops if self.ceiling_tflops else None

    @property
    def of_peak(self) -> float | None:
        return self.achieved_tflops / self.peak_tflops if self.peak_tflops else None


def energy_params(source: str, price_per_device_hour: float, currency: str) -> dict[str, str]:
    """The MLflow params of a run's energy and cost: how its energy is measured (or why it is not), its price."""
    return {"energy_source": source, "price_per_device_hour": f"{price_per_device_hour!r}", "currency": currency}


ENERGY_SCOPES = {"nvml": "GPU board", "rapl": "CPU package"}  # the counter -> what its energy covers
NOT_MEASURED = "not measured"


class Energy(Record):
    """What a finished run's training took: energy from the devices' counters, device-hours, and their cost at the user's price."""

    joules: float | None = Field(description="Energy of the run's devices over training; None where no counter could be read (see source)")
    source: str = Field(description="The counter read ('nvml: ...', 'rapl: ...'), or 'unavailable: <the reason>'")
    samples: int | None = Field(default=None, description="Readings of the counter over training (the first included); None: a run "
                                "recorded before they were counted")
    devices: float = Field(description="Devices the run held: GPUs or TPU chips; on a CPU, the share of the host's cores it used")
    device_hours: float = Field(description="train_time_s x devices / 3600")
    price_per_device_hour: float = Field(description="From the user's price table (settings)")
    currency: str

    @property
    def scope(self) -> str:
        """What the energy covers: 'GPU board' (NVML: the whole board of each of the run's GPUs), 'CPU package' (RAPL: whole CPU
        packages, every process on the host) or 'not measured'. Energies of different scopes are never compared."""
        return ENERGY_SCOPES.get(self.source.split(":", 1)[0], NOT_MEASURED) if self.joules is not None else NOT_MEASURED

    @property
    def cost(self) -> float:
        return self.device_hours * self.price_per_device_hour

    def cost_of(self, seconds: float) -> float:
        """What ``seconds`` of the run's devices cost (e.g. its time to the quality target)."""
        return self.price_per_device_hour * self.devices * seconds / 3600

    def mlflow_params(self) -> dict[str, str]:
        return energy_params(self.source, self.price_per_device_hour, self.currency) | {"energy_scope": self.scope}

    def mlflow_metrics(self) -> dict[str, float]:
        return {"device_hours": self.device_hours, "cost": self.cost, **({"energy_j": self.joules} if self.joules is not None else {}),
                **({"energy_samples": self.samples} if self.samples is not None else {})}


class TrainRecord(Record):
    """A training run: configuration, and summary once it has finished."""

    version: Literal[1, 2] = 2  # 1: a run logged before records (params only), read back by from_mlflow
    config: TrainConfig
    summary: TrainSummary | None = None
    utilisation: Utilisation | None = None
    energy: Energy | None = None
    test: dict[str, float | None] = Field(default_factory=dict, description="Scores on the test split after training (workloads that score one, e.g. digits' accuracy)")

    def mlflow_params(self) -> dict[str, str]:
        """Flat MLflow params, under the names runs have always had (strings, as MLflow keeps them): the shared settings and the
        run's own workload's options, those set only (no other workload's options, no None)."""
        c = self.config
        spec = {k: v for k, v in c.spec.params().items() if k not in {"batch_sizes", "resume", "world_size", "strategy"}}
        values = {**spec, "workload": c.workload, "framework": c.framework, "framework_version": c.framework_version,
                  f"{c.framework}_version": c.framework_version, "device_name": c.device_name, "world_size": c.world_size,
                  "strategy": c.strategy, "cpu_threads": c.threads, "batch_size": c.batch_size, "per_device_batch": c.per_device_batch,
                  "dataset_digest": c.dataset_digest, "train_pairs": c.train_samples, "data_in_memory": c.data_in_memory,
                  "split": json.dumps(c.split), "host": c.host, "code_version": c.code_version, "speed": json.dumps(c.speed),
                  **c.workload_params}
        return {k: json.dumps(v) if isinstance(v, (list, dict)) else str(v) for k, v in values.items() if v is not None}

    def mlflow_metrics(self) -> dict[str, float]:
        """The summary's metrics (finite numbers only), under the names runs have always had."""
        s = self.summary
        if s is None:
            return {}
        values = {"epochs": s.epochs, "steps": s.steps, "warmup_s": s.warmup_s, "time_per_epoch_s": s.time_per_epoch_s,
                  "samples_per_s": s.samples_per_s, "train_time_s": s.train_time_s, "samples_seen": s.samples_seen,
                  "target_reached": float(s.target_reached), "time_to_target_s": s.time_to_target_s,
                  "epochs_to_target": s.epochs_to_target, "samples_to_target": s.samples_to_target,
                  **{"final_" + k.removeprefix("loss_"): v for k, v in s.final_losses.items()}}
        values |= {f"test_{k}": v for k, v in self.test.items()}
        if (u := self.utilisation) is not None:
            values |= {"flops_per_sample": u.flops_per_sample, "achieved_tflops": u.achieved_tflops, "ceiling_tflops": u.ceiling_tflops,
                       "peak_tflops": u.peak_tflops, "mfu_ceiling": u.of_ceiling, "mfu_peak": u.of_peak}
        if self.energy is not None:
            values |= self.energy.mlflow_metrics()
        return {k: float(v) for k, v in values.items() if v is not None and math.isfinite(float(v))}

    @classmethod
    def from_mlflow(cls, params: dict[str, str], metrics: dict[str, float], finished: bool) -> "TrainRecord":
        """The record of a run logged before records existed (version 1: params and metrics only)."""
        def value(name: str, default=None):
            return _param(params, name, default)

        from tasks.common.config.workload_table import options_model

        try:
            options = options_model(value("workload", DEFAULT_WORKLOAD)).model_fields  # the run's workload's, logged flat beside the shared
        except UserError:  # a workload this process's table does not know: its options are not told from the rest
            options = {}
        spec = _spec_from_params(TrainSpec, params, skip={"batch_sizes", "resume", "world_size", "strategy", "cell", "options"}, more=set(options))
        framework = value("framework", "torch")
        known = set(TrainSpec.model_fields) | set(options) | {"workload", "framework", "framework_version", f"{framework}_version", "device_name",
                                                "world_size", "strategy", "cpu_threads", "batch_size", "per_device_batch", "dataset_digest",
                                                "train_pairs", "data_in_memory", "split", "host", "code_version", "speed"}
        config = TrainConfig(
            workload=value("workload", DEFAULT_WORKLOAD), framework=framework, framework_version=value("framework_version", value(f"{framework}_version", "?")),
            device=spec.device, device_name=value("device_name", "?"), world_size=int(value("world_size", 1)), strategy=value("strategy", "?"),
            threads=int(value("cpu_threads")) if value("cpu_threads") else _threads_in(value("device_name", "")), batch_size=int(value("batch_size", 0)), dataset=spec.dataset,
            dataset_digest=value("dataset_digest", ""), train_samples=int(value("train_pairs", 0)),
            data_in_memory=value("data_in_memory", "False") == "True", split=json.loads(value("split", "{}")), host=value("host", "?"),
            code_version=value("code_version", "?"), spec=spec, workload_params={k: v for k, v in params.items() if k not in known},
            speed=json.loads(value("speed", "{}")))
        summary = None
        if finished and "time_per_epoch_s" in metrics:
            m = metrics
            batch = config.batch_size
            # runs of that version logged every epoch's samples/s under samples_per_s (MLflow shows the last): an epoch's
            # samples over the median epoch time is the run's value
            samples = (config.train_samples // batch) * batch / m["time_per_epoch_s"] if batch and config.train_samples else m.get("samples_per_s", math.nan)
            summary = TrainSummary(
                epochs=int(m.get("epochs", 0)), steps=int(m.get("steps", 0)), warmup_s=m.get("warmup_s"), time_per_epoch_s=m["time_per_epoch_s"],
                samples_per_s=samples, train_time_s=m.get("train_time_s", 0.0), samples_seen=int(m.get("samples_seen", 0)),
                final_losses={"loss_l1": m.get("final_l1")}, target_reached=m.get("target_reached") == 1.0,
                time_to_target_s=m.get("time_to_target_s"), epochs_to_target=_int_or_none(m.get("epochs_to_target")),
                samples_to_target=_int_or_none(m.get("samples_to_target")),
                validation={k.removeprefix("val_"): v for k, v in m.items() if k.startswith("val_")})
        return cls(version=1, config=config, summary=summary)


def _param(params: dict[str, str], name: str, default=None):
    """A version-1 run's param as MLflow kept it (a string), ``default`` where it is missing or was None."""
    text = params.get(name)
    return default if text is None or text == "None" else text


def _spec_from_params(model: type[BaseModel], params: dict[str, str], skip: set[str], more: set[str] = frozenset()):
    """The spec a version-1 run logged field by field as strings (lists and mappings as JSON), validated again; ``more``: the
    names of further fields the spec takes beside its own (a training spec's workload options)."""
    given = {name: _param(params, name) for name in [*model.model_fields, *more] if name not in skip}
    return model(**{name: json.loads(text) if text[:1] in "[{" else text for name, text in given.items() if text is not None})


def _int_or_none(value: float | None) -> int | None:
    return None if value is None else int(value)


def _threads_in(device_name: str) -> int | None:
    """The thread count a version-1 run wrote into its device name ('cpu (2 threads)')."""
    import re

    found = re.search(r"\((\d+) threads?\)", device_name)
    return int(found.group(1)) if found else None


class RolloutConfig(Record):
    """What a rollout was, resolved: the request, the model, the reference and the tiling."""

    workload: str = DEFAULT_WORKLOAD
    framework: str
    model_run: str
    spec: InferSpec
    device_name: str
    dataset: str
    simulation: str
    steps: int
    frame_stride: int
    tile: tuple[int, int]
    tiles: int
    regime: dict[str, Scalar] = Field(default_factory=dict, description="The reference simulation against the training range")


class RolloutSummary(Record):
    """How a finished rollout went: speed, accuracy against the solver and the verdict."""

    scores: dict[str, float | None] = Field(description="frames_per_s, latencies, errors, horizons, Strouhal numbers, the solver's speed ...")
    verdict: str
    solver: str


class RolloutRecord(Record):
    """A rollout: configuration, and summary once it has finished."""

    version: Literal[1, 2] = 2  # 1: a rollout logged before records (params only), read back by from_mlflow
    config: RolloutConfig
    summary: RolloutSummary | None = None

    @classmethod
    def from_mlflow(cls, params: dict[str, str], metrics: dict[str, float], tags: dict[str, str], finished: bool) -> "RolloutRecord":
        """The record of a rollout logged before records existed (version 1: params, metrics and tags only)."""
        from tasks.common.tracking.names import Tag

        def value(name: str, default=None):
            return _param(params, name, default)

        spec = _spec_from_params(InferSpec, params, skip={"cell"})
        tile = [int(x) for x in value("tile_shape", "0x0").split("x")]
        config = RolloutConfig(
            framework=tags.get(Tag.FRAMEWORK, "torch"), model_run=tags.get(Tag.MODEL_RUN, value("model_run_id", "")), spec=spec,
            device_name=value("device_name", "?"), dataset=value("rollout_dataset", spec.dataset or "?"),
            simulation=value("rollout_simulation", value("simulation", "?")), steps=int(value("rollout_steps", spec.steps)),
            frame_stride=int(value("frame_stride", 1)), tile=(tile[0], tile[-1]), tiles=int(value("tiles", 1)),
            regime={k: value(k) for k in ("reynolds", "regime") if value(k) is not None})
        summary = (RolloutSummary(scores=dict(metrics), verdict=value("verdict", ""), solver=value("solver_compared", "?"))
                   if finished and "frames_per_s" in metrics else None)
        return cls(version=1, config=config, summary=summary)
