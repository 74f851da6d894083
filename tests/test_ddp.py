"""DistributedDataParallel and SyncBatchNorm with swapped models (issue 19).

The DDP test trains a small ResNet (resnet18_cifar's layers at a few channels: every layer torchext's, BatchNorm +
ReLU and BatchNorm + add + ReLU fused by torch.fx, a max-pool and the global pool) and its stock twin from the same
weights under DistributedDataParallel in 2 processes: gloo on the CPU (CI), NCCL on 2 GPUs where there are 2. Each
rank trains on its own batches; after every step the parameters must be the same on both ranks (DDP averaged the
gradients) and within rounding of the stock model's on the same rank. On the GPUs a third model trains too: the
stock model converted to nn.SyncBatchNorm and then swapped (the SyncBatchNorms stay stock, the rest is torchext's)
against the converted stock model (SyncBatchNorm refuses CPU tensors, so this part needs the GPUs).

The single-process tests cover what swap_modules does with SyncBatchNorm and what
nn.SyncBatchNorm.convert_sync_batchnorm does with a swapped model."""

import copy
import datetime
import os
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import torchext
from torchext import nn as tnn
from torchext.models import BasicBlock
from torchext.swap import SYNC_BATCH_NORM

WORLD = 2
STEPS = 3
BATCH = 4  # per rank
IMAGE = 16
FUSIONS = 5  # the stem's BN + ReLU, and BN + ReLU and BN + add + ReLU in each of the two blocks


class SmallResNet(nn.Module):
    """A conv stem + BatchNorm + ReLU, a max-pool, a BasicBlock with the identity shortcut, one with the strided 1x1
    conv + BatchNorm shortcut, the global average pool, flatten and a Linear: every kind of layer resnet18_cifar
    has (and a max-pool), at ``width`` channels."""

    def __init__(self, width: int = 8, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, kernel_size=3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = nn.Sequential(BasicBlock(width, width), BasicBlock(width, 2 * width, stride=2))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.flatten = nn.Flatten(1)
        self.fc = nn.Linear(2 * width, num_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        return self.fc(self.flatten(self.avgpool(self.layer1(x))))


def _close(actual, expected, rel, what):
    """Within rel of the expected tensor's largest magnitude (as tests/test_fusion.py compares)."""
    scale = expected.abs().max().item()
    err = (actual - expected).abs().max().item()
    assert err <= rel * max(scale, 1e-30), f"[{what}] max error {err:.3g} against max |expected| {scale:.3g}"


def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1).double() for t in tensors])


def _same_on_every_rank(flat: torch.Tensor, what: str) -> None:
    gathered = [torch.empty_like(flat) for _ in range(WORLD)]
    dist.all_gather(gathered, flat)
    for r in range(1, WORLD):
        assert torch.equal(gathered[r], gathered[0]), f"[{what}] rank {r} differs from rank 0 by " + (
            f"{(gathered[r] - gathered[0]).abs().max().item():.3g}"
        )


def _pairs(device, dtype, sync_bn: bool):
    """{name: (stock model, torchext model, report)} from the same initial weights."""
    torch.manual_seed(0)
    base = SmallResNet().to(device, dtype)
    out = {}
    stock = copy.deepcopy(base)
    report = torchext.swap_modules(copy.deepcopy(base))
    assert not report.left_stock, str(report)
    assert len(report.graph_fused) == FUSIONS, str(report)
    out["fused"] = (stock, report.model, report)
    if sync_bn:
        stock = nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(base))
        report = torchext.swap_modules(copy.deepcopy(stock))
        left = {s.cls for s in report.left_stock}
        assert left == {"nn.SyncBatchNorm"}, str(report)
        assert all(s.reason == SYNC_BATCH_NORM for s in report.left_stock), str(report)
        assert not report.graph_fused, str(report)
        out["sync_bn"] = (stock, report.model, report)
    return out


def _worker(rank: int, init_method: str, backend: str, device_type: str) -> None:
    dist.init_process_group(
        backend, init_method=init_method, rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=120)
    )
    try:
        _train(rank, backend, device_type)
    finally:
        dist.destroy_process_group()
    # Leave without the interpreter's finalization. In torch 2.14, once a DistributedDataParallel has been built, the
    # process group outlives destroy_process_group and gloo's worker threads are never joined (measured: the process
    # keeps 5 threads after destroy_process_group and gc, against 2 without DDP). A worker that drops its last work's
    # tensors needs the GIL; if it gets it while the interpreter finalizes, the process aborts ("terminate called
    # without an active exception"; the aborting thread's stack is ProcessGroupGloo::runLoop -> TensorImpl's
    # decref_pyobject -> PyEval_RestoreThread -> pthread_exit, no torchext frame; 3 runs in about 180 on a 2-core
    # machine; pytorch/pytorch#107298 and #179291 describe both halves). A failure above has raised before this line,
    # and mp.spawn has its traceback.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _train(rank: int, backend: str, device_type: str) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    if device_type == "cuda":
        torch.cuda.set_device(rank)
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        device, dtype, rel = torch.device("cuda", rank), torch.float32, 2e-3
    else:
        device, dtype, rel = torch.device("cpu"), torch.float64, 1e-8
    ids = [rank] if device.type == "cuda" else None
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own batches
    batches = []
    for _ in range(STEPS):
        x = torch.randn(BATCH, 3, IMAGE, IMAGE, generator=gen).to(device, dtype)
        batches.append((x, torch.randint(0, 10, (BATCH,), generator=gen).to(device)))
    for name, (stock, ours, _) in _pairs(device, dtype, sync_bn=device.type == "cuda").items():
        models = {"stock": DDP(stock, device_ids=ids), "torchext": DDP(ours, device_ids=ids)}
        losses = {"stock": nn.CrossEntropyLoss(), "torchext": tnn.CrossEntropyLoss()}
        opts = {k: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for k, m in models.items()}
        for step, (x, y) in enumerate(batches):
            loss_values = {}
            for k, model in models.items():
                loss = losses[k](model(x), y)
                opts[k].zero_grad(set_to_none=True)
                loss.backward()
                opts[k].step()
                loss_values[k] = loss.detach()
            what = f"{name}, step {step}, rank {rank}"
            _close(loss_values["torchext"], loss_values["stock"], rel, f"{what}: loss")
            losses_seen = [torch.empty_like(loss_values["stock"]) for _ in range(WORLD)]
            dist.all_gather(losses_seen, loss_values["stock"])
            assert not torch.equal(losses_seen[0], losses_seen[1]), f"[{what}] the ranks trained on the same data"
            params = {k: dict(m.module.named_parameters()) for k, m in models.items()}
            assert list(params["torchext"]) == list(params["stock"]), what
            for k in models:
                _same_on_every_rank(_flat(params[k].values()), f"{what}: {k} parameters")
            for key, p in params["torchext"].items():
                _close(p, params["stock"][key], rel, f"{what}: {key}")
        stock_buffers = dict(stock.named_buffers())
        for key, b in ours.named_buffers():  # running statistics: rank 0's, broadcast by DDP, then this rank's batch
            _close(b.double(), stock_buffers[key].double(), rel, f"{name}, rank {rank}: {key}")
        stock.eval()
        ours.eval()
        with torch.no_grad():
            _close(ours(batches[0][0]), stock(batches[0][0]), rel, f"{name}, rank {rank}: eval output")


def _spawn(tmp_path, backend: str, device_type: str) -> None:
    init_method = f"file://{tmp_path / 'rendezvous'}"  # a file store: no port to find free, nothing to collide
    mp.spawn(_worker, args=(init_method, backend, device_type), nprocs=WORLD, join=True)


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed, gloo")
def test_ddp_gloo_fully_swapped_matches_stock(tmp_path):
    _spawn(tmp_path, "gloo", "cpu")


@pytest.mark.gpu
@pytest.mark.slow  # two processes training: left out of the compute-sanitizer pass
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
def test_ddp_nccl_fully_swapped_and_sync_batch_norm_match_stock(tmp_path):
    _spawn(tmp_path, "nccl", "cuda")


# ---------------------------------------------------------------------------------------------------------------
# SyncBatchNorm, in one process


def test_swap_leaves_sync_batch_norm_stock_with_a_line_in_the_report():
    torch.manual_seed(0)
    stock = nn.SyncBatchNorm.convert_sync_batchnorm(SmallResNet().double())
    report = torchext.swap_modules(copy.deepcopy(stock))
    assert [s.name for s in report.left_stock] == ["bn1", "layer1.0.bn1", "layer1.0.bn2", "layer1.1.bn1",
                                                   "layer1.1.bn2", "layer1.1.downsample.1"], str(report)  # fmt: skip
    assert sum(type(m) is nn.SyncBatchNorm for m in report.model.modules()) == 6
    assert report.counts["left_stock_by_class"] == {"nn.SyncBatchNorm": 6}
    assert "SyncBatchNorm: its statistics are reduced across ranks" in str(report)
    assert not report.graph_fused
    # Convolutions, ReLUs, pools and the Linear are torchext's; without torch.distributed set up, SyncBatchNorm
    # normalizes like BatchNorm2d.
    assert {r.old for r in report.replaced} == {"nn.Conv2d", "nn.ReLU", "nn.MaxPool2d", "nn.AdaptiveAvgPool2d",
                                                "nn.Linear"}  # fmt: skip
    x = torch.randn(2, 3, IMAGE, IMAGE, dtype=torch.float64)
    _close(report.model(x), stock(x), 1e-9, "train-mode output")


def test_convert_sync_batchnorm_after_swap_without_fusion_works():
    torch.manual_seed(0)
    stock = SmallResNet().double()
    ours = torchext.swap_modules(copy.deepcopy(stock), fuse=False).model
    converted = nn.SyncBatchNorm.convert_sync_batchnorm(ours)
    bns = [m for m in converted.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    assert len(bns) == 6 and all(type(m) is nn.SyncBatchNorm for m in bns)
    assert torchext.swap_modules(converted, inplace=False).counts["left_stock_by_class"] == {"nn.SyncBatchNorm": 6}
    x = torch.randn(2, 3, IMAGE, IMAGE, dtype=torch.float64)
    _close(converted(x), stock(x), 1e-9, "train-mode output")


@pytest.mark.parametrize("copy_first", [False, True], ids=["model", "deepcopy"])
def test_convert_sync_batchnorm_after_fusion_raises(copy_first):
    """A fused BatchNorm replaced by a plain SyncBatchNorm would lose its ReLU (or add + ReLU) without a word: the
    fused GraphModule refuses, naming the layer and what to do."""
    torch.manual_seed(0)
    fused = torchext.swap_modules(SmallResNet().double()).model
    if copy_first:
        fused = copy.deepcopy(fused)
    with pytest.raises(TypeError, match=r"'bn1' is a fused BatchNormReLU2d .* convert the stock model before"):
        nn.SyncBatchNorm.convert_sync_batchnorm(fused)
    fused = torchext.swap_modules(SmallResNet().double()).model
    block = fused.get_submodule("layer1.0")
    with pytest.raises(TypeError, match="'layer1.0.bn2' is a fused BatchNormAddReLU2d .* residual add and the ReLU"):
        block.bn2 = nn.BatchNorm2d(8).double()
    block.bn2 = tnn.BatchNormAddReLU2d(8).double()  # a module of the same fused class may replace it
