"""Memory pool benchmark: torchext's pool beside its power-of-two baseline, PyTorch's caching allocator,
cudaMallocAsync and raw cudaMalloc, in one run.

    python benchmarks/bench_memory.py [--parts loop,empty,replay,epoch] [--quick] [--out FILE.csv]

Parts (each a row group in the CSV and a table on stdout):
  loop    the allocators' own allocate+free in a C++ loop (no Python, no tensors): nanoseconds per pair over 1000
          sizes log-uniform from 512 B to 64 MiB, freed at once (live=0) or first-in-first-out behind 16 live ones.
  empty   torch.empty + free from Python over the same sizes, PyTorch running on each allocator in a process of its
          own (the allocator is chosen once per process); processes alternate so machine drift hits all.
  replay  the allocations and frees of real ResNet-18 CIFAR-10 training steps (recorded from PyTorch's allocator
          with torch.cuda.memory._record_memory_history; batch 512, bf16 autocast, channels-last, cudnn.benchmark)
          replayed on each allocator: peak reserved / peak requested bytes.
  epoch   ResNet-18 CIFAR-10 training epochs on the pool and on PyTorch's allocator, alternating processes.

Timing conventions follow benchmarks/common.py: medians of repeats with the 20th/80th percentiles; every row
carries the GPU, torch, CUDA and date. Without --out the CSV goes to benchmarks/results/memory_gpu.csv.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import math
import os
import random
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)

from common import CsvWriter, environment, quantiles  # noqa: E402

from torchext.memory import load_trace, replay_trace  # noqa: E402

TRACE = os.path.join(HERE, "results", "resnet18_alloc_trace.json.gz")
TORCH_ALLOCATORS = ("caching", "best_fit", "pow2", "cuda_malloc_async")  # what PyTorch can run on, per process
LOOP_ALLOCATORS = ("best_fit", "pow2", "caching", "cuda_malloc_async", "cuda_malloc")


def mixed_sizes(n=1000, lo=512, hi=64 << 20, seed=0):
    rng = random.Random(seed)
    return [int(math.exp(rng.uniform(math.log(lo), math.log(hi)))) for _ in range(n)]


# ------------------------------------------------------------------------------------------------ child processes
def child_env(allocator: str) -> dict:
    env = {**os.environ, "PYTHONPATH": ROOT}
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if allocator == "cuda_malloc_async":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "backend:cudaMallocAsync"
    return env


def run_child(worker: str, allocator: str, *extra: str, timeout: int = 900) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", worker, "--allocator", allocator, *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=child_env(allocator), timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{worker} on {allocator} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def start_allocator(allocator: str) -> None:
    """In a child: put PyTorch on `allocator` before CUDA is touched."""
    import torchext

    if allocator in ("best_fit", "pow2"):
        torchext.memory.enable_pool(allocator)


def worker_empty(args) -> dict:
    sizes = mixed_sizes()
    out = {}
    for live in (0, 16):

        def loop(live=live):
            ring = []
            for n in sizes:
                ring.append(torch.empty(n, dtype=torch.uint8, device="cuda"))
                if len(ring) > live:
                    del ring[0]
            ring.clear()

        for _ in range(3):
            loop()
        torch.cuda.synchronize()
        samples = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            loop()
            samples.append((time.perf_counter() - t0) / len(sizes) * 1e9)
        out[f"live{live}"] = samples
    return out


def worker_replay(args) -> dict:
    trace = load_trace(args.trace)
    torch.cuda.init()
    torch.cuda.reset_peak_memory_stats()
    stream = torch.cuda.current_stream()
    peak_requested = replay_trace(
        trace["events"],
        lambda n: torch.cuda.caching_allocator_alloc(n, 0, stream),
        torch.cuda.caching_allocator_delete,
    )
    torch.cuda.synchronize()
    return {
        "peak_requested": peak_requested,
        "peak_reserved": torch.cuda.max_memory_reserved(),
        "peak_allocated": torch.cuda.max_memory_allocated(),
    }


def resnet_batches(loader_seed, batch, steps):
    """Batches for the recorded steps: torchext.data's GPU loader over synthetic CIFAR-10-shaped images (the
    allocations of a step do not depend on pixel values)."""
    from torchext.data import GPULoader, synthetic_cifar10

    data = synthetic_cifar10(n_train=batch * steps, n_val=batch, seed=loader_seed)
    return GPULoader(data.train_x, data.train_y, batch, train=True, device="cuda", seed=loader_seed, channels_last=True)


def make_resnet_training(batch: int):
    from torchext.models import resnet18_cifar

    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    model = resnet18_cifar().cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.1)

    def step(x, y):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    return model, step


def worker_record(args) -> dict:
    """Records the allocations of model set-up plus `steps` training steps on PyTorch's caching allocator."""
    batch, steps = 512, 4
    torch.cuda.memory._record_memory_history(context=None, stacks="python", max_entries=1_000_000)
    loader = resnet_batches(0, batch, steps)
    _, step = make_resnet_training(batch)
    for x, y in loader:
        step(x, y)
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    events, live, next_id = [], {}, 0
    for e in snapshot["device_traces"][0]:
        if e["action"] == "alloc":
            live[e["addr"]] = next_id
            events.append(("a", next_id, int(e["size"])))
            next_id += 1
        elif e["action"] == "free_requested" and e["addr"] in live:
            events.append(("f", live.pop(e["addr"]), 0))
    trace = {
        "about": f"ResNet-18 (torchext.models.resnet18_cifar) CIFAR-10 training: model set-up and {steps} steps at "
        f"batch {batch}, bf16 autocast, channels-last, cudnn.benchmark, SGD with Nesterov momentum; recorded from "
        f"PyTorch's caching allocator (sizes are its 512-byte-rounded block sizes)",
        **environment("cuda"),
        "events": events,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.trace)), exist_ok=True)
    with gzip.open(args.trace, "wt") as f:
        json.dump(trace, f)
    return {"events": len(events), "allocations": next_id}


def worker_epoch(args) -> dict:
    from torchext.data import GPULoader, load_cifar10

    data = load_cifar10(args.data)
    batch = 512
    loader = GPULoader(data.train_x, data.train_y, batch, train=True, device="cuda", seed=0, channels_last=True)
    _, step = make_resnet_training(batch)
    times = []
    for _ in range(args.epochs):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for x, y in loader:
            step(x, y)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return {
        "epoch_seconds": times,
        "images": len(loader) * batch,
        "peak_allocated": torch.cuda.max_memory_allocated(),
        "peak_reserved": torch.cuda.max_memory_reserved(),
        "val_source": data.val_source,
    }


# --------------------------------------------------------------------------------------------------- the parts
def part_loop(csv, args, report):
    import torchext  # noqa: F401

    Pool = torch.classes.torchext.Pool
    sizes = mixed_sizes()
    stream = 0
    report.append("### Allocate + free in a C++ loop (ns per pair, 1000 sizes 512 B - 64 MiB)\n")
    report.append("| allocator | live=0 | live=16 |\n|---|---|---|")
    results = {}
    for allocator in LOOP_ALLOCATORS:
        cells = []
        for live in (0, 16):
            slow = allocator == "cuda_malloc"
            rounds, reps = (1, 3) if slow else (20 if not args.quick else 5, args.reps)
            samples = []
            for _ in range(reps):
                if allocator in ("best_fit", "pow2"):
                    pool = Pool(allocator, "cuda", 0, 0)
                    samples.append(pool.time_alloc_free(sizes, live, rounds, stream))
                    del pool
                else:
                    samples.append(Pool.time_baseline_alloc_free(allocator, 0, sizes, live, rounds))
            p50, p20, p80 = dataclasses.astuple(quantiles(samples))
            csv.row("alloc_free_loop", allocator, f"live{live}", [len(sizes)], "uint8", "time", "ns", p50, p20, p80)
            results[(allocator, live)] = p50
            cells.append(f"{p50:,.0f}")
        report.append(f"| {allocator} | " + " | ".join(cells) + " |")
    best = max(results[("best_fit", 0)], results[("best_fit", 16)])
    report.append(
        f"\nTarget: the pool's own allocate+free under 500 ns: **{best:.0f} ns** "
        f"({'met' if best < 500 else 'missed'}).\n"
    )


def part_empty(csv, args, report):
    rounds = 2 if args.quick else 3
    samples = {a: {"live0": [], "live16": []} for a in TORCH_ALLOCATORS}
    for _ in range(rounds):
        for allocator in TORCH_ALLOCATORS:
            r = run_child("empty", allocator, "--reps", str(args.reps))
            for k in r:
                samples[allocator][k] += r[k]
    report.append("### torch.empty + free from Python (ns per pair; PyTorch on each allocator, own process)\n")
    report.append(
        "| allocator | live=0 | live=16 | vs caching (live=0) | vs caching (live=16) |\n|---|---|---|---|---|"
    )
    med = {}
    for allocator in TORCH_ALLOCATORS:
        for k, s in samples[allocator].items():
            p50, p20, p80 = dataclasses.astuple(quantiles(s))
            med[(allocator, k)] = p50
            csv.row("torch_empty_free", allocator, k, [1000], "uint8", "time", "ns", p50, p20, p80)
    for allocator in TORCH_ALLOCATORS:
        r0 = med[("caching", "live0")] / med[(allocator, "live0")]
        r16 = med[("caching", "live16")] / med[(allocator, "live16")]
        report.append(
            f"| {allocator} | {med[(allocator, 'live0')]:,.0f} | {med[(allocator, 'live16')]:,.0f} | "
            f"{r0:.2f}x | {r16:.2f}x |"
        )
    worst = min(med[("caching", k)] / med[("best_fit", k)] for k in ("live0", "live16"))
    report.append(
        f"\nTarget: torch.empty + free on the pool no slower than on the caching allocator: speed ratio "
        f"(caching time / pool time, worse of the two patterns) **{worst:.2f}x** "
        f"({'met' if worst >= 1.0 else 'missed'}).\n"
    )


def part_replay(csv, args, report):
    if not os.path.exists(args.trace):
        r = run_child("record", "caching", "--trace", args.trace)
        report.append(f"Recorded {r['allocations']} allocations ({r['events']} events) into {args.trace}.\n")
    trace = load_trace(args.trace)
    report.append("### Replay of ResNet-18 CIFAR-10 training steps (peak reserved / peak requested)\n")
    report.append(
        f"Trace: {trace['about']}; {sum(1 for e in trace['events'] if e[0] == 'a')} allocations, "
        f"recorded on {trace['gpu']} ({trace['date']}).\n"
    )
    report.append(
        "| allocator | peak requested (MiB) | peak reserved (MiB) | reserved / requested |\n|---|---|---|---|"
    )
    ratios = {}
    for allocator in TORCH_ALLOCATORS:
        r = run_child("replay", allocator, "--trace", args.trace)
        ratio = r["peak_reserved"] / r["peak_requested"]
        ratios[allocator] = ratio
        csv.row(
            "resnet18_replay",
            allocator,
            "peak_reserved",
            [len(trace["events"])],
            "uint8",
            "bytes",
            "B",
            r["peak_reserved"],
            r["peak_reserved"],
            r["peak_reserved"],
        )
        csv.row(
            "resnet18_replay",
            allocator,
            "peak_requested",
            [len(trace["events"])],
            "uint8",
            "bytes",
            "B",
            r["peak_requested"],
            r["peak_requested"],
            r["peak_requested"],
        )
        csv.row(
            "resnet18_replay",
            allocator,
            "reserved_over_requested",
            [len(trace["events"])],
            "uint8",
            "ratio",
            "x",
            ratio,
            ratio,
            ratio,
        )
        report.append(
            f"| {allocator} | {r['peak_requested'] / 2**20:,.1f} | {r['peak_reserved'] / 2**20:,.1f} | {ratio:.3f} |"
        )
    report.append(
        f"\nTarget: peak reserved / peak allocated <= 1.05 on the pool: **{ratios['best_fit']:.3f}** "
        f"({'met' if ratios['best_fit'] <= 1.05 else 'missed'}).\n"
    )


def part_epoch(csv, args, report):
    if not args.data:
        report.append("### ResNet-18 epochs: skipped (no --data)\n")
        return
    times = {"caching": [], "best_fit": []}
    runs = {}
    for _ in range(2):
        for allocator in times:
            r = run_child("epoch", allocator, "--data", args.data, "--epochs", str(args.epochs))
            times[allocator] += r["epoch_seconds"][1:]  # the first epoch includes cudnn.benchmark's search
            runs[allocator] = r
    report.append(
        f"### ResNet-18 CIFAR-10 training epochs ({runs['caching']['images']} images, batch 512, bf16, "
        f"channels-last; epoch 1 of each process left out)\n"
    )
    report.append(
        "| allocator | epoch (s) p50 | p20 | p80 | peak allocated (MiB) | peak reserved (MiB) |\n"
        "|---|---|---|---|---|---|"
    )
    med = {}
    for allocator, t in times.items():
        p50, p20, p80 = dataclasses.astuple(quantiles(t))
        med[allocator] = p50
        csv.row(
            "resnet18_epoch", allocator, "train", [runs[allocator]["images"]], "bfloat16", "time", "s", p50, p20, p80
        )
        report.append(
            f"| {allocator} | {p50:.3f} | {p20:.3f} | {p80:.3f} | "
            f"{runs[allocator]['peak_allocated'] / 2**20:,.0f} | {runs[allocator]['peak_reserved'] / 2**20:,.0f} |"
        )
    ratio = med["best_fit"] / med["caching"]
    report.append(
        f"\nTarget: epoch time on the pool within 2% of the default allocator: pool / default "
        f"**{ratio:.3f}** ({'met' if ratio <= 1.02 else 'missed'}).\n"
    )


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--parts", default="loop,empty,replay,epoch")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=os.path.join(HERE, "results", "memory_gpu.csv"))
    p.add_argument("--trace", default=TRACE)
    p.add_argument("--data", default=None, help="CIFAR-10 for the epoch part (see torchext.data.load_cifar10)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--allocator", help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.worker:
        start_allocator(args.allocator)
        result = {"empty": worker_empty, "replay": worker_replay, "record": worker_record, "epoch": worker_epoch}[
            args.worker
        ](args)
        print(json.dumps(result))
        return

    if not torch.cuda.is_available():
        sys.exit("bench_memory.py needs a CUDA device")
    csv = CsvWriter(args.out, environment("cuda"))
    env = environment("cuda")
    report = [f"## Memory pool benchmark: {env['gpu']}, torch {env['torch']}, CUDA {env['cuda']}, {env['date']}\n"]
    parts = {"loop": part_loop, "empty": part_empty, "replay": part_replay, "epoch": part_epoch}
    for name in args.parts.split(","):
        t0 = time.time()
        parts[name](csv, args, report)
        print(f"[bench_memory] {name} took {time.time() - t0:.0f} s", file=sys.stderr)
        print("\n".join(report), flush=True)
        report.clear()
    csv.close()


if __name__ == "__main__":
    main()
