"""Writing the output folder: results.json and summary.md (each replaced whole), the plots, and the writer that
refreshes them after every epoch."""

from __future__ import annotations

import json
import os
import time
import warnings

from .plots import _skipped_plots, make_plots
from .report import render_summary


class _OutputWriter:
    """Writes results.json, summary.md and the plots into ``out`` after every epoch, so that an interrupted run keeps
    what it measured. results.json and summary.md are rewritten every time; the plots too, unless drawing them has
    taken more than a tenth of the run's time so far (fast epochs on a GPU), and always at the end. Only rank 0
    writes (``enabled``). ``describe()`` says what the folder holds, for the last line of the run."""

    PLOT_SHARE = 0.1

    def __init__(self, out: str, enabled: bool = True):
        self.out, self.enabled = out, enabled
        self.start = time.perf_counter()
        self.plot_time = 0.0
        self.paths: list[str] = []
        self.plots_missing: str | None = None  # why no plots were drawn (matplotlib missing)
        self.skipped: list[tuple[str, str]] = []  # (plot, why it was left out)

    def write(self, results: dict, final: bool) -> None:
        if not self.enabled:
            return
        paths = _write_tables(results, self.out)
        elapsed = time.perf_counter() - self.start
        if self.plots_missing is None and (final or self.plot_time <= self.PLOT_SHARE * elapsed):
            t0 = time.perf_counter()
            try:
                paths += make_plots(results, self.out)
                self.skipped = _skipped_plots(results)
            except ImportError as e:
                self.plots_missing = str(e)
                warnings.warn(f"torchext-compare: no plots ({e}); pip install matplotlib", stacklevel=2)
            self.plot_time += time.perf_counter() - t0
        elif self.paths:
            paths += [p for p in self.paths if p.endswith(".png")]
        self.paths = paths

    def describe(self) -> str:
        if not self.paths:
            return f"nothing written to {self.out}: no epoch had ended"
        names = [os.path.basename(p) for p in self.paths]
        text = f"wrote {', '.join(names)} to {self.out}"
        if self.plots_missing is not None:
            text += "; no plots: matplotlib is not installed (pip install matplotlib)"
        for name, reason in self.skipped:
            text += f"; no {name}: {reason}"
        return text


def _write_tables(results: dict, out_dir: str) -> list[str]:
    """Writes results.json and summary.md into out_dir, each through a temporary file renamed over the old one (an
    interrupt never leaves half a file); returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = [os.path.join(out_dir, "results.json"), os.path.join(out_dir, "summary.md")]
    texts = [json.dumps(results, indent=1) + "\n", render_summary(results)]
    for path, text in zip(paths, texts, strict=True):
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)
    return paths


def write_outputs(results: dict, out_dir: str) -> list[str]:
    """Writes results.json, summary.md and the plots into out_dir; returns the paths written (no plots, with a
    warning saying to install matplotlib, where it is missing)."""
    paths = _write_tables(results, out_dir)
    try:
        paths += make_plots(results, out_dir)
    except ImportError as e:
        warnings.warn(f"torchext-compare: no plots ({e}); pip install matplotlib", stacklevel=2)
    return paths
