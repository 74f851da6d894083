"""What share of GPU time runs in torchext's kernels, measured with torch.profiler.

``gpu_time_share(fn, *args, steps=5, warmup=2)`` calls ``fn(*args)`` ``warmup`` times, then ``steps`` times under
torch.profiler, and returns::

    {"device": "cuda:0", "total_us": ..., "torchext_us": ..., "share": torchext_us / total_us,
     "by_kind": {"kernel": us, "memcpy": us, "memset": us}, "events": n, "reason": None, "steps": 5,
     "by_kernel": [{"name", "full_name", "kind", "torchext", "calls", "us", "share"}, ...]}   # top ``top``

``GpuTimeProfiler`` is the same as a context manager around any code (a few steps of a real training loop):
``with GpuTimeProfiler() as p: ...`` then ``p.result``.

What counts: every GPU activity the profiler records (kernels, memcpy, memset; not the user-annotation ranges
drawn over them), by duration on the device, summed (kernels of concurrent streams are not de-overlapped). A kernel
is torchext's when its demangled name contains the namespace ``torchext::``: every ``__global__`` function in
cuda_ops/ lives in ``torchext::cuda_ops``, and Kineto reports demangled names, e.g.
``void torchext::cuda_ops::(anonymous namespace)::unary_kernel<float, 4, ...>(float const*, ...)``; a mangled
name (``_ZN8torchext...``) is demangled first. Work that torchext's ops hand to ATen (a ``.contiguous()`` copy of
an input) and memsets count as stock.

Where there is nothing to measure (a CPU device, no CUDA, a torch without CUPTI support, no GPU activity
recorded) the result has ``share`` None and ``reason`` saying why; nothing raises.
"""

import re
from collections import defaultdict
from collections.abc import Iterable
from typing import Any, Callable, NamedTuple, Optional, Union

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
]

_ACTIVITY_KINDS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
_TORCHEXT_NAMESPACE = re.compile(r"(?<![\w])torchext::")
_ANONYMOUS = "(anonymous namespace)::"


class DeviceEvent(NamedTuple):
    """One activity on the GPU: its (demangled) name, kind ('kernel', 'memcpy' or 'memset') and duration."""

    name: str
    kind: str
    us: float


def _demangle(name: str) -> str:
    if name.startswith("_Z"):
        try:
            return torch._C._demangle(name)
        except Exception:
            return name
    return name


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


def _event_kind(event: Any) -> Optional[str]:
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


def device_events(events: Iterable[Any], device: Union[str, torch.device, None] = None) -> list[DeviceEvent]:
    """The GPU activities among torch.profiler's events (``prof.events()``: FunctionEvents, or anything with
    ``name``, ``device_type``, ``activity_type``, ``device_index`` and ``time_range``); with a device that has an
    index, only that device's."""
    index = torch.device(device).index if device is not None else None
    out = []
    for e in events:
        if getattr(e, "device_type", None) != torch.autograd.DeviceType.CUDA:
            continue
        if index is not None and getattr(e, "device_index", index) != index:
            continue
        kind = _event_kind(e)
        if kind is None:
            continue
        out.append(DeviceEvent(_demangle(e.name), kind, float(e.time_range.end - e.time_range.start)))
    return out


def summarize(events: Iterable[DeviceEvent], top: int = 10) -> dict[str, Any]:
    """Totals of a list of DeviceEvents: total_us, torchext_us, share (None with a reason when there is no GPU
    time), by_kind, and the ``top`` kernels by time in by_kernel."""
    events = list(events)
    total = sum(e.us for e in events)
    by_kind: dict[str, float] = defaultdict(float)
    per_name: dict[str, dict[str, Any]] = {}
    torchext_us = 0.0
    for e in events:
        by_kind[e.kind] += e.us
        ours = e.kind == "kernel" and is_torchext_kernel(e.name)
        if ours:
            torchext_us += e.us
        if e.name not in per_name:
            short = short_kernel_name(e.name) if e.kind == "kernel" else e.name
            per_name[e.name] = {
                "name": short,
                "full_name": e.name,
                "kind": e.kind,
                "torchext": ours,
                "calls": 0,
                "us": 0.0,
            }
        row = per_name[e.name]
        row["calls"] += 1
        row["us"] += e.us
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
        "events": len(events),
        "by_kernel": rows,
        "reason": reason,
    }


def _resolve_device(device: Union[str, torch.device, None]) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _unavailable_reason(device: torch.device) -> Optional[str]:
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
        "events": 0,
        "by_kernel": [],
        "reason": reason,
    }


class GpuTimeProfiler:
    """Context manager: profiles the GPU work of its body; ``result`` (the dict ``gpu_time_share`` returns,
    without ``steps``) is set on exit. Waits for the device on entry (earlier work is not counted) and on exit.
    Where nothing can be measured the body still runs and ``result`` has ``share`` None and a ``reason``."""

    def __init__(self, device: Union[str, torch.device, None] = None, top: int = 10) -> None:
        self.device = _resolve_device(device)
        self.top = top
        self.result: Optional[dict[str, Any]] = None
        self._prof = None
        self._reason: Optional[str] = None

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
    device: Union[str, torch.device, None] = None,
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
