"""The run: the data, both contenders (model, loss, optimizer, schedule; DDP, torch.compile and CUDA graphs set up
here), the epoch loop alternating them, validation, the per-seed results, the profiled steps and the
``--allocator pool`` child process."""

from __future__ import annotations

import copy
import dataclasses
import gc
import json
import os
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .config import ONECYCLE_WARMUP, CompareConfig, CompareError
from .devices import (
    _all_reduce,
    _Dist,
    _dist_backend,
    _dist_from_env,
    _environment,
    _init_dist,
    _requested_device,
    _resolve_device,
    _train_shard,
)
from .output import _OutputWriter
from .report import _jsonable, _progress_text, summarize


@dataclass
class _Contender:
    name: str
    net: nn.Module  # the plain model: evaluation, parameters, profiling
    train_model: nn.Module  # net, wrapped in DistributedDataParallel and/or compiled
    criterion: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any | None
    scaler: Any
    graphed: Any | None = None  # the GraphedTrainStep of --cuda-graphs, captured at the first training batch
    epochs: list = field(default_factory=list)
    confusion: list | None = None


def _progress(iterable, desc: str, enabled: bool, total: int):
    if not enabled:
        return iterable
    try:
        from tqdm import tqdm
    except ImportError:
        return iterable
    return tqdm(iterable, desc=desc, total=total, leave=False, dynamic_ncols=True)


def _epoch_seed(seed: int, epoch: int, rank: int) -> int:
    return int(np.random.SeedSequence([seed, epoch, rank, 0x5EED]).generate_state(1, np.uint64)[0] >> 1)


def _autocast(device: torch.device, amp: str):
    dtype = torch.float16 if amp == "fp16" else torch.bfloat16
    return torch.autocast(device_type=device.type, dtype=dtype, enabled=amp != "none")


def _train_step(c: _Contender, model: nn.Module, xb, yb, device, amp) -> torch.Tensor:
    with _autocast(device, amp):
        loss = c.criterion(model(xb), yb)
    c.optimizer.zero_grad(set_to_none=True)
    c.scaler.scale(loss).backward()
    c.scaler.step(c.optimizer)
    c.scaler.update()
    return loss.detach()


def _graphed_step(c: _Contender, xb, yb, cfg: CompareConfig) -> torch.Tensor:
    """--cuda-graphs: the step replayed from c's graph, captured at its first batch (its warm-up steps undone)."""
    if c.graphed is None:
        from ..graphs import GraphedTrainStep

        amp_dtype = torch.bfloat16 if cfg.amp == "bf16" else None
        c.graphed = GraphedTrainStep(c.train_model, c.criterion, c.optimizer, xb, yb, autocast_dtype=amp_dtype)
    return c.graphed(xb, yb)


def _train_batch(c: _Contender, xb, yb, cfg: CompareConfig, device, dist: _Dist, loss_sum: torch.Tensor) -> None:
    """One iteration of the training loop (benchmarks/bench_loop.py times it as it is): the step (replayed from c's
    CUDA graph with --cuda-graphs; on this rank's slice of the batch under torchrun), the schedule's step, and the
    batch's loss added to ``loss_sum`` on the device: nothing is read back on the host."""
    if cfg.cuda_graphs:
        loss = _graphed_step(c, xb, yb, cfg)
    else:
        loss = _train_step(c, c.train_model, _train_shard(xb, dist), _train_shard(yb, dist), device, cfg.amp)
    if c.scheduler is not None:
        c.scheduler.step()
    loss_sum.add_(loss.float())


def _memory_start(device: torch.device) -> int:
    if device.type != "cuda":
        return 0
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def _train_epoch(c: _Contender, loader, epoch: int, seed: int, cfg: CompareConfig, device, dist: _Dist, bars: bool):
    c.net.train()
    loader.set_epoch(epoch)
    # The same dropout masks for both models (where their activations share a layout: masks are drawn in memory order).
    torch.manual_seed(_epoch_seed(seed, epoch, dist.rank))
    start_allocated = _memory_start(device)
    loss_sum = torch.zeros((), dtype=torch.float32, device=device)
    steps = 0
    desc = f"seed {seed} epoch {epoch + 1}/{cfg.epochs} {c.name}"
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for xb, yb in _progress(loader, desc, bars, len(loader)):
        _train_batch(c, xb, yb, cfg, device, dist, loss_sum)
        steps += 1
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - t0
    c.optimizer.zero_grad(set_to_none=True)  # what stays resident while the other model trains: no gradients
    peak_allocated = peak_reserved = None
    if device.type == "cuda":
        from ..ops import check_targets

        check_targets()  # the loss's target checks are read back without stopping the GPU: surface any error here
        peak_allocated = torch.cuda.max_memory_allocated(device)
        peak_reserved = torch.cuda.max_memory_reserved(device)
    total_loss, total_steps = _all_reduce([loss_sum.item(), float(steps)], dist, device)
    elapsed = _all_reduce([elapsed], dist, device, op="max")[0]
    record = {
        "epoch": epoch + 1,
        "train_loss": total_loss / max(total_steps, 1),
        "epoch_time_s": elapsed,
        "images": steps * cfg.batch_size,
        "images_per_s": steps * cfg.batch_size / elapsed if elapsed > 0 else None,
        "lr_end": c.optimizer.param_groups[0]["lr"],
    }
    if device.type == "cuda":
        mem = _all_reduce([float(start_allocated), float(peak_allocated), float(peak_reserved)], dist, device, "max")
        record.update(
            start_allocated_bytes=int(mem[0]), peak_allocated_bytes=int(mem[1]), peak_reserved_bytes=int(mem[2])
        )
    else:
        record.update(start_allocated_bytes=None, peak_allocated_bytes=None, peak_reserved_bytes=None)
    return record


@torch.no_grad()
def _evaluate(c: _Contender, loader, num_classes: int, cfg: CompareConfig, device, dist: _Dist):
    """(val loss, val accuracy, confusion matrix as nested lists: rows = true class, columns = predicted).
    The loss is torch's cross entropy without label smoothing for both models, so it measures the model."""
    c.net.eval()
    if dist.world > 1:
        import torch.distributed as tdist

        for buffer in c.net.buffers():  # batch-norm running statistics: rank 0's, as DDP's next forward would use
            tdist.broadcast(buffer, 0)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    confusion = torch.zeros(num_classes * num_classes, dtype=torch.int64, device=device)
    for xb, yb in loader:
        if dist.world > 1:
            xb, yb = torch.tensor_split(xb, dist.world)[dist.rank], torch.tensor_split(yb, dist.world)[dist.rank]
            if yb.numel() == 0:
                continue
        with _autocast(device, cfg.amp):
            logits = c.net(xb)
        logits = logits.float()
        loss_sum += F.cross_entropy(logits, yb, reduction="sum").double()
        confusion += torch.bincount(yb * num_classes + logits.argmax(1), minlength=num_classes * num_classes)
    if dist.world > 1:
        tdist.all_reduce(loss_sum)
        tdist.all_reduce(confusion)
    confusion = confusion.view(num_classes, num_classes).cpu()
    n = int(confusion.sum())
    return loss_sum.item() / max(n, 1), float(confusion.diagonal().sum()) / max(n, 1), confusion.tolist()


def _package():
    """The torchext.compare package. The loop calls its ``_evaluate``, so that replacing ``torchext.compare._evaluate``
    (as tests do, to interrupt a run during validation) reaches the loop, as it did when the tool was one module."""
    return sys.modules[__package__]


def _make_contender(name, net, criterion, cfg: CompareConfig, device, dist: _Dist, steps_per_epoch: int):
    # A captured step reads the learning rate from a tensor the scheduler updates, through optimizers that do not
    # synchronize the host (torchext/graphs.py).
    lr = torch.tensor(cfg.lr, device=device) if cfg.cuda_graphs else cfg.lr
    if cfg.optimizer == "sgd":
        import torchext

        ours = name == "torchext" and cfg.swap_optimizer and not cfg.cuda_graphs
        extra = {"fused": True} if cfg.cuda_graphs else {}
        if ours and cfg.autocast_copies and device.type == "cuda" and cfg.amp in ("bf16", "fp16"):
            extra["autocast_copies"] = torch.float16 if cfg.amp == "fp16" else torch.bfloat16
        optimizer = (torchext.optim.SGD if ours else torch.optim.SGD)(
            net.parameters(),
            lr=lr,
            momentum=cfg.momentum,
            nesterov=cfg.nesterov,
            weight_decay=cfg.weight_decay,
            **extra,
        )
    else:
        optimizer = torch.optim.Adam(
            net.parameters(), lr=lr, weight_decay=cfg.weight_decay, **({"capturable": True} if cfg.cuda_graphs else {})
        )
    total = cfg.epochs * steps_per_epoch
    if cfg.schedule == "onecycle":
        scheduler = torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=cfg.lr, total_steps=total, pct_start=ONECYCLE_WARMUP, cycle_momentum=False
        )
    elif cfg.schedule == "cosine":
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total)
    else:
        scheduler = None
    scaler = torch.amp.GradScaler(device.type, enabled=cfg.amp == "fp16")
    train_model = net
    if dist.world > 1:
        from torch.nn.parallel import DistributedDataParallel

        train_model = DistributedDataParallel(net, device_ids=[device.index] if device.type == "cuda" else None)
    if cfg.compile or cfg.compile_mode is not None:
        import torchext

        torchext.set_compile_mode(cfg.torchext_compile)
        train_model = torch.compile(
            train_model, mode=None if cfg.compile_mode in (None, "default") else cfg.compile_mode
        )
    return _Contender(name, net, train_model, criterion.to(device), optimizer, scheduler, scaler)


def _swap(model: nn.Module, cfg: CompareConfig):
    import torchext

    report = torchext.swap_modules(
        model,
        linear=cfg.swap_linear,
        activations=cfg.swap_activations,
        inplace=True,
        fuse=cfg.fuse,
        conv=cfg.swap_conv,
        forks=cfg.forks,
        # torchext's convolutions run NHWC: with channels-last weights the model runs channels-last from its first
        # convolution on, rather than converting each activation inside each convolution (swap_modules' docstring).
        channels_last=cfg.swap_conv,
    )
    return report.model, report


def _gpu_time_share(step, steps: int, device=None):
    """``torchext.profiling.gpu_time_share(step, steps=..., device=...)``: the share of GPU time in torchext's
    kernels (``share``, ``total_us``, ``torchext_us``, ``by_kernel``, ...) as a dict; a bare number becomes
    ``{"share": x}``. A failure is recorded, not raised: it must not lose a finished run."""
    try:
        from .. import profiling

        result = profiling.gpu_time_share(step, steps=steps, device=device, top=60)
    except Exception as e:  # noqa: BLE001 - reported in the results instead
        warnings.warn(f"torchext-compare: the GPU-time share could not be measured: {e}", stacklevel=2)
        return {"error": f"{type(e).__name__}: {e}"}
    if isinstance(result, (int, float)):
        return {"share": float(result)}
    return _jsonable(result)


def _load_data(cfg: CompareConfig):
    from .. import data as tdata

    if cfg.data == "synthetic":
        return tdata.synthetic_cifar10(cfg.synthetic_train, cfg.synthetic_val, seed=0)
    try:
        return tdata.load_cifar10(cfg.data, download=cfg.download, val_split=cfg.val_split, val_from=cfg.val_from)
    except (FileNotFoundError, ValueError, ImportError, RuntimeError) as e:
        message = str(e).replace("pass download=True", "pass --download")
        raise CompareError(f"--data {cfg.data or '(default location)'}: {message}") from e


def _run_pool_child(config: CompareConfig) -> dict:
    """Runs the comparison in a fresh process on torchext's pool and returns its results.json."""
    child = dataclasses.replace(config, allocator="pool", child=True)
    cmd = [sys.executable, "-m", "torchext.compare", *child.to_argv()]
    env = dict(os.environ)
    package_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # above torchext/
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(cmd, env=env)
    try:
        proc.wait()
    except KeyboardInterrupt:
        proc.wait()  # Ctrl-C reached the child too: let it write what it measured and say so
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"the --allocator pool child process failed with exit code {proc.returncode}: {cmd}")
    if _dist_from_env().rank != 0:
        return {}
    with open(os.path.join(config.out, "results.json")) as f:
        return json.load(f)


def run(config: CompareConfig) -> dict:
    """Runs the comparison and writes results.json, summary.md and the plots into ``config.out`` (rank 0 only);
    returns the results.json content (every rank gets the same figures)."""
    from .._loader import built_with_cuda

    cfg = config.resolved()
    cfg.validate()
    dist = _dist_from_env()
    device = _requested_device(cfg)
    if dist.world > 1 and cfg.batch_size % dist.world:
        raise CompareError(f"--batch-size {cfg.batch_size} does not split evenly over {dist.world} ranks")
    notes = []
    if device.type == "cuda" and not built_with_cuda():
        raise CompareError(
            f"--device {device}: this torchext build has no CUDA kernels (built without nvcc); rebuild it with "
            "CUDA or use --device cpu"
        )
    if cfg.allocator == "pool":
        if device.type != "cuda":
            raise CompareError(
                "--allocator pool needs a CUDA device: torchext.memory's pool is a CUDA allocator "
                f"(device is {device}); use --allocator default"
            )
        if not config.child:
            return _run_pool_child(config)
        from .. import memory

        memory.enable_pool()  # before anything initializes CUDA
    backend = _dist_backend(cfg, device)
    device = _resolve_device(device, dist, backend)
    if cfg.cuda_graphs and (device.type != "cuda" or dist.world > 1):
        raise CompareError(
            "--cuda-graphs needs one CUDA device: it captures the training step into a CUDA graph "
            f"(device is {device}, {dist.world} process(es)); leave it out on the CPU and under torchrun"
        )
    if device.type == "cpu" and cfg.amp != "none":
        if config.amp is not None:
            raise CompareError(
                f"--amp {cfg.amp} needs a CUDA device: torchext's CPU kernels are float32/float64 only; "
                "use --amp none on the CPU"
            )
        notes.append(f"the {cfg.model} recipe's {cfg.amp} autocast is CUDA-only here: trained in float32 on the CPU")
        cfg = dataclasses.replace(cfg, amp="none")

    _init_dist(dist, device, backend)
    from ..compile import compile_mode, set_compile_mode

    previous_compile_mode = compile_mode()  # --torchext-compile sets it for this run only
    try:
        results = _run(cfg, config, device, dist, notes, backend)
    finally:
        set_compile_mode(previous_compile_mode)
        if dist.owns_group:
            import torch.distributed as tdist

            tdist.destroy_process_group()
    return results


def _run(cfg: CompareConfig, config: CompareConfig, device, dist: _Dist, notes: list, backend: str) -> dict:
    from ..data import GPULoader

    start = time.perf_counter()

    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    bars = not cfg.quiet and dist.main and sys.stderr.isatty()
    log = not cfg.quiet and dist.main
    data = _load_data(cfg)
    if len(data.train_y) < cfg.batch_size:
        raise CompareError(f"--batch-size {cfg.batch_size} is larger than the {len(data.train_y)} training images")
    val_loader = GPULoader(
        data.val_x, data.val_y, cfg.val_batch_size, train=False, device=device, channels_last=cfg.channels_last
    )
    results = {
        "config": {**cfg.as_dict(), "recipe": cfg.model, "overrides": config.overrides()},
        "environment": _environment(device, dist, backend),
        "data": {
            "source": data.source,
            "val_source": data.val_source,
            "train_images": int(len(data.train_y)),
            "val_images": int(len(data.val_y)),
            "classes": list(data.classes),
        },
        "notes": notes,
        "seeds": [],
        "swap_report": None,
        "swap_report_text": None,
        "parameters": None,
        "gpu_time_share": None,
        "stock_gpu_time": None,
        "memory": {"allocator": cfg.allocator, "device": device.type, "pool_stats": None},
    }
    if dist.world > 1:
        notes.append(
            f"DistributedDataParallel over {dist.world} ranks ({backend} process group): each trains on "
            f"1/{dist.world} of every global batch of {cfg.batch_size}; batch-norm statistics are computed per rank"
        )
        env = results["environment"]
        if (env["ranks_per_gpu"] or 1) > 1:
            notes.append(
                f"{dist.world} ranks share {env['gpus']} GPU(s) (--dist-backend gloo): the accuracies are DDP's, "
                "the epoch times and the GPU busy fraction are not DDP's speed"
            )
    if log:
        print(f"torchext-compare: {cfg.model} on {device} x{dist.world}; {data.describe()}", flush=True)
    writer = _OutputWriter(cfg.out, enabled=dist.main)

    def checkpoint(status: str) -> dict:
        """The results so far, with their status, written to --out (rank 0)."""
        results["status"] = status
        if cfg.allocator == "pool" and device.type == "cuda":
            from .. import memory

            results["memory"]["pool_stats"] = memory.stats(device)
            results["memory"]["pool_kind"] = memory.enabled_kind()
        results["wall_time_s"] = time.perf_counter() - start
        snapshot = _jsonable({**results, "summary": summarize(results)})
        writer.write(snapshot, final=status != "running")
        return snapshot

    try:
        for i, seed in enumerate(cfg.seeds):
            profile = i == len(cfg.seeds) - 1 and device.type == "cuda" and cfg.profile_steps > 0
            results["seeds"].append({"seed": seed, "models": {}})
            _run_seed(seed, cfg, data, val_loader, device, dist, results, bars, log, profile, checkpoint)
            gc.collect()  # the seed's models, optimizers and loader are gone: give their memory back before the next
            if device.type == "cuda":
                torch.cuda.empty_cache()
    except KeyboardInterrupt:
        if results["seeds"] and not results["seeds"][-1]["models"]:
            results["seeds"].pop()  # interrupted before the seed's first epoch ended: nothing of it to keep
        if dist.main and log:
            print(f"\ntorchext-compare: interrupted; {_progress_text(results)}", flush=True)
        if results["seeds"]:
            checkpoint("interrupted")
        if dist.main and log:
            print(f"torchext-compare: {writer.describe()}", flush=True)
        raise
    results = checkpoint("complete")
    if dist.main and log:
        print(f"torchext-compare: {writer.describe()}", flush=True)
    return results


def _run_seed(
    seed, cfg, data, val_loader, device, dist: _Dist, results: dict, bars: bool, log: bool, profile: bool, checkpoint
):
    """Trains both models for one seed, filling in its entry, the last of ``results["seeds"]``, and calling
    ``checkpoint("running")`` after every epoch both models finished; fills in the swap report on the first seed
    and, when ``profile``, the GPU-time share of the final torchext model. Nothing of the seed outlives the call."""
    num_classes = len(data.classes)
    stock, ours, report = _models(cfg, num_classes, device, seed)
    if results["swap_report"] is None:
        results["swap_report"] = _jsonable(report)
        results["swap_report_text"] = str(report)
        results["parameters"] = {
            "stock": sum(p.numel() for p in stock.parameters()),
            "torchext": sum(p.numel() for p in ours.parameters()),
        }
    del report
    loader = _train_loader(data.train_x, data.train_y, cfg, device, seed)
    contenders = _contenders(stock, ours, cfg, device, dist, len(loader))
    for epoch in range(cfg.epochs):
        order = contenders if epoch % 2 == 0 else contenders[::-1]
        for position, c in enumerate(order):
            record = _train_epoch(c, loader, epoch, seed, cfg, device, dist, bars)
            val_loss, val_acc, confusion = _package()._evaluate(c, val_loader, num_classes, cfg, device, dist)
            record.update(val_loss=val_loss, val_accuracy=val_acc, position=position)
            c.epochs.append(record)
            c.confusion = confusion
            if log:
                print(
                    f"seed {seed} epoch {epoch + 1}/{cfg.epochs} {c.name:8s} train loss {record['train_loss']:.4f}"
                    f"  val loss {val_loss:.4f}  val acc {100 * val_acc:.2f}%  {record['epoch_time_s']:.2f} s"
                    f"  {record['images_per_s']:.0f} img/s",
                    flush=True,
                )
        results["seeds"][-1] = _seed_entry(seed, contenders)
        checkpoint("running")
    if profile:
        # After every figure is recorded: the profiled steps change the final models, which are not evaluated
        # again. Both models are profiled, so that their GPU work per step can be set against their wall time.
        if dist.main:
            loader.set_epoch(0)
            xb, yb = next(iter(loader))
            xb, yb = _train_shard(xb, dist), _train_shard(yb, dist)
            for key, c in (("stock_gpu_time", contenders[0]), ("gpu_time_share", contenders[1])):
                model = c.train_model if dist.world == 1 else c.net  # DDP's collectives need every rank
                c.net.train()

                def step(c=c, model=model):
                    if c.graphed is not None:
                        c.graphed(xb, yb)
                    else:
                        _train_step(c, model, xb, yb, device, cfg.amp)

                results[key] = _gpu_time_share(step, cfg.profile_steps, device)
        if dist.world > 1:
            import torch.distributed as tdist

            tdist.barrier()


def _models(cfg: CompareConfig, num_classes: int, device, seed: int):
    """(stock model, its torchext copy, the swap report): the stock model built under ``torch.manual_seed(seed)``,
    on the device and in the recipe's memory format, and a deep copy of it swapped to torchext."""
    from .. import models as tmodels

    torch.manual_seed(seed)
    stock = tmodels.get_model(cfg.model, num_classes=num_classes).to(device)
    if cfg.channels_last:
        stock = stock.to(memory_format=torch.channels_last)
    ours, report = _swap(copy.deepcopy(stock), cfg)
    return stock, ours, report


def _train_loader(x, y, cfg: CompareConfig, device, seed: int):
    """The training batches of a seed: shuffled and augmented on the device (``torchext.data.GPULoader``)."""
    from ..data import GPULoader

    return GPULoader(x, y, cfg.batch_size, train=True, device=device, seed=seed, channels_last=cfg.channels_last)


def _contenders(stock, ours, cfg: CompareConfig, device, dist: _Dist, steps_per_epoch: int) -> list:
    """[stock, torchext]: each model with its loss (torch's or torchext's cross entropy, the same label smoothing),
    optimizer, schedule and wrappers."""
    import torchext

    criteria = {
        "stock": nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing),
        "torchext": torchext.nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing),
    }
    return [
        _make_contender(name, net, criteria[name], cfg, device, dist, steps_per_epoch)
        for name, net in (("stock", stock), ("torchext", ours))
    ]


def _seed_entry(seed: int, contenders: list) -> dict:
    """A seed's results entry: each model's epochs so far, its final figures (those of its last epoch) and peaks."""
    entry = {"seed": seed, "models": {}}
    for c in contenders:
        peaks = [e["peak_allocated_bytes"] for e in c.epochs if e["peak_allocated_bytes"] is not None]
        reserved = [e["peak_reserved_bytes"] for e in c.epochs if e["peak_reserved_bytes"] is not None]
        entry["models"][c.name] = {
            "epochs": list(c.epochs),
            "final_val_accuracy": c.epochs[-1]["val_accuracy"],
            "final_val_loss": c.epochs[-1]["val_loss"],
            "final_train_loss": c.epochs[-1]["train_loss"],
            "peak_allocated_bytes": max(peaks) if peaks else None,
            "peak_reserved_bytes": max(reserved) if reserved else None,
            "confusion_matrix": c.confusion,
        }
    return entry
