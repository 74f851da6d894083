"""Turns a benchmark CSV (benchmarks/common.py's format) into markdown tables with the targets of the Foundation
issue checked. Numbers come only from the CSV.

    python benchmarks/report.py benchmarks/results/ops_gpu.csv [--date D] > benchmarks/results/ops_gpu.md
"""

import argparse
import csv
from collections import defaultdict

# target_for -> (kind, threshold). kind 'copy': torchext bandwidth as a share of copy bandwidth in the same dtype;
# 'speedup': torch time / torchext time (CUDA events); 'gpu_speedup': the same for GPU (kernel) time.
ACTIVATIONS = ("relu", "leaky_relu", "sigmoid", "tanh", "gelu", "gelu_tanh", "silu")


def target_for(op, mode, shape, dtype):
    if op in ACTIVATIONS and mode in ("fwd", "bwd") and dtype == "float32":
        return ("copy", 0.90)
    if op == "softmax" and mode == "fwd" and dtype == "float32":
        return ("copy", 0.90)
    if op == "softmax" and mode == "bwd" and dtype == "float32":
        return ("speedup", 1.8)
    if op == "cross_entropy" and mode == "fwd+bwd" and dtype in ("float32", "bfloat16"):
        # "PyTorch's GPU time": kernel time from the profiler (benchmarks/common.py's device_time_fn).
        return {
            "65536x10": ("gpu_speedup", 5.0),
            "1048576x10": ("gpu_speedup", 20.0),
            "8192x32768": ("gpu_speedup", 2.5),
        }.get(shape)
    return None


def _fmt(value, spec):
    return "" if value is None else spec.format(value)


def load(path, date=None):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise SystemExit(f"{path} has no rows")
    date = date or max(r["date"] for r in rows)
    return [r for r in rows if r["date"] == date], date


def render(path, date=None) -> str:
    rows, date = load(path, date)
    time, bw, gpu = {}, {}, {}
    for r in rows:
        key = (r["op"], r["provider"], r["mode"], r["shape"], r["dtype"])
        {"time": time, "bandwidth": bw, "gpu_time": gpu}[r["metric"]][key] = float(r["p50"])
    copy_bw = {k[4]: v for k, v in bw.items() if k[0] == "copy"}
    env = rows[0]
    on_gpu = not env["gpu"].startswith("cpu")  # the targets are GPU targets
    timing = (
        "Medians of repeated runs timed with CUDA events after warm-up, L2 flushed before each run"
        if on_gpu
        else "Medians of repeated runs timed with time.perf_counter after warm-up (a CPU run: no target applies)"
    )
    out = [
        f"# Op benchmarks: torchext vs PyTorch, {env['gpu']}",
        "",
        f"torch {env['torch']}, CUDA {env['cuda'] or '-'}, torchext {env['version']}, run {date}. {timing}; "
        "fresh random inputs. Bandwidth counts the bytes each op must move (benchmarks/bench_ops.py).",
        "",
    ]
    if copy_bw:
        out += ["Device-to-device copy, same run: " + ", ".join(f"{d} {v:.0f} GB/s" for d, v in copy_bw.items()), ""]
    groups = defaultdict(list)  # (op, provider) -> runs; every provider but torch is compared against torch
    for (op, provider, mode, shape, dtype), t in time.items():
        if provider != "torch":
            groups[(op, provider)].append((mode, shape, dtype, t))
    header = (
        "| op | mode | shape | dtype | torchext us | torch us | speedup | GPU-time speedup | torchext GB/s | % of copy "
        "| target | met |"
    )
    sep = "|" + "---|" * 12
    out += [header, sep]
    met_all = []
    for op, provider in groups:
        label = op if provider == "torchext" else f"{op} [{provider}]"
        for mode, shape, dtype, t in sorted(groups[(op, provider)], key=lambda g: (g[2], g[1], g[0])):
            theirs = time.get((op, "torch", mode, shape, dtype))
            speedup = theirs / t if theirs else None
            g_ours, g_theirs = gpu.get((op, provider, mode, shape, dtype)), gpu.get((op, "torch", mode, shape, dtype))
            gpu_speedup = g_theirs / g_ours if g_ours and g_theirs else None
            gbs = bw.get((op, provider, mode, shape, dtype))
            pct = gbs / copy_bw[dtype] if gbs and dtype in copy_bw else None
            target = target_for(op, mode, shape, dtype) if on_gpu and provider == "torchext" else None
            met, target_s = "", ""
            if target:
                kind, thr = target
                value = {"copy": pct, "speedup": speedup, "gpu_speedup": gpu_speedup}[kind]
                target_s = {"copy": f">= {thr:.0%} of copy", "speedup": f">= {thr:g}x", "gpu_speedup": f">= {thr:g}x GPU time"}[
                    kind
                ]
                met = "yes" if value is not None and value >= thr else "**no**"
                met_all.append(met == "yes")
            cells = [
                label,
                mode,
                shape,
                dtype,
                f"{t:.1f}",
                _fmt(theirs, "{:.1f}"),
                _fmt(speedup, "{:.2f}x"),
                _fmt(gpu_speedup, "{:.2f}x"),
                _fmt(gbs, "{:.0f}"),
                _fmt(pct, "{:.0%}"),
                target_s,
                met,
            ]
            out.append("| " + " | ".join(cells) + " |")
    if met_all:
        out += ["", f"Targets met: {sum(met_all)} of {len(met_all)}."]
    return "\n".join(out)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("csv")
    p.add_argument("--date", default=None, help="which run (its date column); default the latest")
    a = p.parse_args()
    print(render(a.csv, a.date))
