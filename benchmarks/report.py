"""Turns a benchmark CSV (benchmarks/common.py's format) into markdown tables with the targets of the Foundation
issue checked. Numbers come only from the CSV.

    python benchmarks/report.py benchmarks/results/ops_gpu.csv [--date D] > benchmarks/results/ops_gpu.md
"""

import argparse
import csv
from collections import defaultdict

# (op, mode, shape or None, dtype or None) -> (what, kind, threshold). kind 'copy': torchext bandwidth as a share
# of copy bandwidth in the same dtype; 'speedup': torch time / torchext time.
ACTIVATIONS = ("relu", "leaky_relu", "sigmoid", "tanh", "gelu", "gelu_tanh", "silu")


def target_for(op, mode, shape, dtype):
    if op in ACTIVATIONS and mode in ("fwd", "bwd") and dtype == "float32":
        return ("copy", 0.90)
    if op == "softmax" and mode == "fwd" and dtype == "float32":
        return ("copy", 0.90)
    if op == "softmax" and mode == "bwd" and dtype == "float32":
        return ("speedup", 1.8)
    if op == "cross_entropy" and mode == "fwd+bwd" and dtype in ("float32", "bfloat16"):
        return {"65536x10": ("speedup", 5.0), "1048576x10": ("speedup", 20.0), "8192x32768": ("speedup", 2.5)}.get(
            shape
        )
    return None


def load(path, date=None):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise SystemExit(f"{path} has no rows")
    date = date or max(r["date"] for r in rows)
    return [r for r in rows if r["date"] == date], date


def render(path, date=None) -> str:
    rows, date = load(path, date)
    time, bw = {}, {}
    for r in rows:
        key = (r["op"], r["provider"], r["mode"], r["shape"], r["dtype"])
        (time if r["metric"] == "time" else bw)[key] = float(r["p50"])
    copy_bw = {k[4]: v for k, v in bw.items() if k[0] == "copy"}
    env = rows[0]
    on_gpu = not env["gpu"].startswith("cpu")  # the targets are GPU targets
    out = [
        f"# Op benchmarks: torchext vs PyTorch, {env['gpu']}",
        "",
        f"torch {env['torch']}, CUDA {env['cuda'] or '-'}, torchext {env['version']}, run {date}. "
        "Medians of repeated runs timed with CUDA events after warm-up, L2 flushed before each run; "
        "fresh random inputs. Bandwidth counts the bytes each op must move (benchmarks/bench_ops.py).",
        "",
    ]
    if copy_bw:
        out += ["Device-to-device copy, same run: " + ", ".join(f"{d} {v:.0f} GB/s" for d, v in copy_bw.items()), ""]
    groups = defaultdict(list)
    for (op, provider, mode, shape, dtype), t in time.items():
        if provider == "torchext":
            groups[op].append((mode, shape, dtype, t))
    header = "| op | mode | shape | dtype | torchext us | torch us | speedup | torchext GB/s | % of copy | target | met |"
    sep = "|" + "---|" * 11
    out += [header, sep]
    met_all = []
    for op in groups:
        for mode, shape, dtype, t in sorted(groups[op], key=lambda g: (g[2], g[1], g[0])):
            theirs = time.get((op, "torch", mode, shape, dtype))
            speedup = theirs / t if theirs else None
            gbs = bw.get((op, "torchext", mode, shape, dtype))
            pct = gbs / copy_bw[dtype] if gbs and dtype in copy_bw else None
            target = target_for(op, mode, shape, dtype) if on_gpu else None
            met, target_s = "", ""
            if target:
                kind, thr = target
                value = pct if kind == "copy" else speedup
                target_s = f">= {thr:.0%} of copy" if kind == "copy" else f">= {thr:g}x"
                met = "yes" if value is not None and value >= thr else "**no**"
                met_all.append(met == "yes")
            out.append(
                f"| {op} | {mode} | {shape} | {dtype} | {t:.1f} | {theirs:.1f} | {speedup:.2f}x | "
                f"{'' if gbs is None else f'{gbs:.0f}'} | {'' if pct is None else f'{pct:.0%}'} | {target_s} | {met} |"
                if theirs
                else f"| {op} | {mode} | {shape} | {dtype} | {t:.1f} | | | | | {target_s} | {met} |"
            )
    out += ["", f"Targets met: {sum(met_all)} of {len(met_all)}."]
    return "\n".join(out)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("csv")
    p.add_argument("--date", default=None, help="which run (its date column); default the latest")
    a = p.parse_args()
    print(render(a.csv, a.date))
