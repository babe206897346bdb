"""A workload's own dataset written once into the store: the writer lock, --overwrite, the remains of an interrupted write, and its MLflow generate run."""

import shutil
import time
from pathlib import Path
from typing import Callable, TypeVar

from tasks.common.config.errors import UserError
from tasks.common.tracking.names import Tag
from tasks.common.stores.store import MANIFEST, writer_lock

T = TypeVar("T")


def read_checked(dataset_dir: Path, workload: str, read: Callable[[], tuple[T, bool]]) -> T:
    """What ``read()`` reads of ``workload``'s dataset in ``dataset_dir``, where it says (its second value) that the content
    matches the manifest's digests; UserError naming the dataset and how to write it again where it does not, or where
    the store does not read at all."""
    try:
        content, matches = read()
        problem = None if matches else "its content does not match its digest"
    except Exception as exc:  # zarr and numpy raise many kinds for missing or truncated chunks
        problem = f"its store does not read ({type(exc).__name__})"
    if problem:
        raise UserError(f"dataset {dataset_dir.name!r} is damaged: {problem}; write it again with "
                        f"'python -m flows generate --workload {workload} --dataset {dataset_dir.name} --overwrite'")
    return content


def refuse_damaged(load_checked: Callable[[Path], object]) -> Callable:
    """A workload's ``check_generate`` (settings, spec) for a dataset it writes whole: UserError where one of that name
    exists, is not to be overwritten, and ``load_checked`` (dataset folder) refuses it (damaged, or another workload's)."""
    def check_generate(settings, spec) -> None:
        dataset_dir = settings.dataset_dir(spec.dataset)
        if not spec.overwrite and (dataset_dir / MANIFEST).is_file():
            load_checked(dataset_dir)
    return check_generate


def check_batches(batch_sizes: list[int], world: int, train: int, what: str, dataset: str) -> None:
    """UserError for a global batch size that does not split evenly over ``world`` devices or exceeds the ``train``
    training samples (``what``: 'images', 'showers', ...) of ``dataset``."""
    for b in batch_sizes:
        if b % world:
            raise UserError(f"batch size {b} does not split evenly over {world} devices; use a multiple of {world}")
        if b > train:
            raise UserError(f"batch size {b} exceeds the {train} training {what} of dataset {dataset!r}; use at most {train}")


def write_once(settings, spec, check_generate: Callable, write: Callable, load: Callable) -> tuple[dict, bool, float]:
    """Under the dataset's writer lock: remove it first for ``spec.overwrite``; refuse what ``check_generate``
    (settings, spec) refuses; ``write`` (dataset folder) it when it has no manifest, removing what an
    interrupted write left; then ``load`` (dataset folder) its checked manifest. Returns (manifest, whether it
    was written now, seconds)."""
    dataset_dir = settings.dataset_dir(spec.dataset)
    with writer_lock(dataset_dir, f"dataset {spec.dataset!r}"):
        if spec.overwrite and dataset_dir.exists():
            shutil.rmtree(dataset_dir)
        check_generate(settings, spec)
        written = not (dataset_dir / MANIFEST).is_file()
        t0 = time.perf_counter()
        if written:
            if dataset_dir.exists():  # an interrupted write left a store without its manifest
                shutil.rmtree(dataset_dir)
            write(dataset_dir)
        manifest = load(dataset_dir)
        return manifest, written, time.perf_counter() - t0


def record_generate(settings, spec, manifest: dict, written: bool, wall: float, count: tuple[str, int], params: dict,
                    description: str, parent_run_id: str | None) -> dict:
    """The dataset's MLflow ``generate`` run (its parameters, wall time, tags and the dataset logged); returns the
    dataset summary the pipeline passes on. ``count`` is what the dataset holds, e.g. ("images", 5000)."""
    from tasks.common.tracking.runs import mlflow_run

    dataset_dir = settings.dataset_dir(spec.dataset)
    noun, number = count
    with mlflow_run(settings, "generate", f"generate-{spec.dataset}", params=params, parent_run_id=parent_run_id, description=description) as run:
        run.log_metrics({"wall_s": wall, noun: number, "written_now": float(written)})
        run.set_tags({Tag.DATASET: spec.dataset, Tag.DATASET_DIGEST: manifest["digest"]})
        run.log_dataset(spec.dataset, manifest["digest"], dataset_dir, "generated", {noun: number})
    return {"dataset": spec.dataset, "path": str(dataset_dir), "digest": manifest["digest"], noun: number, "written": written, "run_id": run.run_id}
