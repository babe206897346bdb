"""Figures written to files (matplotlib, Agg backend)."""

from pathlib import Path

import numpy as np


def _pyplot():
    """matplotlib's pyplot on the Agg backend, imported on the first figure: a command that draws none
    (a refused request, a planning parent) starts without it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _field(ax, data, title, vmax, cmap="RdBu_r"):
    im = ax.imshow(data, origin="lower", cmap=cmap, vmin=-vmax, vmax=vmax)
    ax.set_title(title, fontsize=8)
    ax.set_xticks([])
    ax.set_yticks([])
    return im


def vorticity_panels(pred: np.ndarray, ref: np.ndarray, labels: list[str], path: Path, title: str) -> Path:
    """Rows of (prediction, reference, difference) vorticity maps; pred/ref (N, H, W)."""
    plt = _pyplot()
    n = len(labels)
    fig, axes = plt.subplots(n, 3, figsize=(9, 1.6 * n + 0.6), squeeze=False)
    vmax = float(np.percentile(np.abs(ref), 99)) or 1.0
    for row in range(n):
        _field(axes[row, 0], pred[row], f"predicted {labels[row]}", vmax)
        _field(axes[row, 1], ref[row], f"reference {labels[row]}", vmax)
        _field(axes[row, 2], pred[row] - ref[row], "difference", vmax)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def profile_panels(panels: dict[str, tuple[str, dict[str, np.ndarray]]], path: Path, title: str) -> Path:
    """One panel per profile side by side: name -> (x-axis label, {curve label: values}), a log energy axis."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(3.4 * len(panels), 3.2), squeeze=False)
    for ax, (name, (xlabel, curves)) in zip(axes[0], panels.items()):
        for label, values in curves.items():
            ax.plot(np.arange(len(values)), values, marker="o", ms=2.5, lw=1, label=label)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("mean energy (GeV)")
        ax.set_yscale("log")
        ax.set_title(name, fontsize=8)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def error_curves(errors: dict[str, list[float]], threshold: float, path: Path, title: str) -> Path:
    """Relative L2 error per rollout step, one line per field."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, values in errors.items():
        ax.plot(np.arange(1, len(values) + 1), values, marker="o", ms=3, label=name)
    ax.axhline(threshold, color="k", ls="--", lw=0.8, label=f"threshold {threshold:g}")
    ax.set_xlabel("rollout step")
    ax.set_ylabel("relative L2 error")
    ax.set_yscale("log")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def bar_chart(labels: list[str], values: list[float], ylabel: str, path: Path, title: str) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(4, 0.8 * len(labels) + 2), 3.5))
    ax.bar(range(len(values)), values, color="tab:blue")
    ax.set_xticks(range(len(values)), labels, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def coefficient_history(time: np.ndarray, cd: np.ndarray, cl: np.ndarray, path: Path, title: str) -> Path:
    """Drag and lift coefficients over time: the whole run, and its last second."""
    plt = _pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(10, 5), sharex="col")
    late = time >= time[-1] - 1.0
    for col, sel in enumerate((slice(None), late)):
        axes[0, col].plot(time[sel], cd[sel], lw=0.8)
        axes[1, col].plot(time[sel], cl[sel], lw=0.8, color="C1")
        axes[1, col].set_xlabel("t [s]")
    axes[0, 0].set_ylabel("$c_D$")
    axes[1, 0].set_ylabel("$c_L$")
    axes[0, 0].set_title("whole run", fontsize=9)
    axes[0, 1].set_title("last second", fontsize=9)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def rollout_frame(pred: np.ndarray, ref: np.ndarray, step: int, title: str):
    """The rollout animation's figure at step ``step`` (0-based), laid out, not yet drawn: the figure, its three axes,
    their (prediction, reference, error) images and the caption."""
    plt = _pyplot()
    vmax = float(np.percentile(np.abs(ref), 99)) or 1.0
    height, width = ref.shape[1:]
    fig, axes = plt.subplots(3, 1, figsize=(6, 3 * 2 * height / width + 1.2), dpi=80)
    images = [_field(ax, data, label, vmax) for ax, data, label in
              zip(axes, (pred[step], ref[step], pred[step] - ref[step]), ("predicted", "reference", "error"))]
    caption = fig.suptitle(f"{title}: step {step + 1}", fontsize=9)
    fig.tight_layout()
    return fig, axes, images, caption


def rollout_animation(pred: np.ndarray, ref: np.ndarray, path: Path, title: str, fps: int = 4) -> Path:
    """A GIF of (prediction, reference, error) vorticity side by side, one frame per rollout step;
    pred/ref (N, H, W).

    The figure's axes, titles and colour scale are drawn once; each frame redraws only its three fields, their frames
    and the caption over that background (matplotlib's animation writer drew the whole figure three times a frame), and
    every frame takes one palette made from the first, middle and last frames (a GIF holds 256 colours a frame) instead
    of working out one of its own."""
    from PIL import Image

    plt = _pyplot()
    fig, axes, images, caption = rollout_frame(pred, ref, 0, title)
    canvas = fig.canvas
    changing = (*images, caption)
    for artist in changing:
        artist.set_visible(False)
    canvas.draw()
    background = canvas.copy_from_bbox(fig.bbox)
    for artist in changing:
        artist.set_visible(True)
    frames = []
    for i in range(len(ref)):
        canvas.restore_region(background)
        for ax, im, data in zip(axes, images, (pred[i], ref[i], pred[i] - ref[i])):
            im.set_data(data)
            ax.draw_artist(im)
            for spine in ax.spines.values():  # above the field, as in a full drawing
                ax.draw_artist(spine)
        caption.set_text(f"{title}: step {i + 1}")
        fig.draw_artist(caption)
        frames.append(Image.fromarray(np.asarray(canvas.buffer_rgba())[..., :3].copy()))
    plt.close(fig)
    sample = [frames[0], frames[len(frames) // 2], frames[-1]]
    strip = Image.new("RGB", (sample[0].width, sample[0].height * len(sample)))
    for k, frame in enumerate(sample):
        strip.paste(frame, (0, k * frame.height))
    palette = strip.quantize(256, method=Image.Quantize.FASTOCTREE)
    indexed = [frame.quantize(palette=palette, dither=Image.Dither.NONE) for frame in frames]
    indexed[0].save(path, save_all=True, append_images=indexed[1:], duration=int(1000 / fps), loop=0)
    return path
