"""Fusions that span modules, found with torch.fx: BatchNorm + ReLU and BatchNorm + residual add + ReLU; BatchNorm's
statistics from the convolution before it; and forks of the tensors used twice, whose gradients then meet in
torchext's add.

``swap_modules(model, fuse=True)`` calls ``fuse_batch_norm(model, report)`` after swapping module by module. It traces
the model with ``torch.fx`` (torch.nn and torchext.nn modules are leaves) and rewrites, in the traced graph:

- ``relu(bn(x))`` -> ``bn(x)`` with ``bn`` now a ``torchext.nn.BatchNormReLU2d`` (one kernel per direction);
- ``relu(bn(x) + shortcut)`` (either operand order, ``+``, ``+=`` or ``torch.add`` without ``alpha``) ->
  ``bn(x, shortcut)`` with ``bn`` a ``torchext.nn.BatchNormAddReLU2d``: the residual tail of torchvision's
  ``BasicBlock`` and ``Bottleneck`` and of ``torchext.models.resnet18_cifar``'s block.

``bn`` is an exact ``nn.BatchNorm2d`` (or torchext's); the ReLU is an ``nn.ReLU`` module, ``F.relu``, ``torch.relu`` or
``Tensor.relu``. In the graph, the BatchNorm becomes a module of the fused class (which subclasses ``nn.BatchNorm2d``:
``momentum`` / ``eps`` / ``track_running_stats`` semantics unchanged) holding the BatchNorm's own Parameters and
buffers, and the ReLU and the add leave the graph; the original model keeps its (unfused) modules and stays correct,
sharing those tensors. A pattern is left alone, and reported with its reason, when the BatchNorm's output is used
elsewhere too (the ReLU would change what that other user sees), when the BatchNorm module is called more than once, or
when it carries hooks.

Then the convolutions' statistics. Where a torchext ``Conv2d`` (no activation) feeds only a torchext BatchNorm (plain,
fused with the ReLU, or with the add and the ReLU), the convolution becomes a ``torchext.nn.Conv2dStats`` (the same
Parameters) that in training also returns its output's per-channel sum and sum of squares from its epilogue
(``conv2d_stats``), and the BatchNorm takes them (``bn(out, sum=..., sum_sq=...)``) in place of its statistics pass:
one read of the output less per BatchNorm in a training step, every convolution-BatchNorm pair of a ResNet. In eval the
convolution returns no sums and the BatchNorm normalizes with its running statistics, as before; a BatchNorm in
training after a convolution in eval computes its own. Each is reported in ``report.graph_conv_stats`` (pattern
'conv+bn stats'); a pair left alone (the convolution or the BatchNorm called twice or carrying hooks) in
``report.graph_not_fused`` with its reason. The sums are accumulated in float32 in a fixed order (deterministic);
E[x^2] - E[x]^2 then gives the variance, which loses precision only where a channel's mean is large against its spread
(docs/batch_norm.md).

Then the forks. Where a tensor feeds several modules (a residual block's input goes to its first convolution and to
the shortcut: the fused BatchNorm's residual argument, or the downsampling convolution), autograd sums the gradients
that come back to it with ATen's add: in a fully swapped ResNet-18, 8 kernels per step (one per block), the largest
piece of its GPU time left outside torchext (issue 19). After the fusions, each such tensor ``x`` with ``n`` users gets
``torchext.functional.fork(x, n)``: ``n`` aliases of ``x`` (views), one per user, whose backward sums the incoming
gradients with ``torchext.ops.add`` instead (the same a + b; for two users the same bits). Where ``x`` does not
require grad at run time (eval under ``torch.no_grad()``, a frozen stem) the fork hands out ``x`` itself. Each fork is
reported (``report.graph_forks``: pattern 'fork', the producer and its users). Kept conservative, a tensor is forked
only where that cannot change what any user sees:

- it is the output of a module of exactly a torchext.nn class (not the model's input, a parameter or buffer, nor the
  result of a function or method call, which may be a view of a tensor written in place later, or a module such as
  ``nn.Flatten`` that returns a view of its input: the alias of such a view would raise in backward once its base
  changed, where the stock model's autograd does not); torchext's modules always return fresh tensors;
- all its users, two or more, are modules of exactly a torchext.nn class (swapped or fused): torchext's modules
  never write into their inputs, while an alias written in place would raise (it is a view made in a custom autograd
  Function), and a function or method call, or a stock module such as ``nn.ReLU(inplace=True)``, might;
- no user module carries hooks (a forward pre-hook could write into its input): such a tensor is left alone and
  reported with the reason in ``report.graph_not_fused``.

The pass runs where the model is traced, so only for models with a BatchNorm2d, as the fusions.

The result (where something was fused or forked) is a ``torch.fx.GraphModule`` holding the model's Parameters and
buffers (so an optimizer built on the model's parameters still trains it; ``state_dict`` keys and their order are the
model's); ``model.eval()``, ``train()``, DataParallel / DDP wrapping, ``torch.compile`` and ``state_dict`` round trips
work on it as on the model. A model that fx cannot trace (data-dependent control flow, hooks on the model itself) is
returned unchanged, with the reason in the report: its modules are still swapped one by one.

A fused BatchNorm module computes more than its class's name says (the ReLU, and the add, left the graph), and a
Conv2dStats and the BatchNorm taking its sums depend on each other, so the GraphModule refuses to have one replaced by a
module of another kind: ``nn.SyncBatchNorm.convert_sync_batchnorm``,
which swaps every BatchNorm for a plain SyncBatchNorm, raises a ``TypeError`` naming the fused layer instead of
silently dropping its ReLU (convert the stock model before ``swap_modules``, or swap with ``fuse=False``). The guard is
on the GraphModule and on the containers fx made for it; it survives ``copy.deepcopy``, not pickling."""

from __future__ import annotations

import copy
import operator
from typing import NamedTuple

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from . import functional as tf
from . import nn as tnn

__all__ = ["GraphFused", "GraphNotFused", "fuse_batch_norm"]


class GraphFused(NamedTuple):
    pattern: str  # 'bn+relu', 'bn+add+relu', 'conv+bn stats' or 'fork'
    # the modules (and the add) that became one, e.g. 'layer1.0.bn2 + add + layer1.0.relu'; for a fork, the tensor's
    # producer and the modules that share it, e.g. 'layer1.0.bn2 -> layer1.1.conv1 + layer1.1.bn2'; for the
    # statistics, the convolution and the BatchNorm, e.g. 'layer1.0.conv1 -> layer1.0.bn1'
    modules: str
    new: str  # the BatchNorm module's new class; a fork's 'torchext.functional.fork'; 'torchext.nn.Conv2dStats'


class GraphNotFused(NamedTuple):
    pattern: str
    modules: str
    reason: str


_RELU_FUNCTIONS = (F.relu, torch.relu, torch.relu_)
_RELU_METHODS = ("relu", "relu_")
_ADD_FUNCTIONS = (operator.add, operator.iadd, torch.add)


class _Tracer(fx.Tracer):
    """torch.fx's default tracer, with torchext.nn's modules as leaves too (they subclass torch.nn's; the fused
    Conv2dBatchNormReLU, a Sequential with its own forward, included: tracing into it would run its BatchNorm's
    bookkeeping, num_batches_tracked, on the real module)."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if type(m).__module__ == tnn.__name__:
            return True
        return super().is_leaf_module(m, module_qualified_name)


def _module(gm: fx.GraphModule, node: fx.Node) -> nn.Module | None:
    return gm.get_submodule(node.target) if node.op == "call_module" else None


def _is_relu(gm: fx.GraphModule, node: fx.Node) -> bool:
    if node.op == "call_module":
        return type(_module(gm, node)) in (nn.ReLU, tnn.ReLU)
    if node.op == "call_function":
        return node.target in _RELU_FUNCTIONS and len(node.args) == 1
    return node.op == "call_method" and node.target in _RELU_METHODS and len(node.args) == 1


def _is_add(node: fx.Node) -> bool:
    return (
        node.op == "call_function"
        and node.target in _ADD_FUNCTIONS
        and len(node.args) == 2
        and not node.kwargs
        and all(isinstance(a, fx.Node) for a in node.args)
    )


def _only_user(node: fx.Node) -> fx.Node | None:
    return next(iter(node.users)) if len(node.users) == 1 else None


def _name(gm: fx.GraphModule, node: fx.Node) -> str:
    if node.op == "call_module":
        return str(node.target)
    if node.op == "call_function":
        return getattr(node.target, "__name__", str(node.target))
    return f".{node.target}()"


def _has_hooks(module: nn.Module) -> bool:
    hook_dicts = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
    return any(len(getattr(module, d, None) or {}) for d in hook_dicts)


def _fused_copy(bn: nn.Module, cls: type) -> nn.Module:
    """A new module of class ``cls`` holding ``bn``'s very Parameters and buffers (running statistics and
    num_batches_tracked are updated in place, so both see every update) and its attributes. ``bn`` itself keeps its
    class, so the original model, whose forward still applies the ReLU and the add, stays correct."""
    new = copy.copy(bn)
    for key, value in list(new.__dict__.items()):
        if isinstance(value, dict):  # _parameters, _buffers, _modules, the hook dicts: the copy's own
            new.__dict__[key] = value.copy()
    new.__class__ = cls
    return new


_FUSED_CLASSES = (tnn.BatchNormReLU2d, tnn.BatchNormAddReLU2d, tnn.Conv2dStats)
_BN_CLASSES = (nn.BatchNorm2d, tnn.BatchNorm2d)
# The BatchNorms that can take a convolution's sums (their forward has sum / sum_sq).
_STATS_BN_CLASSES = (tnn.BatchNorm2d, tnn.BatchNormReLU2d, tnn.BatchNormAddReLU2d)
# Set on a BatchNorm module of the GraphModule that takes a Conv2dStats' sums (the guard keeps its class).
_TAKES_STATS = "_torchext_takes_conv_stats"


def _guarded(module: object) -> bool:
    return isinstance(module, _FUSED_CLASSES) or bool(getattr(module, _TAKES_STATS, False))


# The modules a forked tensor may come from and feed: torchext.nn's own classes, none of which writes into its input
# or returns a view of it.
_FORKABLE_USERS = frozenset(getattr(tnn, name) for name in tnn.__all__)


def _check_replacement(parent: nn.Module, name: str, module: object) -> None:
    """Raises TypeError when ``parent``'s child ``name`` is a fused BatchNorm and ``module`` is not of its class."""
    old = parent.__dict__.get("_modules", {}).get(name)
    if _guarded(old) and not isinstance(module, type(old)):
        if isinstance(old, tnn.Conv2dStats):
            folded = "a convolution that also returns its output's per-channel sums for the BatchNorm after it"
            what = "those sums (the BatchNorm would get a tuple)"
        elif isinstance(old, tnn.BatchNormReLU2d):
            folded, what = "BatchNorm with the ReLU folded in", "the ReLU"
        elif isinstance(old, tnn.BatchNormAddReLU2d):
            folded, what = "BatchNorm with the residual add and the ReLU folded in", "the residual add and the ReLU"
        else:
            folded = "BatchNorm that takes the per-channel sums of the convolution before it"
            what = "those sums (its forward would not take them)"
        name = parent.__dict__.get("_fused_prefix", "") + name
        raise TypeError(
            f"torchext: {name!r} is a fused {type(old).__name__} ({folded} by swap_modules' torch.fx fusion); "
            f"replacing it with a {type(module).__name__} would drop {what}. To use "
            "nn.SyncBatchNorm, convert the stock model before swap_modules (SyncBatchNorm layers are left stock), or "
            "swap with fuse=False. A conversion interrupted by this error has left the model partly converted."
        )


class _GuardsFusedChildren:
    """Mixin of the fused GraphModule and its fx-made containers: add_module / setattr of a child that is a fused
    BatchNorm must keep a module of its class (``_check_replacement``)."""

    def add_module(self, name: str, module: nn.Module | None) -> None:
        _check_replacement(self, name, module)
        super().add_module(name, module)

    def __setattr__(self, name: str, value) -> None:
        if isinstance(value, nn.Module) or value is None:
            _check_replacement(self, name, value)
        super().__setattr__(name, value)


class _FusedContainer(_GuardsFusedChildren, nn.Module):
    """The plain nn.Module fx makes for a path (``layer1``, ``layer1.0``) of a fused GraphModule, guarded."""


class _FusedGraphModule(_GuardsFusedChildren, fx.GraphModule):
    """The GraphModule fuse_batch_norm returns: guarded, and its deep copies guarded again (fx rebuilds the
    containers of a copy as plain modules)."""

    def __deepcopy__(self, memo):
        res = super().__deepcopy__(memo)
        _guard_fused_parents(res)
        return res


def _guard_fused_parents(gm: fx.GraphModule) -> None:
    """Makes the fx-made parent of every fused BatchNorm a _FusedContainer that knows its path (for the message)."""
    for name, module in gm.named_modules():
        if _guarded(module) and "." in name:
            parent_name = name.rpartition(".")[0]
            parent = gm.get_submodule(parent_name)
            if type(parent) is nn.Module:
                parent.__class__ = _FusedContainer
            if isinstance(parent, _FusedContainer):
                parent.__dict__["_fused_prefix"] = parent_name + "."


def _set_submodule(gm: fx.GraphModule, target: str, module: nn.Module) -> None:
    parent_name, _, name = target.rpartition(".")
    parent = gm.get_submodule(parent_name) if parent_name else gm
    setattr(parent, name, module)


def _restore_module_tree(gm: fx.GraphModule, model: nn.Module) -> None:
    """fx.GraphModule keeps only the modules its graph calls, in the order it calls them. Put back every module of
    the model that holds state but is not called (its parameters and buffers stay in the state_dict), and the
    model's order of children at every level, so that state_dict keys and their order are the model's."""
    for name, module in model.named_modules():
        if not name:
            continue
        try:
            gm.get_submodule(name)
        except AttributeError:
            if (
                next(module.parameters(recurse=False), None) is not None
                or next(module.buffers(recurse=False), None) is not None
            ):
                gm.add_submodule(name, module)
    for name, module in model.named_modules():
        try:
            target = gm.get_submodule(name) if name else gm
        except AttributeError:
            continue
        order = [k for k in module._modules if k in target._modules]
        rest = [k for k in target._modules if k not in module._modules]
        target._modules = type(target._modules)((k, target._modules[k]) for k in order + rest)


def _use_conv_stats(gm: fx.GraphModule, report, calls: dict) -> int:
    """Makes each torchext Conv2d that feeds only a torchext BatchNorm a Conv2dStats whose sums the BatchNorm takes
    (the module docstring), reporting each pair in ``report.graph_conv_stats`` and each pair left alone in
    ``report.graph_not_fused``. Returns the number of pairs."""
    pairs = 0
    for bn_node in list(gm.graph.nodes):
        bn = _module(gm, bn_node)
        if type(bn) not in _STATS_BN_CLASSES or not bn_node.args or bn_node.kwargs:
            continue
        conv_node = bn_node.args[0]
        if not isinstance(conv_node, fx.Node) or conv_node.op != "call_module":
            continue
        conv = _module(gm, conv_node)
        if type(conv) is not tnn.Conv2d or conv.activation != "none" or len(conv_node.users) != 1:
            continue
        if conv_node in bn_node.args[1:]:  # bn(c, c): the residual is the convolution's output too
            continue
        names = f"{conv_node.target} -> {bn_node.target}"
        reason = None
        if calls[conv_node.target] > 1 or calls[bn_node.target] > 1:
            reason = "the convolution or the BatchNorm is called more than once in the model"
        elif _has_hooks(conv) or _has_hooks(bn):
            reason = "a hook is registered on the convolution or the BatchNorm"
        elif bn.num_features != conv.out_channels:
            reason = f"the BatchNorm has {bn.num_features} features, the convolution {conv.out_channels} channels"
        if reason is not None:
            report.graph_not_fused.append(GraphNotFused("conv+bn stats", names, reason))
            continue
        _set_submodule(gm, conv_node.target, _fused_copy(conv, tnn.Conv2dStats))
        if bn_node.target not in report.fused_bn:  # a plain BatchNorm, still the model's own module: a copy
            bn = _fused_copy(bn, type(bn))
            _set_submodule(gm, bn_node.target, bn)
        bn.__dict__[_TAKES_STATS] = True
        parts, last = [], conv_node
        for i in range(3):  # out, sum, sum_sq, in this order after the convolution
            with gm.graph.inserting_after(last):
                last = gm.graph.call_function(operator.getitem, (conv_node, i))
            parts.append(last)
        bn_node.args = (parts[0],) + tuple(bn_node.args[1:])
        bn_node.kwargs = {"sum": parts[1], "sum_sq": parts[2]}
        pairs += 1
        report.graph_conv_stats.append(GraphFused("conv+bn stats", names, "torchext.nn.Conv2dStats"))
        report.fused_bn[str(conv_node.target)] = (type(conv), tnn.Conv2dStats)
    return pairs


def _insert_forks(gm: fx.GraphModule, report) -> int:
    """Gives every tensor of ``gm``'s graph that feeds several torchext modules a ``torchext.functional.fork`` (the
    rules are the module docstring's), reporting each fork in ``report.graph_forks`` and each tensor left alone for a
    hook in ``report.graph_not_fused``. Returns the number of forks."""
    forks = 0
    for node in list(gm.graph.nodes):
        users = list(node.users)
        if node.op != "call_module" or type(_module(gm, node)) not in _FORKABLE_USERS or len(users) < 2:
            continue
        if not all(u.op == "call_module" and type(_module(gm, u)) in _FORKABLE_USERS for u in users):
            continue
        names = f"{_name(gm, node)} -> " + " + ".join(str(u.target) for u in users)
        if any(_has_hooks(_module(gm, u)) for u in users):
            report.graph_not_fused.append(
                GraphNotFused("fork", names, "a hook is registered on a module that shares the tensor")
            )
            continue
        with gm.graph.inserting_after(node):
            fork = gm.graph.call_function(tf.fork, (node, len(users)))
        for i, user in enumerate(users):
            with gm.graph.inserting_before(user):
                alias = gm.graph.call_function(operator.getitem, (fork, i))
            user.replace_input_with(node, alias)
        forks += 1
        report.graph_forks.append(GraphFused("fork", names, "torchext.functional.fork"))
    return forks


def fuse_batch_norm(model: nn.Module, report, conv_stats: bool = True, forks: bool = True) -> nn.Module:
    """Rewrites ``model``'s BatchNorm + ReLU and BatchNorm + add + ReLU patterns, gives each BatchNorm after a
    convolution the convolution's sums (``conv_stats``), then forks the tensors that feed several torchext modules
    (``forks``; see the module docstring), and records each fusion (``report.graph_fused``; ``report.fused_bn`` maps
    each fused BatchNorm's and Conv2dStats' name to its (old, new) class), each convolution giving its BatchNorm's
    statistics (``report.graph_conv_stats``), each fork (``report.graph_forks``), each pattern left alone
    (``report.graph_not_fused``) and how the model was handled (``report.graph_note``) in ``report`` (a
    ``SwapReport``). Returns the model to use: a GraphModule when something was fused or forked, else ``model``
    itself."""
    if not any(type(m) in _BN_CLASSES for m in model.modules()):
        return model
    if _has_hooks(model):
        report.graph_note = "the model carries hooks of its own, which torch.fx would drop: BatchNorm fusions skipped"
        return model
    try:
        graph = _Tracer().trace(model)
    except Exception as e:  # fx raises many types: TraceError, TypeError, NotImplementedError, ...
        message = str(e).splitlines()[0] if str(e) else ""
        report.graph_note = (
            f"torch.fx could not trace the model ({type(e).__name__}: {message[:200]}): BatchNorm fusions skipped, "
            "modules swapped one by one"
        )
        return model
    gm = _FusedGraphModule(model, graph, class_name=type(model).__name__)
    # The nn.Identity swap_modules leaves where it fused an activation into the layer before it passes its input on:
    # dropped from the graph, so that the layer's output is seen as what its users read (a fork needs that).
    fused_away = {row.activation for row in report.fused}
    for node in list(gm.graph.nodes):
        if node.op == "call_module" and node.target in fused_away and type(_module(gm, node)) is nn.Identity:
            if len(node.args) == 1 and not node.kwargs and not _has_hooks(_module(gm, node)):
                node.replace_all_uses_with(node.args[0])
                gm.graph.erase_node(node)
    calls: dict[str, int] = {}
    for node in gm.graph.nodes:
        if node.op == "call_module":
            calls[node.target] = calls.get(node.target, 0) + 1

    fused_any = False
    for bn_node in list(gm.graph.nodes):
        bn = _module(gm, bn_node)
        if type(bn) not in _BN_CLASSES or getattr(bn_node, "_erased", False):
            continue
        user = _only_user(bn_node)
        if user is None:
            # Used by more than one node: fusing a ReLU into it would change what the others see.
            relu_users = [u for u in bn_node.users if _is_relu(gm, u)]
            if relu_users:
                report.graph_not_fused.append(
                    GraphNotFused(
                        "bn+relu",
                        f"{bn_node.target} + {_name(gm, relu_users[0])}",
                        "the BatchNorm's output has other users besides the ReLU",
                    )
                )
            continue
        if _is_relu(gm, user):
            pattern, add, relu, shortcut = "bn+relu", None, user, None
        elif _is_add(user) and _only_user(user) is not None and _is_relu(gm, _only_user(user)):
            pattern, add, relu = "bn+add+relu", user, _only_user(user)
            shortcut = user.args[1] if user.args[0] is bn_node else user.args[0]
            if shortcut is bn_node:
                continue  # bn(x) + bn(x)
        else:
            continue
        names = " + ".join([str(bn_node.target)] + (["add"] if add is not None else []) + [_name(gm, relu)])
        reason = None
        if calls[bn_node.target] > 1:
            reason = f"{bn_node.target} is called more than once in the model"
        elif _has_hooks(bn) or (relu.op == "call_module" and _has_hooks(_module(gm, relu))):
            reason = "a hook is registered on the BatchNorm or the ReLU module"
        if reason is not None:
            report.graph_not_fused.append(GraphNotFused(pattern, names, reason))
            continue
        new_cls = tnn.BatchNormReLU2d if add is None else tnn.BatchNormAddReLU2d
        old_cls = type(bn)
        _set_submodule(gm, bn_node.target, _fused_copy(bn, new_cls))
        args = (bn_node.args[0],) if add is None else (bn_node.args[0], shortcut)
        with gm.graph.inserting_before(relu):  # every input (the shortcut included) is defined by now
            fused = gm.graph.call_module(bn_node.target, args)
        relu.replace_all_uses_with(fused)
        for node in (relu, add, bn_node):
            if node is not None:
                gm.graph.erase_node(node)
        fused_any = True
        report.graph_fused.append(GraphFused(pattern, names, f"torchext.nn.{new_cls.__name__}"))
        report.fused_bn[str(bn_node.target)] = (old_cls, new_cls)
    stats = _use_conv_stats(gm, report, calls) if conv_stats else 0
    forks = _insert_forks(gm, report) if forks else 0
    if not fused_any and not stats and not forks:
        report.graph_note = "traced with torch.fx: no BatchNorm pattern to fuse and no tensor to fork"
        return model
    _restore_module_tree(gm, model)
    _guard_fused_parents(gm)
    gm.graph.lint()
    gm.recompile()
    gm.train(model.training)
    report.graph_note = (
        f"traced with torch.fx: {len(report.graph_fused)} BatchNorm fusion(s), {stats} convolution(s) giving their "
        f"BatchNorm's statistics, {forks} fork(s)"
    )
    return gm
