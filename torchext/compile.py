"""How torch.compile's inductor treats torchext's ops: as opaque kernels (the default), or decomposed into ATen ops
that it can fuse with their neighbours (docs/compile.md).

Under ``set_compile_mode("decompose")``, inductor lowers the ops in ``DECOMPOSABLE`` (the elementwise activations and
softmax / log_softmax, forward and backward, and add: ops whose torchext kernel is one pass over memory, which inductor
generates as well and can fuse into the producer's or consumer's kernel) to the ATen ops with the same math. The
decompositions apply below autograd, so torchext's autograd (csrc/autograd.cpp) still decides what is saved and
which backward op runs; only the kernels change. Eager calls, and backends other than inductor, are not affected.
The losses, cross_entropy, matmul and linear always run torchext's kernels.

The mode is read when a function is compiled: set it before the first call of a torch.compile'd function, or call
``torch._dynamo.reset()`` after changing it. It goes through inductor's decomposition table
(``torch._inductor.decomposition.decompositions`` and the memoized copy inductor reads), a private torch API;
tests/test_compile.py checks it. The keys of inductor's on-disk caches (FX graph and AOTAutograd) do not cover that
table, so "decompose" turns both caches off (a graph compiled in one mode would otherwise be reused in the other)
and "kernels" turns them back to what they were.
"""

import torch

__all__ = ["COMPILE_MODES", "DECOMPOSABLE", "compile_mode", "set_compile_mode"]

COMPILE_MODES = ("kernels", "decompose")

_ops = torch.ops.torchext
_aten = torch.ops.aten


def _softmax_backward(grad_output, output):
    return _aten._softmax_backward_data.default(grad_output, output, -1, output.dtype)


def _log_softmax_backward(grad_output, output):
    return _aten._log_softmax_backward_data.default(grad_output, output, -1, output.dtype)


# torchext op -> the ATen computation of the same math (cuda_ops/activation_math.h; torchext's relu_backward, like
# ATen's threshold_backward, gives 0 where the output is <= 0).
DECOMPOSABLE = {
    _ops.relu.default: lambda self: _aten.relu.default(self),
    _ops.relu_backward.default: lambda grad_output, output: _aten.threshold_backward.default(grad_output, output, 0),
    _ops.leaky_relu.default: lambda self, negative_slope=0.01: _aten.leaky_relu.default(self, negative_slope),
    _ops.leaky_relu_backward.default: lambda grad_output, self, negative_slope: _aten.leaky_relu_backward.default(
        grad_output, self, negative_slope, False
    ),
    _ops.sigmoid.default: lambda self: _aten.sigmoid.default(self),
    _ops.sigmoid_backward.default: lambda grad_output, output: _aten.sigmoid_backward.default(grad_output, output),
    _ops.tanh.default: lambda self: _aten.tanh.default(self),
    _ops.tanh_backward.default: lambda grad_output, output: _aten.tanh_backward.default(grad_output, output),
    _ops.gelu.default: lambda self, *, approximate="none": _aten.gelu.default(self, approximate=approximate),
    _ops.gelu_backward.default: lambda grad_output, self, *, approximate="none": _aten.gelu_backward.default(
        grad_output, self, approximate=approximate
    ),
    _ops.silu.default: lambda self: _aten.silu.default(self),
    _ops.silu_backward.default: lambda grad_output, self: _aten.silu_backward.default(grad_output, self),
    _ops.softmax.default: lambda self: _aten._softmax.default(self, -1, False),
    _ops.softmax_backward.default: _softmax_backward,
    _ops.log_softmax.default: lambda self: _aten._log_softmax.default(self, -1, False),
    _ops.log_softmax_backward.default: _log_softmax_backward,
    _ops.add.default: lambda self, other: _aten.add.Tensor(self, other),
}

_mode = "kernels"
_saved_cache_settings: dict = {}


def compile_mode() -> str:
    """The current mode: 'kernels' (inductor calls torchext's kernels) or 'decompose'."""
    return _mode


def set_compile_mode(mode: str) -> None:
    """'kernels' (the default): inductor calls torchext's kernels, as opaque ops. 'decompose': inductor lowers the
    ops in DECOMPOSABLE to ATen ops it can fuse. Takes effect for functions compiled afterwards."""
    global _mode
    if mode not in COMPILE_MODES:
        raise ValueError(f"torchext.set_compile_mode: `mode` must be one of {COMPILE_MODES}, got {mode!r}")
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    from torch._inductor import decomposition

    caches = ((inductor_config, "fx_graph_cache"), (functorch_config, "enable_autograd_cache"))
    table = decomposition.decompositions
    if mode == "decompose":
        table.update(DECOMPOSABLE)
        for config, name in caches:
            _saved_cache_settings.setdefault(name, getattr(config, name))
            setattr(config, name, False)
    else:
        for op in DECOMPOSABLE:
            table.pop(op, None)
        for config, name in caches:
            if name in _saved_cache_settings:
                setattr(config, name, _saved_cache_settings.pop(name))
    # select_decomp_table() serves a memoized copy of the table.
    cached_copy = getattr(decomposition, "fast_random_decomps", None)
    if hasattr(cached_copy, "cache_clear"):
        cached_copy.cache_clear()
    _mode = mode
