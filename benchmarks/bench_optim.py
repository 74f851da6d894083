"""Benchmarks torchext.optim.SGD's step against torch.optim.SGD's (its default foreach form and fused=True) on the
parameters of the comparison's models, side by side in one process.

ResNet-18 (CIFAR variant, 62 float32 tensors, 11.2 M parameters) and cnn_cifar, the recipe's SGD (momentum 0.9,
Nesterov, weight decay 5e-4), each optimizer stepping its own copy of the parameters with fresh random gradients.
Wall-clock per step (CUDA events around optimizer.step(), L2 flushed, median of --reps, time_interleaved: what a
training loop waits for, launch and Python overhead included) and GPU time (the profiler's kernel time per step).
Tidy rows to a CSV, a Markdown table to stdout.

    python benchmarks/bench_optim.py --out benchmarks/results/optim_gpu.csv > benchmarks/results/optim_gpu.md
    python benchmarks/bench_optim.py --device cpu      # checks the script runs

Napkin bytes per step with momentum: read param, grad and buffer, write param and buffer: 5 x 4 bytes a float32
parameter (the GB/s column uses it for every provider).
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import CsvWriter, device_kernels, device_time_fn, environment, time_interleaved  # noqa: E402

PROVIDERS = ("torch-foreach", "torch-fused", "torchext")


def _optimizer(provider, params, device):
    import torchext

    kw = dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
    if provider == "torchext":
        return torchext.optim.SGD(params, **kw)
    if provider == "torch-fused":
        if device == "cpu":
            return None
        return torch.optim.SGD(params, fused=True, **kw)
    return torch.optim.SGD(params, foreach=device != "cpu", **kw)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--out", default=None, help="CSV to append rows to")
    p.add_argument("--models", default="resnet18_cifar,cnn_cifar")
    args = p.parse_args()
    import torchext

    env = environment(args.device)
    writer = CsvWriter(args.out, env) if args.out else None
    print(f"# SGD step ({env['gpu']}, torch {env['torch']}, CUDA {env['cuda']}, {env['date']})\n")
    print(
        "Momentum 0.9, Nesterov, weight decay 5e-4, float32 parameters with gradients; median (p20-p80) of "
        f"{args.reps} steps each, interleaved. wall: CUDA events around optimizer.step() (host overhead included); "
        "GPU: the profiler's kernel time per step. GB/s: 20 bytes per parameter over the GPU time.\n"
    )
    print("| model | tensors | parameters | optimizer | wall us | GPU us | kernels per step | GB/s | wall vs foreach |")
    print("|---|---|---|---|---|---|---|---|---|")
    for model in args.models.split(","):
        net = torchext.models.get_model(model, num_classes=10).to(args.device)
        base = [q.detach() for q in net.parameters()]
        n = sum(q.numel() for q in base)
        setups = []
        for provider in PROVIDERS:
            params = [torch.nn.Parameter(q.clone()) for q in base]
            for q in params:
                q.grad = torch.randn_like(q) * 1e-3
            opt = _optimizer(provider, params, args.device)
            if opt is not None:
                setups.append((provider, opt, params))

        def stepper(opt, params):
            def step():
                # Fresh gradients outside the timed region would need a second event pair; the same gradients are
                # fine here (the step's work does not depend on their values).
                opt.step()

            return step

        fns = [stepper(opt, params) for _, opt, params in setups]
        walls = time_interleaved(fns, args.device, warmup=10, reps=args.reps)
        rows = []
        for (provider, _, _), fn, wall in zip(setups, fns, walls, strict=True):
            if args.device == "cpu":
                gpu, kernels = None, None
            else:
                gpu = device_time_fn(fn, args.device, reps=20)
                kernels = sum(calls for _, calls, _ in device_kernels(fn, args.device))
            rows.append((provider, wall, gpu, kernels))
        foreach_wall = rows[0][1].p50
        for provider, wall, gpu, kernels in rows:
            gbs = 20 * n / (gpu.p50 * 1e-6) / 1e9 if gpu else None
            print(
                f"| {model} | {len(base)} | {n / 1e6:.2f} M | {provider} "
                f"| {wall.p50:.1f} ({wall.p20:.1f}-{wall.p80:.1f}) "
                f"| {f'{gpu.p50:.1f}' if gpu else '-'} | {f'{kernels:g}' if kernels is not None else '-'} "
                f"| {f'{gbs:.0f}' if gbs else '-'} | {foreach_wall / wall.p50:.2f}x |"
            )
            if writer:
                writer.row(
                    "sgd_step", provider, "wall", [n], "float32", f"{model}_time", "us", wall.p50, wall.p20, wall.p80
                )
                if gpu:
                    writer.row(
                        "sgd_step",
                        provider,
                        "gpu",
                        [n],
                        "float32",
                        f"{model}_gpu_time",
                        "us",
                        gpu.p50,
                        gpu.p20,
                        gpu.p80,
                    )


if __name__ == "__main__":
    main()
