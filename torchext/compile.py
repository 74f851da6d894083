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

Importing torchext also bounds inductor's message about an op it has no lowering for (every torchext op in the
"kernels" mode): see ``bound_inductor_operator_str``.
"""

import importlib.abc
import importlib.machinery
import sys

import torch

__all__ = ["COMPILE_MODES", "DECOMPOSABLE", "bound_inductor_operator_str", "compile_mode", "set_compile_mode"]

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


# Inductor's message about an op it calls as an opaque kernel. When inductor first lowers an op without a lowering of
# its own (each torchext op in the "kernels" mode) it logs "Creating implicit fallback for:" with the op's arguments,
# formatted by torch._inductor.exc.OperatorIssue.operator_str; its exceptions for a lowering that fails use the same
# text. torch writes an IR argument with every IR node it derives from, in full each time it is reached, so the text
# doubles with every op whose output two later ops read (a residual block's input): torch.compile of the fully swapped
# ResNet-18 spent its time writing it and never finished its first step. torch 2.11 builds the text whether or not the
# log is on; later versions only when inductor's INFO log is on (TORCH_LOGS=inductor). bound_inductor_operator_str
# replaces the formatter with one that writes each IR argument as its type, name, dtype, size and device. Only the
# message changes: which ops fall back, and how, is inductor's as before. tests/test_compile.py checks it.

_MAX_ITEMS = 16  # list items written per argument
_MAX_REPR = 200  # characters of any other argument's repr


def _short_arg(arg, depth: int = 0) -> str:
    """One line for an argument of an op that inductor lowers: an IR node without its inputs, lists shortened."""
    from torch._inductor import ir

    if isinstance(arg, (list, tuple)):
        if depth >= 2:
            return f"<{type(arg).__name__} of {len(arg)}>"
        items = [_short_arg(a, depth + 1) for a in arg[:_MAX_ITEMS]] + (["..."] if len(arg) > _MAX_ITEMS else [])
        text = ", ".join(items)
        return f"[{text}]" if isinstance(arg, list) else f"({text})"
    if isinstance(arg, ir.IRNode):
        fields = []
        getters = (("name", "get_name"), ("dtype", "get_dtype"), ("size", "get_size"), ("device", "get_device"))
        for label, getter in getters:
            try:
                fields.append(f"{label}={getattr(arg, getter)()}")
            except Exception:  # a node without a name (an unrealized pointwise) or without a layout yet
                pass
        return f"{type(arg).__name__}({', '.join(fields)})"
    text = repr(arg)
    return text if len(text) <= _MAX_REPR else text[:_MAX_REPR] + "..."


def _operator_str(target, args, kwargs) -> str:
    """torch._inductor.exc.OperatorIssue.operator_str's text (the target, then one line per argument), each IR
    argument written without what it derives from."""
    lines = [f"target: {target}"] + [f"args[{i}]: {_short_arg(arg)}" for i, arg in enumerate(args)]
    if kwargs:
        lines.append("kwargs: {" + ", ".join(f"{k!r}: {_short_arg(v)}" for k, v in kwargs.items()) + "}")
    return "\n".join("  " + line for line in lines)


def _bound(exc_module) -> None:
    issue = getattr(exc_module, "OperatorIssue", None)
    if issue is not None and hasattr(issue, "operator_str"):
        issue.operator_str = staticmethod(_operator_str)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Applies _bound to torch._inductor.exc once it is imported (the first torch.compile imports it), so that
    importing torchext does not import inductor (about 2 s)."""

    name = "torch._inductor.exc"

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            exec_module = spec.loader.exec_module

            def exec_and_bound(module):
                exec_module(module)
                _bound(module)

            spec.loader.exec_module = exec_and_bound
        return spec


def bound_inductor_operator_str() -> None:
    """Bounds inductor's "Creating implicit fallback" / lowering-error text (above): now if inductor is imported,
    else when it is. ``import torchext`` calls it; calling it again does nothing more."""
    if _PatchOnImport.name in sys.modules:
        _bound(sys.modules[_PatchOnImport.name])
    elif not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())


bound_inductor_operator_str()
