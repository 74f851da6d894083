"""What torchext-compare's training loop adds per step on top of the step itself (issue 19): the tool's loop against
a bare loop of the same step, for both models of the comparison, stock and torchext-swapped.

    python benchmarks/bench_loop.py --out benchmarks/results/loop_gpu.csv   # CUDA, both models, about a minute
    python benchmarks/bench_loop.py --device cpu --steps 3                 # smoke run on the CPU (batch 16)

Each model runs its recipe (``torchext.compare.RECIPES``: resnet18_cifar batch 512, bf16 autocast, channels-last,
SGD Nesterov + one-cycle, label smoothing 0.1; cnn_cifar batch 128, float32, Adam), built as the tool builds it
(``_models``, ``_contenders``: the same models, losses, optimizers and schedules). The loops, per provider:

  bare      the step written out: autocast forward and loss, zero_grad, backward, optimizer step, scheduler step,
            on 8 batches made beforehand and already on the device (cycled), with an optimizer of its own
  step      the tool's iteration as it runs it (``_train_batch``: its step, the schedule, the loss summed on the
            device) on the same batches
  loop_c1   the tool's iteration fed by ``GPULoader`` (crop, flip and normalization on the device) one batch at a
            time (``chunk=1``, the loader before issue 19)
  loop      the same with the loader the tool builds (``_train_loader``: ``chunk`` batches prepared at once)
  epoch     whole epochs of the tool's ``_train_epoch`` (``--epoch-images`` images each), the memory reset before
            and the synchronizations around it included: its time per step is the tool's epoch time over its steps
  epoch_keep  the same epochs (alternated with ``epoch``) with the allocator's cache kept: the memory reset's
            ``torch.cuda.empty_cache()`` left out, the peaks still reset

So ``step`` - ``bare`` is the tool's bookkeeping per step, ``loop`` - ``step`` the loader, ``epoch`` - ``loop`` what
an epoch costs around its steps (the emptied allocator cache refilled, the epoch's plan, the synchronizations).

Timing: each loop warms up, then ``--rounds`` rounds run every (provider, loop) pair for ``--steps`` steps in an order
that rotates from round to round (drift of the machine reaches all alike). Per step, on CUDA: ``step_time``, the time
between CUDA events recorded after consecutive steps (the pace at which steps finish, whether the host or the GPU
is the bottleneck), ``host_time``, the host's time to issue the step (Python, dispatch, launches), and ``wall_time``,
each round's wall-clock time over its steps; on the CPU all are perf_counter times. Median, p20 and p80 (epoch rows:
over the epochs). ``gpu_time``: the GPU work of one step of ``bare`` and ``loop`` (kernel time profiled over
``--profile-steps`` steps with ``torchext.profiling``), for the GPU's busy share.
"""

import argparse
import dataclasses
import itertools
import os
import sys
import time
from unittest import mock

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import CsvWriter, Timing, environment, quantiles  # noqa: E402

from torchext import profiling  # noqa: E402
from torchext.compare import ONECYCLE_WARMUP, CompareConfig  # noqa: E402
from torchext.compare.devices import _Dist  # noqa: E402
from torchext.compare import train  # noqa: E402
from torchext.compare.train import _contenders, _models, _train_batch, _train_epoch, _train_loader  # noqa: E402
from torchext.data import GPULoader  # noqa: E402

MODELS = ("resnet18_cifar", "cnn_cifar")
LOOPS = ("bare", "step", "loop_c1", "loop")
PROVIDERS = ("stock", "torchext")
PREMADE_BATCHES = 8


def recipe(model: str, device: torch.device, batch_size: int | None) -> CompareConfig:
    """The model's recipe as the tool resolves it (on the CPU without autocast, as the tool falls back); epochs set
    high so that the one-cycle schedule outlasts the benchmark's steps."""
    cfg = CompareConfig(model=model, device=str(device), batch_size=batch_size, quiet=True).resolved()
    cfg = dataclasses.replace(cfg, epochs=10_000)
    if device.type == "cpu":
        cfg = dataclasses.replace(cfg, amp="none")
    cfg.validate()
    return cfg


def bare_step(net, criterion, cfg: CompareConfig, device: torch.device):
    """The training step as one writes it without the tool: its own optimizer and schedule (the recipe's)."""
    params = list(net.parameters())
    if cfg.optimizer == "sgd":
        opt = torch.optim.SGD(
            params, lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov, weight_decay=cfg.weight_decay
        )
    else:
        opt = torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = None
    if cfg.schedule == "onecycle":
        sched = torch.optim.lr_scheduler.OneCycleLR(
            opt, max_lr=cfg.lr, total_steps=10**7, pct_start=ONECYCLE_WARMUP, cycle_momentum=False
        )
    amp = cfg.amp != "none"
    amp_dtype = torch.float16 if cfg.amp == "fp16" else torch.bfloat16

    def step(xb, yb):
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp):
            loss = criterion(net(xb), yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if sched is not None:
            sched.step()

    return step


def cycling(loader):
    """The loader's batches, epoch after epoch, without end."""
    while True:
        yield from loader


def run_steps(fn, n: int, device: torch.device):
    """Calls fn() n times: (pace per step, host time per step, wall-clock per step), microseconds."""
    host = []
    if device.type == "cuda":
        events = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        events[0].record()
        for i in range(n):
            h = time.perf_counter()
            fn()
            host.append((time.perf_counter() - h) * 1e6)
            events[i + 1].record()
        torch.cuda.synchronize(device)
        wall = (time.perf_counter() - t0) * 1e6 / n
        pace = [events[i].elapsed_time(events[i + 1]) * 1e3 for i in range(n)]
        return pace, host, wall
    t0 = time.perf_counter()
    for _ in range(n):
        h = time.perf_counter()
        fn()
        host.append((time.perf_counter() - h) * 1e6)
    return list(host), host, (time.perf_counter() - t0) * 1e6 / n


def stats(samples: list) -> Timing:
    """Median, p20 and p80 (one sample: itself three times)."""
    return quantiles(samples * 2 if len(samples) == 1 else samples)


def gpu_us_per_step(fn, steps: int, device: torch.device) -> float | None:
    if steps < 1 or device.type != "cuda":
        return None
    result = profiling.gpu_time_share(fn, steps=steps, warmup=1, device=device)
    return result["total_us"] / steps if result.get("share") is not None else None


def synthetic_images(n: int) -> tuple:
    """n random CIFAR-shaped uint8 images (NHWC) and labels, the same on every call."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (n, 32, 32, 3), dtype=torch.uint8, generator=gen)
    return x, torch.randint(0, 10, (n,), generator=gen)


def contenders_of(cfg: CompareConfig, device: torch.device, steps_per_epoch: int) -> dict:
    """{'stock': ..., 'torchext': ...}: the two models with their losses, optimizers and schedules, as the tool
    builds them."""
    stock, ours, _ = _models(cfg, 10, device, seed=0)
    return dict(zip(PROVIDERS, _contenders(stock, ours, cfg, device, _Dist(), steps_per_epoch), strict=True))


def premade_batches(x, y, cfg: CompareConfig, device: torch.device) -> list:
    """PREMADE_BATCHES augmented batches on the device, made beforehand (GPULoader, one batch at a time)."""
    loader = GPULoader(
        x, y, cfg.batch_size, train=True, device=device, seed=0, channels_last=cfg.channels_last, chunk=1
    )
    return list(itertools.islice(iter(loader), PREMADE_BATCHES))


def bench_model(model: str, args, device: torch.device, writer: CsvWriter) -> dict:
    """Times every loop of one model for both providers; returns {(provider, loop): {metric: Timing}}."""
    cfg = recipe(model, device, args.batch_size)
    x, y = synthetic_images(max(args.epoch_images, (PREMADE_BATCHES + 1) * cfg.batch_size))
    dist = _Dist()
    loader = _train_loader(x, y, cfg, device, seed=0)
    loader_c1 = GPULoader(
        x, y, cfg.batch_size, train=True, device=device, seed=0, channels_last=cfg.channels_last, chunk=1
    )
    epoch_loader = _train_loader(x[: args.epoch_images], y[: args.epoch_images], cfg, device, seed=0)
    premade = premade_batches(x, y, cfg, device)
    contenders = contenders_of(cfg, device, len(loader))

    fns = {}
    for provider, c in contenders.items():
        c.net.train()
        loss_sum = torch.zeros((), device=device)
        bare = bare_step(c.net, c.criterion, cfg, device)
        batches = {loop: itertools.cycle(premade) for loop in ("bare", "step")}
        batches.update(loop_c1=cycling(loader_c1), loop=cycling(loader))
        fns[(provider, "bare")] = lambda b=bare, it=batches["bare"]: b(*next(it))
        for loop in ("step", "loop_c1", "loop"):
            fns[(provider, loop)] = lambda c=c, it=batches[loop], s=loss_sum: _train_batch(
                c, *next(it), cfg, device, dist, s
            )
    keys = list(fns)
    for key in keys:
        for _ in range(args.warmup):
            fns[key]()
    samples = {key: {"step_time": [], "host_time": [], "wall_time": []} for key in keys}
    for r in range(args.rounds):
        for j in range(len(keys)):
            key = keys[(r + j) % len(keys)]
            pace, host, wall = run_steps(fns[key], args.steps, device)
            samples[key]["step_time"] += pace
            samples[key]["host_time"] += host
            samples[key]["wall_time"].append(wall)
    out = {key: {metric: stats(v) for metric, v in m.items()} for key, m in samples.items()}
    for provider in PROVIDERS:
        for loop in ("bare", "loop"):
            us = gpu_us_per_step(fns[(provider, loop)], args.profile_steps, device)
            if us is not None:
                out[(provider, loop)]["gpu_time"] = Timing(us, us, us)
    # Whole epochs last: each empties the allocator's cache, which the loops above would then pay for. Two kinds,
    # alternated: as the tool runs them, and with the cache kept (peaks reset only), to tell the reset's cost apart.
    for provider, c in contenders.items():
        per_step = {"epoch": [], "epoch_keep": []}
        for epoch in range(args.epochs):
            for i, kind in enumerate(("epoch_keep", "epoch")):
                start = _memory_start_keeping_cache if kind == "epoch_keep" else train._memory_start
                with mock.patch.object(train, "_memory_start", start):
                    record = _train_epoch(c, epoch_loader, 2 * epoch + i, 0, cfg, device, dist, False)
                per_step[kind].append(record["epoch_time_s"] * 1e6 / (record["images"] / cfg.batch_size))
        for kind, samples in per_step.items():
            t = stats(samples)
            out[(provider, kind)] = {"wall_time": t, "step_time": t}
    shape = (cfg.batch_size, 3, 32, 32)
    dtype = {"bf16": "bfloat16", "fp16": "float16"}.get(cfg.amp, "float32")
    for (provider, loop), metrics in out.items():
        for metric, t in metrics.items():
            writer.row(model, provider, loop, shape, dtype, metric, "us", t.p50, t.p20, t.p80)
    return {"cfg": cfg, "timings": out, "epoch_steps": len(epoch_loader)}


def _memory_start_keeping_cache(device: torch.device) -> int:
    """torchext.compare.train._memory_start without its torch.cuda.empty_cache(): the peaks reset only."""
    if device.type != "cuda":
        return 0
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def _ms(t: Timing | None) -> str:
    return "" if t is None else f"{t.p50 / 1000:.3f} ({t.p20 / 1000:.3f}-{t.p80 / 1000:.3f})"


def render(results: dict, env: dict, args) -> str:
    lines = [
        "# torchext-compare's training loop against a bare loop (benchmarks/bench_loop.py)",
        "",
        f"{env['gpu']}; torch {env['torch']}, CUDA {env['cuda'] or '-'}, torchext {env['version']}; {env['date']}.",
        f"{args.rounds} rounds x {args.steps} steps per loop after {args.warmup} warm-up steps, {args.epochs} epoch(s) "
        "per provider. Milliseconds per step, median (p20-p80); 'x bare' compares medians. The epoch rows are "
        f"wall-clock, the others {'perf_counter' if env['gpu'].startswith('cpu') else 'CUDA-event'} times per step.",
    ]
    labels = {
        "bare": "bare loop, premade batches",
        "step": "tool's iteration (_train_batch), premade batches",
        "loop_c1": "tool's iteration + GPULoader, chunk 1 (before)",
        "loop": "tool's iteration + GPULoader as the tool builds it",
        "epoch": "tool's _train_epoch (its reported epoch time / steps)",
        "epoch_keep": "the same epoch without emptying the allocator's cache first",
    }
    for model, r in results.items():
        cfg, t = r["cfg"], r["timings"]
        lines += [
            "",
            f"## {model}: batch {cfg.batch_size}, {cfg.optimizer} ({cfg.schedule}), amp {cfg.amp}, "
            f"{'channels-last' if cfg.channels_last else 'contiguous'}; epochs of {r['epoch_steps']} steps",
            "",
            "| loop | stock step | x bare | torchext step | x bare | stock host | torchext host |",
            "|---|---|---|---|---|---|---|",
        ]
        for loop in (*LOOPS, "epoch", "epoch_keep"):
            cells = []
            for provider in PROVIDERS:
                m = t[(provider, loop)]
                ratio = m["step_time"].p50 / t[(provider, "bare")]["step_time"].p50
                cells += [_ms(m["step_time"]), f"{ratio:.3f}x"]
            hosts = [_ms(t[(p, loop)].get("host_time")) for p in PROVIDERS]
            lines.append(f"| {labels[loop]} | {' | '.join(cells)} | {' | '.join(hosts)} |")
        busy = []
        for provider in PROVIDERS:
            for loop in ("bare", "loop"):
                g = t[(provider, loop)].get("gpu_time")
                if g is not None:
                    share = g.p50 / t[(provider, loop)]["step_time"].p50
                    busy.append(f"{provider} {loop} {g.p50 / 1000:.3f} ms ({100 * share:.0f}% busy)")
        lines += ["", "GPU work per step: " + ("; ".join(busy) if busy else "not measured (CUDA only)") + "."]
        goal = [f"{p} {t[(p, 'epoch')]['step_time'].p50 / t[(p, 'bare')]['step_time'].p50:.3f}x" for p in PROVIDERS]
        lines.append(f"The tool's epoch time per step against the bare loop: {', '.join(goal)} (goal: 1.05x or less).")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated (default: both)")
    p.add_argument("--batch-size", type=int, help="overrides the recipe's (default on the CPU: 16)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per loop and round")
    p.add_argument("--rounds", type=int, help="rounds over every loop (default: 5 on CUDA, 1 on the CPU)")
    p.add_argument("--warmup", type=int, help="warm-up steps per loop (default: 5 on CUDA, 1 on the CPU)")
    p.add_argument("--epochs", type=int, help="whole epochs per provider (default: 3 on CUDA, 1 on the CPU)")
    p.add_argument("--epoch-images", type=int, help="images per epoch (default: 45000, CIFAR-10's training split "
                   "less the held-out 5000, on CUDA; 4 batches on the CPU)")  # fmt: skip
    p.add_argument("--profile-steps", type=int, default=5, help="steps profiled for the GPU work (CUDA; 0: none)")
    p.add_argument("--out", help="CSV (appended; default: benchmarks/results/loop_gpu.csv or loop_cpu.csv)")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
        torch.backends.cudnn.benchmark = True  # as the tool sets it
    cpu = device.type == "cpu"
    if cpu and args.batch_size is None:
        args.batch_size = 16
    args.rounds = args.rounds or (1 if cpu else 5)
    args.warmup = args.warmup if args.warmup is not None else (1 if cpu else 5)
    args.epochs = args.epochs or (1 if cpu else 3)
    args.out = args.out or f"benchmarks/results/loop_{'cpu' if cpu else 'gpu'}.csv"
    env = environment(str(device))
    env["version"] = f"{env['version']} ({os.environ.get('TORCHEXT_COMMIT', 'working tree')})"
    writer = CsvWriter(args.out, env)
    results = {}
    epoch_images = args.epoch_images
    for model in args.models.split(","):
        batch = args.batch_size or CompareConfig(model=model).resolved().batch_size
        args.epoch_images = epoch_images or (4 * batch if cpu else 45000)
        results[model] = bench_model(model, args, device, writer)
    writer.close()
    print(render(results, env, args), end="")


if __name__ == "__main__":
    main()
