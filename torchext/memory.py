"""torchext.memory: a stream-ordered, coalescing GPU memory pool that PyTorch can run on.

Run a whole program on the pool (call it before anything touches CUDA)::

    import torchext
    torchext.memory.enable_pool()
    model = ResNet18().cuda()              # every CUDA tensor now comes from the pool
    ...
    torchext.memory.stats()                # the pool's figures; torch.cuda.memory_allocated() & co. work too

or only a block of code, next to PyTorch's own allocator (needs ``torch.cuda.MemPool``)::

    with torchext.memory.pool_scope():
        x = torch.empty(1 << 20, device="cuda")   # segments for this scope come from the pool

The policy code is ``cuda_ops/pool.{h,cpp}`` (plain C++), the GPU backend ``cuda_ops/pool_cuda.cu``, the torch
side ``csrc/memory.cpp`` and ``csrc/memory_cuda.cpp``. :class:`Pool` gives direct access to a standalone pool,
on the GPU or on host memory (for tests and experiments on machines without a GPU).

With the pool enabled, ``torch.cuda.memory_allocated()``, ``memory_reserved()``, ``max_memory_allocated()``,
``max_memory_reserved()``, ``reset_peak_memory_stats()``, ``memory_stats()`` (the ``*.all.*`` keys) and
``empty_cache()`` report on and act on the pool. ``torch.cuda.memory_snapshot()`` and ``memory_summary()`` do not
(PyTorch raises there); use :func:`stats` and :meth:`Pool.snapshot`.

CUDA graphs work on the pool as on PyTorch's allocator (``torch.cuda.graph``, ``make_graphed_callables``,
``torchext.graphs.GraphedTrainStep``, ``pool=other_graph.pool()``): what a graph allocates during capture comes
from a private pool of its own, reused within the capture, kept (and reused by later captures into the same pool)
between replays, and given back to the device when the last graph holding the pool is gone and its last tensor
freed. :func:`stats` counts the private pools in every figure and reports them as ``graph_pools`` and
``graph_pool_bytes``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gzip
import json
import numbers
import os

import torch

from ._loader import built_with_cuda

__all__ = [
    "Pool",
    "Segment",
    "Block",
    "enable_pool",
    "enabled_kind",
    "is_enabled",
    "pool_scope",
    "stats",
    "reset_peak_stats",
    "empty_cache",
    "device_pool",
    "load_trace",
    "replay_trace",
    "KINDS",
]

KINDS = ("best_fit", "pow2")


@dataclasses.dataclass(frozen=True)
class Block:
    address: int
    size: int
    stream: int
    in_use: bool  # handed out, or freed and waiting for another stream's work (record_stream)


@dataclasses.dataclass(frozen=True)
class Segment:
    address: int
    size: int
    small: bool
    blocks: tuple[Block, ...]  # in address order, covering the segment exactly
    pool: tuple[int, int] = (0, 0)  # the CUDA graph private pool it belongs to; (0, 0): the device pool


def _convert_stats(raw) -> dict:
    """The C++ side returns every figure as a float; all but the fragmentation are counts of bytes or events."""
    return {k: float(v) if k == "fragmentation" else int(v) for k, v in raw.items()}


def _describe(value) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def _int_arg(value, name: str, where: str, minimum: int = 0) -> int:
    """`value` as an int the C++ side takes (a signed 64-bit integer), or an error naming the argument: TypeError for
    anything but an integer (bool, float, str and None included), ValueError below `minimum`, OverflowError at 2**63
    and above."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"torchext.memory.{where}: `{name}` must be an int, got {_describe(value)}")
    value = int(value)
    if value < minimum:
        raise ValueError(f"torchext.memory.{where}: `{name}` must be >= {minimum}, got {value}")
    if value >= 1 << 63:
        raise OverflowError(f"torchext.memory.{where}: `{name}` must be less than 2**63, got {value}")
    return value


def _str_arg(value, name: str, where: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"torchext.memory.{where}: `{name}` must be a str, got {_describe(value)}")
    return value


def _pool_id(pool, where: str) -> tuple[int, int]:
    """A private pool id (PyTorch's MempoolId_t: ``CUDAGraph.pool()``, ``torch.cuda.graph_pool_handle()``) as two
    ints."""
    if isinstance(pool, (str, bytes)) or not hasattr(pool, "__len__") or len(pool) != 2:
        raise TypeError(f"torchext.memory.{where}: `pool` must be a pair of ints, got {_describe(pool)}")
    return _int_arg(pool[0], "pool[0]", where), _int_arg(pool[1], "pool[1]", where)


def _stream_id(stream, where: str) -> int:
    """A stream argument as the integer the pool takes: None is the default stream (0)."""
    if stream is None:
        return 0
    if isinstance(stream, torch.cuda.Stream):
        return stream.cuda_stream
    if isinstance(stream, bool) or not isinstance(stream, numbers.Integral):
        raise TypeError(
            f"torchext.memory.{where}: `stream` must be None, an int or a torch.cuda.Stream, got {_describe(stream)}"
        )
    return _int_arg(stream, "stream", where)


class Pool:
    """A memory pool of its own, not PyTorch's allocator.

    Args:
        kind: ``"best_fit"`` (splitting, coalescing, stream-ordered) or ``"pow2"`` (the power-of-two free-list
            baseline).
        backend: ``"cuda"`` (segments from ``cudaMalloc`` on ``device``) or ``"host"`` (host memory standing in
            for a device: events complete only on :meth:`complete_events`, and ``capacity`` bytes, if nonzero,
            make it run out of memory like a GPU).

    Addresses are integers; streams are ``torch.cuda.Stream`` objects or raw ``cudaStream_t`` integers (any
    integer id from 0 to 2**63 - 1 on the host backend; None and 0 are the default stream).

    Every method is thread-safe and runs without the GIL, so threads can share a pool. Arguments of the wrong type
    (bool, float, str or None where an int is expected) raise TypeError, negative sizes, capacities and addresses
    ValueError, values of 2**63 and above OverflowError; each message names the argument.
    """

    def __init__(self, kind: str = "best_fit", backend: str = "host", device: int = 0, capacity: int = 0):
        self._pool = torch.classes.torchext.Pool(
            _str_arg(kind, "kind", "Pool"),
            _str_arg(backend, "backend", "Pool"),
            _int_arg(device, "device", "Pool"),
            _int_arg(capacity, "capacity", "Pool"),
        )

    @classmethod
    def _wrap(cls, obj) -> Pool:
        self = cls.__new__(cls)
        self._pool = obj
        return self

    @property
    def kind(self) -> str:
        return self._pool.kind()

    @property
    def backend(self) -> str:
        return self._pool.backend()

    def allocate(self, size: int, stream=None) -> int:
        """Address of ``size`` bytes ordered on ``stream`` (0 for 0 bytes). Raises torch.OutOfMemoryError when the
        device has not that much memory."""
        return self._pool.allocate(_int_arg(size, "size", "Pool.allocate"), _stream_id(stream, "Pool.allocate"))

    def free(self, address: int) -> None:
        """Gives back the block at ``address``, an int that :meth:`allocate` returned. ``free(0)`` does nothing: 0 is
        the address of a 0-byte allocation, so ``free(allocate(n))`` is right for every n, as ``free(NULL)`` is in
        C. ``free(None)`` raises TypeError like any other argument that is not an int (None is never an address
        here), and an address this pool did not hand out, or already took back, raises ValueError."""
        self._pool.free(_int_arg(address, "address", "Pool.free"))

    def record_stream(self, address: int, stream) -> None:
        """The block at ``address`` is also used on ``stream``: once freed, it is reused only after the work queued
        there up to the free has finished (on the host backend: after :meth:`complete_events`)."""
        where = "Pool.record_stream"
        self._pool.record_stream(_int_arg(address, "address", where), _stream_id(stream, where))

    def block_size(self, address: int) -> int:
        """Size of the block handed out at ``address`` (0 if the pool did not hand it out)."""
        return self._pool.block_size(_int_arg(address, "address", "Pool.block_size"))

    def stats(self) -> dict:
        return _convert_stats(self._pool.stats())

    def reset_peak_stats(self) -> None:
        self._pool.reset_peak_stats()

    def empty_cache(self) -> int:
        """Gives every segment with nothing in use back to the device; returns the bytes released."""
        return self._pool.empty_cache()

    def snapshot(self) -> list[Segment]:
        flat = self._pool.snapshot()
        segments: list[Segment] = []
        blocks: list[Block] = []
        for i in range(0, len(flat), 9):
            seg_addr, seg_size, small, addr, size, stream, in_use, pool_a, pool_b = flat[i : i + 9]
            blocks.append(Block(addr, size, stream, bool(in_use)))
            last_of_segment = i + 9 >= len(flat) or flat[i + 9] != seg_addr
            if last_of_segment:
                segments.append(Segment(seg_addr, seg_size, bool(small), tuple(blocks), (pool_a, pool_b)))
                blocks = []
        return segments

    def last_error(self) -> str:
        return self._pool.last_error()

    def time_alloc_free(self, sizes: list[int], live: int = 0, rounds: int = 100, stream=None) -> float:
        """Nanoseconds per allocate+free pair in a C++ loop over ``sizes``, keeping the last ``live`` alive."""
        where = "Pool.time_alloc_free"
        if not isinstance(sizes, (list, tuple)):
            raise TypeError(f"torchext.memory.{where}: `sizes` must be a list of ints, got {_describe(sizes)}")
        return self._pool.time_alloc_free(
            [_int_arg(s, f"sizes[{i}]", where) for i, s in enumerate(sizes)],
            _int_arg(live, "live", where),
            _int_arg(rounds, "rounds", where, minimum=1),
            _stream_id(stream, where),
        )

    # CUDA graphs' private pools. PyTorch drives these on the device pool (through torch.cuda.graph); here they are
    # for tests and experiments, where the `streams` list stands in for "the streams capturing into this graph".
    def begin_allocate_to_pool(self, pool, streams) -> None:
        """Requests on the given streams go to private pool ``pool`` (a pair of ints, not (0, 0); made if new, one
        use more) until :meth:`end_allocate_to_pool`. Raises ValueError if allocations already go to ``pool``."""
        where = "Pool.begin_allocate_to_pool"
        if not isinstance(streams, (list, tuple, set, frozenset)):
            raise TypeError(f"torchext.memory.{where}: `streams` must be a list of streams, got {_describe(streams)}")
        self._pool.begin_allocate_to_pool(*_pool_id(pool, where), [_stream_id(s, where) for s in streams])

    def end_allocate_to_pool(self, pool) -> None:
        self._pool.end_allocate_to_pool(*_pool_id(pool, "Pool.end_allocate_to_pool"))

    def release_pool(self, pool) -> None:
        """One use of private pool ``pool`` less; with none left, its memory goes back to the device once its last
        block is freed. Raises ValueError for a pool that is not held."""
        self._pool.release_pool(*_pool_id(pool, "Pool.release_pool"))

    def create_or_incref_pool(self, pool) -> None:
        self._pool.create_or_incref_pool(*_pool_id(pool, "Pool.create_or_incref_pool"))

    def pool_use_count(self, pool) -> int:
        """The uses of private pool ``pool`` (0 if there is none)."""
        return self._pool.pool_use_count(*_pool_id(pool, "Pool.pool_use_count"))

    # Host backend only.
    def set_capture_underway(self, underway: bool) -> None:
        """Host backend: while True, the simulated device is capturing a CUDA graph, and an event record, query or
        wait, a synchronization or a release of memory raises (each would break a real capture)."""
        if not isinstance(underway, bool):
            raise TypeError(
                f"torchext.memory.Pool.set_capture_underway: `underway` must be a bool, got {_describe(underway)}"
            )
        self._pool.set_capture_underway(underway)

    def complete_events(self) -> None:
        """Host backend: the simulated device finishes all work queued so far."""
        self._pool.complete_events()

    def set_capacity(self, capacity: int) -> None:
        """Host backend: the simulated device's memory in bytes from now on (0: unlimited)."""
        self._pool.set_capacity(_int_arg(capacity, "capacity", "Pool.set_capacity"))

    def waits(self) -> list[tuple[int, int]]:
        """Host backend: the cross-stream waits issued so far, as (waiting stream, stream waited for)."""
        flat = self._pool.waits()
        return list(zip(flat[0::2], flat[1::2]))


def _require_cuda(what: str) -> None:
    if not built_with_cuda():
        raise RuntimeError(f"torchext.memory.{what} needs a torchext build with CUDA; this one has none")
    if not torch.cuda.is_available():
        raise RuntimeError(f"torchext.memory.{what} needs a CUDA device; none is available")


def _check_device(device, where: str) -> None | int:
    """The index of a `device` argument (None: the current device), checked before anything needs CUDA: TypeError
    for a type that names no device, ValueError for a device that is not a CUDA one."""
    if device is None:
        return None
    if isinstance(device, (str, torch.device)):
        try:
            parsed = torch.device(device)
        except RuntimeError as e:
            raise ValueError(f"torchext.memory.{where}: `device` {device!r} is not a device: {e}") from None
        if parsed.type != "cuda":
            raise ValueError(f"torchext.memory.{where}: `device` must be a CUDA device, got {parsed}")
        return parsed.index
    if isinstance(device, bool) or not isinstance(device, numbers.Integral):
        raise TypeError(
            f"torchext.memory.{where}: `device` must be None, an int, a str or a torch.device, got {_describe(device)}"
        )
    return _int_arg(device, "device", where)


def _device_index(device, where: str) -> int:
    index = _check_device(device, where)
    _require_cuda(where)
    return torch.cuda.current_device() if index is None else index


def _device_pool(device, where: str) -> Pool:
    return Pool._wrap(torch.classes.torchext.Pool.device_pool(_device_index(device, where)))


def device_pool(device=None) -> Pool:
    """The process-wide pool of a CUDA device (the one enable_pool() and pool_scope() allocate from)."""
    return _device_pool(device, "device_pool")


def enabled_kind() -> str | None:
    """The kind of pool PyTorch runs on in this process, or None when it runs on its own allocator."""
    return torch.classes.torchext.Pool.enabled_kind() or None


def is_enabled() -> bool:
    return enabled_kind() is not None


def enable_pool(kind: str = "best_fit") -> None:
    """Makes torchext's pool PyTorch's CUDA allocator for the rest of the process.

    Must run before anything touches CUDA: PyTorch cannot switch allocators once its own holds memory. Calling it
    again with the same kind does nothing. To compare allocators, run each in its own process.
    """
    if _str_arg(kind, "kind", "enable_pool") not in KINDS:
        raise ValueError(f"torchext.memory.enable_pool: `kind` must be one of {KINDS}, got {kind!r}")
    if enabled_kind() == kind:
        return
    _require_cuda("enable_pool")
    if torch.cuda.is_initialized() and not is_enabled():
        held = {d: torch.cuda.memory_reserved(d) for d in range(torch.cuda.device_count())}
        held = {d: n for d, n in held.items() if n > 0}
        if held:
            where = ", ".join(f"{n} bytes on cuda:{d}" for d, n in held.items())
            raise RuntimeError(
                f"torchext.memory.enable_pool: CUDA memory was already allocated in this process by PyTorch's "
                f"caching allocator ({where}); the allocator cannot be replaced any more. Call enable_pool() at the "
                f"start of the program, before the first CUDA tensor is made."
            )
        raise RuntimeError(
            "torchext.memory.enable_pool: CUDA was already initialised in this process, so PyTorch's allocator "
            "cannot be replaced any more. Call enable_pool() at the start of the program, before anything touches "
            "CUDA."
        )
    torch.classes.torchext.Pool.enable(kind)


@functools.cache
def _pluggable_allocator():
    from ._loader import LIBRARY_PATH  # the op library, which defines the two C functions (csrc/memory_cuda.cpp)

    return torch.cuda.memory.CUDAPluggableAllocator(LIBRARY_PATH, "torchext_pool_alloc", "torchext_pool_free")


@contextlib.contextmanager
def pool_scope(device=None):
    """Allocations on ``device`` inside the block take their segments from torchext's pool.

    A ``torch.cuda.MemPool`` backed by the pool through ``torch.cuda.memory.CUDAPluggableAllocator``; PyTorch's
    caching allocator still splits those segments into tensors, and its own allocations outside the block are
    untouched. Yields the MemPool: keep it alive as long as tensors made in the block are.
    """
    _check_device(device, "pool_scope")
    _require_cuda("pool_scope")
    if not hasattr(torch.cuda, "MemPool"):
        raise RuntimeError(
            f"torchext.memory.pool_scope needs torch.cuda.MemPool, which torch {torch.__version__} does not have; "
            f"use enable_pool() instead"
        )
    mem_pool = torch.cuda.MemPool(_pluggable_allocator().allocator())
    with torch.cuda.use_mem_pool(mem_pool, device=device):
        yield mem_pool


def stats(device=None) -> dict:
    """The statistics of a device's pool: bytes allocated, requested and reserved (current and ``*_peak``),
    active blocks, allocations, cache hits, segments, device allocations and frees (``cudaMalloc``/``cudaFree``
    calls), cross-stream reuses, bytes waiting on other streams, the largest free block, free bytes, the
    fragmentation figure (1 - largest free block / free bytes), out-of-memory retries and failures, and the CUDA
    graphs' private pools held (``graph_pools``) with the bytes reserved in them (``graph_pool_bytes``, part of
    ``reserved_bytes``)."""
    return _device_pool(device, "stats").stats()


def reset_peak_stats(device=None) -> None:
    _device_pool(device, "reset_peak_stats").reset_peak_stats()


def load_trace(path: str) -> dict:
    """A recorded allocation trace (gzipped JSON with an "events" list of (op, id, size), op "a" or "f"), as
    benchmarks/bench_memory.py records it from PyTorch's allocator history."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"torchext.memory.load_trace: `path` must be a str or a path, got {_describe(path)}")
    with gzip.open(path, "rt") as f:
        return json.load(f)


def replay_trace(events, allocate, free) -> int:
    """Replays (op, id, size) events through ``allocate(size) -> handle`` and ``free(handle)``, then frees what the
    trace left allocated; returns the peak of requested bytes (the same for every allocator)."""
    for name, fn in (("allocate", allocate), ("free", free)):
        if not callable(fn):
            raise TypeError(f"torchext.memory.replay_trace: `{name}` must be callable, got {_describe(fn)}")
    live, current, peak = {}, 0, 0
    for op, ident, size in events:
        if op == "a":
            live[ident] = (allocate(size), size)
            current += size
            peak = max(peak, current)
        else:
            handle, size = live.pop(ident)
            free(handle)
            current -= size
    for handle, _ in live.values():  # e.g. a model's weights and optimizer state, alive after the recorded steps
        free(handle)
    return peak


def empty_cache(device=None) -> int:
    """Gives the pool's unused segments on ``device`` back to the driver; returns the bytes released."""
    return _device_pool(device, "empty_cache").empty_cache()
