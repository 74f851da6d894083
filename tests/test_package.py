"""The package itself: registration of every op on every backend, the version guard, imports without a GPU."""

import os
import shutil
import subprocess
import sys

import pytest
import torch

import torchext
from torchext import _loader

OPS = [
    "relu", "leaky_relu", "sigmoid", "tanh", "gelu", "silu", "softmax", "log_softmax", "cross_entropy", "mse_loss",
    "binary_cross_entropy_with_logits", "multi_margin_loss",
]  # fmt: skip


@pytest.mark.parametrize("name", OPS + [f"{op}_backward" for op in OPS])
def test_op_has_kernels(name):
    qualname = f"torchext::{name}"
    assert torch._C._dispatch_has_kernel_for_dispatch_key(qualname, "CPU"), f"{qualname} has no CPU kernel"
    if _loader.built_with_cuda():
        assert torch._C._dispatch_has_kernel_for_dispatch_key(qualname, "CUDA"), f"{qualname} has no CUDA kernel"


@pytest.mark.parametrize("name", OPS)
def test_op_has_python_layers(name):
    assert callable(getattr(torchext.ops, name))
    assert callable(getattr(torchext.functional, name))
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"torchext::{name}", "Autograd"), "no autograd formula"


def test_version_mismatch_names_both_versions(monkeypatch):
    import torchext._build_info as info

    monkeypatch.setattr(info, "TORCH_VERSION", "1.0.0+other")
    with pytest.raises(ImportError, match=r"built against torch 1\.0\.0\+other but torch .* is installed"):
        _loader.load_library()


def test_import_without_gpu():
    """A CUDA build imports and runs its CPU kernels where no GPU is visible."""
    code = "import torch, torchext; assert not torch.cuda.is_available(); print(torchext.ops.relu(-torch.ones(2)))"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "tensor([0., 0.])" in out.stdout


def test_cuda_code_is_built_where_nvcc_is_found():
    """The build compiles the CUDA kernels whenever a toolkit is present, GPU or not (CI relies on this). A CPU-only
    build asked for at build time (TORCHEXT_CUDA=0) is read from what the build recorded, not from the environment
    the tests run in."""
    if _loader.build_info().TORCHEXT_CUDA == "0":
        pytest.skip("CPU-only build requested at build time (TORCHEXT_CUDA=0 in torchext/_build_info.py)")
    if shutil.which("nvcc") is None:
        pytest.skip("no nvcc on PATH")
    assert _loader.built_with_cuda(), "nvcc is on PATH but torchext was built without its CUDA kernels"


def test_module_links_the_shared_libstdcxx():
    """A module that carries its own static libstdc++ crashes when it formats a number into an error message
    (seen with a GCC wrapper that adds -static-libstdc++). It must use the process's shared one, as torch does."""
    if not sys.platform.startswith("linux") or shutil.which("ldd") is None:
        pytest.skip("checked with ldd on Linux")
    out = subprocess.run(["ldd", torchext._C.__file__], capture_output=True, text=True, timeout=60).stdout
    assert "libstdc++.so" in out, f"{torchext._C.__file__} does not link libstdc++ dynamically:\n{out}"


def test_error_messages_with_numbers():
    """Errors whose messages hold sizes and counts come out as Python exceptions."""
    with pytest.raises(ValueError, match=r"must have the same shape as `self` \[3\], got \[4\]"):
        torch.ops.torchext.silu_backward(torch.ones(4), torch.ones(3))
