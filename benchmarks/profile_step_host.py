"""Where the host's time goes in one training step of torchext-compare's recipes (issue 19: the fully swapped
ResNet-18's step is bound by the host, so its epoch-time ratio follows host costs): the tool's iteration
(``_train_batch``) on premade batches, stock and torchext, under ``torch.profiler`` (CPU activity only: no CUPTI
overhead on the launches).

    python benchmarks/profile_step_host.py --out benchmarks/results/step_host_gpu.csv   # CUDA, about 30 s

Per provider: the step's host time (perf_counter around the iteration, median of ``--steps`` unprofiled steps, the
GPU synchronized before each so that no step waits on the GPU's queue), the launches per step (cudaLaunchKernel
and its variants; memsets and copies apart), and the ops with the most self CPU time per step (the profiler's
``self_cpu_time_total`` over the profiled steps), and the synchronizing calls torch sees in one step
(``torch.cuda.set_sync_debug_mode``); with ``--cprofile``, the Python functions by their own time
(cProfile, whose overhead inflates Python calls against C++ ones: read it for the ranking).

``--phases``: the step's host time split by phase (forward with the loss under autocast, zero_grad, backward, the
optimizer step, the schedule's step; the GPU synchronized before each, so that each figure is the host's own work),
median of ``--steps`` steps after 5, and the forward's host time per leaf module (the time between successive leaf
modules' forward hooks, the GPU synchronized in each hook: glue between modules, such as a fork, lands in the next
module's figure; post hooks only, since a forward pre-hook makes torchext's BatchNorm compute its own statistics). A
hook, and its synchronization, cost each module call some host time of their own, so these figures are above the
unhooked forward's share, by more for the model with more leaf modules (stock's ResNet-18 has 60, torchext's 43).

``--spin SECONDS --provider P``: runs P's iteration (of the first of --models) for that long and nothing else, for a
native sampling profiler to attach once the line START is printed, e.g. ``py-spy record --native --threads --idle -r
200 --duration 5 -f raw --pid PID`` (benchmarks/pyspy_summary.py reads its output); it writes no rows."""

import argparse
import contextlib
import cProfile
import dataclasses
import io
import itertools
import os
import pstats
import statistics
import sys
import time
import warnings
from unittest import mock

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_loop import PREMADE_BATCHES, contenders_of, premade_batches, recipe, sync, synthetic_images  # noqa: E402
from common import CsvWriter, environment  # noqa: E402

from torchext import fusion  # noqa: E402
from torchext.compare.devices import _Dist  # noqa: E402
from torchext.compare.train import _autocast, _train_batch  # noqa: E402

LAUNCH = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")


def profile(fn, steps: int, device: torch.device):
    """(host us per step unprofiled: (median, p20, p80), launches per step, [(name, calls per step, self us per
    step)])."""
    host = []
    for _ in range(steps):
        sync(device)
        t0 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t0) * 1e6)
    sync(device)
    host.sort()
    acts = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(steps):
            fn()
        sync(device)
    events = prof.key_averages()
    launches = sum(e.count for e in events if e.key in LAUNCH) / steps
    ops = sorted(((e.key, e.count / steps, e.self_cpu_time_total / steps) for e in events), key=lambda r: -r[2])
    return (host[len(host) // 2], host[len(host) // 5], host[(4 * len(host)) // 5]), launches, ops


def phases(c, premade, cfg, device: torch.device, steps: int) -> dict:
    """{phase: median host us}: the step's phases timed apart, the GPU synchronized before each (see --phases); 'total'
    is the median of the steps' sums. The tool's own bookkeeping after the step (the loss added to its running sum)
    is left out, and the step runs eagerly whatever cfg.cuda_graphs says. Takes steps + 5 real optimizer steps."""
    it = itertools.cycle(premade)
    times = {k: [] for k in ("forward", "zero_grad", "backward", "step", "schedule", "total")}

    def timed(fn):
        sync(device)
        t = time.perf_counter()
        out = fn()
        return out, time.perf_counter() - t

    def forward(xb, yb):
        with _autocast(device, cfg.amp):
            return c.criterion(c.train_model(xb), yb)

    def step():
        c.scaler.step(c.optimizer)
        c.scaler.update()

    for i in range(steps + 5):
        xb, yb = next(it)
        loss, t_forward = timed(lambda: forward(xb, yb))  # noqa: B023 (called at once)
        _, t_zero = timed(lambda: c.optimizer.zero_grad(set_to_none=True))
        _, t_backward = timed(lambda: c.scaler.scale(loss).backward())  # noqa: B023 (called at once)
        _, t_step = timed(step)
        _, t_schedule = timed(c.scheduler.step if c.scheduler is not None else (lambda: None))
        marks = [t_forward, t_zero, t_backward, t_step, t_schedule]
        if i >= 5:
            for name, dt in zip(times, [*marks, sum(marks)], strict=True):
                times[name].append(dt * 1e6)
    return {name: statistics.median(v) for name, v in times.items()}


def module_forward_times(c, premade, cfg, device: torch.device, steps: int) -> list:
    """[(module name, class, median host us)] of the forward's leaf modules in first-call order (see --phases): a
    module called several times in one forward gets the sum of its calls in that forward. The forwards run in
    training mode (BatchNorm running statistics move, as in any step); the gradients they leave are cleared."""
    per_forward, order, last = [], {}, [0.0]
    modules = dict(c.train_model.named_modules())

    def hook(name):
        now = time.perf_counter()
        acc = per_forward[-1]
        acc[name] = acc.get(name, 0.0) + (now - last[0]) * 1e6
        order.setdefault(name, len(order))
        sync(device)
        last[0] = time.perf_counter()

    hooks = [
        m.register_forward_hook(lambda mod, i, o, name=name: hook(name)) for name, m in modules.items()
        if not list(m.children())
    ]  # fmt: skip
    try:
        for xb, _ in itertools.islice(itertools.cycle(premade), steps + 2):
            per_forward.append({})
            sync(device)
            last[0] = time.perf_counter()
            with _autocast(device, cfg.amp):
                out = c.train_model(xb)
            hook("(after the last module)")
            del out
    finally:
        for h in hooks:
            h.remove()
        c.optimizer.zero_grad(set_to_none=True)
    rows = []
    for name in sorted(order, key=order.get):
        values = [f.get(name, 0.0) for f in per_forward[2:]]
        rows.append((name, type(modules[name]).__name__ if name in modules else "", statistics.median(values)))
    return rows


def synchronizing_calls(fn, device: torch.device) -> list[str]:
    """The synchronizing CUDA calls torch sees in one call of fn (torch.cuda.set_sync_debug_mode): .item(), host
    copies, nonzero and the like. Calls made inside a kernel wrapper's own C++ are not seen."""
    if device.type != "cuda":
        return []
    sync(device)
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return [str(w.message).splitlines()[0][:120] for w in caught if "synchroniz" in str(w.message)]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="resnet18_cifar")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--device", default="cuda", help="cuda; cpu for a smoke run (batch 16, the CPU kernels)")
    p.add_argument("--no-swap-conv", action="store_true", help="the default recipe (convolutions stay cuDNN's)")
    p.add_argument("--cprofile", action="store_true", help="also the Python functions by own time (cProfile)")
    p.add_argument(
        "--no-conv-stats",
        action="store_true",
        help="swap_modules without its convolution -> BatchNorm statistics (each BatchNorm runs its own pass)",
    )
    p.add_argument("--phases", action="store_true", help="also the host time per phase and per leaf module")
    p.add_argument("--spin", type=float, default=0.0, help="run one provider's iteration this long, for py-spy")
    p.add_argument("--provider", default="torchext", choices=("torchext", "stock"), help="--spin's provider")
    p.add_argument("--out", default="benchmarks/results/step_host_gpu.csv")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    env = environment(args.device)
    writer = CsvWriter(os.devnull if args.spin > 0 else args.out, env)  # --spin writes no rows
    print(f"# Host time of one training step ({env['gpu']}, torch {env['torch']}, CUDA {env['cuda']}, {env['date']})\n")
    for model in args.models.split(","):
        batch = 16 if device.type == "cpu" else None
        cfg = dataclasses.replace(recipe(model, device, batch), swap_conv=not args.no_swap_conv)
        x, y = synthetic_images((PREMADE_BATCHES + 1) * cfg.batch_size)
        dist = _Dist()
        premade = premade_batches(x, y, cfg, device)
        with (
            mock.patch.object(fusion, "_use_conv_stats", lambda gm, report, calls: 0)
            if args.no_conv_stats
            else (contextlib.nullcontext())
        ):
            contenders = contenders_of(cfg, device, PREMADE_BATCHES + 1)
        conv = "cuDNN's convolutions" if args.no_swap_conv else "every layer torchext's"
        conv += ", BatchNorms on their own statistics (--no-conv-stats)" if args.no_conv_stats else ""
        print(f"## {model}: batch {cfg.batch_size}, {cfg.optimizer}, amp {cfg.amp}, torchext: {conv}\n")
        results, cprofiles, phase_times, module_times = {}, {}, {}, {}
        for provider, c in contenders.items():
            c.net.train()
            loss_sum = torch.zeros((), device=device)
            it = itertools.cycle(premade)

            def fn(c=c, it=it, s=loss_sum, cfg=cfg, dist=dist):
                _train_batch(c, *next(it), cfg, device, dist, s)

            for _ in range(5):
                fn()
            if args.spin > 0:
                if provider != args.provider:
                    continue
                sync(device)
                print("START", flush=True)
                t0, n = time.perf_counter(), 0
                while time.perf_counter() - t0 < args.spin:
                    fn()
                    n += 1
                sync(device)
                print(f"{provider}: {n} steps, {(time.perf_counter() - t0) / n * 1e3:.2f} ms a step", flush=True)
                return
            if args.phases:
                phase_times[provider] = phases(c, premade, cfg, device, args.steps)
                module_times[provider] = module_forward_times(c, premade, cfg, device, args.steps)
                shape = (cfg.batch_size, 3, 32, 32)
                for name, us in phase_times[provider].items():
                    writer.row(model, provider, f"phase {name}", shape, cfg.amp, "host_time", "us", us, us, us)
                for name, cls, us in module_times[provider]:
                    writer.row(
                        model, provider, f"forward {name} ({cls})", shape, cfg.amp, "host_time", "us", us, us, us
                    )
            syncs = synchronizing_calls(fn, device)
            results[provider] = profile(fn, args.steps, device)
            if args.cprofile:
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(args.steps):
                    fn()
                sync(device)
                prof.disable()
                text = io.StringIO()
                pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(30)
                cprofiles[provider] = text.getvalue()
            host, launches, ops = results[provider]
            print(f"{provider}: {len(syncs)} synchronizing call(s) in a step{': ' if syncs else ''}{'; '.join(syncs)}")
            shape, dtype = (cfg.batch_size, 3, 32, 32), cfg.amp
            writer.row(model, provider, "step", shape, dtype, "host_time", "us", *host)
            writer.row(model, provider, "step", shape, dtype, "launches", "count", launches, launches, launches)
            for name, calls, us in ops[: args.top]:
                op = name.replace(",", ";")
                writer.row(model, provider, op, shape, dtype, "self_cpu_time", "us", us, us, us)
                writer.row(model, provider, op, shape, dtype, "calls", "count", calls, calls, calls)
        print()
        print("| provider | host us per step, median (p20-p80) | launches per step |")
        print("|---|---|---|")
        for provider, (host, launches, _) in results.items():
            print(f"| {provider} | {host[0]:.0f} ({host[1]:.0f}-{host[2]:.0f}) | {launches:.0f} |")
        for provider, (_, _, ops) in results.items():
            print(f"\n### {provider}: ops by self CPU time per step\n")
            print("| op | calls per step | self CPU us per step |")
            print("|---|---|---|")
            for name, calls, us in ops[: args.top]:
                print(f"| {name[:90]} | {calls:.1f} | {us:.1f} |")
        if phase_times:
            names = list(phase_times)
            print("\n### Host time per phase, us (median; the GPU synchronized before each phase)\n")
            print("| phase | " + " | ".join(names) + " |")
            print("|---|" + "---|" * len(names))
            for phase in phase_times[names[0]]:
                print(f"| {phase} | " + " | ".join(f"{phase_times[n][phase]:.0f}" for n in names) + " |")
            for provider, rows in module_times.items():
                print(
                    f"\n### {provider}: forward host time per leaf module, us (median; glue before a module included)\n"
                )
                print("| module | class | us |")
                print("|---|---|---|")
                for name, cls, us in rows:
                    print(f"| {name} | {cls} | {us:.1f} |")
                print(f"| sum | | {sum(us for _, _, us in rows):.0f} |")
        for provider, text in cprofiles.items():
            print(f"\n### {provider}: cProfile over {args.steps} steps, by own time\n\n```\n{text.strip()}\n```")
        print()


if __name__ == "__main__":
    main()
