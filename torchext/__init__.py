"""torchext: hand-written CUDA kernels registered as PyTorch ops.

Everything is reached through ``torch.ops.torchext.*``; the layers above it are
``torchext.ops`` (typed wrappers with autograd, fake kernels and autocast rules),
``torchext.functional`` (torch.nn.functional's signatures), ``torchext.nn`` (modules) and ``torchext.optim``
(optimizers). ``torchext.models`` and ``torchext.data`` hold the CIFAR-10 models and data pipeline of the
stock-vs-torchext training comparison;
``torchext.swap_modules`` turns a stock model into a torchext one and ``torchext.profiling`` measures the share of GPU
time spent in torchext's kernels.

The ops live in a C++ library without Python, ``torchext/lib/libtorchext.so``, which ``torchext._C`` loads; a LibTorch
program links the same library through CMake: ``find_package(torchext)`` with ``torchext.cmake_prefix_path`` on
``CMAKE_PREFIX_PATH`` (docs/cpp.md).
"""

from ._loader import CMAKE_PREFIX_PATH, load_library

_C = load_library()
# For CMake's find_package(torchext), as torch.utils.cmake_prefix_path is for find_package(Torch).
cmake_prefix_path = CMAKE_PREFIX_PATH

from . import functional, graphs, memory, models, nn, ops, optim, profiling, swap  # noqa: E402
from .nn import Linear  # noqa: E402
from .ops import matmul  # noqa: E402
from .swap import swap_modules  # noqa: E402
from .compile import compile_mode, set_compile_mode  # noqa: E402

__version__ = "0.1.0"


def __getattr__(name: str):
    """``torchext.data`` is imported on first use: ``python -m torchext.data`` then runs it once, as __main__, rather
    than a second copy beside the one the package imported."""
    if name == "data":
        import importlib

        return importlib.import_module(".data", __name__)
    raise AttributeError(f"module 'torchext' has no attribute {name!r}")


__all__ = [
    "ops",
    "functional",
    "nn",
    "optim",
    "memory",
    "models",
    "data",
    "profiling",
    "graphs",
    "swap",
    "Linear",
    "matmul",
    "swap_modules",
    "compile_mode",
    "set_compile_mode",
    "cmake_prefix_path",
    "__version__",
]
