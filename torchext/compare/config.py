"""torchext-compare's configuration: ``CompareConfig`` with its validation and the argv round trip, the recipes per
model, and the command-line parser."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Any

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
DIST_BACKENDS = ("nccl", "gloo")
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
    dist_backend:     under torchrun: 'nccl' (the default on CUDA; one GPU per rank) or 'gloo' (the default on the
                      CPU; on CUDA it lets ranks share GPUs, ``cuda:LOCAL_RANK % device_count``: DDP's arithmetic on
                      fewer GPUs, for its accuracy, not its speed).
    out:              output folder.
    swap_linear, swap_conv, swap_activations, fuse, forks: passed to ``torchext.swap_modules`` (as linear,
                      conv, activations, fuse, forks).
    swap_optimizer:   the torchext model's SGD is ``torchext.optim.SGD`` (the same update on torchext's kernel);
                      Adam, and SGD under ``cuda_graphs``, stay torch's.
    autocast_copies:  with that optimizer, on CUDA under bf16/fp16 autocast: ``autocast_copies=`` the autocast
                      dtype (its step writes the weights' low-precision copies that torchext's convolutions read
                      instead of casting the weights in every forward; docs/autocast_copies.md).
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
    dist_backend: str | None = None
    out: str = "compare_out"
    swap_linear: bool = True
    swap_conv: bool = False
    swap_activations: bool = True
    fuse: bool = True
    forks: bool = True
    swap_optimizer: bool = True
    autocast_copies: bool = True
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
        from ..models import MODELS

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
            (
                self.dist_backend is None or self.dist_backend in DIST_BACKENDS,
                f"--dist-backend must be one of {', '.join(DIST_BACKENDS)}, got {self.dist_backend!r}",
            ),
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


_BOOL_OPTIONAL = (
    "nesterov",
    "channels_last",
    "swap_linear",
    "swap_conv",
    "swap_activations",
    "fuse",
    "forks",
    "swap_optimizer",
    "autocast_copies",
)


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
    from ..models import MODELS

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
    p.add_argument(
        "--dist-backend",
        choices=DIST_BACKENDS,
        default=d.dist_backend,
        help="process group under torchrun (default: nccl on CUDA, gloo on the CPU); gloo on CUDA lets ranks share "
        "GPUs (cuda:LOCAL_RANK %% GPUs): DDP's accuracy on fewer GPUs than ranks, not its speed",
    )
    p.add_argument("--out", default=d.out, help=f"output folder (default: {d.out})")
    p.add_argument("--swap-linear", action=argparse.BooleanOptionalAction, default=True, help="swap nn.Linear")
    p.add_argument(
        "--swap-conv",
        action=argparse.BooleanOptionalAction,
        default=d.swap_conv,
        help="swap nn.Conv2d too: every layer torchext's (off by default, so that the default runs compare the other "
        "layers against the same cuDNN convolutions; torchext's conv2d runs at 1.04x cuDNN's speed over a ResNet-18 "
        "step's 3x3 convolutions on an H200, not yet on every shape: docs/conv2d.md)",
    )
    p.add_argument(
        "--swap-activations", action=argparse.BooleanOptionalAction, default=True, help="swap activation modules"
    )
    p.add_argument(
        "--fuse", action=argparse.BooleanOptionalAction, default=True, help="fuse Linear / Conv2d + activation pairs"
    )
    p.add_argument(
        "--forks",
        action=argparse.BooleanOptionalAction,
        default=d.forks,
        help="fork the tensors that feed several torchext modules, so that torchext's add sums their gradients "
        "(--no-forks: autograd sums them with ATen's add)",
    )
    p.add_argument(
        "--swap-optimizer",
        action=argparse.BooleanOptionalAction,
        default=d.swap_optimizer,
        help="train the torchext model with torchext.optim.SGD (SGD recipes, not under --cuda-graphs)",
    )
    p.add_argument(
        "--autocast-copies",
        action=argparse.BooleanOptionalAction,
        default=d.autocast_copies,
        help="with torchext.optim.SGD under CUDA autocast, let its step write the weights' low-precision copies "
        "that torchext's convolutions read instead of casting each weight in every forward",
    )
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


# What the tool tells a user without a GPU to run first (the README's CPU smoke command).
SMOKE_COMMAND = "torchext-compare --model mlp --data synthetic --device cpu --epochs 2 --seeds 0 --out runs/smoke"
