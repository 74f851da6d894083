"""cross_entropy against torch.nn.functional.cross_entropy, forward and backward."""

import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import (
    assert_accurate,
    device_dtype_params,
    device_params,
    gpu,
    make_tensor,
    poison_allocator,
)
from torch.library import opcheck

import torchext

# (N, C): one row, odd sizes, CIFAR's 10 classes, every forward path (1, 4 and 32 threads per row, a block per
# row), rows that are not a multiple of any vector width.
SHAPES = [(1, 1), (7, 3), (1023, 10), (64, 10), (33, 17), (5, 128), (9, 1023), (3, 2049), (4, 4100), (0, 10)]


def _targets(n, c, device, ignore_index=-100, ignore_some=True):
    t = torch.randint(0, c, (n,), device=device)
    if ignore_some and n > 2:
        t[1] = ignore_index
    return t


def _weight(kind, c, dtype, device):
    if kind is None:
        return None
    return torch.empty(c, dtype=torch.float64).uniform_(0.2, 2.0).to(device=device, dtype=dtype)


def _check(device, dtype, shape, reduction, weight_kind, label_smoothing, layout="contiguous", ignore_index=-100):
    n, c = shape
    x = make_tensor(shape, dtype, device, layout, requires_grad=True)
    x64 = x.detach().to(torch.float64).requires_grad_(True)
    t = _targets(n, c, device, ignore_index)
    w = _weight(weight_kind, c, dtype, device)
    w64 = None if w is None else w.to(torch.float64)
    kwargs = dict(ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing)
    x_before = x.detach().clone()

    poison_allocator(device, x)
    ours = torchext.ops.cross_entropy(x, t, w, **kwargs)
    theirs = F.cross_entropy(x, t, w, **kwargs)
    ref = F.cross_entropy(x64, t, w64, **kwargs)
    assert ours.dtype == dtype and ours.shape == theirs.shape
    what = f"cross_entropy {shape} {reduction} weight={weight_kind} ls={label_smoothing}"
    assert_accurate(ours, theirs, ref, f"{what} loss", dtype=dtype)

    g = make_tensor(ours.shape, dtype, device, low=0.5, high=1.5) if reduction == "none" else None
    if g is not None and layout != "contiguous" and g.dim() == 1 and g.numel() > 1:
        g = make_tensor((n,), dtype, device, "strided", low=0.5, high=1.5)
    g64 = None if g is None else g.to(torch.float64)
    if n == 0 and reduction == "mean":
        return  # NaN loss; torch gives a zero gradient
    (gx,) = torch.autograd.grad(ours, x, g)
    (gx_theirs,) = torch.autograd.grad(theirs, x, g)
    (gx_ref,) = torch.autograd.grad(ref, x64, g64)
    assert_accurate(gx, gx_theirs, gx_ref, f"{what} input.grad", dtype=dtype)
    assert torch.equal(x.detach(), x_before), "input was modified"


@pytest.mark.parametrize("device,dtype", device_dtype_params())
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_matches_torch(device, dtype, shape, reduction):
    _check(device, dtype, shape, reduction, None, 0.0)


@pytest.mark.parametrize("device,dtype", device_dtype_params())
@pytest.mark.parametrize("shape", [(7, 3), (1023, 10), (33, 17), (9, 1023), (4, 4100)], ids=str)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weight_kind", [None, "per-class"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_cross_entropy_weight_and_smoothing(device, dtype, shape, reduction, weight_kind, label_smoothing):
    _check(device, dtype, shape, reduction, weight_kind, label_smoothing)


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("layout", ["transposed", "strided"])
def test_cross_entropy_non_contiguous(device, layout):
    _check(device, torch.float32, (37, 10), "none", "per-class", 0.1, layout=layout)
    _check(device, torch.float32, (37, 10), "mean", None, 0.0, layout=layout)


@pytest.mark.parametrize("device", device_params())
def test_cross_entropy_other_input_ranks(device):
    x1 = make_tensor((10,), torch.float64, device, requires_grad=True)
    t1 = torch.tensor(3, device=device)
    for reduction in ("mean", "none"):
        ours, theirs = torchext.ops.cross_entropy(x1, t1, reduction=reduction), F.cross_entropy(x1, t1, reduction=reduction)
        assert ours.shape == theirs.shape and torch.allclose(ours, theirs)
    x4 = make_tensor((2, 5, 3, 4), torch.float64, device, requires_grad=True)
    t4 = torch.randint(0, 5, (2, 3, 4), device=device)
    for reduction in ("mean", "none"):
        ours = torchext.ops.cross_entropy(x4, t4, reduction=reduction, label_smoothing=0.2)
        theirs = F.cross_entropy(x4, t4, reduction=reduction, label_smoothing=0.2)
        assert ours.shape == theirs.shape and torch.allclose(ours, theirs)
        (ga,) = torch.autograd.grad(ours.sum(), x4)
        (gb,) = torch.autograd.grad(theirs.sum(), x4)
        assert torch.allclose(ga, gb), "[x4.grad]"


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_all_ignored(device, reduction):
    x = make_tensor((6, 4), torch.float32, device, requires_grad=True)
    t = torch.full((6,), -1, device=device)
    ours = torchext.ops.cross_entropy(x, t, ignore_index=-1, reduction=reduction)
    theirs = F.cross_entropy(x, t, ignore_index=-1, reduction=reduction)
    assert torch.equal(torch.isnan(ours), torch.isnan(theirs)), f"[loss] {ours} vs {theirs}"
    assert torch.allclose(ours.nan_to_num(), theirs.nan_to_num())
    (ga,) = torch.autograd.grad(ours.sum(), x)
    (gb,) = torch.autograd.grad(theirs.sum(), x)
    assert torch.equal(ga, gb), "[x.grad] all-ignored batch"


@pytest.mark.parametrize("device", device_params())
def test_cross_entropy_extreme_logits(device):
    x = make_tensor((8, 12), torch.float32, device) * 1000
    x[2, :] = -float("inf")
    x[2, 5] = 0.0
    x[3, 1] = -float("inf")
    t = torch.randint(0, 12, (8,), device=device)
    t[3] = 0
    ours = torchext.ops.cross_entropy(x, t, reduction="none")
    theirs = F.cross_entropy(x, t, reduction="none")
    assert torch.allclose(ours, theirs, rtol=1e-5, atol=1e-3, equal_nan=True), f"{ours} vs {theirs}"


@pytest.mark.parametrize("device", device_params())
def test_cross_entropy_gradcheck(device):
    x = make_tensor((6, 5), torch.float64, device, requires_grad=True)
    t = _targets(6, 5, device)
    w = _weight("per-class", 5, torch.float64, device)
    for reduction in ("mean", "sum", "none"):
        assert torch.autograd.gradcheck(
            lambda x: torchext.ops.cross_entropy(x, t, w, reduction=reduction, label_smoothing=0.15), (x,)
        )


@pytest.mark.parametrize("device", device_params())
def test_cross_entropy_opcheck(device):
    x = make_tensor((8, 5), torch.float32, device, requires_grad=True)
    t = _targets(8, 5, device)
    w = _weight("per-class", 5, torch.float32, device)
    opcheck(torch.ops.torchext.cross_entropy.default, (x, t, None, "mean", -100, 0.0))
    opcheck(torch.ops.torchext.cross_entropy.default, (x, t, w, "none", -100, 0.1))
    loss, lse, total_weight = torch.ops.torchext.cross_entropy(x.detach(), t, w, "sum", -100, 0.1)
    opcheck(
        torch.ops.torchext.cross_entropy_backward.default,
        (torch.ones_like(loss), x.detach(), t, w, "sum", -100, 0.1, lse, total_weight),
    )


@pytest.mark.parametrize("device", device_params())
def test_cross_entropy_rejects_bad_input(device):
    x = make_tensor((4, 3), torch.float32, device)
    t = torch.tensor([0, 1, 2, 1], device=device)
    # On CUDA the check is deferred by default: check_targets() raises (tests below cover the modes).
    with pytest.raises(IndexError, match="`target` values must be in \\[0, 3\\)"):
        torchext.ops.cross_entropy(x, torch.tensor([0, 3, 1, 1], device=device))
        torchext.ops.check_targets()
    with pytest.raises(IndexError, match="`target`"):
        torchext.ops.cross_entropy(x, torch.tensor([0, -2, 1, 1], device=device))
        torchext.ops.check_targets()
    with pytest.raises(TypeError, match="`target` must be int64"):
        torchext.ops.cross_entropy(x, t.int())
    with pytest.raises(TypeError, match="`target` must be int64"):
        torchext.ops.cross_entropy(x, torch.rand(4, 3, device=device))
    with pytest.raises(ValueError, match="`target` must have shape \\(4,\\)"):
        torchext.ops.cross_entropy(x, t[:3])
    with pytest.raises(ValueError, match="`weight` must be 1-D with one entry per class \\(3\\)"):
        torchext.ops.cross_entropy(x, t, torch.ones(4, device=device))
    with pytest.raises(TypeError, match="`weight` must have the same dtype"):
        torchext.ops.cross_entropy(x, t, torch.ones(3, device=device, dtype=torch.float64))
    with pytest.raises(ValueError, match="`reduction` must be"):
        torchext.ops.cross_entropy(x, t, reduction="avg")
    with pytest.raises(ValueError, match="`label_smoothing` must be in \\[0, 1\\]"):
        torchext.ops.cross_entropy(x, t, label_smoothing=1.5)
    with pytest.raises(TypeError, match="`self` must be"):
        torchext.ops.cross_entropy(x.int(), t)
    # After an error the op keeps working.
    torchext.ops.cross_entropy(x, t)


@gpu
def test_cross_entropy_rejects_mixed_devices():
    x = make_tensor((4, 3), torch.float32, "cuda")
    with pytest.raises(RuntimeError, match="`target` must be on the same device as `self`"):
        torchext.ops.cross_entropy(x, torch.tensor([0, 1, 2, 1]))
    with pytest.raises(RuntimeError, match="`weight` must be on the same device as `self`"):
        torchext.ops.cross_entropy(x, torch.tensor([0, 1, 2, 1], device="cuda"), torch.ones(3))


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cross_entropy_large_cuda(dtype):
    """The benchmark's shapes, checked once: many rows of 10 classes, and long rows."""
    for shape in [(65536, 10), (64, 32768)]:
        _check("cuda", dtype, shape, "mean", None, 0.0)
        _check("cuda", dtype, shape, "mean", "per-class", 0.1)


@gpu
def test_cross_entropy_misaligned_logits():
    base = make_tensor((33 * 16 + 1,), torch.float32, "cuda")
    x = base[1:].view(33, 16).requires_grad_(True)
    assert x.data_ptr() % 16 != 0
    t = _targets(33, 16, "cuda")
    ours = torchext.ops.cross_entropy(x, t, reduction="sum", label_smoothing=0.1)
    theirs = F.cross_entropy(x, t, reduction="sum", label_smoothing=0.1)
    assert torch.allclose(ours, theirs, rtol=1e-5)
    (ga,) = torch.autograd.grad(ours, x)
    (gb,) = torch.autograd.grad(theirs, x)
    assert torch.allclose(ga, gb, rtol=1e-5, atol=1e-6)


@gpu
def test_cross_entropy_deterministic():
    x = make_tensor((100003, 10), torch.float32, "cuda")
    t = _targets(100003, 10, "cuda")
    first = torchext.ops.cross_entropy(x, t)
    for _ in range(3):
        assert torch.equal(torchext.ops.cross_entropy(x, t), first), "mean reduction changed between runs"


# Target-check modes on CUDA (csrc/target_checks.h): TORCHEXT_CHECK_TARGETS unset/deferred, sync, off.
BAD_TARGET = "`target` values must be in \\[0, 3\\) or equal ignore_index \\(-100\\); 1 of 4 targets are not"


@gpu
def test_cross_entropy_deferred_target_check():
    """Default: the bad call returns (NaN in its bad row) without waiting for the GPU; the error comes from the next
    call once the check has landed, or from check_targets(), once."""
    torchext.ops.check_targets()  # nothing left over from other tests
    x = torch.randn(4, 3, device="cuda")
    good, bad = torch.tensor([0, 1, 2, 1], device="cuda"), torch.tensor([0, 3, 1, 1], device="cuda")
    torchext.ops.cross_entropy(x, good)  # first use: the pinned host buffer is allocated here
    torchext.ops.check_targets()
    torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU work queued ahead of the loss
    loss = torchext.ops.cross_entropy(x, bad, reduction="none")
    assert not torch.cuda.current_stream().query(), "the call waited for the GPU"
    torch.cuda.synchronize()
    assert torch.isnan(loss[1]) and torch.isfinite(loss[[0, 2, 3]]).all()
    with pytest.raises(IndexError, match=BAD_TARGET + ".*found after the call that received them"):
        torchext.ops.cross_entropy(x, good)
    torchext.ops.cross_entropy(x, good)  # reported once
    torchext.ops.check_targets()
    torchext.ops.cross_entropy(x, bad)
    with pytest.raises(IndexError, match=BAD_TARGET):
        torchext.ops.check_targets()
    torchext.ops.check_targets()


@gpu
def test_cross_entropy_deferred_check_keeps_later_errors():
    """A call that raises an earlier call's error still queues its own check."""
    torchext.ops.check_targets()
    x = torch.randn(4, 3, device="cuda")
    bad = torch.tensor([0, 3, 1, 1], device="cuda")
    torchext.ops.cross_entropy(x, bad)
    torch.cuda.synchronize()
    with pytest.raises(IndexError):
        torchext.ops.cross_entropy(x, torch.tensor([5, 5, 5, 5], device="cuda"))
    with pytest.raises(IndexError, match="4 of 4 targets are not"):
        torchext.ops.check_targets()


@gpu
def test_cross_entropy_sync_and_off_target_checks(monkeypatch):
    torchext.ops.check_targets()
    x = torch.randn(4, 3, device="cuda")
    bad = torch.tensor([0, 3, 1, 1], device="cuda")
    monkeypatch.setenv("TORCHEXT_CHECK_TARGETS", "sync")
    with pytest.raises(IndexError, match=BAD_TARGET + "$"):
        torchext.ops.cross_entropy(x, bad)
    monkeypatch.setenv("TORCHEXT_CHECK_TARGETS", "off")
    assert torch.isnan(torchext.ops.cross_entropy(x, bad, reduction="none")[1])
    torchext.ops.check_targets()  # nothing was queued
    monkeypatch.setenv("TORCHEXT_CHECK_TARGETS", "later")
    with pytest.raises(ValueError, match="TORCHEXT_CHECK_TARGETS=later: expected 'deferred'"):
        torchext.ops.cross_entropy(x, bad)


@gpu
def test_cross_entropy_pending_check_reported_at_exit(tmp_path):
    """A script whose last loss call gets a bad target still hears of it: the pending check prints at exit."""
    import subprocess
    import sys

    script = tmp_path / "last_call.py"
    script.write_text(
        "import torch, torchext\n"
        "x = torch.randn(4, 3, device='cuda')\n"
        "print(torchext.ops.cross_entropy(x, torch.tensor([0, 3, 1, 1], device='cuda')).item())\n"
    )
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    env.pop("TORCHEXT_CHECK_TARGETS", None)
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "nan", proc.stdout + proc.stderr
    assert "torchext: " in proc.stderr and "1 of 4 targets are not" in proc.stderr, proc.stderr[-2000:]
