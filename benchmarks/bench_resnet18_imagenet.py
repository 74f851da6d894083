"""torchvision's ResNet-18 at ImageNet's size (issue 19): the training step of the stock model against the same model
with every layer torchext's, and against stock under torch.compile.

    python benchmarks/bench_resnet18_imagenet.py --out benchmarks/results/resnet18_imagenet_gpu.csv   # CUDA, ~2 min
    python benchmarks/bench_resnet18_imagenet.py --smoke                                             # CPU, seconds

The model is ``torchvision.models.resnet18(num_classes=1000)`` (``torchext.models.resnet18_torchvision``), batch 128 of
3 x 224 x 224 synthetic images and labels made beforehand on the device (4 batches, cycled), bf16 autocast,
channels-last, SGD (momentum 0.9, Nesterov, weight decay 5e-4, constant learning rate). The providers:

  stock           the model as torchvision builds it, nn.CrossEntropyLoss
  torchext        a copy of the same weights through ``torchext.swap_modules`` with every family (Conv2d, BatchNorm2d,
                  ReLU, pools, Linear) and the torch.fx fusions (BatchNorm + ReLU, BatchNorm + add + ReLU), and
                  ``torchext.nn.CrossEntropyLoss``
  stock_compile   a copy of the stock model under ``torch.compile`` (default mode; CUDA only, ``--no-compile`` skips it)

Each provider warms up (``--warmup`` steps; torch.compile's compilation and cuDNN's autotuning happen there), then
``--rounds`` rounds run every provider for ``--steps`` steps in an order that rotates from round to round. Per round
and provider: the CUDA-event time from before its first step to after its last, over the steps (``step_time``, the
headline: median over the rounds, p20 and p80), and the time between consecutive steps' events (``step_pace``, every
step of every round). ``peak_allocated``: the allocator's peak over each provider's warm-up (MiB).
``gpu_time_share``: torchext's kernels' share of the torchext model's GPU time over ``--profile-steps`` steps
(torchext.profiling). On the CPU (``--smoke``: batch 2, 64 x 64, 2 steps, 2 rounds) the times are perf_counter's and
there is no autocast: a check that the script runs, not a measurement.
"""

import argparse
import copy
import itertools
import os
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import CsvWriter, Timing, environment, quantiles  # noqa: E402

import torchext  # noqa: E402
from torchext import profiling  # noqa: E402
from torchext.models import resnet18_torchvision  # noqa: E402

OP = "resnet18_torchvision"
PROVIDERS = ("stock", "torchext", "stock_compile")
PREMADE_BATCHES = 4
NUM_CLASSES = 1000


def stats(samples: list) -> Timing:
    """Median, p20 and p80 (one sample: itself three times)."""
    return quantiles(samples * 2 if len(samples) == 1 else samples)


def make_providers(args, device: torch.device) -> tuple[dict, object]:
    """{provider: (model to call, loss, optimizer)} from one set of initial weights, and torchext's SwapReport."""
    torch.manual_seed(0)
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
    base = resnet18_torchvision(num_classes=NUM_CLASSES).to(device, memory_format=memory_format)
    report = torchext.swap_modules(copy.deepcopy(base), inplace=True)
    models = {"stock": base, "torchext": report.model}
    criteria = {"stock": nn.CrossEntropyLoss(), "torchext": torchext.nn.CrossEntropyLoss()}
    if args.compile:
        models["stock_compile"] = torch.compile(copy.deepcopy(base))
        criteria["stock_compile"] = nn.CrossEntropyLoss()
    providers = {}
    for name, model in models.items():
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, nesterov=True, weight_decay=5e-4)
        providers[name] = (model, criteria[name], opt)
    return providers, report


def make_step(model, criterion, opt, batches, device: torch.device, amp: bool):
    it = itertools.cycle(batches)

    def step():
        x, y = next(it)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            loss = criterion(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def run_round(fn, n: int, device: torch.device) -> tuple[float, list]:
    """n calls of fn(): (time per step over the round, [time between consecutive steps]), microseconds."""
    if device.type == "cuda":
        events = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
        torch.cuda.synchronize(device)
        events[0].record()
        for i in range(n):
            fn()
            events[i + 1].record()
        torch.cuda.synchronize(device)
        pace = [events[i].elapsed_time(events[i + 1]) * 1e3 for i in range(n)]
        return events[0].elapsed_time(events[n]) * 1e3 / n, pace
    pace = []
    t0 = time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        fn()
        pace.append((time.perf_counter() - t) * 1e6)
    return (time.perf_counter() - t0) * 1e6 / n, pace


def bench(args, device: torch.device, writer: CsvWriter) -> dict:
    providers, report = make_providers(args, device)
    gen = torch.Generator().manual_seed(0)
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
    batches = [
        (
            torch.randn(args.batch_size, 3, args.image, args.image, generator=gen)
            .to(device)
            .contiguous(memory_format=memory_format),
            torch.randint(0, NUM_CLASSES, (args.batch_size,), generator=gen).to(device),
        )
        for _ in range(PREMADE_BATCHES)
    ]
    amp = args.amp == "bf16"
    steps = {name: make_step(*p, batches, device, amp) for name, p in providers.items()}
    peaks = {}
    for name, step in steps.items():
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        for _ in range(args.warmup):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            peaks[name] = torch.cuda.max_memory_allocated(device) / 2**20
    names = list(steps)
    per_round = {name: [] for name in names}
    pace = {name: [] for name in names}
    for r in range(args.rounds):
        for j in range(len(names)):
            name = names[(r + j) % len(names)]
            t, p = run_round(steps[name], args.steps, device)
            per_round[name].append(t)
            pace[name] += p
    share = None
    if device.type == "cuda" and args.profile_steps > 0:
        try:
            result = profiling.gpu_time_share(steps["torchext"], steps=args.profile_steps, warmup=1, device=device)
            share = result.get("share")
        except Exception as e:  # noqa: BLE001 - the timings above must not be lost to the profiler
            print(f"bench_resnet18_imagenet: the GPU-time share could not be measured: {e}", file=sys.stderr)
    shape = (args.batch_size, 3, args.image, args.image)
    dtype = "bfloat16" if amp else "float32"
    out = {}
    for name in names:
        t, p = stats(per_round[name]), stats(pace[name])
        writer.row(OP, name, "train_step", shape, dtype, "step_time", "us", t.p50, t.p20, t.p80)
        writer.row(OP, name, "train_step", shape, dtype, "step_pace", "us", p.p50, p.p20, p.p80)
        if name in peaks:
            writer.row(OP, name, "train_step", shape, dtype, "peak_allocated", "MiB", *[peaks[name]] * 3)
        out[name] = {"step_time": t, "step_pace": p, "peak": peaks.get(name)}
    if share is not None:
        writer.row(OP, "torchext", "train_step", shape, dtype, "gpu_time_share", "%", *[100 * share] * 3)
    return {"timings": out, "report": report, "share": share}


def _ms(t: Timing) -> str:
    return f"{t.p50 / 1e3:.3f} ({t.p20 / 1e3:.3f}-{t.p80 / 1e3:.3f})"


def render(result: dict, env: dict, args) -> str:
    t, report = result["timings"], result["report"]
    clock = "perf_counter" if env["gpu"].startswith("cpu") else "CUDA-event"
    lines = [
        "# torchvision ResNet-18 at 224 x 224, training step: stock vs torchext (bench_resnet18_imagenet.py)",
        "",
        f"{env['gpu']}; torch {env['torch']}, CUDA {env['cuda'] or '-'}, torchext {env['version']}; {env['date']}.",
        f"Batch {args.batch_size} x 3 x {args.image} x {args.image} synthetic, 1000 classes, amp {args.amp}, "
        f"{'channels-last' if args.channels_last else 'contiguous'}, SGD Nesterov; warm-up {args.warmup} step(s) per "
        f"provider, then {args.rounds} rounds x {args.steps} steps, providers alternated. Milliseconds per step "
        f"({clock}): the median of the rounds' means (p20-p80); 'x stock' compares medians.",
        "",
        "| provider | step (ms) | x stock | images/s | step-to-step pace (ms) | peak allocated (MiB) |",
        "|---|---|---|---|---|---|",
    ]
    base = t["stock"]["step_time"].p50
    for name, m in t.items():
        s, p = m["step_time"], m["step_pace"]
        peak = "" if m["peak"] is None else f"{m['peak']:.0f}"
        lines.append(
            f"| {name} | {_ms(s)} | {s.p50 / base:.3f}x | {args.batch_size / (s.p50 / 1e6):.0f} | {_ms(p)} | {peak} |"
        )
    c = report.counts
    left = ", ".join(f"{s.name} ({s.cls}: {s.reason})" for s in report.left_stock) or "none"
    lines += [
        "",
        f"torchext model: {c['replaced']} modules swapped, {c['graph_fused']} BatchNorm fusions by torch.fx "
        f"({sum(f.pattern == 'bn+relu' for f in report.graph_fused)} BN + ReLU, "
        f"{sum(f.pattern == 'bn+add+relu' for f in report.graph_fused)} BN + add + ReLU); left stock: {left}.",
    ]
    if result["share"] is not None:
        lines.append(
            f"GPU-time share of torchext's kernels in the torchext step: {100 * result['share']:.1f}% "
            f"({args.profile_steps} profiled steps)."
        )
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--image", type=int, default=224, help="image side (default 224)")
    p.add_argument("--steps", type=int, default=50, help="timed steps per provider and round (default 50)")
    p.add_argument("--rounds", type=int, default=5, help="rounds over the providers (default 5)")
    p.add_argument("--warmup", type=int, default=10, help="warm-up steps per provider (default 10)")
    p.add_argument("--amp", choices=("bf16", "none"), help="autocast (default: bf16 on CUDA, none on the CPU)")
    p.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, help="time stock under torch.compile too "
                   "(default: on CUDA)")  # fmt: skip
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--profile-steps", type=int, default=3, help="steps profiled for the GPU-time share (CUDA; 0: none)")
    p.add_argument("--smoke", action="store_true", help="CPU, batch 2, 64 x 64, 2 steps, 2 rounds, 1 warm-up step")
    p.add_argument("--out", help="CSV (appended; default: benchmarks/results/resnet18_imagenet_gpu.csv or _cpu.csv)")
    args = p.parse_args(argv)
    if args.smoke:
        args.device, args.batch_size, args.image, args.steps, args.rounds, args.warmup = "cpu", 2, 64, 2, 2, 1
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
        torch.backends.cudnn.benchmark = True
    cpu = device.type == "cpu"
    args.amp = args.amp or ("none" if cpu else "bf16")
    if cpu and args.amp != "none":
        p.error("--amp bf16 is for CUDA (the CPU run is a smoke test)")
    args.compile = (not cpu) if args.compile is None else args.compile
    args.out = args.out or f"benchmarks/results/resnet18_imagenet_{'cpu' if cpu else 'gpu'}.csv"
    env = environment(str(device))
    env["version"] = f"{env['version']} ({os.environ.get('TORCHEXT_COMMIT', 'working tree')})"
    writer = CsvWriter(args.out, env)
    result = bench(args, device, writer)
    writer.close()
    print(render(result, env, args), end="")


if __name__ == "__main__":
    main()
