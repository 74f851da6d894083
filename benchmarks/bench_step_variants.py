"""What the fully swapped ResNet-18 recipe's step costs with and without each of its host-side pieces (issue 19): the
stock step against torchext's as torchext-compare trains it, and against torchext's with one piece taken away.

    python benchmarks/bench_step_variants.py --out benchmarks/results/step_variants_gpu.csv   # CUDA, about a minute

Variants (resnet18_cifar, batch 512, bf16 autocast, channels-last, every layer swapped as ``--swap-conv``; each with
the optimizer the tool gives it, built by the tool's ``_models`` / ``_contenders``):

  stock                  torch's layers, torch.optim.SGD (foreach)
  torchext               the tool's torchext model: forks, and torchext.optim.SGD with autocast_copies=bfloat16
  torchext_no_copies     the same without autocast copies: autocast casts every weight in every forward
  torchext_no_forks      the same without the forks (autograd sums the residual inputs' gradients with ATen's add)
  torchext_bf16_weights  a bound, not a training setup: the convolutions' and the Linear's parameters made bfloat16,
                         so that autocast has nothing to cast and no gradient to cast back (torchext.optim.SGD then
                         updates them in bfloat16)

Each is a bare loop (bench_loop.py's ``bare``: autocast forward and loss, zero_grad, backward, optimizer step) over 8
premade batches already on the GPU. ``--rounds`` rounds run every variant for ``--steps`` steps in an order that
rotates from round to round; per step: ``wall`` (the round's wall-clock time over its steps), ``pace`` (median time
between CUDA events after consecutive steps) and ``host`` (median time for the host to issue a step). The ratio rows
are per round against the same round's stock (median over rounds): on a host-bound step the machine's drift between
rounds is larger than the differences measured, so only same-round ratios are compared. ``gpu``: the GPU work of one
step (kernel time, torchext.profiling) for each variant.
"""

import argparse
import dataclasses
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_loop as bl  # noqa: E402
from common import CsvWriter, environment, quantiles  # noqa: E402

from torchext.compare.devices import _Dist  # noqa: E402
from torchext.compare.train import _contenders, _models  # noqa: E402

VARIANTS = {  # name: (provider, config changes, bf16 weights)
    "stock": ("stock", {}, False),
    "torchext": ("torchext", {}, False),
    "torchext_no_copies": ("torchext", {"autocast_copies": False}, False),
    "torchext_no_forks": ("torchext", {"forks": False}, False),
    "torchext_bf16_weights": ("torchext", {"autocast_copies": False}, True),
}


def bf16_weights(net) -> None:
    """The convolutions' and Linear layers' parameters in bfloat16 (the bound variant)."""
    for m in net.modules():
        if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)):
            for p in (m.weight, m.bias):
                if p is not None:
                    p.data = p.data.to(torch.bfloat16)


def build(variant: str, base, batches, device):
    provider, changes, low = VARIANTS[variant]
    cfg = dataclasses.replace(base, **changes)
    stock, ours, _ = _models(cfg, 10, device, seed=0)
    if low:
        bf16_weights(ours if provider == "torchext" else stock)
    c = dict(zip(bl.PROVIDERS, _contenders(stock, ours, cfg, device, _Dist(), 10**6), strict=True))[provider]
    batch = bl.cycling(batches)

    def step():
        xb, yb = next(batch)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = c.criterion(c.train_model(xb), yb)
        c.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        c.optimizer.step()

    return step


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--out", default="benchmarks/results/step_variants_gpu.csv")
    args = p.parse_args(argv)
    device = torch.device("cuda")
    torch.backends.cudnn.benchmark = True  # as torchext-compare sets it
    base = dataclasses.replace(bl.recipe("resnet18_cifar", device, None), swap_conv=True)
    x, y = bl.synthetic_images((bl.PREMADE_BATCHES + 1) * base.batch_size)
    batches = bl.premade_batches(x, y, base, device)
    steps = {name: build(name, base, batches, device) for name in VARIANTS}
    for fn in steps.values():
        for _ in range(15):
            fn()
    torch.cuda.synchronize()
    names = list(steps)
    raw = {n: {"wall": [], "pace": [], "host": []} for n in names}
    for r in range(args.rounds):
        for n in names[r % len(names) :] + names[: r % len(names)]:
            pace, host, wall = bl.run_steps(steps[n], args.steps, device)
            raw[n]["wall"].append(wall)
            raw[n]["pace"].append(statistics.median(pace))
            raw[n]["host"].append(statistics.median(host))
    gpu = {n: bl.gpu_us_per_step(steps[n], 5, device) for n in names}
    env = environment("cuda")
    writer = CsvWriter(args.out, env)
    shape = (f"resnet18_cifar b{base.batch_size} channels_last",)  # one field: CsvWriter joins a tuple with x
    lines = [f"{'variant':24s} {'wall us':>9s} {'pace us':>9s} {'host us':>9s} {'wall/stock':>10s} {'GPU us':>8s}"]
    for n in names:
        ratios = [w / s for w, s in zip(raw[n]["wall"], raw["stock"]["wall"], strict=True)]
        for metric in ("wall", "pace", "host"):
            t = quantiles(raw[n][metric])
            writer.row("step", n, "train", shape, "bf16", f"{metric}_time", "us", t.p50, t.p20, t.p80)
        t = quantiles(ratios)
        writer.row("step", n, "train", shape, "bf16", "wall_vs_stock_same_round", "x", t.p50, t.p20, t.p80)
        if gpu[n] is not None:
            writer.row("step", n, "train", shape, "bf16", "gpu_time", "us", gpu[n], gpu[n], gpu[n])
        lines.append(
            f"{n:24s} {statistics.median(raw[n]['wall']):9.0f} {statistics.median(raw[n]['pace']):9.0f} "
            f"{statistics.median(raw[n]['host']):9.0f} {t.p50:10.3f} {gpu[n] or float('nan'):8.0f}"
        )
    writer.close()
    print(f"{env['gpu']}, torch {env['torch']}, {args.rounds} rounds x {args.steps} steps; ratios per round")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
