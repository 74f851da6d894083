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

Importing torchext also shortens inductor's message about an op it calls as an opaque kernel, which torch writes at a
length that doubles with every residual block (docs/compile.md, "The fully swapped ResNet-18 under torch.compile").
"""

import importlib.abc
import sys

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


# Inductor's message about an op it has no lowering for ("Creating implicit fallback for:", logged when it first lowers
# each such op: every torchext op in the "kernels" mode, those without a decomposition in "decompose", other libraries'
# custom ops), and about a lowering that fails: torch._inductor.exc.OperatorIssue.operator_str writes each IR argument
# with everything it derives from, doubling at every tensor two ops read; torch 2.11 builds it even with the log off,
# and the fully swapped ResNet-18's first compiled step never ended (docs/compile.md). _bound replaces it, for every op
# in the process, with one line per argument: an IR node's type, name, dtype, size and device. Which ops fall back, and
# how, stays inductor's. A private torch API; tests/test_compile.py checks that the replacement is in place.

_MAX_ITEMS = 16  # items written per list, tuple or dict argument
_MAX_REPR = 200  # characters written of any other argument's repr


def _short_arg(arg, depth: int = 0) -> str:
    """One line for an argument of an op that inductor lowers: an IR node without its inputs, containers shortened."""
    from torch._inductor import ir

    if isinstance(arg, (list, tuple, dict)):
        if depth >= 2:
            return f"<{type(arg).__name__} of {len(arg)}>"
        if isinstance(arg, dict):
            items = [f"{k!r}: {_short_arg(v, depth + 1)}" for k, v in list(arg.items())[:_MAX_ITEMS]]
        else:
            items = [_short_arg(a, depth + 1) for a in arg[:_MAX_ITEMS]]
        text = ", ".join(items + (["..."] if len(arg) > _MAX_ITEMS else []))
        return {dict: "{%s}", list: "[%s]"}.get(type(arg), "(%s)") % text
    if isinstance(arg, ir.IRNode):
        fields = []
        getters = (("name", "get_name"), ("dtype", "get_dtype"), ("size", "get_size"), ("device", "get_device"))
        for label, getter in getters:
            try:
                fields.append(f"{label}={getattr(arg, getter)()}")
            except Exception:  # a node without a name (an unrealized pointwise) or without a layout yet
                pass
        return f"{type(arg).__name__}({', '.join(fields)})"
    try:
        text = repr(arg)
    except Exception:
        return f"<{type(arg).__name__}>"
    return text if len(text) <= _MAX_REPR else text[:_MAX_REPR] + "..."


def _operator_str(target, args, kwargs) -> str:
    """OperatorIssue.operator_str's text (the target, then one line per argument), each argument bounded."""
    lines = [f"target: {target}"] + [f"args[{i}]: {_short_arg(arg)}" for i, arg in enumerate(args)]
    if kwargs:
        lines.append(f"kwargs: {_short_arg(dict(kwargs))}")
    return "\n".join("  " + line for line in lines)


def _bound(exc_module) -> None:
    issue = getattr(exc_module, "OperatorIssue", None)
    if issue is not None and hasattr(issue, "operator_str"):
        issue.operator_str = staticmethod(_operator_str)


class _BoundAfterExec(importlib.abc.Loader):
    """The module's own loader, and _bound once it has run the module."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _bound(module)

    def __getattr__(self, name):  # get_source, get_code, ... (inspect, linecache)
        return getattr(self._loader, name)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds torch._inductor.exc through the other finders and has its loader apply _bound after running it, on
    every import (a reload, or one after a failed import, included). Importing torchext thus does not import inductor
    (about 2 s); the first ``import torch._dynamo`` (torch.compile's first call) does."""

    name = "torch._inductor.exc"

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        for finder in list(sys.meta_path):
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _BoundAfterExec(spec.loader)
                return spec
        return None


def _bound_operator_str() -> None:
    """Applies _bound now if inductor's exc module is imported, and to every later import of it."""
    if not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())
    if _PatchOnImport.name in sys.modules:
        _bound(sys.modules[_PatchOnImport.name])


_bound_operator_str()
