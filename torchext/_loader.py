"""Loads the compiled module torchext._C, which links the op library torchext/lib/libtorchext.so: loading it
registers every op with the dispatcher.

The extension is compiled against one torch release; loaded under another it would fail with an unreadable
"undefined symbol" error (or worse, load and misbehave). We compare versions first and say what to do.
"""

import importlib
import os

import torch

# The op library (csrc/, cuda_ops/; no Python in it) and the C++ package beside it (setup.py writes them).
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
LIBRARY_PATH = os.path.join(PACKAGE_DIR, "lib", "libtorchext.so")
CMAKE_PREFIX_PATH = os.path.join(PACKAGE_DIR, "share", "cmake")


def _rebuild_hint() -> str:
    return "Rebuild torchext against the installed torch: pip install --no-build-isolation --force-reinstall ."


def load_library():
    try:
        build_info = importlib.import_module("torchext._build_info")
    except ImportError as e:
        raise ImportError(
            "torchext is not built: torchext/_build_info.py is missing. Install it with "
            "`pip install --no-build-isolation .` (or `-e .`) from the repository root."
        ) from e
    built, running = build_info.TORCH_VERSION, torch.__version__
    if built != running:
        raise ImportError(
            f"torchext was built against torch {built} but torch {running} is installed; the compiled ops are not "
            f"binary-compatible across torch releases. {_rebuild_hint()}"
        )
    try:
        return importlib.import_module("torchext._C")
    except ImportError as e:
        raise ImportError(
            f"torchext's compiled module failed to load under torch {running} (built against {built}): {e}. "
            f"{_rebuild_hint()}"
        ) from e


def build_info():
    """torchext/_build_info.py, written by setup.py: the torch release built against, TORCHEXT_CUDA as set at build
    time (None when unset), WITH_CUDA, CUDA_VERSION and CUDA_ARCH_LIST."""
    return importlib.import_module("torchext._build_info")


def built_with_cuda() -> bool:
    """Whether the compiled module contains the CUDA kernels."""
    return build_info().WITH_CUDA
