"""What torchext-compare's training loop adds per step on top of the step itself (issue 19): the tool's loop against
a bare loop of the same step, for both models of the comparison, stock and torchext-swapped.

    python benchmarks/bench_loop.py --out benchmarks/results/loop_gpu.csv   # CUDA, both models, about a minute
    python benchmarks/bench_loop.py --timeline --out benchmarks/results/loop_timeline_gpu.csv   # resnet18_cifar, 2 min
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

``--timeline`` (default model resnet18_cifar) asks instead where the epoch's time goes: the rounds above set medians
of steps against an epoch's mean over its steps, two different statistics. Every kind runs exactly one epoch's steps
(the length of the tool's loader over ``--epoch-images``), synchronized before and after, its figure its wall-clock
time over its steps as the tool reports an epoch; ``--rounds`` runs of each, every round in a shuffled order. The
kinds, rows ``run_<kind>``:

  bare, step  as above, on the premade batches
  loop        the tool's iteration over one fresh epoch of the tool's loader (the epoch's plan and every chunk)
  epoch       ``_train_epoch`` itself, its loader wrapped to stamp the steps; its figure is its own epoch_time_s
  epoch_keep  the same with the allocator's cache kept, as above
  bare_nogc, epoch_nogc  with the garbage collector disabled during the loop (``gc.disable()``, enabled again after)

Each step is stamped on the host (perf_counter when the loop asks for the next batch) and on CUDA (an event then, no
synchronization), so a run also gives: its mean and median pace, its first ``--first-steps`` steps against the rest,
the steps at which the loader prepares its next chunk against the others, p99 and max, the ramp (t0 to the first
step's end on the GPU), the lag (the host's return from a step to the step's end on the GPU), the drain (the host's
return from the last step to the end of the final synchronization), the garbage collector's time and passes during
the loop, and the caching allocator's new segments (cudaMalloc calls). Rows: median, p20 and p80 over the runs.
Each run is also set against the bare loop's run of the same provider in the same round (``x_bare_paired``, unit
ratio): a kind's runs spread by about 10% from round to round on a host-bound step, which these ratios cancel.
``--kinds`` narrows the kinds (bare always runs), so that more rounds fit in a call.
"""

import argparse
import dataclasses
import gc
import itertools
import os
import random
import statistics
import sys
import time
from unittest import mock

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import CsvWriter, Timing, environment, quantiles  # noqa: E402

from torchext import profiling  # noqa: E402
from torchext.compare import ONECYCLE_WARMUP, CompareConfig, train  # noqa: E402
from torchext.compare.devices import _Dist  # noqa: E402
from torchext.compare.train import _contenders, _models, _train_batch, _train_epoch, _train_loader  # noqa: E402
from torchext.data import GPULoader  # noqa: E402

MODELS = ("resnet18_cifar", "cnn_cifar")
LOOPS = ("bare", "step", "loop_c1", "loop")
PROVIDERS = ("stock", "torchext")
PREMADE_BATCHES = 8
TIMELINE_KINDS = ("bare", "bare_nogc", "step", "loop", "epoch", "epoch_keep", "epoch_nogc")  # rows run_<kind>
COUNT_METRICS = ("gc_count", "segments")


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


class Stamped:
    """The batches of one timed run (``steps`` of them, from ``batches``: a GPULoader, whose ``iter()`` is a new
    epoch, or an endless iterator), stamping each step of the loop that consumes them: on the host, perf_counter when
    the loop asks for the next batch (step i has returned), and on CUDA an event recorded then (no synchronization).
    It stands in for the loader of ``_train_epoch``, which cannot be instrumented otherwise (``set_epoch`` and
    ``len`` pass through). ``t0`` is taken when the loop starts, the event ``events[0]`` with it. While the loop
    runs, the Python garbage collector's passes are timed (``gc_s``, ``gc_count``) and, with ``gc_off``, the
    collector is disabled (enabled again when the loop ends)."""

    def __init__(self, batches, steps: int, device: torch.device, gc_off: bool = False):
        self.batches, self.steps, self.gc_off = batches, steps, gc_off
        cuda = device.type == "cuda"
        self.events = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)] if cuda else None
        self.host, self.t0, self.gc_s, self.gc_count, self._gc_start = [], None, 0.0, 0, 0.0

    def __len__(self) -> int:
        return self.steps

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.batches, "set_epoch"):
            self.batches.set_epoch(epoch)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self.gc_s += time.perf_counter() - self._gc_start
            self.gc_count += 1

    def __iter__(self):
        enabled = gc.isenabled()
        if self.gc_off:
            gc.disable()
        gc.callbacks.append(self._on_gc)
        try:
            self.t0 = time.perf_counter()
            if self.events is not None:
                self.events[0].record()
            for i, batch in enumerate(itertools.islice(self.batches, self.steps)):
                yield batch
                self.host.append(time.perf_counter())
                if self.events is not None:
                    self.events[i + 1].record()
        finally:
            gc.callbacks.remove(self._on_gc)
            if enabled:
                gc.enable()


def sync(device: torch.device) -> None:
    """Waits for the device's queue (CUDA); nothing on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timeline_run(kind: str, c, bare, premade, loader, epoch: int, steps: int, cfg, device, dist) -> tuple:
    """One run of ``steps`` steps of a TIMELINE_KINDS kind for contender c, synchronized before and after: (its
    Stamped, its wall-clock seconds). An epoch kind's seconds are the tool's own (``_train_epoch``'s epoch_time_s);
    the other kinds time their loop the way ``_train_epoch`` times its own."""
    gc_off = kind.endswith("_nogc")
    if kind.startswith("epoch"):
        stamped = Stamped(loader, steps, device, gc_off)
        start = _memory_start_keeping_cache if kind == "epoch_keep" else train._memory_start
        with mock.patch.object(train, "_memory_start", start):
            record = _train_epoch(c, stamped, epoch, 0, cfg, device, dist, False)
        return stamped, record["epoch_time_s"]
    if kind.startswith("bare"):
        source, body = premade, bare
    else:
        loss_sum = torch.zeros((), dtype=torch.float32, device=device)
        source = loader if kind == "loop" else premade
        if kind == "loop":
            loader.set_epoch(epoch)

        def body(xb, yb):
            _train_batch(c, xb, yb, cfg, device, dist, loss_sum)

    stamped = Stamped(source, steps, device, gc_off)
    sync(device)
    t0 = time.perf_counter()
    for xb, yb in stamped:
        body(xb, yb)
    sync(device)
    return stamped, time.perf_counter() - t0


def _percentile(samples: list, q: int) -> float:
    return statistics.quantiles(samples, n=100, method="inclusive")[q - 1] if len(samples) > 1 else samples[0]


def run_figures(s: Stamped, seconds: float, first: int, chunk: int) -> dict:
    """A run's figures, {metric: value}, in microseconds but for ``gc_count``. Step i's pace is the time between the
    events after steps i-1 and i (the first: from t0), its host time the time between the host's stamps; ``lag`` is
    the median of how long after the host returned from a step the GPU finished it (the events' times from t0: the
    queue is empty at t0); ``drain`` the time from the host's return from the last step to the end of the final
    synchronization. On the CPU, paces are the host's times."""
    host = [(h - s.t0) * 1e6 for h in s.host]
    done = host if s.events is None else [s.events[0].elapsed_time(e) * 1e3 for e in s.events[1:]]
    n = len(host)
    pace = [b - a for a, b in zip([0.0, *done[:-1]], done, strict=True)]
    interval = [b - a for a, b in zip([0.0, *host[:-1]], host, strict=True)]
    k = max(1, min(first, n - 1))
    figures = {
        "wall_time": seconds * 1e6 / n,
        "step_mean": statistics.fmean(pace),
        "step_p50": statistics.median(pace),
        "host_p50": statistics.median(interval),
        "step_p99": _percentile(pace, 99),
        "step_max": max(pace),
        "first_steps": statistics.fmean(pace[:k]),
        "rest_steps": statistics.fmean(pace[k:] or pace),
        "ramp": done[0],
        "lag": statistics.median(d - h for d, h in zip(done, host, strict=True)),
        "drain": seconds * 1e6 - host[-1],
        "gc_time": s.gc_s * 1e6,
        "gc_count": s.gc_count,
    }
    chunk_steps = [pace[i] for i in range(k, n) if i % chunk == 0]
    other_steps = [pace[i] for i in range(k, n) if i % chunk]
    if chunk_steps and other_steps:
        figures.update(chunk_steps=statistics.fmean(chunk_steps), other_steps=statistics.fmean(other_steps))
    return figures


def _segments(device: torch.device) -> int | None:
    """The caching allocator's cudaMalloc count so far (None on the CPU)."""
    return torch.cuda.memory_stats(device).get("segment.all.allocated", 0) if device.type == "cuda" else None


def bench_timeline(model: str, args, device: torch.device, writer: CsvWriter) -> dict:
    """--timeline: every TIMELINE_KINDS kind of both providers in runs of one epoch's steps, ``--rounds`` runs each
    in a shuffled order per round; returns {(provider, kind): {metric: Timing over the runs}}."""
    cfg = recipe(model, device, args.batch_size)
    x, y = synthetic_images(max(args.epoch_images, (PREMADE_BATCHES + 1) * cfg.batch_size))
    dist = _Dist()
    loader = _train_loader(x[: args.epoch_images], y[: args.epoch_images], cfg, device, seed=0)
    steps = len(loader)
    premade = premade_batches(x, y, cfg, device)
    contenders = contenders_of(cfg, device, steps)
    bares, cycles = {}, {}
    for provider, c in contenders.items():
        c.net.train()
        bares[provider] = bare_step(c.net, c.criterion, cfg, device)
        cycles[provider] = itertools.cycle(premade)
    kinds = args.kinds
    keys = [(provider, kind) for provider in PROVIDERS for kind in kinds]
    epoch = 0

    def run(key, n):
        nonlocal epoch
        provider, kind = key
        epoch += 1
        c = contenders[provider]
        return timeline_run(kind, c, bares[provider], cycles[provider], loader, epoch, n, cfg, device, dist)

    for key in keys:
        if args.warmup:
            run(key, args.warmup)
    samples = {key: {} for key in keys}
    for r in range(args.rounds):
        order = list(keys)
        random.Random(r).shuffle(order)  # each round in its own order: no kind always follows the same one
        walls = {}
        for key in order:
            before = _segments(device)
            stamped, seconds = run(key, steps)
            figures = run_figures(stamped, seconds, args.first_steps, loader.chunk)
            if before is not None:
                figures["segments"] = _segments(device) - before
            for metric, value in figures.items():
                samples[key].setdefault(metric, []).append(value)
            walls[key] = figures["wall_time"]
        # Paired: each run against the bare loop of the same provider in the same round (seconds apart), so that the
        # machine's drift from round to round, which spreads a kind's runs by about 10%, cancels.
        for provider, kind in keys:
            samples[(provider, kind)].setdefault("x_bare_paired", []).append(
                walls[(provider, kind)] / walls[(provider, "bare")]
            )
    out = {key: {metric: stats(v) for metric, v in m.items()} for key, m in samples.items()}
    for provider, c in contenders.items():
        loss_sum = torch.zeros((), device=device)
        batches = cycling(loader)
        fns = {
            "bare": lambda b=bares[provider], it=cycles[provider]: b(*next(it)),
            "loop": lambda c=c, it=batches, s=loss_sum: _train_batch(c, *next(it), cfg, device, dist, s),
        }
        for kind, fn in fns.items():
            us = gpu_us_per_step(fn, args.profile_steps, device) if (provider, kind) in out else None
            if us is not None:
                out[(provider, kind)]["gpu_time"] = Timing(us, us, us)
    shape = (cfg.batch_size, 3, 32, 32)
    dtype = {"bf16": "bfloat16", "fp16": "float16"}.get(cfg.amp, "float32")
    for (provider, kind), metrics in out.items():
        for metric, t in metrics.items():
            unit = "count" if metric in COUNT_METRICS else "ratio" if metric == "x_bare_paired" else "us"
            writer.row(model, provider, f"run_{kind}", shape, dtype, metric, unit, t.p50, t.p20, t.p80)
    return {"cfg": cfg, "timeline": out, "epoch_steps": steps, "chunk": loader.chunk}


def _ms(t: Timing | None) -> str:
    return "" if t is None else f"{t.p50 / 1000:.3f} ({t.p20 / 1000:.3f}-{t.p80 / 1000:.3f})"


def render(results: dict, env: dict, args) -> str:
    timer = "perf_counter" if env["gpu"].startswith("cpu") else "CUDA-event"
    if args.timeline:
        how = (
            f"--timeline: {args.rounds} run(s) of one epoch's steps per provider and kind, every round in its own "
            f"(shuffled) order, after a run of {args.warmup} warm-up steps each; gc thresholds {gc.get_threshold()}. "
            f"Milliseconds: each run's figure, median (p20-p80) over the runs; paces are {timer} times."
        )
    else:
        how = (
            f"{args.rounds} rounds x {args.steps} steps per loop after {args.warmup} warm-up steps, {args.epochs} "
            "epoch(s) per provider. Milliseconds per step, median (p20-p80); 'x bare' compares medians. The epoch "
            f"rows are wall-clock, the others {timer} times per step."
        )
    lines = [
        "# torchext-compare's training loop against a bare loop (benchmarks/bench_loop.py)",
        "",
        f"{env['gpu']}; torch {env['torch']}, CUDA {env['cuda'] or '-'}, torchext {env['version']}; {env['date']}.",
        how,
    ]
    for model, r in results.items():
        lines += _render_timeline(model, r, args) if "timeline" in r else _render_loops(model, r)
    return "\n".join(lines) + "\n"


def _heading(model: str, r: dict, what: str) -> str:
    cfg = r["cfg"]
    return (
        f"## {model}: batch {cfg.batch_size}, {cfg.optimizer} ({cfg.schedule}), amp {cfg.amp}, "
        f"{'channels-last' if cfg.channels_last else 'contiguous'}; {what}"
    )


def _render_loops(model: str, r: dict) -> list:
    labels = {
        "bare": "bare loop, premade batches",
        "step": "tool's iteration (_train_batch), premade batches",
        "loop_c1": "tool's iteration + GPULoader, chunk 1 (before)",
        "loop": "tool's iteration + GPULoader as the tool builds it",
        "epoch": "tool's _train_epoch (its reported epoch time / steps)",
        "epoch_keep": "the same epoch without emptying the allocator's cache first",
    }
    t = r["timings"]
    lines = [
        "",
        _heading(model, r, f"epochs of {r['epoch_steps']} steps"),
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
    lines += ["", _busy(t, "step_time")]
    goal = [f"{p} {t[(p, 'epoch')]['step_time'].p50 / t[(p, 'bare')]['step_time'].p50:.3f}x" for p in PROVIDERS]
    lines.append(f"The tool's epoch time per step against the bare loop: {', '.join(goal)} (goal: 1.05x or less).")
    return lines


def _x_range(t: Timing) -> str:
    """A ratio's median and p20-p80: '1.029x (0.938-1.106)'."""
    return f"{t.p50:.3f}x ({t.p20:.3f}-{t.p80:.3f})"


def _busy(t: dict, pace: str) -> str:
    """The GPU work per step of bare and loop, and its share of their pace (metric ``pace``)."""
    busy = []
    for provider in PROVIDERS:
        for loop in ("bare", "loop"):
            g = t.get((provider, loop), {}).get("gpu_time")
            if g is not None:
                share = g.p50 / t[(provider, loop)][pace].p50
                busy.append(f"{provider} {loop} {g.p50 / 1000:.3f} ms ({100 * share:.0f}% busy)")
    return "GPU work per step: " + ("; ".join(busy) if busy else "not measured (CUDA only)") + "."


TIMELINE_LABELS = {
    "bare": "bare loop, premade batches",
    "bare_nogc": "bare loop, gc disabled during the loop",
    "step": "tool's iteration (_train_batch), premade batches",
    "loop": "tool's iteration + a fresh epoch of the tool's loader",
    "epoch": "tool's _train_epoch (its epoch_time_s / steps)",
    "epoch_keep": "_train_epoch, the allocator's cache kept",
    "epoch_nogc": "_train_epoch, gc disabled during its loop",
}
TIMELINE_COLUMNS = (  # (metric, heading) of the table of where a run's time goes
    ("host_p50", "host median"),
    ("first_steps", "first {k}"),
    ("rest_steps", "rest"),
    ("chunk_steps", "chunk steps"),
    ("other_steps", "other steps"),
    ("step_p99", "p99"),
    ("step_max", "max"),
    ("ramp", "ramp"),
    ("lag", "lag"),
    ("drain", "drain"),
    ("gc_time", "gc"),
)


def _render_timeline(model: str, r: dict, args) -> list:
    t, steps = r["timeline"], r["epoch_steps"]
    k = max(1, min(args.first_steps, steps - 1))

    def ratio(p, kind, metric, base_kind, base_metric):
        return t[(p, kind)][metric].p50 / t[(p, base_kind)][base_metric].p50

    lines = [
        "",
        _heading(model, r, f"runs of one epoch's {steps} steps (--timeline)"),
        "",
        "| run | stock mean | x bare | paired x bare | stock median | mean / median | torchext mean | x bare "
        "| paired x bare | torchext median | mean / median |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for kind in args.kinds:
        cells = []
        for p in PROVIDERS:
            m = t[(p, kind)]
            cells += [_ms(m["wall_time"]), f"{ratio(p, kind, 'wall_time', 'bare', 'wall_time'):.3f}x"]
            cells += [_x_range(m["x_bare_paired"])]
            cells += [_ms(m["step_p50"]), f"{ratio(p, kind, 'wall_time', kind, 'step_p50'):.3f}x"]
        lines.append(f"| {TIMELINE_LABELS[kind]} | {' | '.join(cells)} |")

    def each(kind, metric, base_kind, base_metric):
        return ", ".join(f"{p} {ratio(p, kind, metric, base_kind, base_metric):.3f}x" for p in PROVIDERS)

    def paired(kind):
        return ", ".join(f"{p} {_x_range(t[(p, kind)]['x_bare_paired'])}" for p in PROVIDERS)

    lines += [
        "",
        "'mean' is a run's wall-clock time (synchronized before and after) over its steps, as the tool reports an "
        "epoch; 'median' the median of its steps' paces, as the loop rows of the default mode report a loop; "
        "'x bare' sets a run's mean against the bare loop's mean (medians over the runs), 'paired x bare' each run "
        "against the bare loop's run of the same round (median and p20-p80 over the rounds: the machine's drift "
        "between rounds cancels), 'mean / median' a run's mean against its own median.",
        f"- The bare loop's mean against its own median (what comparing a mean with a median adds): "
        f"{each('bare', 'wall_time', 'bare', 'step_p50')}.",
    ]
    if "epoch" in args.kinds:
        lines += [
            f"- The epoch's mean against the bare loop's median (the comparison of the default mode): "
            f"{each('epoch', 'wall_time', 'bare', 'step_p50')}.",
            f"- The epoch's mean against the bare loop's mean (like for like; goal: 1.05x or less): "
            f"{each('epoch', 'wall_time', 'bare', 'wall_time')}; paired by round: {paired('epoch')}.",
        ]
    if "loop" in args.kinds:
        lines.append(
            f"- The loop's mean against the bare loop's: {each('loop', 'wall_time', 'bare', 'wall_time')}; paired by "
            f"round: {paired('loop')}."
        )
    lines += [
        _busy(t, "step_mean").replace("per step:", "per step (share of the run's mean pace):"),
        "",
        "Where a run's time goes, milliseconds (median over the runs):",
        "",
        "| provider, run | " + " | ".join(h.format(k=k) for _, h in TIMELINE_COLUMNS) + " | new segments |",
        "|---|" + "---|" * (len(TIMELINE_COLUMNS) + 1),
    ]
    for p in PROVIDERS:
        for kind in args.kinds:
            m = t[(p, kind)]
            cells = [f"{m[metric].p50 / 1000:.3f}" if metric in m else "-" for metric, _ in TIMELINE_COLUMNS]
            cells[-1] += f" ({m['gc_count'].p50:g})"
            cells.append(f"{m['segments'].p50:g}" if "segments" in m else "-")
            lines.append(f"| {p}, {kind} | {' | '.join(cells)} |")
    lines += [
        "",
        f"- host median: the median time between the host's returns from consecutive steps. first {k} / rest: the "
        f"mean pace of the run's first {k} steps / of the others (a slow start: an emptied cache, the epoch's plan).",
        f"- chunk steps / other steps: the mean pace of the steps after the first {k} at which the loader prepares its "
        f"next {r['chunk']} batches (every {r['chunk']}th) / of the others; on premade batches the same positions, as "
        "a control. p99, max: the slowest steps' paces.",
        "- ramp: from t0 (queue empty) to the end of the first step on the GPU. lag: the median time from the host's "
        "return from a step to the end of that step on the GPU (small: the GPU waits for the host). drain: from the "
        "host's return from the last step to the end of the final synchronization.",
        "- gc: time in the garbage collector's passes during the loop (passes). new segments: cudaMalloc calls of the "
        "caching allocator during the run (an emptied cache refilled).",
        "- Rows: bare and step on the 8 premade batches, loop and the epochs on one epoch of the tool's loader; "
        "_nogc: gc.disable() for the loop (enabled again after); epoch_keep: _memory_start without empty_cache().",
    ]
    return lines


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--models", help="comma-separated (default: both; with --timeline: resnet18_cifar)")
    p.add_argument("--batch-size", type=int, help="overrides the recipe's (default on the CPU: 16)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per loop and round (not with --timeline)")
    p.add_argument("--rounds", type=int, help="rounds over every loop (default: 5 on CUDA, 1 on the CPU); with "
                   "--timeline, the runs of each kind")  # fmt: skip
    p.add_argument("--warmup", type=int, help="warm-up steps per loop (default: 5 on CUDA, 1 on the CPU)")
    p.add_argument("--timeline", action="store_true", help="instead of the loops' rounds, runs of one epoch's steps "
                   "of every kind (TIMELINE_KINDS), each step stamped: where the epoch's time goes")  # fmt: skip
    p.add_argument("--kinds", default=",".join(TIMELINE_KINDS), help="--timeline: the kinds run, comma-separated "
                   f"(bare always; default: all of {','.join(TIMELINE_KINDS)})")  # fmt: skip
    p.add_argument("--first-steps", type=int, default=5, help="--timeline: the steps counted as a run's start")
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
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if not args.timeline and args.kinds != p.get_default("kinds"):
        p.error("--kinds chooses --timeline's kinds: add --timeline")
    unknown = sorted(set(kinds) - set(TIMELINE_KINDS))
    if unknown:
        p.error(f"--kinds: unknown {', '.join(unknown)} (expected some of {', '.join(TIMELINE_KINDS)})")
    args.kinds = [k for k in TIMELINE_KINDS if k in kinds or k == "bare"]
    args.rounds = args.rounds or (1 if cpu else 5)
    args.warmup = args.warmup if args.warmup is not None else (1 if cpu else 5)
    args.epochs = args.epochs or (1 if cpu else 3)
    args.out = args.out or f"benchmarks/results/loop_{'cpu' if cpu else 'gpu'}.csv"
    env = environment(str(device))
    env["version"] = f"{env['version']} ({os.environ.get('TORCHEXT_COMMIT', 'working tree')})"
    writer = CsvWriter(args.out, env)
    results = {}
    epoch_images = args.epoch_images
    models = args.models or ("resnet18_cifar" if args.timeline else ",".join(MODELS))
    for model in models.split(","):
        batch = args.batch_size or CompareConfig(model=model).resolved().batch_size
        args.epoch_images = epoch_images or (4 * batch if cpu else 45000)
        results[model] = (bench_timeline if args.timeline else bench_model)(model, args, device, writer)
    writer.close()
    print(render(results, env, args), end="")


if __name__ == "__main__":
    main()
