"""Turns a benchmark CSV (benchmarks/common.py's format) into markdown tables with the targets checked: the
Foundation issue's for bench_ops.py's CSV, the GEMM issue's for bench_matmul.py's (--matmul, or found from the
rows). Numbers come only from the CSV.

    python benchmarks/report.py benchmarks/results/ops_gpu.csv [--date D] > benchmarks/results/ops_gpu.md
    python benchmarks/report.py --matmul benchmarks/results/matmul_gpu.csv > benchmarks/results/matmul_gpu.md
"""

import argparse
import csv
import math
import os
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


# -- bench_matmul.py's CSV (the GEMM issue) ---------------------------------------------------------------------------

MATMUL_DTYPES = ("float32", "tf32", "bfloat16", "float16")
MATMUL_KERNELS = ("naive", "smem_tiled", "register_blocked", "vectorized", "warp_tiled", "mma_sync", "wgmma")
TENSOR_CORE_KERNELS = ("mma_sync", "wgmma")
# max |C - C_cuBLAS| / max |C_cuBLAS| above which a ladder cell is flagged: the kernel may be wrong.
MATMUL_ERR_FLAG = {"float32": 1e-3, "tf32": 3e-2, "bfloat16": 3e-2, "float16": 3e-2}


class MatmulRows:
    """The rows of one run, indexed by (op, provider, mode, shape, dtype, metric) -> row."""

    def __init__(self, rows):
        self.rows = {}
        for r in rows:
            self.rows[(r["op"], r["provider"], r["mode"], r["shape"], r["dtype"], r["metric"])] = r

    def get(self, op, provider, mode, shape, dtype, metric="time"):
        r = self.rows.get((op, provider, mode, shape, dtype, metric))
        return float(r["p50"]) if r is not None else None

    def has(self, op, provider, mode, shape, dtype, metric):
        return (op, provider, mode, shape, dtype, metric) in self.rows

    def unit(self, op, provider, mode, shape, dtype, metric):
        r = self.rows.get((op, provider, mode, shape, dtype, metric))
        return r["unit"] if r is not None else None

    def keys(self):
        return self.rows.keys()


def _cube(size) -> str:
    return f"{size}x{size}x{size}"


def _pct_of_cublas(rs, provider, mode, shape, dtype):
    ours, theirs = rs.get("matmul", provider, mode, shape, dtype), rs.get("matmul", "torch", mode, shape, dtype)
    return theirs / ours if ours and theirs else None


def _ladder_cell(rs, provider, mode, shape, dtype) -> str:
    if rs.has("matmul", provider, mode, shape, dtype, "unsupported"):
        return "n/a"
    if rs.has("matmul", provider, mode, shape, dtype, "skipped"):
        est = rs.get("matmul", provider, mode, shape, dtype, "skipped")
        return "skipped" if est is None or est != est else f"skipped (~{est / 1e6:.1f} s/call)"
    tflops = rs.get("matmul", provider, mode, shape, dtype, "throughput")
    if tflops is None:
        return ""
    cell = f"{tflops:.1f}" if tflops >= 1 else f"{tflops:.2g}"
    pct = _pct_of_cublas(rs, provider, mode, shape, dtype) if provider != "torch" else None
    if pct is not None:
        cell += f" ({pct:.0%})"
    err = rs.get("matmul", provider, mode, shape, dtype, "max_rel_err")
    if err is not None and err > MATMUL_ERR_FLAG.get(dtype, 1e-2):
        cell += f" **err {err:.1e}**"
    return cell


def _provider_label(rs, provider, mode, shape, dtype):
    if provider == "torch":
        return "cuBLAS (torch.matmul)"
    if provider == "torchext":
        chosen = rs.unit("matmul", provider, mode, shape, dtype, "kernel")
        return f"torchext default ({chosen})" if chosen else "torchext default"
    return provider.replace("torchext-", "")


def _matmul_targets(rs):
    """(target, measured, kernel, threshold, kind) for the GEMM issue's targets: kind 'pct' (share of cuBLAS) or
    'x' (speedup over PyTorch); measured None when the run lacks the rows."""
    out = []
    s4096 = _cube(4096)

    def pct(provider, dtype):
        return _pct_of_cublas(rs, provider, "NN", s4096, dtype)

    def best_tc(dtype):
        vals = [(pct(f"torchext-{k}", dtype), k) for k in TENSOR_CORE_KERNELS]
        # The default path counts too when it runs a tensor-core kernel: for tf32 on Hopper it is wgmma after a
        # K-major copy of an N-major B (wgmma reads 32-bit operands K-major only), which a named kernel never makes.
        chosen = rs.unit("matmul", "torchext", "NN", s4096, dtype, "kernel")
        if chosen in TENSOR_CORE_KERNELS:
            vals.append((pct("torchext", dtype), f"default: {chosen}"))
        vals = [v for v in vals if v[0] is not None]
        return max(vals) if vals else (None, None)

    v = pct("torchext-warp_tiled", "float32")
    out.append(("warp_tiled float32 4096^3 >= 90% of cuBLAS float32", v, None, 0.90, "pct"))
    for dtype, thr in (("bfloat16", 0.90), ("float16", 0.90), ("tf32", 0.85)):
        v, k = best_tc(dtype)
        out.append((f"best tensor-core kernel {dtype} 4096^3 >= {thr:.0%} of cuBLAS {dtype}", v, k, thr, "pct"))

    def speedup(op, shape, dtype):
        ours = rs.get(op, "torchext", "fwd+bwd", shape, dtype)
        theirs = rs.get(op, "torch", "fwd+bwd", shape, dtype)
        return theirs / ours if ours and theirs else None

    out.append(("Linear+bias+ReLU bf16 8192x4096->4096 fwd+bwd >= 1.05x torch.nn.Linear+relu",
                speedup("linear_relu", "8192x4096x4096", "bfloat16"), None, 1.05, "x"))
    for dtype in ("bfloat16", "float32"):
        out.append((f"classifier 512x512->10 (+ReLU) {dtype} fwd+bwd >= 1.0x torch.nn.Linear+relu",
                    speedup("linear_relu", "512x512x10", dtype), None, 1.0, "x"))
    return out


def render_matmul(path, date=None) -> str:
    rows, date = load(path, date)
    gpu_rows = [r for r in rows if not r["gpu"].startswith("cpu")]
    cpu_rows = [r for r in rows if r["gpu"].startswith("cpu")]
    rs, cpu = MatmulRows(gpu_rows), MatmulRows(cpu_rows)  # the same keys can name a CPU and a GPU measurement
    env = (gpu_rows or cpu_rows)[0]
    out = [
        f"# Matmul benchmarks: torchext's GEMM ladder vs cuBLAS, torchext.nn.Linear vs torch.nn.Linear, "
        f"{env['gpu']}",
        "",
        f"torch {env['torch']}, CUDA {env['cuda'] or '-'}, torchext {env['version']}, run {date}. "
        + (
            "Medians of repeated runs (CUDA events after warm-up, L2 flushed before each run; the repeats capped by "
            "time, see benchmarks/bench_matmul.py); fresh randn inputs. TFLOP/s = 2 M N K / time; (x%) = cuBLAS time "
            "/ our time, cuBLAS measured in the same process with the same dtype, layout and tf32 setting. n/a: the "
            "kernel does not take these inputs on this device; skipped: too slow for the run's time budget."
            if gpu_rows
            else "Medians of repeated runs timed with time.perf_counter after warm-up (a CPU-only run); fresh randn "
            "inputs."
        ),
        "",
    ]
    png = os.path.splitext(os.path.basename(path))[0] + ".png"
    if os.path.exists(os.path.join(os.path.dirname(os.path.abspath(path)), png)):
        out += [f"![TFLOP/s per kernel and size]({png})", ""]

    keys = [k for k in rs.keys() if k[0] == "matmul"]
    if gpu_rows and keys:
        targets = _matmul_targets(rs)
        out += ["## Targets", "", "| target | measured | result |", "|---|---|---|"]
        for what, value, kernel, thr, kind in targets:
            if value is None:
                out.append(f"| {what} | not measured | **MISS** |")
                continue
            shown = f"{value:.0%}" if kind == "pct" else f"{value:.2f}x"
            if kernel:
                shown += f" ({kernel})"
            out.append(f"| {what} | {shown} | {'PASS' if value >= thr else '**MISS**'} |")
        passed = sum(1 for _, v, _, t, _ in targets if v is not None and v >= t)
        out += ["", f"Targets met: {passed} of {len(targets)}.", ""]

        # The ladder, row-major operands (NN).
        nn = [k for k in keys if k[2] == "NN"]
        sizes = sorted({int(k[3].split("x")[0]) for k in nn if len(set(k[3].split("x"))) == 1})
        out += ["## The ladder: TFLOP/s (% of cuBLAS), C = A B with row-major A and B", ""]
        for dtype in MATMUL_DTYPES:
            if not any(k[4] == dtype for k in nn):
                continue
            note = {
                "float32": "float32, tf32 off everywhere (CUDA cores for torchext's SIMT kernels, cuBLAS FP32)",
                "tf32": "float32 inputs with torch.backends.cuda.matmul.allow_tf32 = True for torchext and cuBLAS "
                "(the CUDA-core kernels ignore it: see the float32 table)",
                "bfloat16": "bfloat16, float32 accumulation",
                "float16": "float16, float32 accumulation",
            }[dtype]
            out += [f"### {note}", "", "| kernel | " + " | ".join(f"{s}^3" for s in sizes) + " |",
                    "|---|" + "---|" * len(sizes)]
            providers = ["torch"] + [f"torchext-{k}" for k in MATMUL_KERNELS] + ["torchext"]
            for provider in providers:
                cells = [_ladder_cell(rs, provider, "NN", _cube(s), dtype) for s in sizes]
                if not any(cells):
                    continue
                label = _provider_label(rs, provider, "NN", _cube(sizes[-1]), dtype)
                if provider == "torchext":
                    chosen = {rs.unit("matmul", provider, "NN", _cube(s), dtype, "kernel") for s in sizes} - {None}
                    label = f"torchext default ({', '.join(sorted(chosen))})" if chosen else "torchext default"
                out.append(f"| {label} | " + " | ".join(cells) + " |")
            out.append("")

        # Layouts at the size that has them.
        lay = [k for k in keys if k[2] in ("NT", "TN")]
        if lay:
            shape = sorted({k[3] for k in lay})[0]
            out += [f"## Layouts at {shape.replace('x', ' x ')}: TFLOP/s (% of cuBLAS in the same layout)", "",
                    "NN: torch.matmul(a, b); NT: b = w.t() (linear forward, grad_input); TN: a = x.t() (grad_weight).",
                    "", "| dtype | kernel | NN | NT | TN |", "|---|---|---|---|---|"]
            for dtype in MATMUL_DTYPES:
                provs = []
                for p in ["torch"] + [f"torchext-{k}" for k in MATMUL_KERNELS] + ["torchext"]:
                    if any(k[1] == p and k[4] == dtype for k in lay):
                        provs.append(p)
                for p in provs:
                    cells = [_ladder_cell(rs, p, m, shape, dtype) for m in ("NN", "NT", "TN")]
                    out.append(f"| {dtype} | {_provider_label(rs, p, 'NT', shape, dtype)} | " + " | ".join(cells)
                               + " |")
            out.append("")

    lin_ops = sorted({k[0] for k in rs.keys() if k[0].startswith("linear_")})
    if lin_ops:
        out += [
            "## Linear + bias + activation: torchext.nn.Linear(activation=act) vs torch.nn.Linear then the activation",
            "",
            "x (M, K) -> (M, N), x requires grad; fwd under no_grad; fwd+bwd = forward + out.backward(g) (grad_x, "
            "grad_w, grad_b). speedup = torch time / torchext time; GPU-time speedup the same from the profiler's "
            "kernel time (no launch gaps).",
            "",
            "| op | M x K -> N | dtype | mode | torchext ms | torch ms | speedup | GPU-time speedup "
            "| torchext TFLOP/s |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        lin_keys = sorted({(k[0], k[3], k[4], k[2]) for k in rs.keys() if k[0] in lin_ops and k[5] == "time"},
                          key=lambda t: (-int(t[1].split("x")[0]) * int(t[1].split("x")[1]), t[0], t[2], t[3]))
        for op, shape, dtype, mode in lin_keys:
            ours, theirs = rs.get(op, "torchext", mode, shape, dtype), rs.get(op, "torch", mode, shape, dtype)
            g_ours = rs.get(op, "torchext", mode, shape, dtype, "gpu_time")
            g_theirs = rs.get(op, "torch", mode, shape, dtype, "gpu_time")
            tf = rs.get(op, "torchext", mode, shape, dtype, "throughput")
            M, K, N = shape.split("x")
            cells = [
                op,
                f"{M} x {K} -> {N}",
                dtype,
                mode,
                _fmt(ours / 1e3 if ours else None, "{:.3f}"),
                _fmt(theirs / 1e3 if theirs else None, "{:.3f}"),
                _fmt(theirs / ours if ours and theirs else None, "{:.2f}x"),
                _fmt(g_theirs / g_ours if g_ours and g_theirs else None, "{:.2f}x"),
                _fmt(tf, "{:.1f}"),
            ]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")

    cpu_shapes = sorted({k[3] for k in cpu.keys() if k[0] == "matmul" and k[5] == "time"})
    if cpu_shapes:
        out += [f"## CPU GEMM, {cpu_rows[0]['gpu']}", "",
                "| M x N x K | dtype | torchext ms | torch ms | torchext GFLOP/s | torch GFLOP/s "
                "| torchext / torch speed | GPU (torchext default) ms | GPU speedup over torchext CPU |",
                "|---|---|---|---|---|---|---|---|---|"]
        for shape in cpu_shapes:
            ours = cpu.get("matmul", "torchext", "NN", shape, "float32")
            theirs = cpu.get("matmul", "torch", "NN", shape, "float32")
            flops = 2.0 * math.prod(int(d) for d in shape.split("x"))
            g = rs.get("matmul", "torchext", "NN", shape, "float32")
            cells = [
                shape.replace("x", " x "),
                "float32",
                _fmt(ours / 1e3 if ours else None, "{:.2f}"),
                _fmt(theirs / 1e3 if theirs else None, "{:.2f}"),
                _fmt(flops / ours / 1e3 if ours else None, "{:.0f}"),
                _fmt(flops / theirs / 1e3 if theirs else None, "{:.0f}"),
                _fmt(theirs / ours if ours and theirs else None, "{:.2f}x"),
                _fmt(g / 1e3 if g else None, "{:.3f}"),
                _fmt(ours / g if ours and g else None, "{:.0f}x"),
            ]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")

    missing = {k[:5] for k in list(rs.keys()) + list(cpu.keys()) if k[5] in ("unsupported", "skipped")}
    if missing:
        out += [f"{len(missing)} configurations were not timed (n/a or skipped above); benchmarks/bench_matmul.py's "
                "stderr names each with the reason.", ""]
    return "\n".join(out).rstrip() + "\n"


def is_matmul_csv(path) -> bool:
    with open(path, newline="") as f:
        return any(r["op"] == "matmul" or r["op"].startswith("linear_") for r in csv.DictReader(f))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("csv")
    p.add_argument("--date", default=None, help="which run (its date column); default the latest")
    p.add_argument("--matmul", action="store_true", help="bench_matmul.py's report (default: found from the rows)")
    a = p.parse_args()
    print(render_matmul(a.csv, a.date) if a.matmul or is_matmul_csv(a.csv) else render(a.csv, a.date))
