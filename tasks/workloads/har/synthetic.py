"""har's synthetic source: windows in UCI HAR's format drawn from a stated sensor model, and their split by subject.

The synthetic data: UCI HAR (30 volunteers, a waist-worn smartphone, six activities, 2.56 s
windows of 9 inertial channels at 50 Hz) is the format; the numbers come from the sensor model
below, drawn from a fixed seed, so every machine writes the same dataset with the same digest.

Sensor model (units: g for accelerations, rad/s for angular rates; body frame x up, y lateral, z forward):
  * gravity, seen by the sensor through the posture (standing and the walking classes upright,
    sitting tilted back by a subject's own 8-16 degrees, lying at about 90 degrees with a roll), the
    subject's fixed mounting offset (roll, pitch, yaw each about 7 degrees) and a small sway per window;
  * gait for the dynamic classes at a subject's cadence of 1.6-1.95 steps/s: upstairs 0.9x slower,
    downstairs 1.12x faster (1.45-2.2 Hz overall); vertical acceleration at the step frequency with
    2nd and 3rd harmonics (stairs up push harder, stairs down land harder: more harmonics), lateral
    sway at half the step frequency, forward surge, angular rates in step with them, and the trunk's
    pitch rocking the gravity vector;
  * per subject: per-axis gains (about 4 %), a gait amplitude scale, noise levels; per window: phases,
    amplitude and cadence jitter, white noise.
Sitting and standing differ only by the tilt, which the mounting offsets blur, so they overlap.
``body_acc`` is the total acceleration less gravity (as UCI's filter separates them); ``total_acc`` includes it.
"""

import numpy as np

from tasks.workloads.har.windows import CLASSES, ROLES, SAMPLE_HZ, STEPS, SUBJECTS

WINDOWS_PER_ACTIVITY = 16  # per subject: 30 x 6 x 16 = 2,880 windows
SPLIT = {"train": 21, "val": 4, "test": 5}  # subjects per role: no subject's windows in two roles
DATA_SEED = 20_240_702  # fixed: the dataset and its split are the dataset's, not a run's
SOURCE = ("synthetic: windows in UCI HAR's format (50 Hz, 128 samples x 9 channels, 6 activities, 30 subjects) "
          "drawn from a stated sensor model (gravity through posture and per-subject mounting, gait with harmonics, "
          "per-subject gains and noise); not the UCI HAR recordings")
SENSOR_MODEL = __doc__.split("Sensor model", 1)[1].strip()  # the manifest's copy


def _rotation(roll: np.ndarray, pitch: np.ndarray, yaw: np.ndarray) -> np.ndarray:
    """(..., 3, 3) rotations: about x (the vertical axis) by ``yaw``, y (lateral) by ``pitch``, z (forward) by ``roll``; radians."""
    def about(axis: int, angle: np.ndarray) -> np.ndarray:
        c, s = np.cos(angle), np.sin(angle)
        m = np.zeros(angle.shape + (3, 3))
        i, j = [k for k in range(3) if k != axis]
        m[..., axis, axis] = 1.0
        m[..., i, i], m[..., i, j], m[..., j, i], m[..., j, j] = c, -s, s, c
        return m
    return about(0, yaw) @ about(1, pitch) @ about(2, roll)


def synthesize(seed: int = DATA_SEED, per_activity: int = WINDOWS_PER_ACTIVITY, subjects: int = SUBJECTS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(windows (N, 128, 9) float32, activities (N,) uint8 0-5, subjects (N,) uint8 1-30) from the sensor
    model of the module's docstring; N = subjects x 6 x ``per_activity``, in (subject, activity, window) order."""
    rng = np.random.default_rng(seed)
    deg = np.pi / 180
    # per subject
    mount = rng.normal(0.0, 7 * deg, (subjects, 3))  # roll, pitch, yaw of the phone on the waist
    cadence = rng.uniform(1.6, 1.95, subjects)  # steps per second when walking
    gain = 1 + rng.normal(0.0, 0.04, (subjects, 6))  # accelerometer and gyroscope axes
    stride = rng.uniform(0.8, 1.2, subjects)  # gait amplitude
    noise_acc, noise_gyro = rng.uniform(0.008, 0.025, subjects), rng.uniform(0.01, 0.04, subjects)
    sit_tilt = rng.uniform(8, 16, subjects) * deg
    # per window
    subject = np.repeat(np.arange(subjects), CLASSES * per_activity)
    activity = np.tile(np.repeat(np.arange(CLASSES), per_activity), subjects)
    n = len(subject)
    t = np.arange(STEPS) / SAMPLE_HZ  # (T,)

    #                      walking upstairs downstairs sitting standing lying
    rate = np.array([1.0, 0.9, 1.12, 0, 0, 0])[activity] * cadence[subject] * rng.uniform(0.96, 1.04, n)  # Hz, 0 when still
    vertical = np.array([0.25, 0.32, 0.36, 0, 0, 0])[activity]
    harmonic2, harmonic3 = np.array([0.3, 0.25, 0.5, 0, 0, 0])[activity], np.array([0.1, 0.1, 0.3, 0, 0, 0])[activity]
    lean = np.array([0.0, 6.0, -4.0, 0, 0, 90.0])[activity] * deg
    pitch = lean + np.where(activity == 3, sit_tilt[subject], 0.0) + rng.normal(0, 3 * deg, n)
    roll = np.where(activity == 5, rng.normal(0, 20 * deg, n), rng.normal(0, 2 * deg, n))
    amplitude = stride[subject] * rng.uniform(0.9, 1.1, n)
    phase = rng.uniform(0, 2 * np.pi, (n, 4))

    step = 2 * np.pi * rate[:, None] * t  # (N, T): the step cycle
    a = amplitude[:, None]
    body = np.zeros((n, STEPS, 3))  # body frame: x up, y lateral, z forward
    body[..., 0] = a * vertical[:, None] * (np.sin(step + phase[:, :1]) + harmonic2[:, None] * np.sin(2 * (step + phase[:, :1]) + 0.6)
                                            + harmonic3[:, None] * np.sin(3 * (step + phase[:, :1]) + 1.3))
    body[..., 1] = a * 0.08 * (rate > 0)[:, None] * np.sin(step / 2 + phase[:, 1:2])
    body[..., 2] = a * 0.14 * (rate > 0)[:, None] * np.sin(step + phase[:, :1] + np.pi / 2)
    gyro = np.zeros((n, STEPS, 3))
    moving = (rate > 0)[:, None] * a
    gyro[..., 0] = moving * 0.2 * np.sin(step / 2 + phase[:, 1:2] + 0.4)  # yaw
    gyro[..., 1] = moving * np.array([0.3, 0.45, 0.5, 0, 0, 0])[activity][:, None] * np.sin(step + phase[:, :1] + 0.9)  # pitch
    gyro[..., 2] = moving * 0.15 * np.sin(step / 2 + phase[:, 1:2] + 2.0)  # roll
    # the still classes sway slowly
    still = (rate == 0)[:, None]
    sway = 2 * np.pi * rng.uniform(0.2, 0.5, n)[:, None] * t + phase[:, 2:3]
    body[..., 2] += still * 0.006 * np.sin(sway)
    gyro[..., 1] += still * 0.02 * np.sin(sway + 0.5)

    # gravity through the posture, the trunk's rocking and the mounting
    rocking = pitch[:, None] + moving * 2.5 * deg * np.sin(step + phase[:, 3:4])  # (N, T)
    posture = _rotation(np.broadcast_to(roll[:, None], rocking.shape), rocking, np.zeros_like(rocking))  # (N, T, 3, 3)
    gravity = posture[..., :, 0]  # (N, T, 3): the body-frame image of up, R @ [1, 0, 0]
    m = mount[subject]
    to_sensor = _rotation(m[:, 0], m[:, 1], m[:, 2])[:, None]  # (N, 1, 3, 3)
    body_acc = np.einsum("ntij,ntj->nti", to_sensor, body)
    g_sensor = np.einsum("ntij,ntj->nti", to_sensor, gravity)
    gyro_s = np.einsum("ntij,ntj->nti", to_sensor, gyro)

    g = gain[subject]  # (N, 6)
    body_acc = body_acc * g[:, None, :3] + rng.normal(0, 1, body_acc.shape) * noise_acc[subject][:, None, None]
    gyro_s = gyro_s * g[:, None, 3:] + rng.normal(0, 1, gyro_s.shape) * noise_gyro[subject][:, None, None]
    total = body_acc + g_sensor * g[:, None, :3]
    windows = np.concatenate([body_acc, gyro_s, total], axis=2).astype(np.float32)  # (N, 128, 9)
    return windows, activity.astype(np.uint8), (subject + 1).astype(np.uint8)


def subject_split(seed: int = DATA_SEED, subjects: int = SUBJECTS) -> dict[str, np.ndarray]:
    """Sorted subject numbers (1-based) of each role: a permutation from ``seed`` cut in SPLIT's sizes
    (scaled down for fewer subjects, at least one each)."""
    order = np.random.default_rng([seed, 1]).permutation(np.arange(1, subjects + 1))
    val = max(1, round(subjects * SPLIT["val"] / SUBJECTS))
    test = max(1, round(subjects * SPLIT["test"] / SUBJECTS))
    cut = {"train": order[: subjects - val - test], "val": order[subjects - val - test: subjects - test], "test": order[subjects - test:]}
    return {role: np.sort(cut[role]).astype(np.uint8) for role in ROLES}
