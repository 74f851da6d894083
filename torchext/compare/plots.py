"""The plots of a results.json: loss and accuracy curves, confusion matrices, speed and peak memory (matplotlib's
object API, no pyplot state)."""

from __future__ import annotations

import os

import numpy as np

from .config import MODEL_NAMES
from .report import _pm, _summary_seeds, _timed_text, summarize

_COLORS = {"stock": "#4c72b0", "torchext": "#dd8452"}


def _curve(results: dict, name: str, key: str):
    """(epochs, mean, min, max) over seeds of a per-epoch figure; where a seed was cut short (an interrupted run), each
    epoch's figures are over the seeds that reached it."""
    runs = [[e[key] for e in s["models"][name]["epochs"]] for s in results["seeds"] if s["models"]]
    rows = np.full((len(runs), max(map(len, runs))), np.nan)
    for i, run_ in enumerate(runs):
        rows[i, : len(run_)] = run_
    return np.arange(1, rows.shape[1] + 1), np.nanmean(rows, 0), np.nanmin(rows, 0), np.nanmax(rows, 0)


def _seeds_text(results: dict) -> str:
    """The training seeds a curve is over: 'training seed 0' or 'training seeds 0, 1, 2: mean, band min-max'."""
    seeds = [str(s["seed"]) for s in results["seeds"] if s["models"]]
    if len(seeds) == 1:
        return f"training seed {seeds[0]}"
    return f"training seeds {', '.join(seeds)}: mean, band min-max"


def _skipped_plots(results: dict) -> list[tuple[str, str]]:
    """(file, reason) of the plots make_plots leaves out for these results."""
    s = results.get("summary") or summarize(results)
    if s["models"]["stock"]["peak_allocated_bytes"] is None:
        return [("memory.png", "peak memory is measured on CUDA devices only")]
    return []


def _seconds_label(v: float) -> str:
    return f"{v:.3f} s" if v < 1 else f"{v:.2f} s" if v < 100 else f"{v:,.0f} s"


def _rate_label(v: float) -> str:
    return f"{v:,.0f}/s" if v >= 10 else f"{v:.2f}/s"


def _plot_curves(ax, results, key, scale=1.0):
    from matplotlib.ticker import MaxNLocator

    for name in MODEL_NAMES:
        x, mean, lo, hi = _curve(results, name, key)
        ax.plot(x, mean * scale, marker="o", ms=3, color=_COLORS[name], label=name)
        if len(results["seeds"]) > 1:
            ax.fill_between(x, lo * scale, hi * scale, color=_COLORS[name], alpha=0.2, linewidth=0)
    ax.set_xlabel("epoch")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend()


def make_plots(results: dict, out_dir: str) -> list[str]:
    """Draws loss_curves.png, accuracy_curves.png, confusion_matrices.png, speed.png and, where peak memory was
    measured (CUDA), memory.png from a results.json dict into out_dir and returns their paths (``_skipped_plots``
    says which were left out and why; a memory.png left from an earlier run is removed). Curves are the mean over
    seeds with a min-max band. Uses matplotlib's object API (no pyplot state, no backend switch), so it works in
    scripts and notebooks."""
    from matplotlib.figure import Figure

    os.makedirs(out_dir, exist_ok=True)
    s = results.get("summary") or summarize(results)
    model = results["config"]["model"]
    summary_seeds = _summary_seeds(results)
    band = _seeds_text(results)
    paths = []

    def save(fig, name):
        path = os.path.join(out_dir, name)
        fig.savefig(path, dpi=120)
        paths.append(path)

    fig = Figure(layout="constrained", figsize=(11, 4))
    ax1, ax2 = fig.subplots(1, 2)
    _plot_curves(ax1, results, "train_loss")
    ax1.set_ylabel("training loss (mean over the epoch)")
    _plot_curves(ax2, results, "val_loss")
    ax2.set_ylabel("validation loss (no label smoothing)")
    fig.suptitle(f"{model}: loss ({band})")
    save(fig, "loss_curves.png")

    fig = Figure(layout="constrained", figsize=(6, 4))
    ax = fig.subplots()
    _plot_curves(ax, results, "val_accuracy", 100.0)
    ax.set_ylabel("validation accuracy (%)")
    ax.set_title(f"{model}: validation accuracy ({band})\nvalidation set: {results['data']['val_source']}", fontsize=9)
    save(fig, "accuracy_curves.png")

    classes = results["data"]["classes"]
    k = len(classes)
    fig = Figure(layout="constrained", figsize=(12, 5.5))
    axes = fig.subplots(1, 2)
    for ax, name in zip(axes, MODEL_NAMES, strict=True):
        cm = np.zeros((k, k), dtype=np.float64)
        for seed in summary_seeds:
            cm += np.asarray(seed["models"][name]["confusion_matrix"], dtype=np.float64)
        rows = cm.sum(1, keepdims=True)
        pct = 100.0 * cm / np.where(rows == 0, 1, rows)
        im = ax.imshow(pct, cmap="Blues", vmin=0, vmax=100)
        for i in range(k):
            for j in range(k):
                ax.text(j, i, f"{pct[i, j]:.0f}", ha="center", va="center", fontsize=7,
                        color="white" if pct[i, j] > 50 else "black")  # fmt: skip
        ax.set_xticks(range(k), classes, rotation=60, ha="right", fontsize=8)
        ax.set_yticks(range(k), classes, fontsize=8)
        ax.set_xlabel("predicted")
        ax.set_ylabel("true")
        acc = s["models"][name]["final_val_accuracy"]
        ax.set_title(f"{name}: {_pm(acc, 100, 2, '%')} (row %)")
        fig.colorbar(im, ax=ax, fraction=0.046)
    seed_names = ", ".join(str(seed["seed"]) for seed in summary_seeds)
    fig.suptitle(f"{model}: confusion matrices of the final models, summed over training seed(s) {seed_names}")
    save(fig, "confusion_matrices.png")

    fig = Figure(layout="constrained", figsize=(10, 4))
    ax1, ax2 = fig.subplots(1, 2)
    panels = (
        (ax1, "epoch_time_s", "epoch time (s)", _seconds_label),
        (ax2, "images_per_s", "training images per second", _rate_label),
    )
    for ax, key, label, text in panels:
        means = [s["models"][n][key]["mean"] for n in MODEL_NAMES]
        stds = [s["models"][n][key]["std"] for n in MODEL_NAMES]
        bars = ax.bar(MODEL_NAMES, means, yerr=stds, capsize=4, color=[_COLORS[n] for n in MODEL_NAMES])
        ax.bar_label(bars, labels=[text(v) for v in means], label_type="center", color="white")
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    ratio = s["epoch_time_ratio"]
    warmup = " (epoch 1, warm-up, left out)" if s["timed_epochs"] != "1" else ""
    fig.suptitle(
        f"{model}: speed over {_timed_text(s['timed_epochs'])}{warmup}"
        + (f"; torchext/stock epoch time {_pm(ratio, 1, 3, 'x')}" if ratio else "")
    )
    save(fig, "speed.png")

    memory_path = os.path.join(out_dir, "memory.png")
    if _skipped_plots(results):
        if os.path.exists(memory_path):
            os.remove(memory_path)  # an earlier run's, which these results would seem to own
    else:
        fig = Figure(layout="constrained", figsize=(7, 4))
        ax = fig.subplots()
        width = 0.38
        x = np.arange(2)
        for i, name in enumerate(MODEL_NAMES):
            vals = [s["models"][name][k]["mean"] / 2**20 for k in ("peak_allocated_bytes", "peak_reserved_bytes")]
            bars = ax.bar(x + (i - 0.5) * width, vals, width, label=name, color=_COLORS[name])
            ax.bar_label(bars, labels=[f"{v:,.0f}" for v in vals], padding=2, fontsize=8)
        ax.set_xticks(x, ["peak allocated", "peak reserved"])
        ax.set_ylabel("MiB")
        ax.legend()
        ax.grid(axis="y", alpha=0.3)
        ax.set_title(f"{model}: peak CUDA memory per model ({results['config']['allocator']} allocator)")
        save(fig, "memory.png")
    return paths
