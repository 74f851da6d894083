"""GPU time per call of every matmul kernel on the small and thin GEMMs of Linear layers, against torch.matmul.

For each layer M x K -> N it times the three GEMMs of a forward and backward pass, in the layouts Linear uses
(forward x @ w.T, grad_input g @ w, grad_weight g.T @ x), with each CUDA-core and tensor-core kernel, the default
choice and torch.matmul (cuBLAS). Each figure is the median over 7 replays of a CUDA graph of 20 calls, divided by
20: GPU time without launch gaps, fresh random inputs. Writes a markdown table to stdout:

    python benchmarks/bench_matmul_small.py > benchmarks/results/matmul_small_gpu.md
"""

import os
import sys

import torch

import torchext

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import environment  # noqa: E402

LAYERS = [
    (512, 512, 10),
    (128, 2304, 512),
    (128, 512, 10),
    (4096, 784, 256),
    (512, 512, 512),
    (8192, 1024, 1024),
]  # (M, K, N)
KERNELS = ["smem_tiled", "warp_tiled", "mma_sync", "wgmma", None]  # None: the default choice


def graph_time_us(fn, reps=20, rounds=7):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / reps)
    return sorted(times)[len(times) // 2]


def main():
    torch.manual_seed(0)
    env = environment("cuda")
    print(
        f"# Small and thin GEMMs: GPU time per call (us), {env['gpu']}\n\n"
        f"torch {env['torch']}, CUDA {env['cuda']}, torchext {env['version']}, {env['date']}. "
        "Medians of 7 replays of a CUDA graph of 20 calls; n/a: the kernel does not take these inputs.\n"
    )
    names = [k or "default" for k in KERNELS]
    print("| layer M x K -> N | GEMM | dtype | torch | " + " | ".join(names) + " | default is |")
    print("|" + "---|" * (len(names) + 5))
    for m, k, n in LAYERS:
        for dtype in (torch.bfloat16, torch.float32):
            x = torch.randn(m, k, device="cuda", dtype=dtype)
            w = torch.randn(n, k, device="cuda", dtype=dtype)
            g = torch.randn(m, n, device="cuda", dtype=dtype)
            for gemm, a, b in (("fwd", x, w.t()), ("grad_input", g, w), ("grad_weight", g.t(), x)):
                row = [f"{graph_time_us(lambda a=a, b=b: torch.matmul(a, b)):.1f}"]
                for kernel in KERNELS:
                    try:
                        us = graph_time_us(lambda a=a, b=b, k=kernel: torchext.ops.matmul(a, b, kernel=k))
                        row.append(f"{us:.1f}")
                    except NotImplementedError:
                        row.append("n/a")
                shape = f"{tuple(a.shape)} @ {tuple(b.shape)}"
                print(
                    f"| {m} x {k} -> {n} | {gemm} {shape} | {str(dtype)[6:]} | "
                    + " | ".join(row)
                    + f" | {torchext.ops.matmul_kernel(a, b)} |"
                )


if __name__ == "__main__":
    main()
