"""torchext-compare: train a stock PyTorch model and its torchext twin side by side on CIFAR-10 (issue 5).

For each seed the stock model is built with ``torch.manual_seed(seed)``, deep-copied, and the copy is swapped to
torchext with ``torchext.swap_modules`` (Linear and Conv2d layers, activations, and Linear or Conv2d + activation pairs
fused into one torchext layer; with ``--swap-conv`` the convolutions' weights channels-last); its loss is
``torchext.nn.CrossEntropyLoss``, the stock one's ``torch.nn.CrossEntropyLoss``, with the same label smoothing. Both get
the same optimizer settings and schedule; in SGD recipes the torchext model's step runs on ``torchext.optim.SGD``
(``--no-swap-optimizer``: torch's for both). They train from identical weights on identical batches (one ``GPULoader``
seeded with the seed; each model's epoch e re-seeds the global RNG with (seed, e), so dropout draws the same masks for
both, except on activations whose layout differs: with --swap-conv on an NCHW recipe torchext's are channels-last),
alternating per epoch: stock then torchext on even epochs, torchext then stock on odd ones, so that drift of the machine
(clocks, temperature, neighbours) hits both. The loop adds little to the step itself (``benchmarks/bench_loop.py``
measures it against a bare loop): nothing is read back on the host per step, and the loader crops, flips and normalizes
8 batches at a time on the device.

Per model and epoch it records the training loss (mean over the epoch's batches, summed on the device: no
synchronization per step), validation loss and accuracy, the epoch's training time (``time.perf_counter`` between
two ``torch.cuda.synchronize()``; validation is not timed), images per second, and the peak allocated and reserved
CUDA memory (each model's epoch starts from an emptied cache with reset peak statistics, so the peaks are its own on
top of what stays resident: both models' weights and optimizer states and the dataset; the loader's block of 8
prepared batches is in them too); the confusion matrices of the final models on the validation set; on CUDA, the
share of the torchext model's GPU time spent in torchext kernels over a few profiled training steps
(``torchext.profiling``), and both models' GPU time per step by op family (convolution, batch norm, pooling,
elementwise, GEMM, loss, optimizer, copies: ``torchext.profiling.event_family``, by kernel name, and a generic ATen
kernel by the op that launched it). summary.md also says which layers
run torchext's code (from the swap report).

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
(NCCL on CUDA, gloo on the CPU; ``--dist-backend gloo`` on CUDA lets ranks share GPUs, to check DDP's accuracy on
fewer GPUs than ranks, not its speed): every rank iterates the same global batches of ``--batch-size`` images and trains
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

The package: ``config`` (CompareConfig, the recipes, the parser), ``devices`` (device choice, torchrun, the
environment), ``train`` (the run and its training loop), ``report`` (the summary and summary.md), ``plots``,
``output`` (the output folder) and ``cli`` (``main``); what they export is imported here, so ``torchext.compare.X``
stays the one name for each.
"""

from __future__ import annotations

from .cli import main
from .config import (
    ALLOCATORS,
    AMP_MODES,
    COMPILE_MODES,
    MODEL_NAMES,
    ONECYCLE_WARMUP,
    OPTIMIZERS,
    RECIPE_FIELDS,
    RECIPES,
    SCHEDULES,
    SMOKE_COMMAND,
    TORCHEXT_COMPILE_MODES,
    VAL_FROM,
    CompareConfig,
    CompareError,
    build_parser,
    config_from_args,
    parse_seeds,
)
from .output import write_outputs
from .plots import make_plots
from .report import _share_text, gpu_busy, render_summary, summarize  # noqa: F401
from .train import _evaluate, _gpu_time_share, run  # noqa: F401  (the loop calls _evaluate from here)

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
    "write_outputs",
    "SMOKE_COMMAND",
    "MODEL_NAMES",
    "OPTIMIZERS",
    "SCHEDULES",
    "AMP_MODES",
    "ALLOCATORS",
    "VAL_FROM",
    "COMPILE_MODES",
    "TORCHEXT_COMPILE_MODES",
    "ONECYCLE_WARMUP",
]
