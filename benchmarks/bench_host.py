"""Host time per call of torchext's modules against torch.nn's, in the same process: the cost a training step pays
on the CPU (Python, dispatcher, autograd, kernel launch) before any GPU work, which is the step time when the step
is host-bound (a small CNN at batch 128, or ResNet-18 on a machine with a slow host).

    python benchmarks/bench_host.py                      # CPU tensors; --device cuda for CUDA ones
    python benchmarks/bench_host.py --out benchmarks/results/host_cpu.csv

Each call runs on a tiny tensor (4 x 16), so the kernels' own work is negligible: on CUDA the loop of calls is
host-bound and its time per call is the host cost; on the CPU the time includes the CPU kernels, which do little at
this size. fwd+bwd is ``module(x).sum().backward()``; the row ``sum+backward`` is that scalar's own share, the same
for every provider. Median of 7 runs of --calls calls each; p20 and p80 of those runs.

A second table times a ResNet step's layers on a tiny channels-last image batch (2 x 16 x 4 x 4, float32; the modules
called under bf16 autocast on CUDA): torchext's Conv2d, Conv2dStats and BatchNormReLU2d against nn.Conv2d and
nn.BatchNorm2d + nn.ReLU, and a tensor read twice through torchext.functional.fork against plain reuse, forward +
backward each (``out.float().sum().backward()``). The input stays float32, so each convolution also casts it (both
providers) and the BatchNorms run in float32, where in the recipe they see bf16 activations; and the shared
``.float().sum().backward()`` is not subtracted, so the ratios understate the differences.
"""

import argparse
import os
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import CsvWriter, environment, quantiles  # noqa: E402

import torchext  # noqa: E402

SHAPE = (4, 16)


def modules(device):
    linear = nn.Linear(16, 16, device=device)
    relu_linear = torchext.nn.Linear.from_torch(linear, activation="relu")
    target = torch.randint(0, 16, (SHAPE[0],), device=device)
    return {
        "relu": (torchext.nn.ReLU(), nn.ReLU(), None),
        "linear": (torchext.nn.Linear.from_torch(linear), linear, None),
        "linear+relu": (relu_linear, nn.Sequential(linear, nn.ReLU()), None),
        "cross_entropy_ls0.1": (
            torchext.nn.CrossEntropyLoss(label_smoothing=0.1),
            nn.CrossEntropyLoss(label_smoothing=0.1),
            target,
        ),
    }


# The layers of a ResNet step on a tiny channels-last image batch (2 x 16 x 4 x 4), under autocast on CUDA (bf16):
# torchext's modules as swap_modules makes them against torch.nn's (see the module docstring for what differs from the
# recipe).
IMAGE = (2, 16, 4, 4)


def image_modules(device):
    conv = nn.Conv2d(16, 16, 3, padding=1, bias=False, device=device).to(memory_format=torch.channels_last)
    bn = nn.BatchNorm2d(16, device=device)
    return {
        "conv3x3": (torchext.nn.Conv2d.from_torch(conv), conv),
        "conv3x3_stats": (_first(torchext.nn.Conv2dStats.from_torch(conv)), conv),
        "bn+relu": (torchext.nn.BatchNormReLU2d.from_torch(bn), nn.Sequential(bn, nn.ReLU())),
    }


class _first(nn.Module):
    """A module's first result (Conv2dStats returns (out, sum, sum_sq) in training)."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x):
        return self.m(x)[0]


def per_call_us(fn, calls: int, device: str):
    for _ in range(max(calls // 10, 20)):
        fn()
    runs = []
    for _ in range(7):
        if device != "cpu":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        if device != "cpu":
            torch.cuda.synchronize()
        runs.append((time.perf_counter() - t0) / calls * 1e6)
    return quantiles(runs)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--out", default="benchmarks/results/host_cpu.csv")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    device = args.device
    env = environment(device)
    env["version"] = f"{env['version']} ({os.environ.get('TORCHEXT_COMMIT', 'working tree')})"
    w = CsvWriter(args.out, env)
    x = torch.randn(SHAPE, device=device, requires_grad=True)
    rows = []

    def record(op, provider, mode, t, shape=SHAPE, dtype=x.dtype):
        w.row(op, provider, mode, shape, dtype, "host_time", "us", t.p50, t.p20, t.p80)
        rows.append((op, provider, mode, t.p50))

    record("sum+backward", "-", "fwd+bwd", per_call_us(lambda: x.sum().backward(), args.calls, device))
    for op, (ours, theirs, target) in modules(device).items():
        for provider, module in (("torchext", ours), ("torch", theirs)):
            call = (lambda m=module: m(x)) if target is None else (lambda m=module, t=target: m(x, t))
            with torch.no_grad():
                record(op, provider, "fwd", per_call_us(call, args.calls, device))
            record(op, provider, "fwd+bwd", per_call_us(lambda c=call: c().sum().backward(), args.calls, device))
    xi = torch.randn(IMAGE, device=device).to(memory_format=torch.channels_last).requires_grad_(True)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if device != "cpu" else torch.autocast("cpu", enabled=False)
    layers = image_modules(device)
    for op, (ours, theirs) in layers.items():
        for provider, module in (("torchext", ours), ("torch", theirs)):

            def call(m=module):
                with amp:
                    return m(xi)

            t = per_call_us(lambda c=call: c().float().sum().backward(), args.calls, device)
            record(op, provider, "fwd+bwd", t, IMAGE, "bf16 autocast" if device != "cpu" else xi.dtype)

    # A tensor read twice: torchext.functional.fork (an autograd.Function whose backward adds with torchext's add)
    # against plain reuse (autograd sums the two gradients itself, with ATen's add).
    def twice(pair):
        (pair[0] + pair[1]).sum().backward()

    forks = {
        ("fork", "torchext"): lambda: twice(torchext.functional.fork(xi, 2)),
        ("reused", "torch"): lambda: twice((xi, xi)),
    }
    for (name, provider), fn in forks.items():
        record(name, provider, "fwd+bwd", per_call_us(fn, args.calls, device), IMAGE, xi.dtype)
    w.close()
    print(f"host time per call, us ({env['gpu']}, torch {env['torch']}, torchext {env['version']})")
    print(f"{'op':22s} {'mode':8s} {'torchext':>9s} {'torch':>9s}")
    table = {(op, provider, mode): us for op, provider, mode, us in rows}
    for op in ["sum+backward", *modules(device)]:
        for mode in ("fwd", "fwd+bwd"):
            if op == "sum+backward":
                if mode == "fwd+bwd":
                    print(f"{op:22s} {mode:8s} {table[(op, '-', mode)]:9.1f}")
                continue
            print(f"{op:22s} {mode:8s} {table[(op, 'torchext', mode)]:9.1f} {table[(op, 'torch', mode)]:9.1f}")
    print(f"\n{IMAGE} channels-last{', bf16 autocast' if device != 'cpu' else ''}, fwd+bwd (out.float().sum())")
    for op in layers:
        print(
            f"{op:22s} {'fwd+bwd':8s} {table[(op, 'torchext', 'fwd+bwd')]:9.1f} {table[(op, 'torch', 'fwd+bwd')]:9.1f}"
        )
    for name, provider in forks:
        print(f"{name:22s} {'fwd+bwd':8s} {table[(name, provider, 'fwd+bwd')]:9.1f}")


if __name__ == "__main__":
    main()
