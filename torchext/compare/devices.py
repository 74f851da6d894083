"""Where the comparison runs: the device (chosen and checked without initializing CUDA), the processes under torchrun
(``_Dist``, the process group, the reductions over ranks, each rank's slice of a batch) and the environment recorded
in results.json."""

from __future__ import annotations

import collections
import datetime
import os
import platform
from dataclasses import dataclass

import torch

from .config import SMOKE_COMMAND, CompareConfig, CompareError


@dataclass
class _Dist:
    world: int = 1
    rank: int = 0
    local_rank: int = 0
    owns_group: bool = False

    @property
    def main(self) -> bool:
        return self.rank == 0


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


def _default_device(model: str) -> str:
    """'cuda' when a GPU is visible. Without one the comparison is refused rather than run on the CPU by default:
    the recipes are sized for a GPU (ResNet-18's takes hours on a CPU), so the CPU must be asked for."""
    if torch.cuda.is_available():
        return "cuda"
    raise CompareError(
        f"no CUDA GPU is visible, and the {model} recipe is meant for one (on a CPU it takes hours). To see what "
        f"the tool does on the CPU in a minute: {SMOKE_COMMAND}. To train {model} on the CPU anyway: add --device cpu"
    )


def _dist_backend(config: CompareConfig, device: torch.device) -> str:
    """The process group's backend under torchrun: ``--dist-backend``, else nccl on CUDA and gloo on the CPU."""
    backend = config.dist_backend or ("nccl" if device.type == "cuda" else "gloo")
    if backend == "nccl" and device.type != "cuda":
        raise CompareError(f"--dist-backend nccl needs CUDA devices (device is {device}); use --dist-backend gloo")
    return backend


def _resolve_device(device: torch.device, dist: _Dist, backend: str) -> torch.device:
    """The device this rank runs on: ``cuda:LOCAL_RANK`` under torchrun (``LOCAL_RANK % GPUs`` with gloo, which lets
    ranks share a GPU; NCCL refuses two ranks on one), the current device for a bare 'cuda'."""
    if device.type == "cuda":
        count = torch.cuda.device_count()
        if dist.world > 1:
            if dist.local_rank >= count and backend != "gloo":
                raise CompareError(
                    f"torchrun started local rank {dist.local_rank} but only {count} CUDA device(s) are visible: "
                    "NCCL (--dist-backend's default on CUDA) needs a GPU per rank. Start at most as many ranks per "
                    "node as GPUs, or pass --dist-backend gloo to let ranks share GPUs (DDP's arithmetic, for its "
                    "accuracy: the times are not DDP's speed)"
                )
            device = torch.device("cuda", dist.local_rank % count)  # count > 0: _requested_device checked
        elif device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if device.index >= count:
            raise CompareError(f"--device {device}: only {count} CUDA devices are visible")
    return device


def _dist_from_env() -> _Dist:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return _Dist()
    return _Dist(world, int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0")))


def _init_dist(dist: _Dist, device: torch.device, backend: str) -> None:
    import torch.distributed as tdist

    if dist.world <= 1:
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not tdist.is_initialized():
        kwargs = {"device_id": device} if backend == "nccl" else {}
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


def _train_shard(t: torch.Tensor, dist: _Dist) -> torch.Tensor:
    if dist.world <= 1:
        return t
    b = t.shape[0] // dist.world
    return t[dist.rank * b : (dist.rank + 1) * b]


def _gpu_sharing(device: torch.device, dist: _Dist) -> tuple[int | None, int | None]:
    """(GPUs in the run, most ranks on one GPU), from every rank's GPU UUID (gathered over the process group, so it
    holds across nodes and whatever CUDA_VISIBLE_DEVICES each rank sees); (None, None) off CUDA."""
    key = str(getattr(torch.cuda.get_device_properties(device), "uuid", device)) if device.type == "cuda" else "cpu"
    keys = [key]
    if dist.world > 1:
        import torch.distributed as tdist

        keys = [None] * dist.world
        tdist.all_gather_object(keys, key)
    if device.type != "cuda":
        return None, None
    ranks_on = collections.Counter(keys)
    return len(ranks_on), max(ranks_on.values())


def _environment(device: torch.device, dist: _Dist, backend: str) -> dict:
    import torchext

    from .._loader import built_with_cuda

    gpus, ranks_per_gpu = _gpu_sharing(device, dist)
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
        "gpus": gpus,
        "ranks_per_gpu": ranks_per_gpu,
        "dist_backend": backend if dist.world > 1 else None,
        "cpu_threads": torch.get_num_threads(),
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "cudnn_benchmark": torch.backends.cudnn.benchmark if device.type == "cuda" else None,
    }
    return env
