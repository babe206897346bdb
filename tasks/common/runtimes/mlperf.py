"""A training run's MLPerf-format log (MLCommons' mllog ``:::MLLOG`` lines) and the check of it by MLCommons' own compliance checker.

What the log holds, as MLPerf's training rules name it: the submission's keys (division ``open``: our workloads are
not MLPerf's benchmarks and follow no closed-division recipe; the benchmark is the workload's name, the platform the
device), ``cache_clear`` (False: no run drops the host's caches), ``init_start`` and ``init_stop`` around the data and
the networks' set-up, then ``run_start``; per epoch ``epoch_start`` and ``epoch_stop`` and, where the epoch validated,
``eval_start``, ``eval_stop`` and ``eval_accuracy`` (the workload's first validation score, named in the metadata: an
accuracy, or an error where the workload's target is one); ``run_stop`` with status ``success`` when the quality target
was reached, else ``aborted``. Times are the loop's: an epoch starts where the last record ended and stops its epoch
time later; its validation runs from there to the record.

The compliance checker (``mlperf_logging.compliance_checker``) runs on the rules of training 4.1.0 that apply to a
benchmark outside MLPerf's list: its common rules (the order of init, run, epoch and eval events, required keys, the
30-minute init limit of the closed division... open: 4 hours), without the division's file they enqueue, which names
MLPerf's own benchmarks and each one's hyper-parameter rules (``closed_<benchmark>.yaml``).
"""

import logging
import tempfile
import time
from pathlib import Path

RULESET = "4.1.0"
LOG_FILE = "mllog.txt"
ORG = "Kármán Bench"


def _now_ms() -> float:
    return time.time() * 1000.0


class MLPerfLog:
    """One run's ``:::MLLOG`` file, written as the run goes (rank 0); also the loop's Recorder around another one."""

    def __init__(self, path: Path, inner=None):
        from mlperf_logging.mllog.mllog import MLLogger

        self.path, self.inner = Path(path), inner
        self._logger = logging.getLogger(f"karman.mllog.{id(self)}")
        self._logger.propagate = False
        self._logger.setLevel(logging.INFO)
        self._handler = logging.FileHandler(self.path, mode="a", encoding="utf-8")
        self._logger.addHandler(self._handler)
        self.mllog = MLLogger(logger=self._logger, default_stack_offset=2)
        self._mark = _now_ms()
        self.score: str | None = None

    def _event(self, key: str, value=None, metadata: dict | None = None, time_ms: float | None = None) -> None:
        self.mllog.event(key, value, metadata=metadata, time_ms=time_ms)

    def init_start(self) -> None:
        self._event("cache_clear", False)
        self.mllog.start("init_start", None)

    def run_start(self, workload: str, framework: str, device_name: str, batch_size: int, seed: int, train_samples: int,
                  eval_samples: str, learning_rate: float, score: str | None) -> None:
        """The submission's keys and the hyper-parameters every MLPerf log names, then ``init_stop`` and ``run_start``."""
        for key, value in (("submission_org", ORG), ("submission_platform", f"{device_name} ({framework})"), ("submission_division", "open"),
                           ("submission_status", "research"), ("submission_benchmark", workload), ("global_batch_size", batch_size),
                           ("gradient_accumulation_steps", 1), ("seed", seed), ("train_samples", train_samples), ("eval_samples", eval_samples),
                           ("opt_base_learning_rate", learning_rate)):
            self._event(key, value)
        self.score = score
        self.mllog.end("init_stop", None)
        self.mllog.start("run_start", None)
        self._mark = _now_ms()

    # the loop's Recorder
    def steps(self, rows) -> None:
        if self.inner is not None:
            self.inner.steps(rows)

    def epoch(self, epoch: int, metrics: dict[str, float]) -> None:
        if self.inner is not None:
            self.inner.epoch(epoch, metrics)
        now = _now_ms()
        start = self._mark
        stop = min(now, start + 1000.0 * metrics.get("epoch_time_s", 0.0))
        meta = {"epoch_num": epoch}
        self.mllog.start("epoch_start", None, metadata=meta, time_ms=start)
        self.mllog.end("epoch_stop", None, metadata=meta, time_ms=stop)
        if self.score is not None and f"val_{self.score}" in metrics:
            self.mllog.start("eval_start", None, metadata=meta, time_ms=stop)
            self.mllog.end("eval_stop", None, metadata=meta, time_ms=now)
            self._event("eval_accuracy", float(metrics[f"val_{self.score}"]), metadata={**meta, "metric": self.score}, time_ms=now)
        self._mark = now

    def run_stop(self, reached: bool, epochs: int) -> None:
        self.mllog.end("run_stop", None, metadata={"status": "success" if reached else "aborted", "epoch_num": epochs})

    def close(self) -> None:
        self._logger.removeHandler(self._handler)
        self._handler.close()


class _CheckerRecords(logging.Filter):
    """Drops the records the compliance checker logs on the root logger (the files it reads, each rule it finds broken),
    which a job's log would otherwise show line by line; records of the project's own loggers reach the root's handlers
    without passing the root logger's filters, and stay."""

    def __init__(self, package: Path):
        super().__init__()
        self.package = str(package)

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.pathname.startswith(self.package)


def compliance(path: Path) -> list[str]:
    """MLCommons' compliance checker on a log, with the rules of training RULESET that apply outside MLPerf's list of
    benchmarks (see the module); the messages of the rules it breaks, [] when it passes."""
    import yaml
    from mlperf_logging.compliance_checker import mlp_compliance

    rules = yaml.safe_load((Path(mlp_compliance.__file__).parent / f"training_{RULESET}" / "common.yaml").read_text())
    for rule in rules:  # the division's rule keeps its check and its init-time limit, not the enqueued closed/open file
        key = rule.get("KEY", {})
        if key.get("NAME") == "submission_division":
            key["POST"] = " s['compile_time_mins'] = 240 if v['value'] == 'open' else 30 "
    checker = mlp_compliance.ComplianceChecker("training", RULESET, quiet=True, werror=False)
    own = _CheckerRecords(Path(mlp_compliance.__file__).parent)
    logging.root.addFilter(own)  # the checker reports on the root logger, quiet or not: its verdict is what this returns
    try:
        with tempfile.TemporaryDirectory() as folder:
            config = Path(folder) / "common.yaml"
            config.write_text(yaml.safe_dump(rules, sort_keys=False))
            checker.check_file(str(path), str(config))
    finally:
        logging.root.removeFilter(own)
    return [str(m) for m in getattr(checker, "overwritable", {}).values()] + [str(m) for m in getattr(checker, "not_overwritable", [])]
