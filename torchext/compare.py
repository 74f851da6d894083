"""torchext-compare: train a stock PyTorch model and its torchext twin side by side on CIFAR-10 (issue 5).

For each seed the stock model is built with ``torch.manual_seed(seed)``, deep-copied, and the copy is swapped to
torchext with ``torchext.swap_modules`` (Linear and Conv2d layers, activations, and Linear+activation pairs fused
into one ``torchext.nn.Linear(activation=...)``); its loss is ``torchext.nn.CrossEntropyLoss``, the stock one's
``torch.nn.CrossEntropyLoss``, with the same label smoothing. Both get the same optimizer and schedule. They train
from identical weights on identical batches (one ``GPULoader`` seeded with the seed; each model's epoch e re-seeds
the global RNG with (seed, e), so dropout draws the same masks for both), alternating per epoch: stock then
torchext on even epochs, torchext then stock on odd ones, so that drift of the machine (clocks, temperature,
neighbours) hits both.

Per model and epoch it records the training loss (mean over the epoch's batches, summed on the device: no
synchronization per step), validation loss and accuracy, the epoch's training time (``time.perf_counter`` between
two ``torch.cuda.synchronize()``; validation is not timed), images per second, and the peak allocated and reserved
CUDA memory (each model's epoch starts from an emptied cache with reset peak statistics, so the peaks are its own
on top of what stays resident: both models' weights and optimizer states and the dataset); the confusion matrices
of the final models on the validation set; on CUDA, the share of the torchext model's GPU time spent in torchext
kernels over a few profiled training steps (``torchext.profiling``).

Usage::

    torchext-compare --model resnet18_cifar --data ~/data/cifar10 --out runs/resnet18   # the recipe below
    python -m torchext.compare --model cnn_cifar --seeds 0,1 --epochs 5 --out runs/cnn
    torchrun --nproc_per_node=8 -m torchext.compare --model resnet18_cifar --out runs/ddp  # DistributedDataParallel
    torchext-compare --model mlp --data synthetic --device cpu --epochs 2 --seeds 0 --out runs/smoke   # CPU smoke

Recipes (defaults per model; any flag given explicitly overrides its value):

========================================  ==========================================================================
model                                     recipe
========================================  ==========================================================================
``resnet18_cifar``, ``resnet18_torchvision``  SGD, Nesterov momentum 0.9, weight decay 5e-4, one-cycle schedule
                                          (peak lr 0.2, 25% warm-up), label smoothing 0.1, batch 512, bf16
                                          autocast, channels-last, 15 epochs
``cnn_cifar``, ``mlp``                    Adam lr 1e-3, constant, no weight decay, no label smoothing, batch 128,
                                          float32 (no autocast), 20 epochs
========================================  ==========================================================================

On the CPU the recipe's bf16 autocast falls back to float32 (torchext's CPU kernels are float32/float64 only; the
fallback is noted in the results), and an explicit ``--amp bf16|fp16`` is refused. ``--amp fp16`` uses a
``GradScaler``.

``--allocator pool`` runs the whole comparison in a child process (``python -m torchext.compare ... --allocator
pool``) that makes ``torchext.memory``'s pool PyTorch's CUDA allocator before CUDA is touched, and adds the pool's
own statistics to the results; it needs a CUDA device.

Under ``torchrun --nproc_per_node=N`` (``WORLD_SIZE`` > 1) both models are wrapped in ``DistributedDataParallel``
(NCCL on CUDA, gloo on the CPU): every rank iterates the same global batches of ``--batch-size`` images and trains
on its 1/N slice, so the global batch and the data order are those of a single-GPU run (batch norm statistics are
per rank, as in plain DDP). Losses, accuracies and confusion matrices are summed over ranks, epoch times are the
slowest rank's, memory peaks the largest rank's; rank 0 writes the outputs.

Outputs in ``--out``: ``results.json`` (the configuration, the environment, every per-epoch figure, memory, the swap
report, the GPU-time share, the summary, and ``status``: running, interrupted or complete), ``summary.md`` (mean +-
std over seeds) and the plots ``loss_curves.png``, ``accuracy_curves.png``, ``confusion_matrices.png``,
``speed.png`` and, on CUDA, ``memory.png`` (:func:`make_plots`, which the notebook calls too). They are written
after every epoch that both models finished, so an interrupted run keeps what it measured; Ctrl-C ends the run,
writes the results once more marked interrupted, says what the folder holds and exits with status 130.

Without ``--device`` on a machine without a GPU the tool refuses at once (a usage error naming ``--device cpu`` and
the CPU smoke command, ``SMOKE_COMMAND``): the recipes are sized for a GPU.

Library use: ``run(CompareConfig(model="mlp", data="synthetic", epochs=2, out="/tmp/x"))`` returns the
``results.json`` content; ``make_plots(results, out_dir)`` draws the plots again.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime
import gc
import json
import math
import os
import platform
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

__all__ = [
    "CompareConfig",
    "CompareError",
    "RECIPES",
    "RECIPE_FIELDS",
    "parse_seeds",
    "build_parser",
    "config_from_args",
    "run",
    "main",
    "summarize",
    "render_summary",
    "make_plots",
    "gpu_busy",
]

MODEL_NAMES = ("stock", "torchext")

_RESNET_RECIPE = {
    "epochs": 15,
    "batch_size": 512,
    "optimizer": "sgd",
    "lr": 0.2,
    "momentum": 0.9,
    "nesterov": True,
    "weight_decay": 5e-4,
    "schedule": "onecycle",
    "label_smoothing": 0.1,
    "amp": "bf16",
    "channels_last": True,
}
_SMALL_RECIPE = {
    "epochs": 20,
    "batch_size": 128,
    "optimizer": "adam",
    "lr": 1e-3,
    "momentum": 0.9,
    "nesterov": False,
    "weight_decay": 0.0,
    "schedule": "constant",
    "label_smoothing": 0.0,
    "amp": "none",
    "channels_last": False,
}
RECIPES: dict[str, dict[str, Any]] = {
    "resnet18_cifar": _RESNET_RECIPE,
    "resnet18_torchvision": _RESNET_RECIPE,
    "cnn_cifar": _SMALL_RECIPE,
    "mlp": _SMALL_RECIPE,
}
RECIPE_FIELDS = tuple(_RESNET_RECIPE)

OPTIMIZERS = ("sgd", "adam")
SCHEDULES = ("onecycle", "cosine", "constant")
AMP_MODES = ("bf16", "fp16", "none")
ALLOCATORS = ("default", "pool")
VAL_FROM = ("auto", "test", "train")
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs", "reduce-overhead")
TORCHEXT_COMPILE_MODES = ("kernels", "decompose")  # torchext.compile.COMPILE_MODES
ONECYCLE_WARMUP = 0.25  # share of the steps spent rising to the peak learning rate


class CompareError(ValueError):
    """A configuration the comparison cannot run (a bad option, or one the device cannot do); the CLI prints it as
    a usage error."""


@dataclass
class CompareConfig:
    """Every option of ``torchext-compare``. Fields left None take the model's recipe (``RECIPES``) in
    :meth:`resolved`; an explicit value overrides the recipe.

    model:            one of ``torchext.models.MODELS``.
    epochs, batch_size, optimizer ('sgd' | 'adam'), lr (peak lr with 'onecycle'), momentum and nesterov (SGD only),
    weight_decay, schedule ('onecycle' | 'cosine' | 'constant', stepped per batch), label_smoothing,
    amp ('bf16' | 'fp16' | 'none'), channels_last: recipe values.
    seeds:            one comparison per seed (initial weights, data order, augmentation, dropout).
    compile:          ``torch.compile`` both models.
    compile_mode:     torch.compile's ``mode`` (``COMPILE_MODES``); setting it implies ``compile``.
    torchext_compile: how inductor treats torchext's ops when compiling (``torchext.set_compile_mode``): 'kernels'
                      (opaque torchext kernels) or 'decompose' (the one-pass ops lowered to ATen, which inductor
                      fuses). Used only with ``compile``.
    cuda_graphs:      capture each model's whole training step (forward, loss, backward, optimizer step) into one
                      CUDA graph at its first batch and replay it (``torchext.graphs.GraphedTrainStep``; CUDA only).
                      Both models then use SGD with ``fused=True`` or Adam with ``capturable=True``, and a tensor
                      learning rate.
    allocator:        'default' (PyTorch's caching allocator) or 'pool' (torchext.memory's, in a child process).
    data:             a CIFAR-10 path for ``torchext.data.load_cifar10``, None for its default location, or
                      'synthetic' (``synthetic_cifar10(synthetic_train, synthetic_val)``, for CI and smoke tests).
    download:         fetch CIFAR-10 with torchvision when ``data`` holds none.
    val_split, val_from: the validation set (``load_cifar10``'s arguments): the test split when there is one
                      (``val_from='auto'``), else ``val_split`` images held out of train.
    device:           'cuda', 'cuda:1', 'cpu', or None: CUDA, and a CompareError where no GPU is visible (the
                      CPU must be asked for). Under torchrun each rank uses ``cuda:LOCAL_RANK`` (or the CPU when
                      the device is 'cpu').
    out:              output folder.
    swap_linear, swap_conv, swap_activations, fuse: passed to ``torchext.swap_modules`` (as linear, conv,
                      activations, fuse).
    profile_steps:    training steps profiled for the GPU-time share (CUDA only; 0 skips it).
    val_batch_size:   batch size of the validation passes.
    quiet:            no progress bars and no per-epoch lines.
    child:            internal: this process is the ``--allocator pool`` child.
    """

    model: str = "resnet18_cifar"
    epochs: int | None = None
    batch_size: int | None = None
    optimizer: str | None = None
    lr: float | None = None
    momentum: float | None = None
    nesterov: bool | None = None
    weight_decay: float | None = None
    schedule: str | None = None
    label_smoothing: float | None = None
    amp: str | None = None
    channels_last: bool | None = None
    seeds: tuple[int, ...] = (0, 1, 2)
    compile: bool = False
    compile_mode: str | None = None
    torchext_compile: str = "kernels"
    cuda_graphs: bool = False
    allocator: str = "default"
    data: str | None = None
    download: bool = False
    val_split: int = 5000
    val_from: str = "auto"
    synthetic_train: int = 5000
    synthetic_val: int = 1000
    device: str | None = None
    out: str = "compare_out"
    swap_linear: bool = True
    swap_conv: bool = False
    swap_activations: bool = True
    fuse: bool = True
    profile_steps: int = 10
    val_batch_size: int = 1000
    quiet: bool = False
    child: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.seeds, str):
            self.seeds = parse_seeds(self.seeds)
        elif isinstance(self.seeds, int):
            self.seeds = (self.seeds,)
        else:
            self.seeds = tuple(self.seeds)

    def overrides(self) -> list[str]:
        """The recipe fields set explicitly (not None)."""
        return [name for name in RECIPE_FIELDS if getattr(self, name) is not None]

    def resolved(self) -> CompareConfig:
        """A copy with every recipe field filled in from ``RECIPES[model]`` where it is None."""
        if self.model not in RECIPES:
            raise CompareError(f"unknown model {self.model!r}; the models are: {', '.join(RECIPES)}")
        recipe = RECIPES[self.model]
        return dataclasses.replace(
            self, **{name: recipe[name] for name in RECIPE_FIELDS if getattr(self, name) is None}
        )

    def validate(self) -> None:
        """Raises CompareError naming the option when a value is out of range (call on a resolved config)."""
        from .models import MODELS

        if self.model not in MODELS:
            raise CompareError(f"unknown model {self.model!r}; the models are: {', '.join(MODELS)}")
        checks = [
            (isinstance(self.epochs, int) and self.epochs >= 1, f"--epochs must be >= 1, got {self.epochs!r}"),
            (
                isinstance(self.batch_size, int) and self.batch_size >= 1,
                f"--batch-size must be >= 1, got {self.batch_size!r}",
            ),
            (
                self.optimizer in OPTIMIZERS,
                f"--optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}",
            ),
            (self.schedule in SCHEDULES, f"--schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}"),
            (self.amp in AMP_MODES, f"--amp must be one of {', '.join(AMP_MODES)}, got {self.amp!r}"),
            (
                self.allocator in ALLOCATORS,
                f"--allocator must be one of {', '.join(ALLOCATORS)}, got {self.allocator!r}",
            ),
            (self.val_from in VAL_FROM, f"--val-from must be one of {', '.join(VAL_FROM)}, got {self.val_from!r}"),
            (self.lr is not None and self.lr > 0, f"--lr must be positive, got {self.lr!r}"),
            (
                self.momentum is not None and 0 <= self.momentum < 1,
                f"--momentum must be in [0, 1), got {self.momentum!r}",
            ),
            (
                self.weight_decay is not None and self.weight_decay >= 0,
                f"--weight-decay must be >= 0, got {self.weight_decay!r}",
            ),
            (
                self.label_smoothing is not None and 0 <= self.label_smoothing < 1,
                f"--label-smoothing must be in [0, 1), got {self.label_smoothing!r}",
            ),
            (len(self.seeds) >= 1, "--seeds needs at least one seed"),
            (self.val_split >= 1, f"--val-split must be >= 1, got {self.val_split}"),
            (
                self.synthetic_train >= 1 and self.synthetic_val >= 1,
                "--synthetic-train and --synthetic-val must be >= 1",
            ),
            (self.profile_steps >= 0, f"--profile-steps must be >= 0, got {self.profile_steps}"),
            (self.val_batch_size >= 1, f"--val-batch-size must be >= 1, got {self.val_batch_size}"),
        ]
        for ok, message in checks:
            if not ok:
                raise CompareError(message)
        if self.optimizer == "sgd" and self.nesterov and not self.momentum:
            raise CompareError("--nesterov needs a nonzero --momentum")
        if self.compile_mode is not None and self.compile_mode not in COMPILE_MODES:
            raise CompareError(f"--compile-mode must be one of {', '.join(COMPILE_MODES)}, got {self.compile_mode!r}")
        if self.torchext_compile not in TORCHEXT_COMPILE_MODES:
            raise CompareError(
                f"--torchext-compile must be one of {', '.join(TORCHEXT_COMPILE_MODES)}, got {self.torchext_compile!r}"
            )
        if self.cuda_graphs and (self.compile or self.compile_mode is not None):
            raise CompareError(
                "--cuda-graphs captures the eager step; with torch.compile use --compile-mode reduce-overhead instead"
            )
        if self.cuda_graphs and self.amp == "fp16":
            raise CompareError(
                "--cuda-graphs does not take --amp fp16: its GradScaler reads values on the host, which a CUDA graph "
                "cannot capture; use --amp bf16 or none"
            )
        _check_seeds(self.seeds)

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["seeds"] = list(self.seeds)
        return d

    def to_argv(self) -> list[str]:
        """Command-line arguments that ``build_parser()`` parses back into this configuration."""
        argv = ["--model", self.model]
        defaults = CompareConfig()
        for f in dataclasses.fields(self):
            name, value = f.name, getattr(self, f.name)
            if name in ("model", "child"):
                continue
            flag = "--" + name.replace("_", "-")
            if name in _BOOL_OPTIONAL:
                if value is not None and (name in RECIPE_FIELDS or value != getattr(defaults, name)):
                    argv.append(flag if value else "--no-" + flag[2:])
            elif name in ("compile", "cuda_graphs", "download", "quiet"):
                if value:
                    argv.append(flag)
            elif name == "seeds":
                argv += [flag, ",".join(str(s) for s in value)]
            elif value is not None and (name in RECIPE_FIELDS or value != getattr(defaults, name)):
                argv += [flag, str(value)]
        if self.child:
            argv.append("--_child")
        return argv


_BOOL_OPTIONAL = ("nesterov", "channels_last", "swap_linear", "swap_conv", "swap_activations", "fuse")


def _check_seeds(seeds) -> None:
    for s in seeds:
        if not isinstance(s, int) or isinstance(s, bool) or s < 0:
            raise CompareError(f"--seeds must be non-negative integers, got {s!r}")
    if len(set(seeds)) != len(seeds):
        raise CompareError(f"--seeds has a repeated seed: {','.join(str(s) for s in seeds)}")


def parse_seeds(text: str) -> tuple[int, ...]:
    """``"0,1,2"`` -> ``(0, 1, 2)``; raises CompareError for anything but distinct non-negative integers."""
    parts = [p.strip() for p in str(text).split(",")]
    try:
        seeds = tuple(int(p) for p in parts)
    except ValueError:
        raise CompareError(f"--seeds must be a comma-separated list of integers like 0,1,2, got {text!r}") from None
    if not seeds:
        raise CompareError(f"--seeds must be a comma-separated list of integers like 0,1,2, got {text!r}")
    _check_seeds(seeds)
    return seeds


def _seeds_arg(text: str) -> tuple[int, ...]:
    try:
        return parse_seeds(text)
    except CompareError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _recipe_epilog() -> str:
    lines = ["recipes (any flag given explicitly overrides the recipe's value):"]
    for model, r in RECIPES.items():
        opt = f"{r['optimizer']} lr {r['lr']:g}"
        if r["optimizer"] == "sgd":
            opt += f" momentum {r['momentum']:g}" + (" nesterov" if r["nesterov"] else "")
        lines.append(
            f"  {model}: {opt}, weight decay {r['weight_decay']:g}, {r['schedule']} schedule, "
            f"label smoothing {r['label_smoothing']:g}, batch {r['batch_size']}, amp {r['amp']}, "
            f"{'channels-last' if r['channels_last'] else 'contiguous'}, {r['epochs']} epochs"
        )
    lines += [
        "",
        "On the CPU the recipe's bf16 autocast falls back to float32 (noted in results.json); an explicit --amp",
        "bf16/fp16 there is an error. The first epoch (cudnn benchmark, torch.compile warm-up) is left out of the",
        "epoch-time ratio. Under torchrun --nproc_per_node=N both models train with DistributedDataParallel.",
    ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    from .models import MODELS

    p = argparse.ArgumentParser(
        prog="torchext-compare",
        description="Train a stock PyTorch model and its torchext twin side by side on CIFAR-10 (same initial "
        "weights, same batches, alternating per epoch) and write results.json, summary.md and plots.",
        epilog=_recipe_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d = CompareConfig()
    p.add_argument("--model", default=d.model, choices=list(MODELS), help=f"model (default: {d.model})")
    p.add_argument("--epochs", type=int, help="epochs (recipe)")
    p.add_argument("--batch-size", type=int, help="global batch size, split across ranks under torchrun (recipe)")
    p.add_argument("--optimizer", choices=OPTIMIZERS, help="optimizer (recipe)")
    p.add_argument("--lr", type=float, help="learning rate; the peak one with --schedule onecycle (recipe)")
    p.add_argument("--momentum", type=float, help="SGD momentum (recipe)")
    p.add_argument("--nesterov", action=argparse.BooleanOptionalAction, help="SGD Nesterov momentum (recipe)")
    p.add_argument("--weight-decay", type=float, help="weight decay (recipe)")
    p.add_argument("--schedule", choices=SCHEDULES, help="learning-rate schedule, stepped per batch (recipe)")
    p.add_argument("--label-smoothing", type=float, help="label smoothing of both losses (recipe)")
    p.add_argument("--amp", choices=AMP_MODES, help="autocast dtype; fp16 adds a GradScaler (recipe)")
    p.add_argument(
        "--channels-last", action=argparse.BooleanOptionalAction, help="channels-last models and batches (recipe)"
    )
    p.add_argument("--seeds", type=_seeds_arg, default=d.seeds, help="comma-separated seeds (default: 0,1,2)")
    p.add_argument("--compile", action="store_true", help="torch.compile both models")
    p.add_argument(
        "--compile-mode",
        choices=COMPILE_MODES,
        help="torch.compile's mode for both models (implies --compile; default: torch's default mode)",
    )
    p.add_argument(
        "--torchext-compile",
        choices=TORCHEXT_COMPILE_MODES,
        default=d.torchext_compile,
        help="with --compile: inductor calls torchext's kernels as opaque ops ('kernels', default) or lowers the "
        "one-pass ops (activations, softmax) to ATen and fuses them ('decompose'; torchext.set_compile_mode)",
    )
    p.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="capture each model's whole training step into a CUDA graph and replay it (CUDA only; SGD fused or "
        "Adam capturable, tensor lr)",
    )
    p.add_argument(
        "--allocator",
        choices=ALLOCATORS,
        default=d.allocator,
        help="CUDA allocator: PyTorch's (default) or torchext.memory's pool, run in a child process (CUDA only)",
    )
    p.add_argument(
        "--data",
        default=d.data,
        help="CIFAR-10 folder or archive (see torchext.data.load_cifar10; default: ~/.cache/torchext/cifar10), "
        "or 'synthetic' for random class-template images (CI)",
    )
    p.add_argument("--download", action="store_true", help="fetch CIFAR-10 with torchvision when --data holds none")
    p.add_argument(
        "--val-split",
        type=int,
        default=d.val_split,
        help=f"images held out of train for validation when there is no test split (default: {d.val_split})",
    )
    p.add_argument(
        "--val-from",
        choices=VAL_FROM,
        default=d.val_from,
        help="validation set: the test split when there is one (auto), only the test split, or a train hold-out",
    )
    p.add_argument("--synthetic-train", type=int, default=d.synthetic_train, help="train images with --data synthetic")
    p.add_argument("--synthetic-val", type=int, default=d.synthetic_val, help="val images with --data synthetic")
    p.add_argument(
        "--device", default=d.device, help="cuda, cuda:N or cpu (default: cuda; without a GPU, cpu must be given)"
    )
    p.add_argument("--out", default=d.out, help=f"output folder (default: {d.out})")
    p.add_argument("--swap-linear", action=argparse.BooleanOptionalAction, default=True, help="swap nn.Linear")
    p.add_argument(
        "--swap-conv",
        action=argparse.BooleanOptionalAction,
        default=d.swap_conv,
        help="swap nn.Conv2d too (off by default: torchext's conv2d runs at 0.39x cuDNN's speed over a ResNet-18 "
        "step on an H100 so far, docs/conv2d.md)",
    )
    p.add_argument(
        "--swap-activations", action=argparse.BooleanOptionalAction, default=True, help="swap activation modules"
    )
    p.add_argument("--fuse", action=argparse.BooleanOptionalAction, default=True, help="fuse Linear + activation pairs")
    p.add_argument(
        "--profile-steps",
        type=int,
        default=d.profile_steps,
        help="training steps profiled for the GPU-time share of torchext kernels, CUDA only "
        f"(default: {d.profile_steps})",
    )
    p.add_argument("--val-batch-size", type=int, default=d.val_batch_size, help="validation batch size")
    p.add_argument("--quiet", action="store_true", help="no progress bars or per-epoch lines")
    p.add_argument("--_child", dest="child", action="store_true", help=argparse.SUPPRESS)
    return p


def config_from_args(args: argparse.Namespace) -> CompareConfig:
    return CompareConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(CompareConfig)})


# ---------------------------------------------------------------------------------------------------------------
# Running


@dataclass
class _Dist:
    world: int = 1
    rank: int = 0
    local_rank: int = 0
    owns_group: bool = False

    @property
    def main(self) -> bool:
        return self.rank == 0


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


def _requested_device(config: CompareConfig) -> torch.device:
    """The device named by the configuration, checked without initializing CUDA (the pool must come first)."""
    name = config.device or _default_device(config.model)
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise CompareError(f"--device {name!r} is not a device: {e}") from None
    if device.type not in ("cuda", "cpu"):
        raise CompareError(f"--device must be cuda, cuda:N or cpu, got {name!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CompareError(f"--device {name}: no CUDA device is visible (use --device cpu)")
    return device


SMOKE_COMMAND = "torchext-compare --model mlp --data synthetic --device cpu --epochs 2 --seeds 0 --out runs/smoke"


def _default_device(model: str) -> str:
    """'cuda' when a GPU is visible. Without one the comparison is refused rather than run on the CPU by default:
    the recipes are sized for a GPU (ResNet-18's takes hours on a CPU), so the CPU must be asked for."""
    if torch.cuda.is_available():
        return "cuda"
    raise CompareError(
        f"no CUDA GPU is visible, and the {model} recipe is meant for one (on a CPU it takes hours). To see what "
        f"the tool does on the CPU in a minute: {SMOKE_COMMAND}. To train {model} on the CPU anyway: add --device cpu"
    )


def _resolve_device(device: torch.device, dist: _Dist) -> torch.device:
    """The device this rank runs on: ``cuda:LOCAL_RANK`` under torchrun, the current device for a bare 'cuda'."""
    if device.type == "cuda":
        if dist.world > 1:
            device = torch.device("cuda", dist.local_rank)
        elif device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if device.index >= torch.cuda.device_count():
            raise CompareError(f"--device {device}: only {torch.cuda.device_count()} CUDA devices are visible")
    return device


def _dist_from_env() -> _Dist:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return _Dist()
    return _Dist(world, int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0")))


def _init_dist(dist: _Dist, device: torch.device) -> None:
    import torch.distributed as tdist

    if dist.world <= 1:
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not tdist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        kwargs = {"device_id": device} if device.type == "cuda" else {}
        tdist.init_process_group(backend, **kwargs)
        dist.owns_group = True
    if tdist.get_world_size() != dist.world:
        raise CompareError(f"WORLD_SIZE is {dist.world} but the process group has {tdist.get_world_size()} ranks")


def _all_reduce(values: list[float], dist: _Dist, device: torch.device, op: str = "sum") -> list[float]:
    if dist.world <= 1:
        return list(values)
    import torch.distributed as tdist

    t = torch.tensor(values, dtype=torch.float64, device=device)
    tdist.all_reduce(t, op=tdist.ReduceOp.SUM if op == "sum" else tdist.ReduceOp.MAX)
    return t.tolist()


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
        from .graphs import GraphedTrainStep

        amp_dtype = torch.bfloat16 if cfg.amp == "bf16" else None
        c.graphed = GraphedTrainStep(c.train_model, c.criterion, c.optimizer, xb, yb, autocast_dtype=amp_dtype)
    return c.graphed(xb, yb)


def _train_shard(t: torch.Tensor, dist: _Dist) -> torch.Tensor:
    if dist.world <= 1:
        return t
    b = t.shape[0] // dist.world
    return t[dist.rank * b : (dist.rank + 1) * b]


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
    torch.manual_seed(_epoch_seed(seed, epoch, dist.rank))  # the same dropout masks for both models
    start_allocated = _memory_start(device)
    loss_sum = torch.zeros((), dtype=torch.float32, device=device)
    steps = 0
    desc = f"seed {seed} epoch {epoch + 1}/{cfg.epochs} {c.name}"
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for xb, yb in _progress(loader, desc, bars, len(loader)):
        if cfg.cuda_graphs:
            loss = _graphed_step(c, xb, yb, cfg)
        else:
            loss = _train_step(c, c.train_model, _train_shard(xb, dist), _train_shard(yb, dist), device, cfg.amp)
        if c.scheduler is not None:
            c.scheduler.step()
        loss_sum += loss.float()
        steps += 1
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - t0
    c.optimizer.zero_grad(set_to_none=True)  # what stays resident while the other model trains: no gradients
    peak_allocated = peak_reserved = None
    if device.type == "cuda":
        from .ops import check_targets

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


def _make_contender(name, net, criterion, cfg: CompareConfig, device, dist: _Dist, steps_per_epoch: int):
    # A captured step reads the learning rate from a tensor the scheduler updates, through optimizers that do not
    # synchronize the host (torchext/graphs.py).
    lr = torch.tensor(cfg.lr, device=device) if cfg.cuda_graphs else cfg.lr
    if cfg.optimizer == "sgd":
        optimizer = torch.optim.SGD(
            net.parameters(),
            lr=lr,
            momentum=cfg.momentum,
            nesterov=cfg.nesterov,
            weight_decay=cfg.weight_decay,
            **({"fused": True} if cfg.cuda_graphs else {}),
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
    )
    return report.model, report


def _jsonable(obj):
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if hasattr(obj, "as_dict"):
        return _jsonable(obj.as_dict())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _jsonable(dataclasses.asdict(obj))
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, torch.Tensor):
        return _jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        return _jsonable(obj.item())
    return str(obj)


def _gpu_time_share(step, steps: int, device=None):
    """``torchext.profiling.gpu_time_share(step, steps=..., device=...)``: the share of GPU time in torchext's
    kernels (``share``, ``total_us``, ``torchext_us``, ``by_kernel``, ...) as a dict; a bare number becomes
    ``{"share": x}``. A failure is recorded, not raised: it must not lose a finished run."""
    try:
        from . import profiling

        result = profiling.gpu_time_share(step, steps=steps, device=device, top=60)
    except Exception as e:  # noqa: BLE001 - reported in the results instead
        warnings.warn(f"torchext-compare: the GPU-time share could not be measured: {e}", stacklevel=2)
        return {"error": f"{type(e).__name__}: {e}"}
    if isinstance(result, (int, float)):
        return {"share": float(result)}
    return _jsonable(result)


def _environment(device: torch.device, dist: _Dist) -> dict:
    import torchext

    from ._loader import built_with_cuda

    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if device.type == "cuda" else None,
        "torchext": torchext.__version__,
        "torchext_built_with_cuda": built_with_cuda(),
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "world_size": dist.world,
        "cpu_threads": torch.get_num_threads(),
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "cudnn_benchmark": torch.backends.cudnn.benchmark if device.type == "cuda" else None,
    }
    return env


def _load_data(cfg: CompareConfig):
    from . import data as tdata

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
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
    from ._loader import built_with_cuda

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
        from . import memory

        memory.enable_pool()  # before anything initializes CUDA
    device = _resolve_device(device, dist)
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

    _init_dist(dist, device)
    from .compile import compile_mode, set_compile_mode

    previous_compile_mode = compile_mode()  # --torchext-compile sets it for this run only
    try:
        results = _run(cfg, config, device, dist, notes)
    finally:
        set_compile_mode(previous_compile_mode)
        if dist.owns_group:
            import torch.distributed as tdist

            tdist.destroy_process_group()
    return results


def _run(cfg: CompareConfig, config: CompareConfig, device, dist: _Dist, notes: list) -> dict:
    from .data import GPULoader

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
        "environment": _environment(device, dist),
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
            f"DistributedDataParallel over {dist.world} ranks: each trains on 1/{dist.world} of every global batch "
            f"of {cfg.batch_size}; batch-norm statistics are computed per rank"
        )
    if log:
        print(f"torchext-compare: {cfg.model} on {device} x{dist.world}; {data.describe()}", flush=True)
    writer = _OutputWriter(cfg.out, enabled=dist.main)

    def checkpoint(status: str) -> dict:
        """The results so far, with their status, written to --out (rank 0)."""
        results["status"] = status
        if cfg.allocator == "pool" and device.type == "cuda":
            from . import memory

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


def _progress_text(results: dict) -> str:
    """How far the run got, in words: 'seed 0: 2 of 15 epochs; seeds 1, 2 not started'."""
    cfg = results["config"]
    done = {s["seed"]: _epochs_done(s) for s in results["seeds"]}
    parts = [f"seed {seed}: {n} of {cfg['epochs']} epochs" for seed, n in done.items()]
    missing = [str(seed) for seed in cfg["seeds"] if seed not in done]
    if missing:
        parts.append(f"seed{'s' if len(missing) > 1 else ''} {', '.join(missing)} not started")
    return "; ".join(parts)


def _epochs_done(seed_result: dict) -> int:
    """The epochs both models of a seed finished (what the written results hold for it)."""
    models = seed_result["models"]
    return min(len(m["epochs"]) for m in models.values()) if models else 0


class _OutputWriter:
    """Writes results.json, summary.md and the plots into ``out`` after every epoch, so that an interrupted run keeps
    what it measured. results.json and summary.md are rewritten every time; the plots too, unless drawing them has
    taken more than a tenth of the run's time so far (fast epochs on a GPU), and always at the end. Only rank 0
    writes (``enabled``). ``describe()`` says what the folder holds, for the last line of the run."""

    PLOT_SHARE = 0.1

    def __init__(self, out: str, enabled: bool = True):
        self.out, self.enabled = out, enabled
        self.start = time.perf_counter()
        self.plot_time = 0.0
        self.paths: list[str] = []
        self.plots_missing: str | None = None  # why no plots were drawn (matplotlib missing)
        self.skipped: list[tuple[str, str]] = []  # (plot, why it was left out)

    def write(self, results: dict, final: bool) -> None:
        if not self.enabled:
            return
        paths = _write_tables(results, self.out)
        elapsed = time.perf_counter() - self.start
        if self.plots_missing is None and (final or self.plot_time <= self.PLOT_SHARE * elapsed):
            t0 = time.perf_counter()
            try:
                paths += make_plots(results, self.out)
                self.skipped = _skipped_plots(results)
            except ImportError as e:
                self.plots_missing = str(e)
                warnings.warn(f"torchext-compare: no plots ({e}); pip install matplotlib", stacklevel=2)
            self.plot_time += time.perf_counter() - t0
        elif self.paths:
            paths += [p for p in self.paths if p.endswith(".png")]
        self.paths = paths

    def describe(self) -> str:
        if not self.paths:
            return f"nothing written to {self.out}: no epoch had ended"
        names = [os.path.basename(p) for p in self.paths]
        text = f"wrote {', '.join(names)} to {self.out}"
        if self.plots_missing is not None:
            text += "; no plots: matplotlib is not installed (pip install matplotlib)"
        for name, reason in self.skipped:
            text += f"; no {name}: {reason}"
        return text


def _run_seed(
    seed, cfg, data, val_loader, device, dist: _Dist, results: dict, bars: bool, log: bool, profile: bool, checkpoint
):
    """Trains both models for one seed, filling in its entry, the last of ``results["seeds"]``, and calling
    ``checkpoint("running")`` after every epoch both models finished; fills in the swap report on the first seed
    and, when ``profile``, the GPU-time share of the final torchext model. Nothing of the seed outlives the call."""
    import torchext

    from . import models as tmodels
    from .data import GPULoader

    num_classes = len(data.classes)
    torch.manual_seed(seed)
    stock = tmodels.get_model(cfg.model, num_classes=num_classes).to(device)
    if cfg.channels_last:
        stock = stock.to(memory_format=torch.channels_last)
    ours, report = _swap(copy.deepcopy(stock), cfg)
    if results["swap_report"] is None:
        results["swap_report"] = _jsonable(report)
        results["swap_report_text"] = str(report)
        results["parameters"] = {
            "stock": sum(p.numel() for p in stock.parameters()),
            "torchext": sum(p.numel() for p in ours.parameters()),
        }
    del report
    loader = GPULoader(
        data.train_x, data.train_y, cfg.batch_size, train=True, device=device, seed=seed,
        channels_last=cfg.channels_last,
    )  # fmt: skip
    criteria = {
        "stock": nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing),
        "torchext": torchext.nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing),
    }
    contenders = [
        _make_contender(name, net, criteria[name], cfg, device, dist, len(loader))
        for name, net in (("stock", stock), ("torchext", ours))
    ]
    for epoch in range(cfg.epochs):
        order = contenders if epoch % 2 == 0 else contenders[::-1]
        for position, c in enumerate(order):
            record = _train_epoch(c, loader, epoch, seed, cfg, device, dist, bars)
            val_loss, val_acc, confusion = _evaluate(c, val_loader, num_classes, cfg, device, dist)
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


# ---------------------------------------------------------------------------------------------------------------
# Summary


def _stats(values) -> dict | None:
    values = [float(v) for v in values if v is not None]
    if not values:
        return None
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return {"mean": mean, "std": std, "min": min(values), "max": max(values), "n": len(values), "values": values}


def _timed_epochs(epochs: list) -> list:
    """The epochs counted in speed figures: all but the first (cudnn benchmark, compile warm-up), unless there is
    only one."""
    return epochs[1:] if len(epochs) > 1 else epochs


def _summary_seeds(results: dict) -> list:
    """The seeds the summary is over: those with the most epochs (every seed of a finished run; in one still going
    or interrupted, a seed cut short is left out, so that final figures are compared at the same epoch)."""
    seeds = [s for s in results["seeds"] if _epochs_done(s)]
    most = max((_epochs_done(s) for s in seeds), default=0)
    return [s for s in seeds if _epochs_done(s) == most]


def summarize(results: dict) -> dict:
    """Means and standard deviations over seeds (sample std) of each model's final figures, and the paired
    torchext-vs-stock differences and ratios computed per seed (over ``_summary_seeds``)."""
    per_model = {}
    per_seed = {name: {} for name in MODEL_NAMES}
    seeds = _summary_seeds(results)
    for name in MODEL_NAMES:
        rows = [s["models"][name] for s in seeds]
        per_seed[name]["final_val_accuracy"] = [r["final_val_accuracy"] for r in rows]
        per_seed[name]["final_train_loss"] = [r["final_train_loss"] for r in rows]
        per_seed[name]["final_val_loss"] = [r["final_val_loss"] for r in rows]
        per_seed[name]["epoch_time_s"] = [
            sum(e["epoch_time_s"] for e in _timed_epochs(r["epochs"])) / len(_timed_epochs(r["epochs"])) for r in rows
        ]
        per_seed[name]["images_per_s"] = [
            sum(e["images"] for e in _timed_epochs(r["epochs"]))
            / sum(e["epoch_time_s"] for e in _timed_epochs(r["epochs"]))
            for r in rows
        ]
        per_seed[name]["peak_allocated_bytes"] = [r["peak_allocated_bytes"] for r in rows]
        per_seed[name]["peak_reserved_bytes"] = [r["peak_reserved_bytes"] for r in rows]
        per_model[name] = {k: _stats(v) for k, v in per_seed[name].items()}

    def paired(key, fn):
        out = []
        for a, b in zip(per_seed["torchext"][key], per_seed["stock"][key], strict=True):
            if a is not None and b is not None and (fn != "ratio" or b):
                out.append(a - b if fn == "diff" else a / b)
        return _stats(out)

    n_epochs = _epochs_done(seeds[0]) if seeds else 0
    return {
        "models": per_model,
        "accuracy_diff": paired("final_val_accuracy", "diff"),
        "epoch_time_ratio": paired("epoch_time_s", "ratio"),
        "images_per_s_ratio": paired("images_per_s", "ratio"),
        "peak_allocated_ratio": paired("peak_allocated_bytes", "ratio"),
        "peak_reserved_ratio": paired("peak_reserved_bytes", "ratio"),
        "timed_epochs": f"2-{n_epochs}" if n_epochs > 2 else str(n_epochs),
        "seeds": len(seeds),
        "summary_seeds": [s["seed"] for s in seeds],
        "gpu_busy": gpu_busy(results) if results["seeds"] else None,
    }


def _compiled_text(cfg: dict) -> str:
    """', compiled', ', compiled (mode)' or ', CUDA graphs' for the summary's recipe line ('' for eager)."""
    decompose = ", torchext ops decomposed" if cfg.get("torchext_compile") == "decompose" else ""
    if cfg.get("compile_mode"):
        return f", compiled ({cfg['compile_mode']}{decompose})"
    if cfg.get("compile"):
        return f", compiled{decompose and ' (' + decompose[2:] + ')'}"
    return ", CUDA graphs" if cfg.get("cuda_graphs") else ""


def _pm(s: dict | None, scale: float = 1.0, digits: int = 2, suffix: str = "") -> str:
    if s is None:
        return "n/a"
    if s["n"] == 1:
        return f"{s['mean'] * scale:.{digits}f}{suffix}"
    return f"{s['mean'] * scale:.{digits}f} ± {s['std'] * scale:.{digits}f}{suffix}"


def _pm_signed(s: dict | None, scale: float = 1.0, digits: int = 2, suffix: str = "") -> str:
    if s is None:
        return "n/a"
    text = _pm(s, scale, digits, suffix)
    return text if text.startswith("-") else "+" + text


def _share_text(share) -> str:
    if share is None:
        return "not measured (CUDA only)"
    if not isinstance(share, dict):
        return str(share)
    if share.get("error"):
        return f"not measured ({share['error']})"
    if isinstance(share.get("share"), (int, float)):
        text = f"{100 * share['share']:.1f}% of the torchext model's GPU time"
        if isinstance(share.get("total_us"), (int, float)) and share.get("steps"):
            text += f" ({share['total_us'] / 1000:.2f} ms over {share['steps']} profiled training steps)"
        return text
    if share.get("reason"):
        return f"not measured ({share['reason']})"
    return "`" + json.dumps(share, sort_keys=True) + "`"


def gpu_busy(results: dict) -> dict:
    """Per model: the GPU work of one training step (``gpu_ms``: the profiled GPU time over the profiled steps of the
    last seed), the measured wall time of one step (``wall_ms``: the timed epochs of every seed, summed time over
    summed steps) and their ratio (``busy``: the share of a step the GPU is working; well below 1, the step waits
    on the host). Entries are None where a figure is missing (on the CPU, or when profiling failed)."""
    batch = results["config"]["batch_size"]
    profiles = {"stock": results.get("stock_gpu_time"), "torchext": results.get("gpu_time_share")}
    out = {}
    for name in MODEL_NAMES:
        epochs = [e for s in results["seeds"] for e in _timed_epochs(s["models"][name]["epochs"])]
        steps = sum(e["images"] for e in epochs) / batch
        wall_ms = 1000 * sum(e["epoch_time_s"] for e in epochs) / steps if steps else None
        p = profiles[name] if isinstance(profiles[name], dict) else {}
        gpu_ms = p["total_us"] / 1000 / p["steps"] if p.get("total_us") and p.get("steps") else None
        busy = gpu_ms / wall_ms if gpu_ms and wall_ms else None
        out[name] = {"gpu_ms": gpu_ms, "wall_ms": wall_ms, "busy": busy}
    return out


def _busy_text(b: dict) -> str:
    if any(b[name]["busy"] is None for name in MODEL_NAMES):
        return "GPU work per training step: not measured (CUDA only, from the profiled steps)."
    parts = []
    for name in MODEL_NAMES:
        m = b[name]
        parts.append(f"{name} {m['gpu_ms']:.2f} ms of GPU work in {m['wall_ms']:.2f} ms ({100 * m['busy']:.0f}% busy)")
    per = "; ".join(parts)
    return (
        f"GPU work per training step (profiled) against the measured step time: {per}. Well below 100%, the step "
        "waits on the host (Python, autograd, kernel launches), and the epoch-time ratio compares host costs more "
        "than kernels."
    )


def _timed_text(timed: str) -> str:
    """'epochs 2-15', 'epoch 2' or 'epoch 1': the epochs the speed figures cover (``summary["timed_epochs"]``)."""
    return f"epochs {timed}" if "-" in timed else f"epoch {timed}"


def _status_text(results: dict) -> str | None:
    """A line saying the results are partial (run still going, or interrupted), None for a finished run."""
    status = results.get("status", "complete")
    if status == "complete":
        return None
    state = "interrupted" if status == "interrupted" else "still running"
    return (
        f"**Partial results: the run is {state}** ({_progress_text(results)}). Figures are those of the epochs "
        "completed."
    )


def render_summary(results: dict) -> str:
    """summary.md: the configuration in one paragraph, the table of means ± std over seeds, the notes."""
    s = results.get("summary") or summarize(results)
    cfg, env, data = results["config"], results["environment"], results["data"]
    m = s["models"]
    mib = 1.0 / 2**20
    timed = _timed_text(s["timed_epochs"])
    status = _status_text(results)
    lines = [
        f"# torchext vs stock PyTorch: {cfg['model']}",
        "",
        *([status, ""] if status else []),
        f"{env['date']}; {env.get('gpu') or env['device']} x{env['world_size']}; torch {env['torch']}, CUDA "
        f"{env['cuda']}, torchext {env['torchext']}.",
        "",
        f"{cfg['epochs']} epochs, batch {cfg['batch_size']}, {cfg['optimizer']} lr {cfg['lr']:g} ({cfg['schedule']}), "
        f"weight decay {cfg['weight_decay']:g}, label smoothing {cfg['label_smoothing']:g}, amp {cfg['amp']}, "
        f"{'channels-last' if cfg['channels_last'] else 'contiguous'}{_compiled_text(cfg)}, "
        f"allocator {cfg['allocator']}; seeds {', '.join(str(x) for x in cfg['seeds'])}.",
        f"Data: {data['train_images']} training images from {data['source']}; **validation set: "
        f"{data['val_source']}** ({data['val_images']} images).",
        "",
        f"Mean ± std over {s['seeds']} seed(s). Ratios and differences are taken per seed (same initial weights, "
        "same batches), then averaged.",
        "",
        "| | stock | torchext | torchext vs stock |",
        "|---|---|---|---|",
        f"| final val accuracy | {_pm(m['stock']['final_val_accuracy'], 100, 2, '%')} | "
        f"{_pm(m['torchext']['final_val_accuracy'], 100, 2, '%')} | "
        f"{_pm_signed(s['accuracy_diff'], 100, 2, ' points')} |",
        f"| final val loss | {_pm(m['stock']['final_val_loss'], 1, 4)} | "
        f"{_pm(m['torchext']['final_val_loss'], 1, 4)} | |",
        f"| final train loss | {_pm(m['stock']['final_train_loss'], 1, 4)} | "
        f"{_pm(m['torchext']['final_train_loss'], 1, 4)} | |",
        f"| epoch time (s), {timed} | {_pm(m['stock']['epoch_time_s'], 1, 3)} | "
        f"{_pm(m['torchext']['epoch_time_s'], 1, 3)} | {_pm(s['epoch_time_ratio'], 1, 3, 'x')} |",
        f"| images/s, {timed} | {_pm(m['stock']['images_per_s'], 1, 0)} | "
        f"{_pm(m['torchext']['images_per_s'], 1, 0)} | {_pm(s['images_per_s_ratio'], 1, 3, 'x')} |",
        f"| peak allocated (MiB) | {_pm(m['stock']['peak_allocated_bytes'], mib, 1)} | "
        f"{_pm(m['torchext']['peak_allocated_bytes'], mib, 1)} | {_pm(s['peak_allocated_ratio'], 1, 3, 'x')} |",
        f"| peak reserved (MiB) | {_pm(m['stock']['peak_reserved_bytes'], mib, 1)} | "
        f"{_pm(m['torchext']['peak_reserved_bytes'], mib, 1)} | {_pm(s['peak_reserved_ratio'], 1, 3, 'x')} |",
        "",
    ]
    if s["timed_epochs"] == "1":
        lines.append("Speed figures include epoch 1 (the only epoch), with its warm-up (cudnn benchmark, compile).")
    else:
        on_cuda = str(env["device"]).startswith("cuda")
        warmup = " and ".join(
            (["the cudnn benchmark"] if on_cuda else ["first-call allocations"])
            + (["torch.compile"] if cfg["compile"] or cfg.get("compile_mode") else [])
            + (["CUDA-graph capture"] if cfg.get("cuda_graphs") else [])
        )
        lines.append(
            f"Speed figures leave out epoch 1, which includes {warmup} warm-up: they cover {timed}. Epoch "
            "time is training only (validation not timed); the ratio is torchext / stock, below 1 means torchext "
            "is faster."
        )
    if m["stock"]["peak_allocated_bytes"] is None:
        lines.append("Peak memory is measured on CUDA devices only.")
    else:
        lines.append(
            "Peak memory is each model's epoch's peak (cache emptied and peaks reset before each), including what "
            "stays resident throughout: both models' weights and optimizer states and the dataset on the device."
        )
    lines += [
        "",
        f"GPU-time share of torchext kernels: {_share_text(results.get('gpu_time_share'))}.",
        "",
        _busy_text(s.get("gpu_busy") or gpu_busy(results)),
    ]
    pool = results.get("memory", {}).get("pool_stats")
    if pool:
        lines += [
            "",
            f"Allocator: torchext.memory pool ({results['memory'].get('pool_kind')}): peak reserved "
            f"{pool['reserved_bytes_peak'] * mib:.1f} MiB, peak requested "
            f"{pool['requested_bytes_peak'] * mib:.1f} MiB, "
            f"{pool['device_allocs']} cudaMalloc calls, fragmentation {pool['fragmentation']:.3f}.",
        ]
    for note in results.get("notes") or []:
        lines.append(f"\nNote: {note}.")
    if results.get("parameters"):
        p = results["parameters"]
        lines += ["", f"Parameters: stock {p['stock']:,}, torchext {p['torchext']:,}."]
    if results.get("swap_report_text"):
        lines += ["", "Swap report:", "", "```", results["swap_report_text"].rstrip(), "```"]
    return "\n".join(lines) + "\n"


def _write_tables(results: dict, out_dir: str) -> list[str]:
    """Writes results.json and summary.md into out_dir, each through a temporary file renamed over the old one (an
    interrupt never leaves half a file); returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = [os.path.join(out_dir, "results.json"), os.path.join(out_dir, "summary.md")]
    texts = [json.dumps(results, indent=1) + "\n", render_summary(results)]
    for path, text in zip(paths, texts, strict=True):
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)
    return paths


def write_outputs(results: dict, out_dir: str) -> list[str]:
    """Writes results.json, summary.md and the plots into out_dir; returns the paths written (no plots, with a
    warning saying to install matplotlib, where it is missing)."""
    paths = _write_tables(results, out_dir)
    try:
        paths += make_plots(results, out_dir)
    except ImportError as e:
        warnings.warn(f"torchext-compare: no plots ({e}); pip install matplotlib", stacklevel=2)
    return paths


# ---------------------------------------------------------------------------------------------------------------
# Plots

_COLORS = {"stock": "#4c72b0", "torchext": "#dd8452"}


def _curve(results: dict, name: str, key: str):
    """(epochs, mean, min, max) over seeds of a per-epoch figure; where a seed was cut short (an interrupted run), each
    epoch's figures are over the seeds that reached it."""
    runs = [[e[key] for e in s["models"][name]["epochs"]] for s in results["seeds"] if s["models"]]
    rows = np.full((len(runs), max(map(len, runs))), np.nan)
    for i, run_ in enumerate(runs):
        rows[i, : len(run_)] = run_
    return np.arange(1, rows.shape[1] + 1), np.nanmean(rows, 0), np.nanmin(rows, 0), np.nanmax(rows, 0)


def _seeds_text(results: dict) -> str:
    """The training seeds a curve is over: 'training seed 0' or 'training seeds 0, 1, 2: mean, band min-max'."""
    seeds = [str(s["seed"]) for s in results["seeds"] if s["models"]]
    if len(seeds) == 1:
        return f"training seed {seeds[0]}"
    return f"training seeds {', '.join(seeds)}: mean, band min-max"


def _skipped_plots(results: dict) -> list[tuple[str, str]]:
    """(file, reason) of the plots make_plots leaves out for these results."""
    s = results.get("summary") or summarize(results)
    if s["models"]["stock"]["peak_allocated_bytes"] is None:
        return [("memory.png", "peak memory is measured on CUDA devices only")]
    return []


def _seconds_label(v: float) -> str:
    return f"{v:.3f} s" if v < 1 else f"{v:.2f} s" if v < 100 else f"{v:,.0f} s"


def _rate_label(v: float) -> str:
    return f"{v:,.0f}/s" if v >= 10 else f"{v:.2f}/s"


def _plot_curves(ax, results, key, scale=1.0):
    from matplotlib.ticker import MaxNLocator

    for name in MODEL_NAMES:
        x, mean, lo, hi = _curve(results, name, key)
        ax.plot(x, mean * scale, marker="o", ms=3, color=_COLORS[name], label=name)
        if len(results["seeds"]) > 1:
            ax.fill_between(x, lo * scale, hi * scale, color=_COLORS[name], alpha=0.2, linewidth=0)
    ax.set_xlabel("epoch")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend()


def make_plots(results: dict, out_dir: str) -> list[str]:
    """Draws loss_curves.png, accuracy_curves.png, confusion_matrices.png, speed.png and, where peak memory was
    measured (CUDA), memory.png from a results.json dict into out_dir and returns their paths (``_skipped_plots``
    says which were left out and why; a memory.png left from an earlier run is removed). Curves are the mean over
    seeds with a min-max band. Uses matplotlib's object API (no pyplot state, no backend switch), so it works in
    scripts and notebooks."""
    from matplotlib.figure import Figure

    os.makedirs(out_dir, exist_ok=True)
    s = results.get("summary") or summarize(results)
    model = results["config"]["model"]
    summary_seeds = _summary_seeds(results)
    band = _seeds_text(results)
    paths = []

    def save(fig, name):
        path = os.path.join(out_dir, name)
        fig.savefig(path, dpi=120)
        paths.append(path)

    fig = Figure(layout="constrained", figsize=(11, 4))
    ax1, ax2 = fig.subplots(1, 2)
    _plot_curves(ax1, results, "train_loss")
    ax1.set_ylabel("training loss (mean over the epoch)")
    _plot_curves(ax2, results, "val_loss")
    ax2.set_ylabel("validation loss (no label smoothing)")
    fig.suptitle(f"{model}: loss ({band})")
    save(fig, "loss_curves.png")

    fig = Figure(layout="constrained", figsize=(6, 4))
    ax = fig.subplots()
    _plot_curves(ax, results, "val_accuracy", 100.0)
    ax.set_ylabel("validation accuracy (%)")
    ax.set_title(f"{model}: validation accuracy ({band})\nvalidation set: {results['data']['val_source']}", fontsize=9)
    save(fig, "accuracy_curves.png")

    classes = results["data"]["classes"]
    k = len(classes)
    fig = Figure(layout="constrained", figsize=(12, 5.5))
    axes = fig.subplots(1, 2)
    for ax, name in zip(axes, MODEL_NAMES, strict=True):
        cm = np.zeros((k, k), dtype=np.float64)
        for seed in summary_seeds:
            cm += np.asarray(seed["models"][name]["confusion_matrix"], dtype=np.float64)
        rows = cm.sum(1, keepdims=True)
        pct = 100.0 * cm / np.where(rows == 0, 1, rows)
        im = ax.imshow(pct, cmap="Blues", vmin=0, vmax=100)
        for i in range(k):
            for j in range(k):
                ax.text(j, i, f"{pct[i, j]:.0f}", ha="center", va="center", fontsize=7,
                        color="white" if pct[i, j] > 50 else "black")  # fmt: skip
        ax.set_xticks(range(k), classes, rotation=60, ha="right", fontsize=8)
        ax.set_yticks(range(k), classes, fontsize=8)
        ax.set_xlabel("predicted")
        ax.set_ylabel("true")
        acc = s["models"][name]["final_val_accuracy"]
        ax.set_title(f"{name}: {_pm(acc, 100, 2, '%')} (row %)")
        fig.colorbar(im, ax=ax, fraction=0.046)
    seed_names = ", ".join(str(seed["seed"]) for seed in summary_seeds)
    fig.suptitle(f"{model}: confusion matrices of the final models, summed over training seed(s) {seed_names}")
    save(fig, "confusion_matrices.png")

    fig = Figure(layout="constrained", figsize=(10, 4))
    ax1, ax2 = fig.subplots(1, 2)
    panels = (
        (ax1, "epoch_time_s", "epoch time (s)", _seconds_label),
        (ax2, "images_per_s", "training images per second", _rate_label),
    )
    for ax, key, label, text in panels:
        means = [s["models"][n][key]["mean"] for n in MODEL_NAMES]
        stds = [s["models"][n][key]["std"] for n in MODEL_NAMES]
        bars = ax.bar(MODEL_NAMES, means, yerr=stds, capsize=4, color=[_COLORS[n] for n in MODEL_NAMES])
        ax.bar_label(bars, labels=[text(v) for v in means], label_type="center", color="white")
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    ratio = s["epoch_time_ratio"]
    warmup = " (epoch 1, warm-up, left out)" if s["timed_epochs"] != "1" else ""
    fig.suptitle(
        f"{model}: speed over {_timed_text(s['timed_epochs'])}{warmup}"
        + (f"; torchext/stock epoch time {_pm(ratio, 1, 3, 'x')}" if ratio else "")
    )
    save(fig, "speed.png")

    memory_path = os.path.join(out_dir, "memory.png")
    if _skipped_plots(results):
        if os.path.exists(memory_path):
            os.remove(memory_path)  # an earlier run's, which these results would seem to own
    else:
        fig = Figure(layout="constrained", figsize=(7, 4))
        ax = fig.subplots()
        width = 0.38
        x = np.arange(2)
        for i, name in enumerate(MODEL_NAMES):
            vals = [s["models"][name][k]["mean"] / 2**20 for k in ("peak_allocated_bytes", "peak_reserved_bytes")]
            bars = ax.bar(x + (i - 0.5) * width, vals, width, label=name, color=_COLORS[name])
            ax.bar_label(bars, labels=[f"{v:,.0f}" for v in vals], padding=2, fontsize=8)
        ax.set_xticks(x, ["peak allocated", "peak reserved"])
        ax.set_ylabel("MiB")
        ax.legend()
        ax.grid(axis="y", alpha=0.3)
        ax.set_title(f"{model}: peak CUDA memory per model ({results['config']['allocator']} allocator)")
        save(fig, "memory.png")
    return paths


# ---------------------------------------------------------------------------------------------------------------
# CLI


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    config = config_from_args(args)
    try:
        run(config)
    except CompareError as e:
        parser.error(str(e))
    except KeyboardInterrupt:
        return 130  # run() has said what it wrote; 128 + SIGINT, as a shell reports Ctrl-C
    return 0


if __name__ == "__main__":
    sys.exit(main())
