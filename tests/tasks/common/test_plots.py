"""The rollout animation: each frame is the figure a full drawing of that step gives, in one palette for all frames."""

import numpy as np
from PIL import Image

from tasks.common.reports.plots import _pyplot, rollout_animation, rollout_frame


def full_drawing(pred: np.ndarray, ref: np.ndarray, step: int, title: str) -> np.ndarray:
    """Step ``step``'s figure drawn whole (RGB)."""
    fig = rollout_frame(pred, ref, step, title)[0]
    fig.canvas.draw()
    image = np.asarray(fig.canvas.buffer_rgba())[..., :3].astype(int)
    _pyplot().close(fig)
    return image


def test_each_frame_is_the_full_drawing_of_its_step(tmp_path):
    steps, height, width = 7, 32, 64
    y, x = np.mgrid[0:height, 0:width]
    ref = np.stack([np.sin(x / 5 - t) * np.cos(y / 4) for t in range(steps)]).astype(np.float32)
    pred = ref + np.linspace(0.0, 0.6, steps)[:, None, None] * np.cos(x / 3)[None]  # the error grows step by step
    path = rollout_animation(pred, ref, tmp_path / "rollout.gif", "full x1 on re100")
    gif = Image.open(path)
    assert (gif.format, gif.n_frames, gif.info["duration"], gif.info["loop"]) == ("GIF", steps, 250, 0)
    for step in range(steps):
        gif.seek(step)
        frame = np.asarray(gif.convert("RGB")).astype(int)
        whole = full_drawing(pred, ref, step, "full x1 on re100")
        assert frame.shape == whole.shape
        differs = np.abs(frame - whole)
        # the shared palette's rounding only (27 at most here): a field of another step, a missing caption or field frame
        # differs by far more
        assert differs.max() <= 40 and differs.mean() < 3, (step, differs.max(), differs.mean())
        other = full_drawing(pred, ref, (step + 3) % steps, "full x1 on re100")
        assert (np.abs(frame - other).max(axis=-1) > 40).mean() > 0.02  # the check tells steps apart
