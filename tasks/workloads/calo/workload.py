"""The calo workload, framework-neutral: its split, networks, scores, target, trainer and table entry.

Its synthetic dataset is dataset.py's. Training (CaloTrainer, with torch.py, tensorflow.py and jax.py) runs the published
four-tape GAN step through the one loop.
"""

import logging
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from models.calo import physics
from models.calo.nets import (ENERGY_SCALE, LEARNING_RATE, LOSS_WEIGHTS, POWER, PUBLISHED, NetConfig, parameter_counts, pool_cells,
                              train_flops_per_sample)
from models.schedule import lr_factor
from tasks.common.runtimes.data import epoch_order
from tasks.common.stores.datasets import check_batches
from tasks.common.config.settings import Settings
from tasks.common.specs import TrainSpec
from tasks.workloads import RunRules, Workload
from tasks.workloads.calo.dataset import DATA, manifest_of, check_generate, generate, load_checked, read_dataset

log = logging.getLogger("karman.calo")

ROLES = ("train", "val", "test")
# A fifth each for validation and test: the target compares mean profiles per energy bin, and with 200 held-out showers
# (a tenth of 2,000) two sets of real showers already differed by 9-17 % in some layer, the target's own size.
SPLIT_RULE = "event index i: i % 5 == 3 -> val, i % 5 == 4 -> test, the rest train"
FLIP_RATE = 0.05  # the published label noise: this fraction of the discriminator's real/fake labels flipped
CALIBRATION_BATCHES = 100  # batches whose batch-norm statistics the averaged generator takes (as many as momentum 0.99 weighs)
PROFILE_TOLERANCE, SAMPLING_TOLERANCE, LAYER_FLOOR = 0.10, 0.05, 0.01
TARGET = (f"per energy bin ({', '.join(f'{a:g}-{b:g}' for a, b in zip(physics.ENERGY_EDGES, physics.ENERGY_EDGES[1:]))} GeV, all angles): "
          f"the generated mean longitudinal profile within {PROFILE_TOLERANCE:.0%} of the validation data's in every layer holding "
          f"at least {LAYER_FLOOR:.0%} of the bin's energy, and the sampling fraction within {SAMPLING_TOLERANCE:.0%}")
CPU = NetConfig(latent=32, width=0.25, pool=3, energy_scaled=True, average=0.999, profile=100.0, schedule="cosine")  # the CPU configuration (2 cores, half an hour): the published layers on a grid 3x coarser across, a quarter of the channels, the output energy-scaled and averaged, a profile term, the rate falling along a cosine
HEADLINE = {"longitudinal_err": "longitudinal max error", "sampling_fraction_err": "sampling-fraction max error"}


def split_of(events: int) -> dict[str, np.ndarray]:
    """Event indices of each role by SPLIT_RULE (fixed: the dataset's, not the run's seed)."""
    k = np.arange(events) % 5
    return {"train": np.flatnonzero(k < 3), "val": np.flatnonzero(k == 3), "test": np.flatnonzero(k == 4)}


# Accelerators: the published layers, widths, latent and grid (the published parameter counts) with the CPU network's four
# departures. The published recipe alone diverged at that size on an H100 (after 10 steps at batch 128 the fake-image
# loss of the discriminator was 13,692 and the generated showers' longitudinal error 2,488: their energy sums were
# thousands of times off, and the percentage-error heads' losses with them).
ACCELERATOR = replace(PUBLISHED, energy_scaled=True, average=CPU.average, profile=CPU.profile, schedule=CPU.schedule)


def config_of(spec) -> NetConfig:
    """The networks' configuration of a run: CPU (quarter width, latent 32, coarse grid, energy-scaled, averaged, with the
    profile term) on cpu, ACCELERATOR (the published sizes with the same departures) elsewhere."""
    return CPU if spec.device == "cpu" else ACCELERATOR


def to_image(cells: np.ndarray) -> np.ndarray:
    """Cell energies (n, 51, 51, 25) GeV -> the discriminator's input (n, 51, 51, 25, 1), deposits^POWER."""
    return np.power(np.maximum(cells, 0.0), POWER, dtype=np.float32)[..., None]


def from_image(images: np.ndarray) -> np.ndarray:
    """The generator's output (n, 51, 51, 25, 1) -> cell energies (n, 51, 51, 25) GeV."""
    return np.power(np.maximum(images[..., 0], 0.0), 1.0 / POWER).astype(np.float32)


def latent_of(energy: np.ndarray, angle_rad: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """The generator's input (n, latent): energy / 100 GeV, angle in radians, then the noise (n, latent - 2)."""
    return np.concatenate([(energy / ENERGY_SCALE)[:, None], angle_rad[:, None], noise], axis=1).astype(np.float32)


def shower_scores(reference: dict[str, np.ndarray], generated: dict[str, np.ndarray]) -> dict[str, float]:
    """The target's scores of generated showers against reference ones (physics.shower_metrics of each, one
    angle bin): the largest relative error of the mean longitudinal profile over every energy bin and every
    layer holding at least LAYER_FLOOR of the bin's energy, the largest of the sampling fraction, the same
    for the transverse x and y profiles, and the mean relative error of the resolution."""
    err = physics.relative_errors(reference, generated, floor=LAYER_FLOOR)
    worst = lambda a: float(np.nanmax(np.abs(a))) if np.isfinite(a).any() else float("inf")  # noqa: E731
    return {"longitudinal_err": worst(err["longitudinal"]), "sampling_fraction_err": worst(err["sampling_fraction"]),
            "x_err": worst(err["x"]), "y_err": worst(err["y"]),
            "resolution_err": float(np.nanmean(np.abs(err["resolution"]))) if np.isfinite(err["resolution"]).any() else float("inf")}


def target_holds(scores: dict[str, float]) -> bool:
    return scores["longitudinal_err"] <= PROFILE_TOLERANCE and scores["sampling_fraction_err"] <= SAMPLING_TOLERANCE


@dataclass
class CaloData:
    """The three roles' cell energies (n, 51, 51, 25) GeV, primary energies (n,) GeV and angles (n,) degrees, in memory."""

    cells: dict[str, np.ndarray]
    energy: dict[str, np.ndarray]
    angle: dict[str, np.ndarray]
    split: dict[str, list[str]]
    dataset_digest: str
    sampling_fraction: float  # the training events' mean deposited / primary energy: the generator's energy-sum target
    in_memory: bool = True


def prepare(settings: Settings, spec: TrainSpec, main: bool = True) -> CaloData:
    dataset_dir = settings.dataset_dir(spec.dataset)
    manifest = load_checked(dataset_dir)
    cells, energy, angle = read_dataset(dataset_dir)
    parts = split_of(manifest["events"])
    data = CaloData({r: cells[parts[r]] for r in ROLES}, {r: energy[parts[r]] for r in ROLES}, {r: angle[parts[r]] for r in ROLES},
                    {r: [f"{len(parts[r])} of {manifest['events']} synthetic showers, {SPLIT_RULE}"] for r in ROLES}, manifest["digest"], 0.0)
    train_sum = data.cells["train"].sum(axis=(1, 2, 3), dtype=np.float64)
    data.sampling_fraction = float((train_sum / data.energy["train"]).mean())
    return data


def check(settings: Settings, spec: TrainSpec, batch_sizes: list[int], world: int, memory: int | None = None) -> None:
    """UserError for a batch the run cannot take: one that does not split over the devices, one larger than
    the training events."""
    events = manifest_of(settings.dataset_dir(spec.dataset))["events"]
    train = len(split_of(events)["train"])
    check_batches(batch_sizes, world, train, "showers", spec.dataset)


def dataset_info(settings: Settings, dataset: str) -> tuple[str, dict]:
    manifest = load_checked(settings.dataset_dir(dataset))
    return manifest["digest"], {"events": manifest["events"], "synthetic": True}


def setting(spec: TrainSpec) -> str:
    cfg = config_of(spec)
    return (f"3DGAN (published layers, width {cfg.width:g}, latent {cfg.latent}, {'x'.join(map(str, cfg.image))} cells), RMSprop lr {LEARNING_RATE:g} {cfg.schedule}, "
            f"loss weights {'/'.join(f'{w:g}' for w in LOSS_WEIGHTS.values())}, two generator updates per step")


class CaloTrainer:
    """What the torch and Keras trainers share: each step's batch with its randomness drawn in numpy (the
    generator's noise, the flipped labels), validation and test scores of generated showers, the target,
    the record's parameters and the final artifacts. A framework module supplies ``_device`` (the numpy
    batch -> its arrays), ``step``, ``generate_images`` (numpy latent -> numpy images, inference mode),
    ``weights`` (nets.py's layout, by network), ``state`` and ``load_state``; with a generator average,
    ``set_statistics`` (see calibrate) and ``self.calibrated = False`` after each step.

    A batch: ``image`` (b, 51, 51, 25, 1) real images (deposits^POWER); ``energy`` (b, 1) / 100 GeV;
    ``angle`` (b, 1) radians; ``ecal`` (b, 1) the real deposits' sum; ``ecal_fit`` (b, 1) the sum the
    generated showers aim at (energy x the training events' sampling fraction); ``latent`` (3, b, latent):
    the generator's inputs of the discriminator's fake pass and of the two generator updates; ``real_label``
    and ``fake_label`` (b, 1): 1 and 0 with FLIP_RATE of them flipped."""

    framework = "?"

    def __init__(self, data: CaloData, spec, batch_size: int, cfg: NetConfig | None = None, rank: int = 0, world: int = 1):
        self.data, self.spec, self.batch_size, self.rank, self.world = data, spec, batch_size, rank, world
        self.cfg = cfg or config_of(spec)
        self.samples = len(data.energy["train"])
        self.cells = {role: pool_cells(c, self.cfg.pool) for role, c in data.cells.items()}  # on the networks' grid
        self.has_validation = True
        self.headline = HEADLINE
        self.flops_per_sample = train_flops_per_sample(self.cfg)
        counts = parameter_counts(self.cfg)
        self.params = {"network": f"3DGAN width {self.cfg.width:g} latent {self.cfg.latent} grid {'x'.join(map(str, self.cfg.image))}", "generator_parameters": counts["generator"]["trainable"],
                       "discriminator_parameters": counts["discriminator"]["trainable"], "optimizer": "RMSprop (rho 0.9, epsilon 1e-7)",
                       "learning_rate": LEARNING_RATE, "loss_weights": "/".join(f"{k} {w:g}" for k, w in LOSS_WEIGHTS.items()),
                       "generator_updates_per_step": 2, "label_flip_rate": FLIP_RATE, "target": TARGET, "split": SPLIT_RULE,
                       "flops_per_sample": self.flops_per_sample, "energy_scaled": self.cfg.energy_scaled, "generator_average": self.cfg.average,
                       "profile_weight": self.cfg.profile, "learning_rate_schedule": self.cfg.schedule}
        self.speed = {}
        self.rate = LEARNING_RATE
        self._reference: dict[str, dict] = {}
        self.calibrated = False
        self.calibration_batches = CALIBRATION_BATCHES
        self._calibration: list[np.ndarray] | None = None
        self._images: tuple[np.ndarray, np.ndarray] | None = None

    def calibration_latents(self) -> list[np.ndarray]:
        """``calibration_batches`` generator inputs of this rank's share of a training batch: training events' conditions
        and noise drawn from (seed, 32) only, so every rank and every call takes the same."""
        if self._calibration is None:
            rng = np.random.default_rng([self.spec.seed, 32])
            local = max(1, self.batch_size // self.world)
            energy, angle = self.data.energy["train"].astype(np.float64), np.radians(self.data.angle["train"].astype(np.float64))
            self._calibration = []
            for _ in range(self.calibration_batches):
                take = rng.integers(0, len(energy), local)
                self._calibration.append(latent_of(energy[take], angle[take], rng.standard_normal((local, self.cfg.latent - 2))))
        return self._calibration

    def calibrate(self) -> None:
        """The averaged generator's batch-norm statistics taken afresh, before it generates: the mean over
        calibration_latents of each batch's moments in training mode, which the live generator's moving statistics
        approximate for the live weights only (copied to the average, they left its sampling fraction 14-18 % low).
        A no-op without an average or when nothing has stepped since the last call."""
        if self.cfg.average and not self.calibrated:
            self.set_statistics(self.calibration_latents())
            self.calibrated = True

    def set_statistics(self, latents: list[np.ndarray]) -> None:
        raise NotImplementedError

    def batch_of(self, take: np.ndarray, rng: np.random.Generator, part: slice = slice(None)) -> dict[str, np.ndarray]:
        """The numpy batch of training events ``take`` with the step's randomness from ``rng`` (see the class), or
        of its ``part`` (a rank's share): the randomness is drawn for the whole batch, so the ranks' shares differ and
        together are the one-device batch."""
        noise = rng.standard_normal((3, len(take), self.cfg.latent - 2))[:, part]
        flips = (rng.random((2, len(take))) < FLIP_RATE)[:, part]
        take = take[part]
        images, sums = self._training_images()
        energy = self.data.energy["train"][take].astype(np.float64)
        angle = np.radians(self.data.angle["train"][take].astype(np.float64))
        col = lambda v: np.asarray(v, np.float32)[:, None]  # noqa: E731
        return {"image": images[take], "energy": col(energy / ENERGY_SCALE), "angle": col(angle),
                "ecal": col(sums[take]), "ecal_fit": col(energy * self.data.sampling_fraction),
                "latent": np.stack([latent_of(energy, angle, n) for n in noise]),
                "real_label": col(np.where(flips[0], 0.0, 1.0)), "fake_label": col(np.where(flips[1], 1.0, 0.0))}

    def _training_images(self) -> tuple[np.ndarray, np.ndarray]:
        """The training events as the discriminator's inputs (to_image) and their deposits' sums, computed once: a
        batch gathers its rows (the power of every cell, redone per step, had been a tenth of a GPU step)."""
        if self._images is None:
            cells = self.cells["train"]
            self._images = (to_image(cells), cells.sum(axis=(1, 2, 3), dtype=np.float64))
        return self._images

    def _device(self, batch: dict[str, np.ndarray]):
        return batch

    def batches(self, epoch: int, steps: int):
        """This rank's share of each step's global batch, in the epoch's order, with randomness of (seed, epoch, step) only."""
        b, local = self.batch_size, self.batch_size // self.world
        order = epoch_order(self.samples, self.spec.seed, epoch)  # the same on every rank
        mine = slice(self.rank * local, (self.rank + 1) * local)
        for s in range(steps):
            yield self._device(self.batch_of(order[s * b: (s + 1) * b], np.random.default_rng([self.spec.seed, epoch, s, 30]), mine))

    def rate_at(self, progress: float) -> float:
        """Both networks' learning rate at ``progress`` (0 to 1) of the run, by the configuration's schedule; also learning_rate's value from then on."""
        self.rate = LEARNING_RATE * lr_factor(self.cfg.schedule, progress)
        return self.rate

    def learning_rate(self) -> float:
        return self.rate

    def epoch_metrics(self) -> dict[str, float]:
        return {}

    def generate_images(self, latent: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def weights(self) -> dict[str, dict[str, np.ndarray]]:
        raise NotImplementedError

    def generate(self, role: str, chunk: int = 50) -> np.ndarray:
        """Generated cell energies (n, 51, 51, 25) GeV (on the networks' grid) for the conditions of ``role``'s events (fixed noise)."""
        energy, angle = self.data.energy[role].astype(np.float64), np.radians(self.data.angle[role].astype(np.float64))
        noise = np.random.default_rng([self.spec.seed, 31]).standard_normal((len(energy), self.cfg.latent - 2))
        latent = latent_of(energy, angle, noise)
        self.calibrate()
        return np.concatenate([from_image(self.generate_images(latent[i: i + chunk])) for i in range(0, len(latent), chunk)])

    def _metrics(self, role: str, cells: np.ndarray) -> dict[str, np.ndarray]:
        return physics.shower_metrics(cells, self.data.energy[role], self.data.angle[role], angle_edges=(physics.ANGLE_EDGES[0], physics.ANGLE_EDGES[-1]))

    def score(self, role: str) -> tuple[dict[str, float], np.ndarray]:
        """The role's scores (shower_scores) and its generated showers."""
        if role not in self._reference:
            self._reference[role] = self._metrics(role, self.cells[role])
        generated = self.generate(role)
        return shower_scores(self._reference[role], self._metrics(role, generated)), generated

    def evaluate(self) -> dict[str, float]:
        return self.score("val")[0]

    def reached(self, scores: dict[str, float]) -> bool:
        return target_holds(scores)

    def finish(self, run_dir: Path, run, settings) -> dict[str, float]:
        """The generator's weights (npz, nets.py's layout) as the run's model and a figure of the test split's
        profiles, data against generated; returns the test split's scores."""
        scores, generated = self.score("test")  # (generating calibrated the average: the saved weights carry its statistics)
        model_dir = run_dir / "model"
        model_dir.mkdir(exist_ok=True)
        np.savez(model_dir / "generator.npz", **{k.replace("/", "__"): v for k, v in self.weights()["generator"].items()})
        run.log_artifact(model_dir, "model")
        figure = profile_figure(self.cells["test"], generated, run_dir / "shower_profiles.png",
                                f"calo {self.framework}: test split, {len(generated)} synthetic showers against generated ones")
        run.log_artifact(figure)
        log.info("test split: longitudinal max error %.3f, sampling-fraction max error %.3f", scores["longitudinal_err"], scores["sampling_fraction_err"])
        return scores


def profile_figure(data: np.ndarray, generated: np.ndarray, path: Path, title: str) -> Path:
    """Mean longitudinal, x and y profiles (GeV per layer / column / row) of two sets of showers."""
    from tasks.common.reports.plots import profile_panels

    panels = {}
    for name, axis_sum, label in (("longitudinal", (1, 2), "layer"), ("transverse x", (2, 3), "x cell"), ("transverse y", (1, 3), "y cell")):
        panels[name] = (label, {"data (synthetic)": data.sum(axis=axis_sum).mean(0), "generated": generated.sum(axis=axis_sum).mean(0)})
    return profile_panels(panels, path, title)


WORKLOAD = Workload(
    name="calo",
    title="3-D convolutional GAN of calorimeter showers",
    data=DATA,
    frameworks=("torch", "tensorflow", "jax"),
    main_loss="loss_g",
    target=TARGET,
    prepare=prepare,
    check=check,
    dataset_info=dataset_info,
    setting=setting,
    dataset="calo",
    batch_sizes=(64,),
    epochs=30,
    generate=generate,
    check_generate=check_generate,
    rules=RunRules(runs=5, failures=1, max_runtime_s=3600.0),
    quick={"generate": {"events": 400}},  # a quick benchmark's calo cells train on 400 showers (dataset calo-events400)
)
