"""swap_modules: turn a stock model into a torchext one, keeping its parameters, state_dict keys and outputs.

``swap_modules(model)`` walks the module tree and gives every ``nn.Linear``, ``nn.Conv2d``, ``nn.BatchNorm1d`` and
``nn.BatchNorm2d`` and every activation module that torchext implements torchext's class instead (``torchext.nn``
subclasses the torch.nn classes and only changes ``forward``). Swapping changes a module's class in place: the module
object, its Parameters and buffers (same tensors, devices, dtypes, ``requires_grad``), its hooks and its training flag
are kept, so an optimizer built before the swap still holds the model's parameters. ``inplace=False`` swaps a deep
copy instead and leaves the argument untouched.

With ``fuse=True``, a Linear directly followed by a ReLU, GELU or SiLU inside an ``nn.Sequential`` becomes one
``torchext.nn.Linear(activation=...)`` (one kernel: matmul, bias and activation), and a Conv2d directly followed by a
ReLU one ``torchext.nn.Conv2d(activation='relu')`` (the ReLU in the convolution's epilogue); the activation's slot
becomes an ``nn.Identity``; activations hold no parameters, so the state_dict keys do not change. Fusion is skipped
where it could change what some other code sees: when either module is registered more than once in the model, carries
hooks, or the Sequential is a subclass with its own ``forward``. Code that walks a Sequential's layers itself
(``for layer in seq: ...`` keeping the intermediate outputs) would see the Linear's output already activated: use
``fuse=False`` for such models.

With ``channels_last=True`` each torchext Conv2d's weight is made channels-last (as ``module.to(memory_format=
torch.channels_last)`` does; torchext's convolutions run NHWC). Under the layout rule of torch's convolutions, which
torchext's follow, a convolution's output is channels-last when its input or its weight is, so a model that takes
NCHW input then runs channels-last from its first convolution on instead of converting every activation to NHWC and
back inside each convolution; the values are the same. Code in the model that calls ``.view`` on an activation may
need ``.reshape`` then.

Only exact classes are swapped: a user subclass of ``nn.ReLU`` (or ``nn.Linear``, ``nn.Conv2d``) may have its own
``forward``, so it is left stock and named in the report. The report (``SwapReport``) lists what was replaced, what
was fused, what was left stock and why, and what was torchext's already; swapping a swapped model is a no-op.

With ``pooling=True`` (the default) every ``nn.MaxPool2d``, ``nn.AvgPool2d`` and ``nn.AdaptiveAvgPool2d`` is
swapped too; one whose arguments torchext's kernels refuse (padding over half the kernel, a zero stride or
divisor_override: torch raises at its forward as well) is left stock, with the reason in the report.

``nn.SyncBatchNorm`` is left stock, with a line in the report: its statistics (and in the backward its gradient
sums) are reduced across ranks, which torchext's batch_norm does not do, and it is not fused with its ReLU or add. To
train with SyncBatchNorm, convert the stock model first (``nn.SyncBatchNorm.convert_sync_batchnorm(model)``), then
swap: the other layers become torchext's. Converting after the swap works on a model swapped with ``fuse=False`` (its
torchext BatchNorm1d and BatchNorm2d layers become stock SyncBatchNorms); on a fused model it raises a ``TypeError``
naming the first fused BatchNorm, since a SyncBatchNorm in its place would drop the ReLU or the residual add
(torchext/fusion.py).

Losses are not modules of a model: choose ``torchext.nn.CrossEntropyLoss`` (label smoothing supported) where the
training loop builds its loss.
"""

import copy
from collections import Counter
from typing import NamedTuple

import torch
from torch import nn
from torch.nn.utils import parametrize

from . import nn as tnn
from .ops.conv2d import _memory_format
from .ops.matmul import activation_name

__all__ = ["swap_modules", "SwapReport", "Replaced", "Fused", "NotFused", "LeftStock", "AlreadyTorchext"]

# Stock class -> torchext class, for the modules that are swapped one for one.
_ACTIVATIONS: dict[type, type] = {
    nn.ReLU: tnn.ReLU,
    nn.LeakyReLU: tnn.LeakyReLU,
    nn.Sigmoid: tnn.Sigmoid,
    nn.Tanh: tnn.Tanh,
    nn.GELU: tnn.GELU,
    nn.SiLU: tnn.SiLU,
    nn.Softmax: tnn.Softmax,
    nn.LogSoftmax: tnn.LogSoftmax,
}
_POOLS: dict[type, type] = {
    nn.MaxPool2d: tnn.MaxPool2d,
    nn.AvgPool2d: tnn.AvgPool2d,
    nn.AdaptiveAvgPool2d: tnn.AdaptiveAvgPool2d,
}
_BATCH_NORMS: dict[type, type] = {nn.BatchNorm1d: tnn.BatchNorm1d, nn.BatchNorm2d: tnn.BatchNorm2d}
_TORCHEXT_CLASSES: tuple[type, ...] = tuple(getattr(tnn, name) for name in tnn.__all__)

# Losses have torchext versions, but a model does not normally hold its loss: the training loop picks it.
_LOSSES: dict[type, type] = {
    nn.CrossEntropyLoss: tnn.CrossEntropyLoss,
    nn.MSELoss: tnn.MSELoss,
    nn.BCEWithLogitsLoss: tnn.BCEWithLogitsLoss,
    nn.MultiMarginLoss: tnn.MultiMarginLoss,
}

# Leaves that do no arithmetic: not worth a line in the report.
_TRIVIAL = (nn.Identity, nn.Flatten, nn.Unflatten)
_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict, nn.ParameterList, nn.ParameterDict)

NO_KERNEL = "no torchext kernel"
SYNC_BATCH_NORM = (
    "SyncBatchNorm: its statistics are reduced across ranks with torch.distributed, which torchext's batch_norm "
    "does not do; left to torch"
)


def _fused_activation(module: nn.Module) -> str | None:
    """The epilogue name (torchext.ops.matmul.ACTIVATIONS) a Linear can fuse for this activation module, or None
    if it cannot: only the exact stock or torchext classes of ReLU, GELU (both approximations) and SiLU."""
    cls = type(module)
    if cls in (nn.ReLU, tnn.ReLU):
        return "relu"
    if cls in (nn.SiLU, tnn.SiLU):
        return "silu"
    if cls in (nn.GELU, tnn.GELU):
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(module.approximate)
    return None


def class_name(cls: type) -> str:
    """``nn.ReLU`` for torch.nn's classes, ``torchext.nn.ReLU`` for torchext's, the full dotted path otherwise."""
    if getattr(nn, cls.__name__, None) is cls:
        return f"nn.{cls.__name__}"
    if getattr(tnn, cls.__name__, None) is cls:
        return f"torchext.nn.{cls.__name__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def _pool_not_supported(module: nn.Module) -> str | None:
    """Why torchext's pooling kernels would refuse this pooling module's arguments (csrc/pooling.h's checks), or None
    if they take them."""

    def pair(value):
        values = list(value) if isinstance(value, (tuple, list)) else [value]
        return values * (2 // len(values)) if len(values) in (1, 2) else None

    if isinstance(module, nn.AdaptiveAvgPool2d):
        sizes = pair(module.output_size)
        if sizes is None or not all(v is None or (isinstance(v, int) and v >= 0) for v in sizes):
            return f"output_size {module.output_size!r}: torchext takes ints >= 0 or None"
        return None
    kernel, padding = pair(module.kernel_size), pair(module.padding)
    stride = pair(module.stride if module.stride not in (None, (), []) else module.kernel_size)
    dilation = pair(getattr(module, "dilation", 1))
    if any(v is None or not all(isinstance(x, int) for x in v) for v in (kernel, stride, padding, dilation)):
        return "kernel_size, stride, padding and dilation must be ints or pairs of ints"
    if min(kernel) < 1 or min(stride) < 1 or min(dilation) < 1:
        return "kernel_size, stride and dilation must be at least 1"
    if any(not 0 <= p <= k // 2 for p, k in zip(padding, kernel, strict=True)):
        return f"padding {module.padding!r} is not in [0, kernel_size / 2] for kernel_size {module.kernel_size!r}"
    if getattr(module, "divisor_override", None) == 0:
        return "divisor_override 0"
    return None


class Replaced(NamedTuple):
    name: str
    old: str
    new: str


# Fused's and NotFused's `linear`: the field's name before Conv2d + ReLU pairs were fused too.
_LAYER_ALIAS = property(lambda row: row.layer, doc="The layer's name (the field's old name).")


class Fused(NamedTuple):
    layer: str  # the Linear or Conv2d
    activation: str
    epilogue: str  # the layer's activation argument: relu, gelu, gelu_tanh or silu (a Conv2d: relu)

    linear = _LAYER_ALIAS


class NotFused(NamedTuple):
    layer: str
    activation: str
    reason: str

    linear = _LAYER_ALIAS


class LeftStock(NamedTuple):
    name: str
    cls: str
    reason: str


class AlreadyTorchext(NamedTuple):
    name: str
    cls: str


class SwapReport:
    """What ``swap_modules`` did. Module names are qualified (``layer1.0.relu1``; the model itself is ``''``).

    ``replaced``: (name, old class, new class) for each module swapped (a fused activation's new class is
    ``nn.Identity``); ``fused``: (layer, activation, epilogue) pairs; ``not_fused``: (layer, activation, reason)
    for a Linear or Conv2d followed by a fusable activation in a Sequential that was not fused; ``left_stock``:
    (name, class, reason) for modules that still run stock code; ``already_torchext``: (name, class);
    ``channels_last``: the Conv2d layers whose weight ``channels_last=True`` made channels-last; ``model``: the
    swapped model (the argument itself, or its copy with ``inplace=False``).
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.replaced: list[Replaced] = []
        self.fused: list[Fused] = []
        self.not_fused: list[NotFused] = []
        self.left_stock: list[LeftStock] = []
        self.already_torchext: list[AlreadyTorchext] = []
        self.channels_last: list[str] = []
        # The torch.fx rewrites (torchext/fusion.py): what became one fused BatchNorm, the convolutions that give the
        # BatchNorm after them its statistics, the tensors forked so that
        # their gradients meet in torchext's add, what was left and why, how the model was handled (traced, or not
        # traceable), and each fused BatchNorm's (old, new) class by name.
        self.graph_fused: list = []
        self.graph_conv_stats: list = []
        self.graph_forks: list = []
        self.graph_not_fused: list = []
        self.graph_note: str | None = None
        self.fused_bn: dict = {}

    @property
    def counts(self) -> dict[str, object]:
        """Totals, and per class: {'replaced', 'fused', 'not_fused', 'left_stock', 'already_torchext',
        'channels_last', 'graph_fused' (BatchNorm fusions), 'graph_conv_stats', 'graph_forks', 'replaced_by_class'
        (old class -> n), 'left_stock_by_class' (class -> n)}."""
        return {
            "replaced": len(self.replaced),
            "fused": len(self.fused),
            "not_fused": len(self.not_fused),
            "left_stock": len(self.left_stock),
            "already_torchext": len(self.already_torchext),
            "channels_last": len(self.channels_last),
            "graph_fused": len(self.graph_fused),
            "graph_conv_stats": len(self.graph_conv_stats),
            "graph_forks": len(self.graph_forks),
            "replaced_by_class": dict(Counter(r.old for r in self.replaced)),
            "left_stock_by_class": dict(Counter(s.cls for s in self.left_stock)),
        }

    def as_dict(self) -> dict[str, object]:
        """Plain lists and dicts of strings and ints, for results.json."""
        return {
            "counts": self.counts,
            "replaced": [r._asdict() for r in self.replaced],
            "fused": [f._asdict() for f in self.fused],
            "not_fused": [n._asdict() for n in self.not_fused],
            "left_stock": [s._asdict() for s in self.left_stock],
            "already_torchext": [a._asdict() for a in self.already_torchext],
            "channels_last": list(self.channels_last),
            "graph_fused": [f._asdict() for f in self.graph_fused],
            "graph_conv_stats": [f._asdict() for f in self.graph_conv_stats],
            "graph_forks": [f._asdict() for f in self.graph_forks],
            "graph_not_fused": [n._asdict() for n in self.graph_not_fused],
            "graph_note": self.graph_note,
        }

    def __repr__(self) -> str:
        c = self.counts
        return (
            f"SwapReport(replaced={c['replaced']}, fused={c['fused']}, left_stock={c['left_stock']}, "
            f"already_torchext={c['already_torchext']})"
        )

    def __str__(self) -> str:
        c = self.counts
        lines = [
            f"swap_modules: {c['replaced']} replaced, {c['fused']} layer+activation pair(s) fused, "
            f"{c['left_stock']} left stock, {c['already_torchext']} already torchext"
            + (f", {c['graph_fused']} BatchNorm fusion(s)" if c["graph_fused"] else "")
            + (f", {c['graph_conv_stats']} conv->BatchNorm statistics" if c["graph_conv_stats"] else "")
            + (f", {c['graph_forks']} fork(s)" if c["graph_forks"] else "")
            + (f", {c['channels_last']} Conv2d weight(s) made channels-last" if c["channels_last"] else "")
        ]
        if self.graph_note:
            lines.append(f"graph fusions: {self.graph_note}")
        sections = [
            ("replaced", ("module", "old class", "new class"), self.replaced),
            ("fused", ("layer", "activation", "epilogue"), self.fused),
            ("not fused", ("layer", "activation", "reason"), self.not_fused),
            ("left stock", ("module", "class", "reason"), self.left_stock),
            ("already torchext", ("module", "class"), self.already_torchext),
            ("fused by torch.fx", ("pattern", "modules", "now"), self.graph_fused),
            ("statistics from the convolution (torch.fx)", ("pattern", "conv -> bn", "now"), self.graph_conv_stats),
            ("forked by torch.fx", ("pattern", "tensor -> users", "now"), self.graph_forks),
            ("not fused by torch.fx", ("pattern", "modules", "reason"), self.graph_not_fused),
        ]
        for title, header, rows in sections:
            if rows:
                lines += ["", f"{title}:"] + _table(header, [tuple(_display(v) for v in row) for row in rows])
        return "\n".join(lines)


def _display(name: str) -> str:
    return name if name else "(model)"


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    fmt = "  " + "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*header), fmt.format(*("-" * w for w in widths))]
    out += [fmt.format(*row) for row in rows]
    return [line.rstrip() for line in out]


def _has_hooks(module: nn.Module) -> bool:
    hook_dicts = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
    return any(len(getattr(module, d, None) or {}) for d in hook_dicts)


def _plain_sequential(module: nn.Module) -> bool:
    return isinstance(module, nn.Sequential) and type(module).forward is nn.Sequential.forward


def _is_script_module(module: nn.Module) -> bool:
    try:
        import torch.jit

        return isinstance(module, torch.jit.ScriptModule)
    except (ImportError, AttributeError):
        return False


def _make_channels_last(model: nn.Module, report: SwapReport) -> None:
    """swap_modules(channels_last=True): each torchext Conv2d's 4-D parameters (and their gradients) channels-last,
    as ``Module.to(memory_format=torch.channels_last)`` converts them."""

    def to_channels_last(t):
        # Strides as at::empty(..., channels_last) gives them, also where a size of 1 makes the tensor contiguous in
        # both formats (a 1x1 or depthwise kernel), so that it suggests channels-last, as Module.to(memory_format=...)
        # leaves it.
        if t.dim() != 4:
            return t
        return torch.empty_like(t, memory_format=torch.channels_last).copy_(t)

    cl = torch.channels_last
    for name, module in model.named_modules():
        # A parametrized weight is computed at each call: left as it is, not listed.
        if not isinstance(module, tnn.Conv2d) or parametrize.is_parametrized(module):
            continue
        # csrc/conv2d.h's rule: what the weight suggests decides, not its strides.
        weight = module.weight
        as_channels_last = torch.empty_like(weight, device="meta", memory_format=cl)  # strides only, no storage
        if _memory_format(weight) == cl or _memory_format(as_channels_last) != cl:
            continue  # channels-last already, or a shape no layout makes suggest it (K x 1 x 1 x 1)
        module._apply(to_channels_last, recurse=False)
        report.channels_last.append(name)


def swap_modules(
    model: nn.Module,
    linear: bool = True,
    activations: bool = True,
    inplace: bool = True,
    fuse: bool = True,
    conv: bool = True,
    batch_norm: bool = True,
    pooling: bool = True,
    conv_stats: bool = True,
    channels_last: bool = False,
    forks: bool = True,
) -> SwapReport:
    """Swap ``model``'s ``nn.Linear`` (``linear=True``), ``nn.Conv2d`` (``conv=True``), ``nn.BatchNorm1d`` and
    ``nn.BatchNorm2d`` (``batch_norm=True``), activation modules (``activations=True``: ReLU, LeakyReLU, Sigmoid, Tanh,
    GELU, SiLU, Softmax, LogSoftmax) and pooling modules (``pooling=True``: MaxPool2d, AvgPool2d, AdaptiveAvgPool2d) for
    torchext's, in place (``inplace=True``) or in a deep copy. With ``fuse=True``: Linear + ReLU/GELU/SiLU pairs of a
    Sequential become one Linear (which needs both ``linear`` and ``activations``), and, with ``batch_norm`` and
    ``activations``, BatchNorm + ReLU and BatchNorm + residual add + ReLU found by torch.fx become one fused BatchNorm,
    and a tensor that feeds several torchext modules (a residual block's input) is forked so that its gradients are
    summed by torchext's add (torchext/fusion.py; ``report.model`` is then a ``torch.fx.GraphModule`` holding the same
    modules and parameters). With ``conv_stats`` too, each torchext Conv2d that feeds only a torchext BatchNorm hands it
    its output's per-channel sums from the epilogue, and the BatchNorm skips its statistics pass (``conv_stats=False``:
    each BatchNorm computes its own). ``forks=False`` leaves the tensors that feed several torchext modules unforked:
    autograd then sums their gradients itself, with ATen's add. With ``channels_last``, each torchext Conv2d's weight is
    made channels-last (the module docstring). Returns a ``SwapReport``; ``report.model`` is the swapped model: use it.

    Swap before wrapping the model in ``torch.compile`` or DistributedDataParallel.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"swap_modules: model must be a torch.nn.Module, not {type(model).__name__}")
    if type(model).__name__ == "OptimizedModule" and hasattr(model, "_orig_mod"):
        raise ValueError(
            "swap_modules: this model is already compiled (torch.compile); swap the original module first, then "
            "compile the swapped one"
        )
    if not inplace:
        model = copy.deepcopy(model)
    report = SwapReport(model)
    occurrences = Counter(id(m) for _, m in model.named_modules(remove_duplicate=False))
    done = set()  # ids of the modules already handled (a shared module is handled once, under its first name)

    def handle(name: str, module: nn.Module) -> bool:
        """Swap or report one module; False when its children are not to be visited."""
        cls = type(module)
        if _is_script_module(module):
            report.left_stock.append(LeftStock(name, class_name(cls), "TorchScript module: cannot be swapped"))
            return False
        if isinstance(module, _TORCHEXT_CLASSES):
            report.already_torchext.append(AlreadyTorchext(name, class_name(cls)))
        elif cls is nn.Linear:
            if linear:
                module.__class__ = tnn.Linear
                module.activation = activation_name(None)
                report.replaced.append(Replaced(name, class_name(cls), class_name(tnn.Linear)))
            else:
                report.left_stock.append(LeftStock(name, class_name(cls), "linear=False"))
        elif cls is nn.Conv2d:
            if conv:
                module.__class__ = tnn.Conv2d
                module.activation = "none"
                report.replaced.append(Replaced(name, class_name(cls), class_name(tnn.Conv2d)))
            else:
                report.left_stock.append(LeftStock(name, class_name(cls), "conv=False"))
        elif cls in _BATCH_NORMS:
            if batch_norm:
                module.__class__ = _BATCH_NORMS[cls]
                report.replaced.append(Replaced(name, class_name(cls), class_name(_BATCH_NORMS[cls])))
            else:
                report.left_stock.append(LeftStock(name, class_name(cls), "batch_norm=False"))
        elif cls in _ACTIVATIONS:
            if activations:
                module.__class__ = _ACTIVATIONS[cls]
                report.replaced.append(Replaced(name, class_name(cls), class_name(_ACTIVATIONS[cls])))
            else:
                report.left_stock.append(LeftStock(name, class_name(cls), "activations=False"))
        elif isinstance(module, nn.SyncBatchNorm):
            report.left_stock.append(LeftStock(name, class_name(cls), SYNC_BATCH_NORM))
        elif cls in _POOLS:
            reason = _pool_not_supported(module) if pooling else "pooling=False"
            if reason is None:
                module.__class__ = _POOLS[cls]
                report.replaced.append(Replaced(name, class_name(cls), class_name(_POOLS[cls])))
            else:
                report.left_stock.append(LeftStock(name, class_name(cls), reason))
        else:
            bases = (nn.Linear, nn.Conv2d, *_BATCH_NORMS, *_ACTIVATIONS, *_POOLS, *_LOSSES)
            base = next((b for b in bases if isinstance(module, b)), None)
            if base is not None and base in _LOSSES and cls is base:
                reason = f"a loss: build {class_name(_LOSSES[base])} in the training loop instead"
                report.left_stock.append(LeftStock(name, class_name(cls), reason))
            elif base is not None:
                reason = f"subclass of {class_name(base)}, not {class_name(base)} itself: its forward may differ"
                report.left_stock.append(LeftStock(name, class_name(cls), reason))
            elif isinstance(module, _CONTAINERS) or isinstance(module, _TRIVIAL):
                pass
            elif next(module.children(), None) is None or next(module.parameters(recurse=False), None) is not None:
                report.left_stock.append(LeftStock(name, class_name(cls), NO_KERNEL))
        return True

    def fusable_layer(layer: nn.Module, epilogue: str | None) -> type | None:
        """The torchext class that fuses ``epilogue`` into ``layer`` (a Linear or Conv2d not yet fused, swapped by
        this call's flags), or None."""
        if epilogue is None or getattr(layer, "activation", "none") != "none":
            return None
        if type(layer) in (nn.Linear, tnn.Linear) and linear:
            return tnn.Linear
        if type(layer) in (nn.Conv2d, tnn.Conv2d) and conv and epilogue == "relu":
            return tnn.Conv2d
        return None

    def try_fuse(seq_name: str, seq: nn.Sequential) -> None:
        children = list(seq.named_children())
        for (lin_key, lin), (act_key, act) in zip(children, children[1:], strict=False):
            epilogue = _fused_activation(act)
            new_class = fusable_layer(lin, epilogue)
            if new_class is None:
                continue
            if id(lin) in done or id(act) in done:
                continue
            lin_name, act_name = f"{seq_name}{lin_key}", f"{seq_name}{act_key}"
            reason = None
            if occurrences[id(lin)] > 1:
                reason = f"{_display(lin_name)} is registered more than once in the model"
            elif occurrences[id(act)] > 1:
                reason = f"{_display(act_name)} is registered more than once in the model"
            elif _has_hooks(lin) or _has_hooks(act):
                reason = "a hook is registered on one of the two modules"
            if reason is not None:
                report.not_fused.append(NotFused(lin_name, act_name, reason))
                continue
            old_class = type(lin)
            lin.__class__ = new_class
            lin.activation = epilogue
            identity = nn.Identity()
            identity.train(act.training)
            setattr(seq, act_key, identity)
            done.update((id(lin), id(act), id(identity)))
            report.fused.append(Fused(lin_name, act_name, epilogue))
            layer_new = f"{class_name(new_class)}(activation={epilogue!r})"
            report.replaced.append(Replaced(lin_name, class_name(old_class), layer_new))
            report.replaced.append(Replaced(act_name, class_name(type(act)), class_name(nn.Identity)))

    def visit(prefix: str, module: nn.Module) -> None:
        if fuse and (linear or conv) and activations and _plain_sequential(module):
            try_fuse(prefix, module)
        for key, child in list(module.named_children()):
            if child is None or id(child) in done:
                continue
            done.add(id(child))
            if handle(f"{prefix}{key}", child):
                visit(f"{prefix}{key}.", child)

    done.add(id(model))
    if handle("", model):
        visit("", model)
    # Report in module order, not in the order the walk reached them.
    order = {name: i for i, (name, _) in enumerate(model.named_modules(remove_duplicate=False))}
    for rows in (report.replaced, report.left_stock, report.already_torchext):
        rows.sort(key=lambda r: order.get(r[0], len(order)))
    if channels_last:
        _make_channels_last(model, report)
    if fuse and batch_norm and activations:
        from .fusion import fuse_batch_norm

        report.model = fuse_batch_norm(model, report, conv_stats=conv_stats, forks=forks)
        for i, r in enumerate(report.replaced):
            if r.name in report.fused_bn:
                report.replaced[i] = r._replace(new=class_name(report.fused_bn[r.name][1]))
    return report
