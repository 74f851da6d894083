"""Benchmarks torchext's pooling ops against torch's, forward and forward+backward, in one process.

The pools of torchvision's resnet18 and of its CIFAR variant, bfloat16 channels-last and float32 NCHW, each timed
side by side with torch (benchmarks/common.py: CUDA events, L2 flushed, median of --reps); tidy rows to a CSV and a
Markdown table to stdout. About 20 s on an H100.

    python benchmarks/bench_pooling.py --out benchmarks/results/pooling_gpu.csv > benchmarks/results/pooling_gpu.md
    python benchmarks/bench_pooling.py --device cpu      # small shapes, float32: checks the script runs

What is measured (op, provider, mode, shape, dtype as in the CSV):
  op        max_pool2d (3x3 stride 2 padding 1: resnet18's stem, 128 x 64 x 112 x 112), avg_pool2d (2x2 stride 2 on
            the same input), adaptive_avg_pool2d (global, to 1 x 1: resnet18_cifar's head at batch 512, 512 x 512 x
            4 x 4, and resnet18's at batch 128, 128 x 512 x 7 x 7)
  provider  torch (torch.nn.functional, whose global pool is a mean) or torchext
  mode      fwd (no autograd) or fwd+bwd (the forward and the input's gradient through autograd)
  dtype     bfloat16 (channels-last input) or float32 (NCHW input); the shape column says which layout
  metric    time (us), bandwidth (GB/s against the napkin bytes below), max_abs_err (fwd, against torch's: a guard
            against timing a wrong kernel)

Napkin bytes (s = element size; the indices are int64): max_pool2d forward reads x and writes y and the indices,
N C (H W s + OH OW (s + 8)); its backward reads dy and the indices and writes dx, the same total. avg_pool2d and the
global pool: forward N C (H W + OH OW) s, backward the same. fwd+bwd counts both.
"""

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import CsvWriter, environment, time_interleaved  # noqa: E402

# (op, label, (N, C, H, W), (OH, OW) of the output)
GPU_CASES = [
    ("max_pool2d", "3x3s2p1", (128, 64, 112, 112), (56, 56)),
    ("avg_pool2d", "2x2s2", (128, 64, 112, 112), (56, 56)),
    ("adaptive_avg_pool2d", "global", (512, 512, 4, 4), (1, 1)),
    ("adaptive_avg_pool2d", "global", (128, 512, 7, 7), (1, 1)),
]
CPU_CASES = [
    ("max_pool2d", "3x3s2p1", (8, 16, 56, 56), (28, 28)),
    ("avg_pool2d", "2x2s2", (8, 16, 56, 56), (28, 28)),
    ("adaptive_avg_pool2d", "global", (32, 64, 7, 7), (1, 1)),
]
FORMATS = {torch.bfloat16: ("channels_last", torch.channels_last), torch.float32: ("NCHW", torch.contiguous_format)}


def functions(op):
    """(torchext's, torch's) for the op's benchmarked options."""
    import torchext.functional as tf

    if op == "max_pool2d":
        return (lambda x: tf.max_pool2d(x, 3, 2, 1)), (lambda x: F.max_pool2d(x, 3, 2, 1))
    if op == "avg_pool2d":
        return (lambda x: tf.avg_pool2d(x, 2)), (lambda x: F.avg_pool2d(x, 2))
    return (lambda x: tf.adaptive_avg_pool2d(x, 1)), (lambda x: F.adaptive_avg_pool2d(x, 1))


def napkin_bytes(op, shape, out_hw, element_size, mode):
    n, c, h, w = shape
    out = n * c * out_hw[0] * out_hw[1]
    one_pass = n * c * h * w * element_size + out * (element_size + (8 if op == "max_pool2d" else 0))
    return one_pass * (2 if mode == "fwd+bwd" else 1)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtypes", default=None, help="bfloat16,float32 on CUDA (default), float32 on CPU")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--out", default="benchmarks/results/pooling_gpu.csv")
    args = p.parse_args(argv)

    import torchext  # noqa: F401  (registers the ops)

    device, gpu = args.device, args.device != "cpu"
    if gpu and not torchext._loader.built_with_cuda():
        raise SystemExit("torchext was built without CUDA (TORCHEXT_CUDA=0 or no toolkit); rebuild to benchmark GPUs")
    dtypes = [getattr(torch, d) for d in (args.dtypes or ("bfloat16,float32" if gpu else "float32")).split(",")]
    env = environment(device)
    writer = CsvWriter(args.out, env)
    reps = args.reps if gpu else min(args.reps, 5)
    print(f"# pooling against torch ({env['gpu']}, torch {env['torch']}, CUDA {env['cuda']}, {env['date']})\n")
    print(f"Ratio = torch time / torchext time (above 1: torchext faster). Times in us, median of {reps}.\n")
    print("| op | shape | dtype, layout | mode | torch us | torchext us | ratio | torchext GB/s | torch GB/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for op, label, shape, out_hw in GPU_CASES if gpu else CPU_CASES:
        ours, theirs = functions(op)
        for dtype in dtypes:
            layout, fmt = FORMATS[dtype]
            name = f"{'x'.join(map(str, shape))}-{label}-{layout}"
            x = torch.randn(shape, device=device, dtype=dtype).contiguous(memory_format=fmt).requires_grad_()
            with torch.no_grad():
                err = (ours(x).float() - theirs(x).float()).abs().max().item()
            writer.row(op, "torchext", "fwd", [name], dtype, "max_abs_err", "", err, err, err)
            g = torch.randn_like(theirs(x.detach()))

            def forward(fn, x=x):
                def run():
                    with torch.no_grad():
                        fn(x)

                return run

            def step(fn, x=x, g=g):
                return lambda: torch.autograd.grad(fn(x), x, g)

            for mode, make in (("fwd", forward), ("fwd+bwd", step)):
                times = time_interleaved([make(theirs), make(ours)], device, warmup=3, reps=reps)
                nbytes = napkin_bytes(op, shape, out_hw, x.element_size(), mode)
                for provider, t in zip(("torch", "torchext"), times, strict=True):
                    writer.timing(op, provider, mode, [name], dtype, t, nbytes)
                gbs = [nbytes / t.p50 / 1e3 for t in times]
                print(
                    f"| {op} {label} | {'x'.join(map(str, shape))} | {str(dtype)[6:]}, {layout} | {mode} | "
                    f"{times[0].p50:.1f} | {times[1].p50:.1f} | {times[0].p50 / times[1].p50:.2f} | {gbs[1]:.0f} | "
                    f"{gbs[0]:.0f} |"
                )
            del x, g
            if gpu:
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
