"""UCI HAR's signal processing on UCI HAPT's raw recordings (hapt.py): filters, the nine channels, 2.56 s windows, the split by person.

From 50 Hz accelerometer and gyroscope samples to the nine inertial-signal channels of UCI HAR's 2.56 s windows,
and the split by person.

As UCI HAR's README states it (Anguita et al., ESANN 2013): the sensor signals were pre-processed by noise filters
(a median filter and a 3rd-order low-pass Butterworth filter with a 20 Hz corner), then the acceleration was separated
into body and gravity by another low-pass Butterworth filter with a 0.3 Hz corner, and sampled in fixed-width sliding
windows of 2.56 s (128 samples) with 50 % overlap. Here, per recording and channel: a median filter of 3 samples,
then a 3rd-order Butterworth low-pass at 20 Hz, then for the acceleration a 3rd-order Butterworth low-pass at 0.3 Hz
for gravity; each Butterworth filter is run forwards and backwards (zero phase, scipy.signal.sosfiltfilt, so the
magnitude response is the filter's squared). total_acc = the noise-filtered acceleration (g), body_acc = total_acc less
gravity, body_gyro = the noise-filtered angular rate (rad/s). Windows start every 64 samples from a recording's first;
a window is kept where all its 128 labels are one of the six activities (HAPT's labels 1-6, UCI HAR's order), so that
windows crossing a postural transition (7-12) or an unlabelled stretch (-1) are dropped.
"""

import numpy as np

from tasks.workloads.har.windows import CHANNELS, ROLES, SAMPLE_HZ, STEPS

MEDIAN = 3  # samples
NOISE_HZ, GRAVITY_HZ, ORDER = 20.0, 0.3, 3
STRIDE = STEPS // 2  # 50 % overlap
TEST_VOLUNTEERS = (2, 4, 9, 10, 12, 13, 18, 20, 24)  # UCI HAR's test split (its subject_test.txt)
# Validation: 4 of UCI HAR's 21 training volunteers by a fixed rule stated before any training, every seventh volunteer
# (7, 14, 21, 28: none of them a test volunteer); the other 17 train.
VAL_VOLUNTEERS = (7, 14, 21, 28)
UCI_HAR_WINDOWS = {"train": 7352, "test": 2947}  # UCI HAR's published counts: train (21 volunteers) and test (9)
PARAMETERS = {"median_samples": MEDIAN, "noise_lowpass_hz": NOISE_HZ, "gravity_lowpass_hz": GRAVITY_HZ, "butterworth_order": ORDER,
              "zero_phase": True, "sample_hz": SAMPLE_HZ, "window": STEPS, "stride": STRIDE, "labels": "all 128 samples one of HAPT's 1-6"}


def _lowpass(signals: np.ndarray, corner_hz: float) -> np.ndarray:
    """``signals`` (T, C) through a zero-phase ORDER-th order Butterworth low-pass at ``corner_hz``, along time."""
    from scipy.signal import butter, sosfiltfilt

    sos = butter(ORDER, corner_hz, btype="low", fs=SAMPLE_HZ, output="sos")
    return sosfiltfilt(sos, signals, axis=0)


def denoise(signals: np.ndarray) -> np.ndarray:
    """(T, C) -> (T, C): a median filter of MEDIAN samples per channel, then the 20 Hz low-pass."""
    from scipy.signal import medfilt

    median = np.stack([medfilt(signals[:, c], MEDIAN) for c in range(signals.shape[1])], axis=1)
    return _lowpass(median, NOISE_HZ)


def inertial_signals(raw: np.ndarray) -> np.ndarray:
    """One recording's (T, 6) acc-x/y/z (g), gyro-x/y/z (rad/s) -> (T, 9) in CHANNELS' order: body acc, body gyro,
    total acc, each x/y/z."""
    clean = denoise(raw)
    total, gyro = clean[:, :3], clean[:, 3:]
    gravity = _lowpass(total, GRAVITY_HZ)
    return np.concatenate([total - gravity, gyro, total], axis=1)


def windows_of(signals: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(windows (n, 128, C), activities (n,) 0-5) of one recording's processed ``signals`` (T, C) and HAPT ``labels`` (T,):
    every window starting at a multiple of STRIDE whose labels are all one activity of 1-6."""
    starts = np.arange(0, len(labels) - STEPS + 1, STRIDE)
    if not len(starts):
        return np.zeros((0, STEPS, signals.shape[1]), np.float32), np.zeros(0, np.uint8)
    taken = labels[starts[:, None] + np.arange(STEPS)]  # (n, 128)
    keep = (taken == taken[:, :1]).all(axis=1) & (taken[:, 0] >= 1) & (taken[:, 0] <= 6)
    starts = starts[keep]
    windows = signals[starts[:, None] + np.arange(STEPS)]  # (n, 128, C)
    return windows.astype(np.float32), (taken[keep, 0] - 1).astype(np.uint8)


def build(recordings) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(windows (N, 128, 9) float32, activities (N,) uint8 0-5, volunteers (N,) uint8) of ``recordings`` (hapt.Recording),
    in their order."""
    parts = []
    for r in recordings:
        w, a = windows_of(inertial_signals(r.signals), r.labels)
        parts.append((w, a, np.full(len(a), r.volunteer, np.uint8)))
    return tuple(np.concatenate([p[i] for p in parts]) for i in range(3))  # type: ignore[return-value]


def person_split(volunteers: np.ndarray) -> dict[str, np.ndarray]:
    """Sorted volunteer numbers of each role: UCI HAR's test volunteers, VAL_VOLUNTEERS, and the rest for training."""
    present = np.unique(volunteers)
    test, val = np.intersect1d(present, TEST_VOLUNTEERS), np.intersect1d(present, VAL_VOLUNTEERS)
    split = {"train": np.setdiff1d(present, np.union1d(test, val)), "val": val, "test": test}
    return {role: split[role].astype(np.uint8) for role in ROLES}

