"""What share of GPU time runs in torchext's kernels, measured with torch.profiler.

``gpu_time_share(fn, *args, steps=5, warmup=2)`` calls ``fn(*args)`` ``warmup`` times, then ``steps`` times under
torch.profiler, and returns::

    {"device": "cuda:0", "total_us": ..., "torchext_us": ..., "share": torchext_us / total_us,
     "by_kind": {"kernel": us, "memcpy": us, "memset": us}, "events": n, "reason": None, "steps": 5,
     "by_family": {family: {"us", "torchext_us"}}, "family_rule": "launching_op",
     "by_kernel": [{"name", "full_name", "kind", "family", "torchext", "calls", "us", "share"}, ...]}   # top ``top``

(a generic kernel launched by ops of two families is two rows of ``by_kernel``).

``GpuTimeProfiler`` is the same as a context manager around any code (a few steps of a real training loop):
``with GpuTimeProfiler() as p: ...`` then ``p.result``.

What counts: every GPU activity the profiler records (kernels, memcpy, memset; not the user-annotation ranges
drawn over them), by duration on the device, summed (kernels of concurrent streams are not de-overlapped). A kernel
is torchext's when its demangled name contains the namespace ``torchext::``: every ``__global__`` function in
cuda_ops/ lives in ``torchext::cuda_ops``, and Kineto reports demangled names, e.g.
``void torchext::cuda_ops::(anonymous namespace)::unary_kernel<float, 4, ...>(float const*, ...)``; a mangled
name (``_ZN8torchext...``) is demangled first. Work that torchext's ops hand to ATen (a ``.contiguous()`` copy of
an input) and memsets count as stock.

The result also splits the GPU time by op family (``by_family``: {family: {"us", "torchext_us"}} over every
activity, not only the top ones): ``kernel_family(name)`` sorts a kernel into one of ``KERNEL_FAMILIES`` by its name,
for torch's ATen kernels, cuDNN's and cuBLAS's, inductor's fused Triton kernels and torchext's own (whose kernels are
named after their op: ``conv2d_*``, ``batch_norm_*``, ``max_pool2d_*``, ...). ATen's generic kernels (a sum, a
mean, an elementwise functor) say nothing of the layer they serve: one that would sort into 'other' or 'elementwise'
goes to the family of the op that launched it instead, where the profiler links the kernel to its CPU op and that op
or one of its callers is named after a family (``op_family``): the reduction that sums stock's convolution bias
gradient (under ``aten::convolution_backward``) is convolution, the mean of a global average pool (under
``aten::adaptive_avg_pool2d``) is pooling, the loss's sums (under ``aten::cross_entropy_loss``) are the loss. What the
autograd engine runs between nodes (the sum of a tensor's incoming gradients, the sum that reduces a broadcast
bias's gradient to its shape) keeps its name's family.

Where there is nothing to measure (a CPU device, no CUDA, a torch without CUPTI support, no GPU activity
recorded) the result has ``share`` None and ``reason`` saying why; nothing raises.
"""

import functools
import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import torch

__all__ = [
    "DeviceEvent",
    "GpuTimeProfiler",
    "gpu_time_share",
    "is_torchext_kernel",
    "short_kernel_name",
    "device_events",
    "summarize",
    "describe",
    "KERNEL_FAMILIES",
    "FAMILY_LABELS",
    "kernel_family",
    "op_family",
    "event_family",
]

_ACTIVITY_KINDS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
_TORCHEXT_NAMESPACE = re.compile(r"(?<![\w])torchext::")
_ANONYMOUS = "(anonymous namespace)::"


class DeviceEvent(NamedTuple):
    """One activity on the GPU: its (demangled) name, kind ('kernel', 'memcpy' or 'memset') and duration, and the
    family its launching CPU op names (``op_family``; None where there is no link or no op of a family)."""

    name: str
    kind: str
    us: float
    op_family: str | None = None


def _demangle(name: str) -> str:
    if name.startswith("_Z"):
        try:
            return torch._C._demangle(name)
        except Exception:
            return name
    return name


@functools.lru_cache(maxsize=4096)
def is_torchext_kernel(name: str) -> bool:
    """Whether a kernel name (demangled, or Itanium-mangled) names code in torchext's C++ namespace."""
    name = _demangle(name)
    if name.startswith("_Z"):  # could not be demangled: the namespace is spelled 8torchext
        return "8torchext" in name
    return _TORCHEXT_NAMESPACE.search(name) is not None


def _matching_open(s: str, close: int) -> int:
    """Index of the '(' matching the ')' at ``close``, or -1."""
    depth = 0
    for i in range(close, -1, -1):
        if s[i] == ")":
            depth += 1
        elif s[i] == "(":
            depth -= 1
            if depth == 0:
                return i
    return -1


def short_kernel_name(name: str) -> str:
    """A kernel's name for a table: demangled, without the return type, the parameter list and the
    ``(anonymous namespace)::`` qualifiers (template arguments kept, they tell instantiations apart)."""
    s = _demangle(name).strip()
    if s.endswith(")"):
        start = _matching_open(s, len(s) - 1)
        if start > 0:
            s = s[:start]
    s = s.replace(_ANONYMOUS, "")
    depth = 0
    cut = 0
    for i, ch in enumerate(s):  # the return type ends at the last space outside template brackets
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == " " and depth == 0:
            cut = i + 1
    return s[cut:].strip() or name


KERNEL_FAMILIES = (
    "conv",
    "batch_norm",
    "pool",
    "elementwise",
    "gemm",
    "loss",
    "optimizer",
    "copy",
    "other",
)
FAMILY_LABELS = {
    "conv": "convolution",
    "batch_norm": "batch norm",
    "pool": "pooling",
    "elementwise": "elementwise and activations",
    "gemm": "GEMM and Linear",
    "loss": "loss and softmax",
    "optimizer": "optimizer",
    "copy": "copies, casts and fills",
    "other": "other (reductions, indexing, ...)",
}

# (family, pattern) tried in order on the lowercased short name (template arguments kept: they name the functor of
# ATen's generic kernels, e.g. multi_tensor_apply_kernel<..., FusedSgdMathFunctor> or
# unrolled_elementwise_kernel<direct_copy_kernel_cuda...>). The order settles names that match several families:
# a batch-norm statistics update run by an elementwise kernel is batch norm; cuDNN's kernels are convolutions unless
# they are its batch-norm kernels (bn_fw_*, bn_bw_*); an inductor kernel fusing several ops (triton_poi_fused_
# native_batch_norm_..._relu_3) goes to the first family its name mentions in this order.
_FAMILY_RULES = [
    (
        "optimizer",
        r"multi_tensor_apply|fused_?(?:sgd|adam)|_foreach_|non_finite_check_and_unscale|amp_update_scale|::sgd_kernel",
    ),
    ("batch_norm", r"batch_?norm|(?<![a-z0-9])bn_(?:fw|bw)"),
    ("pool", r"(?:max|avg)_?pool|adaptive_(?:avg|max)|pool(?:ing|[123]d)"),
    ("loss", r"cross_?entropy|nll_?loss|softmax|loss|label_smooth|mse_|binary_cross|margin"),
]
# torchext's kernels whose names do not say their op (helpers of one op's files in cuda_ops/), by file.
_TORCHEXT_RULES = [
    ("pool", r"::(?:avg_(?:forward|backward)_\w+|global_avg_pool_\w+)_kernel"),
    (
        "batch_norm",
        r"::(?:normalize_(?:rows_vec|flat)|backward_(?:rows_vec|flat)|reduce_(?:rows_vec|channel)"
        r"|finalize_(?:forward|backward))_kernel",
    ),
    (
        "conv",
        r"::(?:im2col|col2im|accumulate|dy_copy|nchw_epilogue|store_weight|reduce_(?:channels|rows)_fast|finalize)"
        r"_kernel",
    ),
    ("gemm", r"::(?:matmul_\w*|split_k_reduce|linear_\w*|transpose_copy)_kernel"),
    ("elementwise", r"::(?:unary|binary)_kernel"),
]
_GENERIC_RULES = [
    ("conv", r"conv(?!ert)|fprop|dgrad|wgrad|im2col|col2im|cudnn|cask_|winograd|nchwtonhwc|nhwctonchw"),
    (
        "gemm",
        r"gemm|gemv|cublas|cutlass|matmul|wmma|mma_sync|splitkreduce|split_k|(?<![a-z0-9])scal_kernel|addmm"
        r"|(?<![a-z0-9])b?mm(?![a-z0-9])|linear",
    ),
    ("copy", r"copy|memcpy|memset|(?<!masked_)fill|catarray"),
    (
        "elementwise",
        r"elementwise|relu|gelu|silu|sigmoid|tanh|threshold|clamp|dropout|where|masked|(?<![a-z0-9])(?:add|mul|div"
        r"|neg|sqrt|rsqrt|exp|log|pow|abs|sub)(?![a-z0-9])",
    ),
]
_FAMILY_PATTERNS = [(f, re.compile(p)) for f, p in _FAMILY_RULES]
_TORCHEXT_PATTERNS = [(f, re.compile(p)) for f, p in _TORCHEXT_RULES]
_GENERIC_PATTERNS = [(f, re.compile(p)) for f, p in _GENERIC_RULES]


_TRITON_KERNEL = re.compile(r"triton_(?:poi|red|per)_")  # inductor's pointwise and reduction kernels


def _opaque_torchext_ops() -> list[str]:
    """The names of torchext's ops that always run their own kernels under inductor (not lowered to ATen by
    ``set_compile_mode("decompose")``) and are not also ATen's."""
    from .compile import DECOMPOSABLE

    by_namespace: dict[str, set[str]] = defaultdict(set)
    for qualified in torch._C._dispatch_get_all_op_names():  # "torchext::conv2d_stats", "aten::add.Tensor", ...
        namespace, _, name = qualified.partition("::")
        by_namespace[namespace].add(name.split(".")[0])
    decomposable = {op.name().split("::")[1].split(".")[0] for op in DECOMPOSABLE}
    return sorted(by_namespace["torchext"] - by_namespace["aten"] - decomposable)


def _without_extern_ops(short: str) -> str:
    """An inductor pointwise or reduction kernel's name without the ops it does not compute. Inductor names a kernel
    after the ops it computes and also, for a copy or cast it makes for an op that runs its own kernel, after that op
    (triton_poi_fused__to_copy_conv2d_stats_1: a cast for torchext's conv2d_stats; ..._to_copy_linear_view_13: a
    weight cast for a Linear; 'linear' is the one ATen name taken out, as no pointwise kernel computes a GEMM, while
    one named after 'convolution' may add its bias): such names say nothing about the kernel's work."""
    return _extern_ops_pattern().sub("", short)


@functools.cache
def _extern_ops_pattern() -> re.Pattern:
    ops = sorted(set(_opaque_torchext_ops()) | {"linear"}, key=len, reverse=True)
    return re.compile(r"_(?:" + "|".join(map(re.escape, ops)) + r")(?=_)(?!_backward)")


# (family, pattern) tried on the lowercased names of the CPU op that launched a kernel and of its callers, innermost
# first: ATen ops and autograd nodes (aten::convolution_backward, ConvolutionBackward0, AdaptiveAvgPool2DBackward0,
# AddmmBackward0, aten::cross_entropy_loss), torchext's (torchext::conv2d_stats, CppNode<...BatchNormFunction>) and
# the optimizer's annotation range (Optimizer.step#SGD.step).
_OP_RULES = [
    ("batch_norm", r"batch_?norm"),
    ("pool", r"(?:max|avg)_?pool|adaptive_"),
    ("conv", r"conv(?!ert)"),
    ("loss", r"cross_?entropy|nll_?loss|softmax|loss"),
    ("gemm", r"(?<![a-z])linear|addmm|matmul|(?<![a-z0-9])b?mm(?:backward|(?![a-z0-9]))"),
    ("optimizer", r"optimizer\.step|_foreach_|fused_(?:sgd|adam)"),
]
_OP_PATTERNS = [(f, re.compile(p)) for f, p in _OP_RULES]
# The name-sorted families that a kernel's launching op may refine: its generic kernels'.
_REFINED_BY_OP = ("other", "elementwise")


# The autograd engine's range around a node: it also holds the engine's own sums of a tensor's incoming gradients
# (a residual block's two paths), run after the node's function, which are not the node's work.
_ENGINE_RANGE = "autograd::engine::evaluate_function:"


def op_family(op_names: Iterable[str]) -> str | None:
    """The family of the first op, innermost first, whose name is a family's (``_OP_RULES``); None if none is.
    The autograd engine's ranges are skipped (``_ENGINE_RANGE``): the node inside one names its own work."""
    for name in op_names:
        if name.startswith(_ENGINE_RANGE):
            continue
        lowered = name.lower()
        for family, pattern in _OP_PATTERNS:
            if pattern.search(lowered):
                return family
    return None


def event_family(event: DeviceEvent) -> str:
    """A GPU activity's family: its name's (``kernel_family``), or, for a generic kernel of torch's ('other' or
    'elementwise' by name; torchext's kernels are named after their op), that of the op that launched it where that
    op names one."""
    family = kernel_family(event.name, event.kind)
    if family in _REFINED_BY_OP and event.op_family is not None and not is_torchext_kernel(event.name):
        return event.op_family
    return family


@functools.lru_cache(maxsize=4096)  # summarize sorts every event, of a few hundred distinct names
def kernel_family(name: str, kind: str = "kernel") -> str:
    """The op family (one of ``KERNEL_FAMILIES``) of a GPU activity, from its name (demangled or mangled) and kind
    ('kernel', 'memcpy' or 'memset': the last two are copies)."""
    if kind in ("memcpy", "memset"):
        return "copy"
    short = short_kernel_name(name).lower()
    if _TRITON_KERNEL.match(short):
        short = _without_extern_ops(short)
    for family, pattern in _FAMILY_PATTERNS:
        if pattern.search(short):
            return family
    if is_torchext_kernel(name):
        for family, pattern in _TORCHEXT_PATTERNS:
            if pattern.search(short):
                return family
    for family, pattern in _GENERIC_PATTERNS:
        if pattern.search(short):
            return family
    return "other"


def _event_kind(event: Any) -> str | None:
    if getattr(event, "is_user_annotation", False):
        return None  # a range such as ProfilerStep#3 or Optimizer.step#SGD.step: it spans kernels counted already
    activity = getattr(event, "activity_type", None)
    if activity:
        return _ACTIVITY_KINDS.get(str(activity).lower())  # None: annotations and anything else
    # Without an activity type (torch 2.11's FunctionEvents have none) go by the name. Annotation ranges are named
    # "<label>#<label>" ("ProfilerStep#3", "Optimizer.step#SGD.step"). Kernel names may hold a '#' too: ATen's
    # elementwise kernels are instantiated on lambdas ("...launch_clamp_scalar(...)::{lambda()#1}..."), so a '#'
    # marks an annotation only in a name without a signature, template arguments or spaces.
    name = event.name
    if _is_annotation_name(name):
        return None
    if name.startswith("Memcpy"):
        return "memcpy"
    if name.startswith("Memset"):
        return "memset"
    return "kernel"


def _is_annotation_name(name: str) -> bool:
    return "#" in name and not any(c in name for c in "(<{ ")


def _op_chain(op: Any) -> list[str]:
    """The names of a CPU op and of its callers (``cpu_parent``), innermost first."""
    names = []
    while op is not None and len(names) < 64:
        names.append(op.name)
        op = getattr(op, "cpu_parent", None)
    return names


class _Launchers:
    """Which CPU op launched each kernel. The profiler links them two ways. Where device events carry a
    ``linked_correlation_id`` (newer torch), it is the ``id`` of the op that launched them; only CPU ops are indexed
    (their own ``linked_correlation_id`` is 0: the runtime calls' ids, CUPTI's, count separately and collide with
    them). Otherwise (torch 2.11) each CPU op lists the kernels it launched (``kernels``: name, device, duration),
    and a kernel is matched to the first op listing its name, device and duration that started before it ran. One
    of the two ways per profile."""

    def __init__(self, events: list[Any]) -> None:
        cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA
        self.by_id: dict[int, Any] = {}
        self.by_kernel: dict[tuple, list[Any]] = defaultdict(list)
        self.linked = any(
            getattr(e, "device_type", None) == cuda and getattr(e, "linked_correlation_id", None) for e in events
        )
        for e in events:
            if getattr(e, "device_type", None) != cpu or getattr(e, "is_async", False):
                continue
            if self.linked:
                if not getattr(e, "linked_correlation_id", None) and getattr(e, "id", None) is not None:
                    self.by_id[e.id] = e
            else:
                for k in getattr(e, "kernels", None) or ():
                    self.by_kernel[(k.name, k.device, round(float(k.duration), 3))].append(e)

    def op_of(self, event: Any) -> Any:
        if self.linked:
            return self.by_id.get(getattr(event, "linked_correlation_id", None) or 0)
        start = event.time_range.start
        ops = self.by_kernel.get(
            (event.name, getattr(event, "device_index", 0), round(float(event.time_range.end - start), 3))
        )
        for i, op in enumerate(ops or ()):
            if op.time_range.start <= start:
                return ops.pop(i)
        return None


def device_events(events: Iterable[Any], device: str | torch.device | None = None) -> list[DeviceEvent]:
    """The GPU activities among torch.profiler's events (``prof.events()``: FunctionEvents, or anything with
    ``name``, ``device_type``, ``activity_type``, ``device_index`` and ``time_range``); with a device that has an
    index, only that device's. Each kernel gets the family its launching op or that op's callers name
    (``op_family``), where the events link kernels to CPU ops (``_Launchers``)."""
    index = torch.device(device).index if device is not None else None
    events = list(events)
    launchers = _Launchers(events)
    out = []
    for e in events:
        if getattr(e, "device_type", None) != torch.autograd.DeviceType.CUDA:
            continue
        if index is not None and getattr(e, "device_index", index) != index:
            continue
        kind = _event_kind(e)
        if kind is None:
            continue
        family = op_family(_op_chain(launchers.op_of(e))) if kind == "kernel" else None
        out.append(DeviceEvent(_demangle(e.name), kind, float(e.time_range.end - e.time_range.start), family))
    return out


def summarize(events: Iterable[DeviceEvent], top: int = 10) -> dict[str, Any]:
    """Totals of a list of DeviceEvents: total_us, torchext_us, share (None with a reason when there is no GPU
    time), by_kind, and the ``top`` kernels by time in by_kernel."""
    events = list(events)
    total = sum(e.us for e in events)
    by_kind: dict[str, float] = defaultdict(float)
    by_family = {family: {"us": 0.0, "torchext_us": 0.0} for family in KERNEL_FAMILIES}
    per_name: dict[tuple[str, str], dict[str, Any]] = {}
    torchext_us = 0.0
    for e in events:
        by_kind[e.kind] += e.us
        family = event_family(e)
        key = (e.name, family)  # a generic kernel launched by ops of two families is two rows
        if key not in per_name:
            ours = e.kind == "kernel" and is_torchext_kernel(e.name)
            short = short_kernel_name(e.name) if e.kind == "kernel" else e.name
            per_name[key] = {
                "name": short,
                "full_name": e.name,
                "kind": e.kind,
                "family": family,
                "torchext": ours,
                "calls": 0,
                "us": 0.0,
            }
        row = per_name[key]
        row["calls"] += 1
        row["us"] += e.us
        by_family[row["family"]]["us"] += e.us
        if row["torchext"]:
            torchext_us += e.us
            by_family[row["family"]]["torchext_us"] += e.us
    rows = sorted(per_name.values(), key=lambda r: r["us"], reverse=True)[: max(0, top)]
    for row in rows:
        row["share"] = row["us"] / total if total > 0 else None
    reason = None
    if total <= 0:
        reason = "the profiler recorded no GPU activity (no CUDA work ran while it was recording)"
    return {
        "total_us": total,
        "torchext_us": torchext_us,
        "share": torchext_us / total if total > 0 else None,
        "by_kind": dict(by_kind),
        "by_family": by_family,
        "events": len(events),
        "by_kernel": rows,
        "reason": reason,
        "family_rule": "launching_op",  # the families: by name, generic kernels by their launching op
    }


def _resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _unavailable_reason(device: torch.device) -> str | None:
    if device.type != "cuda":
        return f"device is {device.type!r}: torchext's share of GPU time is measured on CUDA devices only"
    if not torch.cuda.is_available():
        return "CUDA is not available in this process: no GPU time to measure"
    if torch.profiler.ProfilerActivity.CUDA not in torch.profiler.supported_activities():
        return "this torch build's profiler cannot record CUDA activity (no CUPTI/Kineto support)"
    return None


def _empty(device: torch.device, reason: str) -> dict[str, Any]:
    return {
        "device": str(device),
        "total_us": 0.0,
        "torchext_us": 0.0,
        "share": None,
        "by_kind": {},
        "by_family": {},
        "events": 0,
        "by_kernel": [],
        "reason": reason,
    }


class GpuTimeProfiler:
    """Context manager: profiles the GPU work of its body; ``result`` (the dict ``gpu_time_share`` returns,
    without ``steps``) is set on exit. Waits for the device on entry (earlier work is not counted) and on exit.
    Where nothing can be measured the body still runs and ``result`` has ``share`` None and a ``reason``."""

    def __init__(self, device: str | torch.device | None = None, top: int = 10) -> None:
        self.device = _resolve_device(device)
        self.top = top
        self.result: dict[str, Any] | None = None
        self._prof = None
        self._reason: str | None = None

    def __enter__(self) -> "GpuTimeProfiler":
        self.result = None
        self._reason = _unavailable_reason(self.device)
        if self._reason is not None:
            return self
        torch.cuda.synchronize(self.device)
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        prof = torch.profiler.profile(activities=activities)
        try:
            prof.__enter__()
        except Exception as e:  # another profiler already running, CUPTI refused, ...
            self._reason = f"torch.profiler could not start: {type(e).__name__}: {e}"
            return self
        self._prof = prof
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        prof, self._prof = self._prof, None
        if prof is None:
            self.result = _empty(self.device, self._reason or "the profiler did not run")
            return False
        try:
            if exc_type is None:
                torch.cuda.synchronize(self.device)
        finally:
            prof.__exit__(exc_type, exc, tb)
        if exc_type is not None:
            return False
        self.result = {"device": str(self.device), **summarize(device_events(prof.events(), self.device), self.top)}
        return False


def gpu_time_share(
    fn: Callable[..., Any],
    *args: Any,
    steps: int = 5,
    warmup: int = 2,
    device: str | torch.device | None = None,
    top: int = 10,
    **kwargs: Any,
) -> dict[str, Any]:
    """Call ``fn(*args, **kwargs)`` ``warmup`` times, then ``steps`` times under the profiler; return the share of
    GPU time spent in torchext's kernels (see the module docstring for the dict). ``device`` defaults to CUDA when
    available. On a device with nothing to measure (a CPU device, no CUDA) ``fn`` is not called and the result
    has ``share`` None and a ``reason``."""
    if steps < 1 or warmup < 0:
        raise ValueError(f"gpu_time_share: steps must be >= 1 and warmup >= 0 (got steps={steps}, warmup={warmup})")
    dev = _resolve_device(device)
    reason = _unavailable_reason(dev)
    if reason is not None:
        return {**_empty(dev, reason), "steps": 0}
    for _ in range(warmup):
        fn(*args, **kwargs)
    with GpuTimeProfiler(dev, top) as p:
        for _ in range(steps):
            fn(*args, **kwargs)
    return {**p.result, "steps": steps if p._reason is None else 0}


def describe(result: dict[str, Any]) -> str:
    """One line for a summary: 'torchext kernels: 41.3% of 12.50 ms of GPU time (5 steps)' or why not measured."""
    if result.get("share") is None:
        return f"torchext share of GPU time: not measured ({result.get('reason') or 'no data'})"
    steps = result.get("steps")
    per = f" over {steps} steps" if steps else ""
    return f"torchext kernels: {100 * result['share']:.1f}% of {result['total_us'] / 1000:.2f} ms of GPU time{per}"
