"""torchext: hand-written CUDA kernels registered as PyTorch ops.

Everything is reached through ``torch.ops.torchext.*``; the layers above it are
``torchext.ops`` (typed wrappers with autograd, fake kernels and autocast rules),
``torchext.functional`` (torch.nn.functional's signatures) and ``torchext.nn`` (modules). ``torchext.models`` and
``torchext.data`` hold the CIFAR-10 models and data pipeline of the stock-vs-torchext training comparison;
``torchext.swap_modules`` turns a stock model into a torchext one and ``torchext.profiling`` measures the share of GPU
time spent in torchext's kernels.
"""

from ._loader import load_library

_C = load_library()

from . import data, functional, graphs, memory, models, nn, ops, profiling, swap  # noqa: E402
from .nn import Linear  # noqa: E402
from .ops import matmul  # noqa: E402
from .swap import swap_modules  # noqa: E402
from .compile import compile_mode, set_compile_mode  # noqa: E402

__version__ = "0.1.0"
__all__ = [
    "ops",
    "functional",
    "nn",
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
    "__version__",
]
