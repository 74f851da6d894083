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
# Ops without a *_backward op (the gradient is grad_output itself).
FORWARD_ONLY = ["add"]


@pytest.mark.parametrize("name", OPS + [f"{op}_backward" for op in OPS] + FORWARD_ONLY)
def test_op_has_kernels(name):
    qualname = f"torchext::{name}"
    assert torch._C._dispatch_has_kernel_for_dispatch_key(qualname, "CPU"), f"{qualname} has no CPU kernel"
    if _loader.built_with_cuda():
        assert torch._C._dispatch_has_kernel_for_dispatch_key(qualname, "CUDA"), f"{qualname} has no CUDA kernel"


@pytest.mark.parametrize("name", OPS + FORWARD_ONLY)
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


def _ldd(path: str) -> str:
    if not sys.platform.startswith("linux") or shutil.which("ldd") is None:
        pytest.skip("checked with ldd on Linux")
    return subprocess.run(["ldd", path], capture_output=True, text=True, timeout=60).stdout


@pytest.mark.parametrize("which", ["module", "library"])
def test_links_the_shared_libstdcxx(which):
    """A module that carries its own static libstdc++ crashes when it formats a number into an error message
    (seen with a GCC wrapper that adds -static-libstdc++). It must use the process's shared one, as torch does."""
    path = torchext._C.__file__ if which == "module" else _loader.LIBRARY_PATH
    out = _ldd(path)
    assert "libstdc++.so" in out, f"{path} does not link libstdc++ dynamically:\n{out}"


def test_op_library_has_no_python():
    """The op library is what a LibTorch program links: it must not need libpython or libtorch_python (only the
    thin module torchext._C, which needs neither but Python's own symbols, is Python's). The module links it, so
    importing the module loads it."""
    library = _ldd(_loader.LIBRARY_PATH)
    for name in ("libpython", "libtorch_python"):
        assert name not in library, f"{_loader.LIBRARY_PATH} links {name}:\n{library}"
    module = _ldd(torchext._C.__file__)
    assert "libtorchext.so => " + os.path.realpath(_loader.LIBRARY_PATH) in module, (
        f"[torchext._C] does not load the library beside it ({_loader.LIBRARY_PATH}):\n{module}"
    )
    assert "libtorch_python" not in module, f"[torchext._C] links libtorch_python:\n{module}"
    symbols = subprocess.run(["nm", "-D", "--defined-only", _loader.LIBRARY_PATH], capture_output=True, text=True)
    if symbols.returncode == 0:
        assert "PyInit__C" not in symbols.stdout, "[libtorchext.so] defines the Python module's PyInit__C"


def test_cmake_package_is_installed():
    """torchext.cmake_prefix_path holds torchextConfig.cmake and its version file, the public headers sit in
    include/torchext/ with the umbrella header, as find_package(torchext) expects (tests/test_cpp.py builds a
    project against them)."""
    config = os.path.join(torchext.cmake_prefix_path, "torchext", "torchextConfig.cmake")
    version = os.path.join(torchext.cmake_prefix_path, "torchext", "torchextConfigVersion.cmake")
    assert os.path.isfile(config) and os.path.isfile(version), f"missing {config} or {version}"
    with open(version) as f:
        assert f'set(PACKAGE_VERSION "{torchext.__version__}")' in f.read(), "[torchextConfigVersion.cmake] version"
    include = os.path.join(_loader.PACKAGE_DIR, "include", "torchext")
    assert os.path.isfile(os.path.join(include, "torchext.h")), f"no umbrella header in {include}"
    sources = os.path.join(os.path.dirname(_loader.PACKAGE_DIR), "csrc", "include", "torchext")
    if os.path.isdir(sources):  # a build from this checkout: every public header is installed
        assert sorted(os.listdir(sources)) == sorted(os.listdir(include)), f"[{include}] differs from {sources}"


def test_error_messages_with_numbers():
    """Errors whose messages hold sizes and counts come out as Python exceptions."""
    with pytest.raises(ValueError, match=r"must have the same shape as `self` \[3\], got \[4\]"):
        torch.ops.torchext.silu_backward(torch.ones(4), torch.ones(3))


def test_cpp_version_matches_the_package():
    """The C++ headers' TORCHEXT_VERSION (csrc/include/torchext/library.h) is pyproject.toml's version."""
    header = os.path.join(_loader.PACKAGE_DIR, "include", "torchext", "library.h")
    with open(header) as f:
        assert f'#define TORCHEXT_VERSION "{torchext.__version__}"' in f.read(), f"[{header}] TORCHEXT_VERSION"
    pyproject = os.path.join(os.path.dirname(_loader.PACKAGE_DIR), "pyproject.toml")
    if os.path.isfile(pyproject):  # imported from a checkout
        with open(pyproject) as f:
            assert f'version = "{torchext.__version__}"' in f.read(), "[pyproject.toml] version != torchext.__version__"
