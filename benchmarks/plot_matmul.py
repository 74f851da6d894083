"""Draws the matmul ladder from bench_matmul.py's CSV: TFLOP/s per kernel at each size, one panel per dtype, cuBLAS
dashed. Numbers come only from the CSV (its latest run unless --date is given).

    python benchmarks/plot_matmul.py benchmarks/results/matmul_gpu.csv [--out benchmarks/results/matmul_gpu.png]
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from report import MATMUL_DTYPES, MATMUL_KERNELS, load  # noqa: E402

TITLES = {
    "float32": "float32 (tf32 off)",
    "tf32": "tf32 (float32 inputs)",
    "bfloat16": "bfloat16",
    "float16": "float16",
}


def ladder_points(rows):
    """{dtype: {provider: [(size, TFLOP/s)]}} from the row-major (NN) cube-shaped matmul rows of one GPU run."""
    out = {}
    for r in rows:
        if r["op"] != "matmul" or r["mode"] != "NN" or r["metric"] != "throughput" or r["gpu"].startswith("cpu"):
            continue
        dims = r["shape"].split("x")
        if len(set(dims)) != 1:
            continue
        out.setdefault(r["dtype"], {}).setdefault(r["provider"], []).append((int(dims[0]), float(r["p50"])))
    for providers in out.values():
        for points in providers.values():
            points.sort()
    return out


def plot(csv_path, png_path, date=None) -> bool:
    """Writes the PNG; False when the CSV holds no ladder rows (a CPU-only run)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, date = load(csv_path, date)
    points = ladder_points(rows)
    dtypes = [d for d in MATMUL_DTYPES if d in points]
    if not dtypes:
        return False
    gpu = next(r["gpu"] for r in rows if not r["gpu"].startswith("cpu"))
    fig, axes = plt.subplots(1, len(dtypes), figsize=(4.2 * len(dtypes), 4.0), squeeze=False)
    colors = plt.get_cmap("tab10")
    for ax, dtype in zip(axes[0], dtypes):
        providers = points[dtype]
        for i, kernel in enumerate(MATMUL_KERNELS):
            pts = providers.get(f"torchext-{kernel}")
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=colors(i), label=kernel)
        if "torch" in providers:
            pts = providers["torch"]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "k--", marker="s", label="cuBLAS")
        ax.set_title(TITLES.get(dtype, dtype))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        sizes = sorted({p[0] for pts in providers.values() for p in pts})
        ax.set_xticks(sizes)
        ax.set_xticklabels([str(s) for s in sizes])
        ax.set_xlabel("M = N = K")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("TFLOP/s")
    handles = {}
    for ax in axes[0]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    order = [k for k in MATMUL_KERNELS + ("cuBLAS",) if k in handles]
    fig.legend([handles[k] for k in order], order, loc="lower center", ncol=len(order), frameon=False)
    fig.suptitle(f"torchext matmul ladder vs cuBLAS, {gpu}, run {date}")
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
    return True


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("csv")
    p.add_argument("--out", default=None, help="PNG path (default: the CSV's name with .png)")
    p.add_argument("--date", default=None, help="which run (its date column); default the latest")
    a = p.parse_args()
    out = a.out or os.path.splitext(a.csv)[0] + ".png"
    if not plot(a.csv, out, a.date):
        raise SystemExit(f"{a.csv} has no GPU ladder rows to plot")
    print(out)
