"""Shared test helpers: devices and dtypes to parametrize over, awkward layouts, poisoned outputs, and the accuracy
rule (our error against a float64 reference at most twice PyTorch's own, above a floor per dtype)."""

import pytest
import torch

import torchext  # registers the ops

HAS_CUDA = torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")

DTYPES = {
    "cpu": (torch.float32, torch.float64),
    "cuda": (torch.float32, torch.float64, torch.float16, torch.bfloat16),
}

# Absolute error floor per dtype: below this, a difference from PyTorch is rounding noise.
ERROR_FLOOR = {torch.float64: 1e-12, torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def device_params():
    """pytest params for every device, the CUDA one skipped where no GPU is present."""
    return [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=gpu)]


def device_dtype_params():
    """(device, dtype) pairs each backend implements."""
    out = []
    for device, dtypes in DTYPES.items():
        marks = [gpu] if device == "cuda" else []
        for dtype in dtypes:
            out.append(pytest.param(device, dtype, id=f"{device}-{str(dtype).split('.')[-1]}", marks=marks))
    return out


LAYOUTS = ("contiguous", "transposed", "strided")
# Every layout a user can hand an op (tests/test_fake_parity.py): LAYOUTS plus channels-last (4-D tensors; 5-D for
# channels_last_3d), expanded (stride 0 in the first dimension) and offset (dense, at a storage offset). An empty
# tensor is any of these with a size-0 dimension.
ALL_LAYOUTS = (*LAYOUTS, "channels_last", "channels_last_3d", "expanded", "offset")


def make_tensor(shape, dtype, device, layout="contiguous", low=-3.0, high=3.0, requires_grad=False):
    """Fresh uniform random values (never zeros) in the given layout:
    contiguous; transposed (a transposed view of a contiguous tensor: dense, but not row-major); strided (every
    other element of the last dimension of a larger tensor: not dense); channels_last / channels_last_3d (that
    memory format); expanded (one row expanded along the first dimension: stride 0, overlapping); offset (a
    contiguous view starting 3 elements into its storage)."""
    shape = tuple(shape)
    if layout in ("channels_last", "channels_last_3d"):
        fmt = torch.channels_last if layout == "channels_last" else torch.channels_last_3d
        t = torch.empty(shape, dtype=torch.float64).uniform_(low, high).to(device, dtype)
        return t.contiguous(memory_format=fmt).requires_grad_(requires_grad)
    if layout == "expanded" and len(shape) > 0:
        row = torch.empty((1, *shape[1:]), dtype=torch.float64).uniform_(low, high).to(device, dtype)
        return row.expand(shape).requires_grad_(requires_grad)
    if layout == "offset":
        t = torch.empty(shape, dtype=torch.float64).uniform_(low, high)
        numel = t.numel()
        out = torch.empty(numel + 3, dtype=dtype, device=device)[3:].view(shape)
        out.copy_(t)
        return out.requires_grad_(requires_grad)
    if layout in ("contiguous", "expanded") or len(shape) == 0:
        t = torch.empty(shape, dtype=torch.float64).uniform_(low, high)
    elif layout == "transposed":
        if len(shape) < 2:
            t = torch.empty(shape, dtype=torch.float64).uniform_(low, high)
        else:
            t = torch.empty(shape[:-2] + (shape[-1], shape[-2]), dtype=torch.float64).uniform_(low, high)
            t = t.transpose(-1, -2)
    elif layout == "strided":
        big = torch.empty(shape[:-1] + (2 * shape[-1],), dtype=torch.float64).uniform_(low, high)
        t = big[..., ::2]
    else:
        raise ValueError(layout)
    t = _keep_layout(t, device, dtype)
    assert (layout != "strided" or t.numel() <= 1 or not t.is_contiguous()), "strided layout must not be contiguous"
    return t.requires_grad_(requires_grad)


def _keep_layout(t, device, dtype):
    # A copy into a buffer with the same strides keeps the layout (also for non-dense views).
    out = torch.empty_strided(t.size(), t.stride(), dtype=dtype, device=device)
    out.copy_(t)
    return out


def poison_allocator(device, like: torch.Tensor):
    """Leave a NaN-filled block of like's size in the allocator's cache, so that the next allocation of that size
    (the op's output) starts as NaN: an element the kernel forgets to write then fails the comparison."""
    if like.numel() == 0:
        return
    block = torch.full((like.numel(),), float("nan"), dtype=like.dtype, device=device)
    del block


def max_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    """Largest absolute difference; NaN in value where reference is not NaN counts as infinite."""
    v = value.detach().to(torch.float64).cpu()
    r = reference.detach().to(torch.float64).cpu()
    if v.shape != r.shape:
        raise AssertionError(f"shape {tuple(v.shape)} != reference shape {tuple(r.shape)}")
    if v.numel() == 0:
        return 0.0
    nan_mismatch = torch.isnan(v) != torch.isnan(r)
    if nan_mismatch.any():
        return float("inf")
    inf_mismatch = (torch.isinf(v) | torch.isinf(r)) & (v != r)
    if inf_mismatch.any():
        return float("inf")
    finite = torch.isfinite(r)
    if not finite.any():
        return 0.0
    return (v[finite] - r[finite]).abs().max().item()


def assert_accurate(ours, theirs, reference, what: str, dtype=None, factor=2.0):
    """Our error against the float64 reference is at most `factor` times PyTorch's, or under the dtype's floor."""
    dtype = dtype or ours.dtype
    scale = max(1.0, reference.detach().abs().max().item()) if reference.numel() else 1.0
    ours_err, theirs_err = max_error(ours, reference), max_error(theirs, reference)
    bound = max(factor * theirs_err, ERROR_FLOOR[dtype] * scale)
    assert ours_err <= bound, (
        f"[{what}] error vs float64 reference {ours_err:.3g} > bound {bound:.3g} (torch's error {theirs_err:.3g})"
    )


def pytest_collection_modifyitems(config, items):
    """Every test that is skipped without a GPU also gets the `gpu` marker, so `-m gpu` selects exactly the GPU
    tests (as the compute-sanitizer run does)."""
    for item in items:
        if any(m.kwargs.get("reason") == gpu.kwargs["reason"] for m in item.iter_markers("skipif")):
            item.add_marker(pytest.mark.gpu)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _no_target_check_left_pending():
    """On CUDA a loss's target check is deferred (csrc/target_checks.h): a test that leaves a bad one pending would
    make a later test's loss call raise. Waiting for them after each test pins such an error on the test that left
    it."""
    yield
    if HAS_CUDA and torch.cuda.is_initialized():
        torchext.ops.check_targets()
