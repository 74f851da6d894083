"""torchext.memory.Pool on the host backend (no GPU needed): the invariants of both pool kinds under randomized
workloads, with real bytes written into every block; the best-fit policy (segment sizes, small/large separation,
best fit, splitting and coalescing); stream semantics (events complete only on complete_events()); statistics;
out-of-memory handling with a capacity; errors; the device-only API on a machine without a GPU."""

from __future__ import annotations

import collections
import contextlib
import ctypes
import dataclasses
import json
import math
import os
import random
import subprocess
import sys
import threading
import time

import pytest
import torch

import torchext  # noqa: F401  (registers torch.classes.torchext.Pool)
from torchext import _loader, memory
from torchext.memory import Pool

KiB = 1 << 10
MiB = 1 << 20

# The policy constants of cuda_ops/pool.h.
ALIGNMENT = 512
SMALL_REQUEST = 1 * MiB
SMALL_SEGMENT = 2 * MiB
LARGE_ROUNDING = 2 * MiB

KINDS = ("best_fit", "pow2")

# Bytes written at each end of a block (the whole block when it is at most FULL_FILL bytes).
EDGE = 64
FULL_FILL = 64 * KiB

# Sizes at the policy's boundaries, mixed into the randomized workloads.
BOUNDARY_SIZES = (
    0, 1, 511, 512, 513, SMALL_REQUEST - 1, SMALL_REQUEST, SMALL_REQUEST + 1, SMALL_SEGMENT, 10 * MiB - 1,
    10 * MiB, 10 * MiB + 1, 20 * MiB, 64 * MiB,
)  # fmt: skip

INT_STATS = (
    "allocated_bytes", "allocated_bytes_peak", "requested_bytes", "requested_bytes_peak", "reserved_bytes",
    "reserved_bytes_peak", "active_blocks", "allocations", "cache_hits", "segments", "device_allocs", "device_frees",
    "cross_stream_reuses", "pending_free_bytes", "largest_free_block", "free_bytes", "oom_retries", "ooms",
    "graph_pools", "graph_pool_bytes",
)  # fmt: skip

DEVICE_POOL = (0, 0)  # the pool id of the device pool's segments in snapshots


def round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m


def pow2_block(n: int) -> int:
    """The block the pow2 pool hands out for n bytes: the next power of two, at least ALIGNMENT."""
    size = ALIGNMENT
    while size < n:
        size <<= 1
    return size


TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)


def is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


# ---------------------------------------------------------------------------------------------------------------
# Real bytes in the blocks: a per-block pattern at both ends (or over the whole block when it is small), checked
# before the block is freed. Two blocks that overlap in fact overwrite each other's pattern.


def _regions(size: int) -> list[tuple[int, int]]:
    if size <= FULL_FILL:
        return [(0, size)]
    return [(0, EDGE), (size - EDGE, EDGE)]


def write_pattern(address: int, size: int, pattern: bytes) -> None:
    for offset, length in _regions(size):
        data = (pattern * (length // len(pattern) + 1))[:length]
        ctypes.memmove(address + offset, data, length)


def check_pattern(address: int, size: int, pattern: bytes, what: str) -> None:
    for offset, length in _regions(size):
        expected = (pattern * (length // len(pattern) + 1))[:length]
        actual = ctypes.string_at(address + offset, length)
        assert actual == expected, (
            f"[{what}] bytes {offset}..{offset + length} of the block at {address:#x} (size {size}) were overwritten: "
            f"another block overlaps it"
        )


# ---------------------------------------------------------------------------------------------------------------
# Invariants of a pool, from stats() and snapshot(), optionally against a model of what the test holds.


@dataclasses.dataclass
class Live:
    requested: int
    size: int
    stream: int
    pattern: bytes
    used_on: set = dataclasses.field(default_factory=set)  # record_stream streams other than its own


def check_pool(
    pool: Pool, what: str, live: dict | None = None, pending: dict | None = None, capture_underway: bool = False
) -> dict:
    """Checks every invariant of the pool; with `live` (address -> Live) and `pending` (address -> size of a block
    freed after record_stream, its events not complete yet), also that the pool agrees with the model. Free
    neighbours on different streams may stay apart in private pools (CUDA graphs), and in the device pool while a
    capture is underway. Returns stats()."""
    stats = pool.stats()
    segments = pool.snapshot()
    kind = pool.kind

    assert set(stats) == set(INT_STATS) | {"fragmentation"}, f"[{what}] stats keys {sorted(stats)}"
    for key in INT_STATS:
        assert stats[key] >= 0, f"[{what}] stats[{key!r}] = {stats[key]} < 0"
    for key in ("allocated_bytes", "requested_bytes", "reserved_bytes"):
        assert stats[f"{key}_peak"] >= stats[key], f"[{what}] {key}_peak {stats[f'{key}_peak']} < current {stats[key]}"

    # Segments: aligned, disjoint, tiled exactly by their blocks in address order.
    in_use: dict[int, object] = {}
    free_sizes: list[int] = []
    device_free_sizes: list[int] = []  # largest_free_block is the device pool's
    graph_pools: dict[tuple[int, int], int] = {}  # private pool -> bytes of its segments
    previous_end = 0
    for seg in segments:
        assert seg.address % ALIGNMENT == 0 and seg.size % ALIGNMENT == 0 and seg.size > 0, (
            f"[{what}] segment {seg.address:#x} of {seg.size} bytes is not {ALIGNMENT}-aligned"
        )
        assert seg.address >= previous_end, (
            f"[{what}] segment {seg.address:#x} overlaps the previous one, which ends at {previous_end:#x}"
        )
        previous_end = seg.address + seg.size
        cursor = seg.address
        for block in seg.blocks:
            assert block.address == cursor, (
                f"[{what}] segment {seg.address:#x}: block at {block.address:#x}, expected one at {cursor:#x} "
                f"(blocks must tile the segment in address order)"
            )
            assert block.size > 0 and block.size % ALIGNMENT == 0, (
                f"[{what}] block {block.address:#x} has size {block.size}, not a positive multiple of {ALIGNMENT}"
            )
            cursor += block.size
            if block.in_use:
                in_use[block.address] = block
            else:
                free_sizes.append(block.size)
                if seg.pool == DEVICE_POOL:
                    device_free_sizes.append(block.size)
        if seg.pool != DEVICE_POOL:
            graph_pools[seg.pool] = graph_pools.get(seg.pool, 0) + seg.size
        assert cursor == seg.address + seg.size, (
            f"[{what}] the blocks of segment {seg.address:#x} cover {cursor - seg.address} bytes of {seg.size}"
        )
        if kind == "best_fit":
            assert (
                seg.size == SMALL_SEGMENT
                if seg.small
                else (seg.size % LARGE_ROUNDING == 0 and seg.size > SMALL_REQUEST)
            ), f"[{what}] {'small' if seg.small else 'large'} segment of {seg.size} bytes"
            streams_may_stay_apart = seg.pool != DEVICE_POOL or capture_underway
            for a, b in zip(seg.blocks, seg.blocks[1:]):
                assert a.in_use or b.in_use or (streams_may_stay_apart and a.stream != b.stream), (
                    f"[{what}] free blocks {a.address:#x} and {b.address:#x} are neighbours but were not coalesced"
                )
        else:
            assert len(seg.blocks) == 1 and not seg.small, f"[{what}] pow2 segment {seg} is not a single block"
            assert is_pow2(seg.size) and seg.size >= ALIGNMENT, f"[{what}] pow2 block of {seg.size} bytes"

    # Every byte reserved is accounted for.
    reserved = sum(seg.size for seg in segments)
    in_use_bytes = sum(block.size for block in in_use.values())
    free_bytes = sum(free_sizes)
    assert stats["reserved_bytes"] == reserved, f"[{what}] reserved_bytes {stats['reserved_bytes']} != {reserved}"
    assert stats["segments"] == len(segments), f"[{what}] segments {stats['segments']} != {len(segments)}"
    assert stats["allocated_bytes"] + stats["pending_free_bytes"] == in_use_bytes, (
        f"[{what}] allocated {stats['allocated_bytes']} + pending {stats['pending_free_bytes']} != "
        f"{in_use_bytes} bytes in blocks in use"
    )
    assert stats["free_bytes"] == free_bytes == reserved - stats["allocated_bytes"] - stats["pending_free_bytes"], (
        f"[{what}] free_bytes {stats['free_bytes']}, free blocks {free_bytes}, reserved - allocated - pending "
        f"{reserved - stats['allocated_bytes'] - stats['pending_free_bytes']}"
    )
    largest = max(device_free_sizes, default=0)
    assert stats["largest_free_block"] == largest, (
        f"[{what}] largest_free_block {stats['largest_free_block']} != {largest}"
    )
    fragmentation = 1.0 - largest / free_bytes if free_bytes else 0.0
    assert stats["fragmentation"] == pytest.approx(fragmentation, abs=1e-12), (
        f"[{what}] fragmentation {stats['fragmentation']} != 1 - largest / free = {fragmentation}"
    )
    assert stats["allocated_bytes"] >= stats["requested_bytes"], f"[{what}] allocated < requested"
    if stats["segments"] == 0:
        assert stats["allocated_bytes"] == stats["active_blocks"] == 0, f"[{what}] blocks in use without segments"
    assert stats["graph_pool_bytes"] == sum(graph_pools.values()), (
        f"[{what}] graph_pool_bytes {stats['graph_pool_bytes']} != {sum(graph_pools.values())} in private segments"
    )
    assert stats["graph_pools"] >= len(graph_pools), f"[{what}] graph_pools {stats['graph_pools']} < {len(graph_pools)}"

    if live is not None:
        pending = pending or {}
        assert set(in_use) == set(live) | set(pending), (
            f"[{what}] blocks in use {sorted(map(hex, in_use))} != held {sorted(map(hex, live))} + waiting on "
            f"events {sorted(map(hex, pending))}"
        )
        assert stats["active_blocks"] == len(live), f"[{what}] active_blocks {stats['active_blocks']} != {len(live)}"
        assert stats["allocated_bytes"] == sum(b.size for b in live.values()), f"[{what}] allocated_bytes"
        assert stats["requested_bytes"] == sum(b.requested for b in live.values()), f"[{what}] requested_bytes"
        assert stats["pending_free_bytes"] == sum(pending.values()), (
            f"[{what}] pending_free_bytes {stats['pending_free_bytes']} != {sum(pending.values())}"
        )
        small_segment = {}
        for seg in segments:
            for block in seg.blocks:
                small_segment[block.address] = seg.small
        for address, b in live.items():
            block = in_use[address]
            assert block.size == b.size >= b.requested, (
                f"[{what}] block {address:#x}: snapshot size {block.size}, block_size {b.size}, requested {b.requested}"
            )
            assert block.stream == b.stream, f"[{what}] block {address:#x} on stream {block.stream}, not {b.stream}"
            if kind == "best_fit":
                assert small_segment[address] == (b.requested <= SMALL_REQUEST), (
                    f"[{what}] a request of {b.requested} bytes was served from a "
                    f"{'small' if small_segment[address] else 'large'} segment"
                )
            else:
                assert b.size == pow2_block(b.requested), f"[{what}] pow2 block of {b.size} for {b.requested} bytes"
        for address, size in pending.items():
            assert in_use[address].size == size, f"[{what}] pending block {address:#x} changed size"
    return stats


def check_everything_free(pool: Pool, what: str) -> None:
    """With nothing held: best_fit has coalesced back to whole segments, pow2 holds only free blocks; then
    empty_cache() gives every byte back."""
    stats = check_pool(pool, what, live={}, pending={})
    for seg in pool.snapshot():
        assert len(seg.blocks) == 1 and not seg.blocks[0].in_use, (
            f"[{what}] with nothing in use, segment {seg.address:#x} is {seg.blocks} instead of one free block"
        )
    released = pool.empty_cache()
    assert released == stats["reserved_bytes"], f"[{what}] empty_cache released {released} of {stats['reserved_bytes']}"
    after = check_pool(pool, what + ", after empty_cache", live={}, pending={})
    assert after["reserved_bytes"] == after["segments"] == after["free_bytes"] == 0, f"[{what}] {after}"
    assert after["device_frees"] == stats["device_frees"] + stats["segments"], f"[{what}] device_frees {after}"
    assert pool.snapshot() == [], f"[{what}] snapshot after empty_cache: {pool.snapshot()}"


class Model:
    """A pool and what the test holds in it: each operation goes through here, writes or checks the bytes and keeps
    the model that check_pool compares with."""

    def __init__(self, pool: Pool, rng: random.Random):
        self.pool = pool
        self.rng = rng
        self.live: dict[int, Live] = {}
        self.pending: dict[int, int] = {}

    def allocate(self, size: int, stream: int, may_fail: bool = False) -> int | None:
        """allocate(size, stream) with its effect on the statistics checked; None when the pool is out of memory
        and `may_fail`."""
        before = self.pool.stats()
        try:
            address = self.pool.allocate(size, stream)
        except torch.OutOfMemoryError:
            if not may_fail:
                raise
            after = self.pool.stats()
            self._after_retry(before, after)
            assert after["ooms"] == before["ooms"] + 1, f"a failed request should count in ooms: {before} -> {after}"
            for key in ("allocated_bytes", "requested_bytes", "active_blocks", "allocations", "cache_hits"):
                assert after[key] == before[key], f"a failed request of {size} bytes changed {key}: {before} -> {after}"
            return None
        after = self.pool.stats()
        if size == 0:
            assert address == 0, f"allocate(0) returned {address:#x}"
            assert after == before, f"allocate(0) changed the statistics: {before} -> {after}"
            return 0
        retried = self._after_retry(before, after)
        assert address % ALIGNMENT == 0 and address != 0, f"allocate({size}) returned {address:#x}"
        assert address not in self.live, f"allocate({size}) returned {address:#x}, which is still held"
        assert address not in self.pending, f"allocate({size}) returned {address:#x}, still waiting on events"
        block = self.pool.block_size(address)
        assert block >= size, f"block_size {block} < requested {size}"
        assert after["allocations"] == before["allocations"] + 1, "allocations did not count the request"
        assert after["ooms"] == before["ooms"], f"a request that succeeded counted as an OOM: {before} -> {after}"
        if not retried:
            grew = after["device_allocs"] - before["device_allocs"]
            assert grew in (0, 1), f"allocate({size}) made {grew} device allocations"
            assert after["cache_hits"] == before["cache_hits"] + 1 - grew, (
                f"cache_hits {before['cache_hits']} -> {after['cache_hits']} with {grew} new segments"
            )
            if not grew or self.pool.kind == "pow2":
                # best_fit gives wholly free large segments back only when it needs a new segment.
                assert after["device_frees"] == before["device_frees"], "a request served from cache released segments"
        pattern = self.rng.randbytes(EDGE)
        write_pattern(address, block, pattern)
        self.live[address] = Live(size, block, stream, pattern)
        return address

    def _after_retry(self, before: dict, after: dict) -> bool:
        """Whether the request went through the out-of-memory retry. Its second attempt synchronizes the device,
        which completes every event: then nothing waits on record_stream any more."""
        retried = after["oom_retries"] > before["oom_retries"]
        assert after["oom_retries"] - before["oom_retries"] in (0, 1), f"oom_retries {before} -> {after}"
        if retried and after["pending_free_bytes"] == 0:
            self.pending.clear()
        return retried

    def free(self, address: int) -> None:
        b = self.live.pop(address)
        check_pattern(address, b.size, b.pattern, f"free of a block of {b.requested} bytes")
        self.pool.free(address)
        if b.used_on:
            self.pending[address] = b.size
        assert self.pool.block_size(address) == 0, f"block_size of freed {address:#x} is not 0"

    def record_stream(self, address: int, stream: int) -> None:
        self.pool.record_stream(address, stream)
        b = self.live[address]
        if stream != b.stream:
            b.used_on.add(stream)

    def complete_events(self) -> None:
        self.pool.complete_events()
        self.pending.clear()

    def empty_cache(self) -> None:
        before = self.pool.stats()
        released = self.pool.empty_cache()
        after = self.check("empty_cache")
        assert released == before["reserved_bytes"] - after["reserved_bytes"], (
            f"empty_cache returned {released}, reserved went {before['reserved_bytes']} -> {after['reserved_bytes']}"
        )
        for seg in self.pool.snapshot():
            assert seg.pool != DEVICE_POOL or any(block.in_use for block in seg.blocks), (
                f"empty_cache kept the wholly free segment {seg}"
            )

    def free_all(self) -> None:
        for address in list(self.live):
            self.free(address)
        self.complete_events()

    def check(self, what: str) -> dict:
        return check_pool(self.pool, what, self.live, self.pending)


def random_size(rng: random.Random) -> int:
    r = rng.random()
    if r < 0.03:
        return 0
    if r < 0.12:
        return rng.choice(BOUNDARY_SIZES)
    return int(math.exp(rng.uniform(0.0, math.log(64 * MiB))))  # log-uniform over 1 B .. 64 MiB


STREAM_IDS = (0, 7, 0x7F00DEAD0000, 3)  # any integers on the host backend; the third looks like a pointer


# ---------------------------------------------------------------------------------------------------------------
# Randomized workloads


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("kind", KINDS)
def test_random_workload_keeps_invariants(kind, seed):
    """A few thousand random allocate / free / record_stream / complete_events / empty_cache calls on 1 to 4
    streams, sizes log-uniform from 1 B to 64 MiB plus the policy's boundaries; every invariant is checked after
    every step, and every block's bytes before it is freed."""
    rng = random.Random(1000 * seed + 17)
    streams = STREAM_IDS[: 1 + seed % 4]
    model = Model(Pool(kind), rng)
    max_live = 48
    for step in range(2500):
        op = rng.random()
        if op < 0.45 and len(model.live) < max_live:
            size = random_size(rng)
            model.allocate(size, rng.choice(streams))
            what = f"seed {seed}, step {step}: allocate({size})"
        elif op < 0.85 and model.live:
            model.free(rng.choice(list(model.live)))
            what = f"seed {seed}, step {step}: free"
        elif op < 0.95 and model.live:
            model.record_stream(rng.choice(list(model.live)), rng.choice(streams))
            what = f"seed {seed}, step {step}: record_stream"
        elif op < 0.99:
            model.complete_events()
            what = f"seed {seed}, step {step}: complete_events"
        else:
            model.empty_cache()
            what = f"seed {seed}, step {step}: empty_cache"
        model.check(what)
    for address, b in model.live.items():
        check_pattern(address, b.size, b.pattern, f"seed {seed}, end of the workload")
    model.free_all()
    check_everything_free(model.pool, f"{kind}, seed {seed}, everything freed")


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("kind", KINDS)
def test_random_workload_with_capacity_keeps_invariants(kind, seed):
    """The same with a device of 160 MiB: requests fail, the pool gives cached segments back and retries (after
    synchronizing, which completes the record_stream events), and the blocks held through all that stay intact."""
    rng = random.Random(5000 + seed)
    streams = STREAM_IDS[: 2 + seed]
    model = Model(Pool(kind, capacity=160 * MiB), rng)
    ooms = retries = 0
    for step in range(1500):
        op = rng.random()
        if op < 0.5 and len(model.live) < 32:
            size = random_size(rng)
            before = model.pool.stats()["oom_retries"]
            address = model.allocate(size, rng.choice(streams), may_fail=True)
            ooms += address is None
            retries += model.pool.stats()["oom_retries"] > before
            what = f"seed {seed}, step {step}: allocate({size}) -> {'OOM' if address is None else 'ok'}"
            if address is None or model.pool.stats()["oom_retries"] > before:
                for held, b in model.live.items():
                    check_pattern(held, b.size, b.pattern, what)
        elif op < 0.85 and model.live:
            model.free(rng.choice(list(model.live)))
            what = f"seed {seed}, step {step}: free"
        elif op < 0.97 and model.live:
            model.record_stream(rng.choice(list(model.live)), rng.choice(streams))
            what = f"seed {seed}, step {step}: record_stream"
        else:
            model.complete_events()
            what = f"seed {seed}, step {step}: complete_events"
        stats = model.check(what)
        assert stats["reserved_bytes"] <= 160 * MiB, f"[{what}] reserved {stats['reserved_bytes']} > the capacity"
    assert ooms > 0, f"the workload should run out of memory now and then: {ooms} OOMs, {retries} retries"
    model.free_all()
    check_everything_free(model.pool, f"{kind}, seed {seed}, capacity, everything freed")


def test_pool_methods_run_without_the_gil():
    """A long call into the pool (time_alloc_free's C++ loop) in one thread does not stop Python in another: every
    method of torch.classes.torchext.Pool runs with the GIL released (TorchBind drops it around the call), so the
    threads of the test below really call into the pool at the same time."""
    pool = Pool("best_fit")
    duration = []
    # Rounds for a call of about half a second on this machine (a fixed count took 0.08 s on an idle one).
    t0 = time.perf_counter()
    pool.time_alloc_free([512, 4096, 3 * MiB], live=2, rounds=20_000)
    rounds = max(20_000, int(20_000 * 0.5 / max(time.perf_counter() - t0, 1e-6)))

    def long_call() -> None:
        t0 = time.perf_counter()
        pool.time_alloc_free([512, 4096, 3 * MiB], live=2, rounds=rounds)
        duration.append(time.perf_counter() - t0)

    thread = threading.Thread(target=long_call)
    thread.start()
    largest_gap, last = 0.0, time.perf_counter()
    while thread.is_alive():
        now = time.perf_counter()
        largest_gap, last = max(largest_gap, now - last), now
    thread.join()
    assert duration[0] > 0.1, f"time_alloc_free took {duration[0]:.3f} s: too short to tell whether the GIL is held"
    assert largest_gap < duration[0] / 4, (
        f"[main thread while another runs a {duration[0]:.2f} s pool call] stalled for {largest_gap:.2f} s at once: "
        f"the pool's methods hold the GIL"
    )


# Pool methods the threads of every_method_from_threads call, besides allocate and free.
THREADED_METHODS = (
    "record_stream", "block_size", "stats", "snapshot", "empty_cache", "reset_peak_stats", "last_error", "kind",
    "backend", "time_alloc_free", "complete_events", "waits", "set_capacity",
)  # fmt: skip


def every_method_from_threads(kind: str, threads: int = 4, operations: int = 2000) -> dict:
    """Threads 1 to `threads` - 1, each on its own stream, allocate, write, check and free blocks of one pool, passing
    half of them to record_stream (on any thread's stream) before freeing them, and now and then call any other
    method. Meanwhile thread 0 plays the device: it calls complete_events over and over, and every fourth time any
    other method (THREADED_METHODS), until the others are done. set_capacity switches
    between unlimited and a capacity that makes some allocations fail. Checks the bytes of every block, that each
    stats() adds up and each snapshot() tiles its segments, and at the end that everything went back. Returns the
    number of calls per method. Run in a subprocess by the test below, so that a crash fails the test instead of
    ending the run."""
    pool = Pool(kind)
    calls = collections.Counter()
    errors: list[BaseException] = []
    done = threading.Event()
    lock = threading.Lock()

    def call_other(rng: random.Random, index: int, held: list, mine: collections.Counter) -> None:
        method = rng.choice(THREADED_METHODS)
        mine[method] += 1
        if method == "record_stream":
            if held:
                pool.record_stream(rng.choice(held)[0], 100 + rng.randrange(threads))
        elif method == "block_size":
            if held:
                address, size, _ = rng.choice(held)
                assert pool.block_size(address) == size, f"thread {index}: block_size of a held block changed"
        elif method == "stats":
            s = pool.stats()
            held_or_free = s["allocated_bytes"] + s["pending_free_bytes"] + s["free_bytes"]
            assert held_or_free == s["reserved_bytes"], f"thread {index}: stats do not add up: {s}"
        elif method == "snapshot":
            for seg in pool.snapshot():
                assert sum(b.size for b in seg.blocks) == seg.size, f"thread {index}: blocks do not tile {seg}"
        elif method == "time_alloc_free":
            with contextlib.suppress(torch.OutOfMemoryError):
                assert pool.time_alloc_free([700, 3 * MiB], live=1, rounds=2, stream=100 + index) > 0
        elif method == "set_capacity":
            pool.set_capacity(rng.choice((0, 24 * MiB)))
        elif method in ("kind", "backend"):
            assert (pool.kind, pool.backend) == (kind, "host"), f"thread {index}: kind {pool.kind}"
        else:
            getattr(pool, method)()

    def run(index: int, body) -> None:
        mine = collections.Counter()
        try:
            body(random.Random(index), index, mine)
        except BaseException as e:  # reported by the main thread
            errors.append(e)
            done.set()
        with lock:
            calls.update(mine)

    def device(rng: random.Random, index: int, mine: collections.Counter) -> None:
        while not done.is_set():  # mostly complete_events: the device is always catching up
            pool.complete_events()
            mine["complete_events"] += 1
            if rng.random() < 0.25:
                call_other(rng, index, [], mine)

    def user(rng: random.Random, index: int, mine: collections.Counter) -> None:
        held: list[tuple[int, int, bytes]] = []
        stream = 100 + index

        def free_one() -> None:
            address, size, pattern = held.pop(rng.randrange(len(held)))
            check_pattern(address, size, pattern, f"thread {index}")
            if rng.random() < 0.5:
                pool.record_stream(address, 100 + rng.randrange(threads))
                mine["record_stream"] += 1
            pool.free(address)
            mine["free"] += 1

        for _ in range(operations):
            if rng.random() < 0.1:
                call_other(rng, index, held, mine)
            elif held and (len(held) >= 16 or rng.random() < 0.45):
                free_one()
            else:
                size = int(math.exp(rng.uniform(0.0, math.log(4 * MiB))))
                try:
                    address = pool.allocate(size, stream)
                except torch.OutOfMemoryError:
                    continue
                mine["allocate"] += 1
                block = pool.block_size(address)
                assert block >= size, f"thread {index}: block_size {block} < {size}"
                pattern = rng.randbytes(EDGE)
                write_pattern(address, block, pattern)
                held.append((address, block, pattern))
        while held:
            free_one()

    workers = [threading.Thread(target=run, args=(i, user if i else device)) for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers[1:]:
        t.join()
    done.set()
    workers[0].join()
    if errors:
        raise errors[0]
    pool.complete_events()
    pool.set_capacity(0)
    check_everything_free(pool, f"{kind} after {threads} threads")
    return {method: calls[method] for method in ("allocate", "free", *THREADED_METHODS)}


def complete_events_while_threads_free(kind: str, operations: int = 5000) -> dict:
    """The crash of issue 17, as small as it gets: three threads allocate, record_stream and free as fast as they can
    while a fourth calls complete_events. Returns the number of blocks freed."""
    pool = Pool(kind)
    done = threading.Event()
    freed = collections.Counter()

    def user(index: int) -> None:
        rng = random.Random(index)
        held = []
        for _ in range(operations):
            if held and (len(held) > 16 or rng.random() < 0.5):
                address = held.pop(rng.randrange(len(held)))
                pool.record_stream(address, 100 + rng.randrange(4))
                pool.free(address)
                freed[index] += 1
            else:
                held.append(pool.allocate(rng.randrange(1, MiB), 100 + index))
        for address in held:
            pool.free(address)

    def device() -> None:
        while not done.is_set():
            pool.complete_events()

    users = [threading.Thread(target=user, args=(i,)) for i in range(3)]
    catching_up = threading.Thread(target=device)
    for t in [catching_up, *users]:
        t.start()
    for t in users:
        t.join()
    done.set()
    catching_up.join()
    pool.complete_events()
    check_everything_free(pool, f"{kind} after complete_events while 3 threads free")
    return {"freed": sum(freed.values())}


@pytest.mark.parametrize("function", ["complete_events_while_threads_free", "every_method_from_threads"])
@pytest.mark.parametrize("kind", KINDS)
def test_threads_without_the_gil(kind, function):
    """Threads calling into one pool at once, in a fresh process so that a crash fails the test. Before the host
    backend had a lock of its own, complete_events_while_threads_free crashed with a segmentation fault nearly every
    run (and every_method_from_threads now and then)."""
    code = (
        f"import json, sys; sys.path.insert(0, {TESTS!r}); import test_memory; "
        f"print(json.dumps(test_memory.{function}({kind!r})))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, (
        f"[{function}, {kind} pool] the process exited with {proc.returncode} (negative: killed by that signal, -11 "
        f"is a segmentation fault):\n{proc.stderr[-4000:]}"
    )
    calls = json.loads(proc.stdout.strip().splitlines()[-1])
    assert all(calls.values()), f"[{function}, {kind} pool] methods never called: {calls}"


# ---------------------------------------------------------------------------------------------------------------
# Best-fit policy: segment sizes, small/large separation, best fit, splitting and coalescing


def segment_of(pool: Pool, address: int):
    for seg in pool.snapshot():
        if seg.address <= address < seg.address + seg.size:
            return seg
    raise AssertionError(f"no segment holds {address:#x}")


@pytest.mark.parametrize(
    "request_size, segment_size, small",
    [
        (1, SMALL_SEGMENT, True),
        (512, SMALL_SEGMENT, True),
        (513, SMALL_SEGMENT, True),
        (SMALL_REQUEST - 1, SMALL_SEGMENT, True),
        (SMALL_REQUEST, SMALL_SEGMENT, True),
        (SMALL_REQUEST + 1, 2 * MiB, False),
        (3 * MiB, 4 * MiB, False),
        (10 * MiB - ALIGNMENT, 10 * MiB, False),
        (10 * MiB - 1, 10 * MiB, False),
        (10 * MiB, 10 * MiB, False),
        (10 * MiB + 1, 12 * MiB, False),
        (11 * MiB, 12 * MiB, False),
        (64 * MiB, 64 * MiB, False),
        (64 * MiB + 1, 66 * MiB, False),
    ],
)
def test_best_fit_segment_sizes(request_size, segment_size, small):
    pool = Pool("best_fit")
    address = pool.allocate(request_size)
    seg = segment_of(pool, address)
    assert (seg.size, seg.small) == (segment_size, small), (
        f"a request of {request_size} bytes got a {'small' if seg.small else 'large'} segment of {seg.size} bytes, "
        f"expected a {'small' if small else 'large'} one of {segment_size}"
    )
    assert seg.address == address, "the first block of a new segment starts at the segment"
    block = pool.block_size(address)
    wanted = round_up(request_size, ALIGNMENT)
    # A large segment keeps a remainder of at most a small request with the block (it could serve nothing else).
    slack = 0 if small else SMALL_REQUEST
    assert wanted <= block <= wanted + slack, f"block of {block} bytes for a request of {request_size}"
    check_pool(pool, f"request of {request_size}")


def test_best_fit_small_requests_pack_into_2mib_segments():
    pool = Pool("best_fit")
    a, b = pool.allocate(SMALL_REQUEST), pool.allocate(SMALL_REQUEST)
    assert segment_of(pool, a) == segment_of(pool, b) and pool.stats()["segments"] == 1, (
        "two 1 MiB requests should share one 2 MiB segment"
    )
    c = pool.allocate(1)
    assert pool.stats()["segments"] == 2 and segment_of(pool, c).small, "a third small request needs a new segment"
    addresses = [pool.allocate(4 * KiB) for _ in range(SMALL_SEGMENT // (4 * KiB) - 1)]
    assert {segment_of(pool, x).address for x in addresses} == {segment_of(pool, c).address}, (
        "4 KiB requests should fill the 2 MiB segment that the 1-byte request opened"
    )
    check_pool(pool, "small requests")


def test_best_fit_large_requests_share_free_space_in_large_segments():
    pool = Pool("best_fit")
    big = pool.allocate(20 * MiB)
    pool.free(big)  # a 20 MiB free segment, split below for 2-9 MiB requests
    addresses = [pool.allocate(n) for n in (2 * MiB, 3 * MiB, 4 * MiB, 9 * MiB)]
    segs = {segment_of(pool, x).address for x in addresses}
    assert segs == {big}, f"requests of 2-9 MiB should be carved out of the free 20 MiB segment, got {pool.snapshot()}"
    check_pool(pool, "large requests in a free segment")


def test_best_fit_gives_back_whole_free_large_segments_before_growing():
    pool = Pool("best_fit")
    a, b = pool.allocate(4 * MiB), pool.allocate(6 * MiB)
    pool.free(a)  # a wholly free 4 MiB segment that cannot hold the next request
    before = pool.stats()
    c = pool.allocate(8 * MiB)
    after = pool.stats()
    assert after["device_frees"] == before["device_frees"] + 1, "the unusable free 4 MiB segment should be released"
    assert after["reserved_bytes"] == 6 * MiB + 8 * MiB, f"reserved {after['reserved_bytes']} bytes"
    pool.free(b)
    pool.free(c)
    small = pool.allocate(1 * KiB)
    assert pool.stats()["reserved_bytes"] == SMALL_SEGMENT, "a small miss also gives back the free large segments"
    pool.free(small)
    check_pool(pool, "release before growing")


def test_best_fit_small_and_large_never_share_a_segment():
    pool = Pool("best_fit")
    big = pool.allocate(5 * MiB)
    pool.free(pool.allocate(20 * MiB))  # a free large segment a small request could have used
    tiny = pool.allocate(1 * KiB)
    assert not segment_of(pool, big).small and segment_of(pool, tiny).small, "1 KiB must come from a small segment"
    assert segment_of(pool, big) != segment_of(pool, tiny) and pool.stats()["segments"] == 2, (
        "a small request must not be carved from the free part of a large segment"
    )
    pool.free(tiny)  # the small segment is now one free 2 MiB block
    two = pool.allocate(2 * MiB)
    assert not segment_of(pool, two).small, "a 2 MiB request must not take the small segment's free 2 MiB block"
    one = pool.allocate(SMALL_REQUEST)
    assert segment_of(pool, one).small, "a 1 MiB request comes from the small segment"
    check_pool(pool, "small and large")


def test_best_fit_takes_the_smallest_free_block_that_fits_small():
    pool = Pool("best_fit")
    # holes of 8, 4 and 16 KiB, separated by 512-byte blocks that stay in use, then the rest of the segment
    layout = [8 * KiB, 512, 4 * KiB, 512, 16 * KiB, 512]
    addresses = [pool.allocate(n) for n in layout]
    for a, b, n in zip(addresses, addresses[1:], layout):
        assert b == a + n, "consecutive requests in a fresh segment should be adjacent"
    hole8, hole4, hole16 = addresses[0], addresses[2], addresses[4]
    for hole in (hole8, hole4, hole16):
        pool.free(hole)
    check_pool(pool, "holes")
    assert pool.allocate(3 * KiB) == hole4, "3 KiB should take the 4 KiB hole, the smallest that fits"
    assert pool.allocate(6 * KiB) == hole8, "6 KiB should take the 8 KiB hole"
    assert pool.allocate(16 * KiB) == hole16, "16 KiB should take the 16 KiB hole exactly"
    rest = addresses[-1] + 512
    assert pool.allocate(20 * KiB) == rest, "20 KiB fits no hole and should come from the rest of the segment"
    check_pool(pool, "best fit, small")


def test_best_fit_takes_the_smallest_free_block_that_fits_large():
    pool = Pool("best_fit")
    pool.free(pool.allocate(20 * MiB))  # one free 20 MiB segment
    layout = [2 * MiB, 2 * MiB, 3 * MiB, 2 * MiB, 5 * MiB, 2 * MiB]  # 16 MiB of the 20 MiB segment, 4 MiB left
    addresses = [pool.allocate(n) for n in layout]
    assert len({segment_of(pool, x).address for x in addresses}) == 1, "the layout should fit one 20 MiB segment"
    hole2, hole3, hole5 = addresses[0], addresses[2], addresses[4]
    rest = addresses[-1] + 2 * MiB
    for hole in (hole2, hole3, hole5):
        pool.free(hole)
    stats = check_pool(pool, "large holes")
    assert stats["largest_free_block"] == 5 * MiB, "the free blocks are 2, 3, 4 and 5 MiB"
    assert pool.allocate(2 * MiB + 512 * KiB) == hole3, "2.5 MiB should take the 3 MiB hole"
    assert pool.allocate(4 * MiB + 512 * KiB) == hole5, "4.5 MiB should take the 5 MiB hole"
    assert pool.allocate(3 * MiB + 512 * KiB) == rest, "3.5 MiB should take the 4 MiB rest of the segment"
    assert pool.allocate(2 * MiB) == hole2, "2 MiB should take the 2 MiB hole"
    assert pool.stats()["segments"] == 1, "every request should have been served from the one segment"
    check_pool(pool, "best fit, large")


@pytest.mark.parametrize("order", ["B,A,C", "B,C,A", "A,C,B"])
def test_best_fit_splits_and_coalesces(order):
    pool = Pool("best_fit")
    blocks = {name: pool.allocate(4 * KiB) for name in "ABC"}
    a = blocks["A"]
    assert blocks["B"] == a + 4 * KiB and blocks["C"] == a + 8 * KiB, "A, B, C should be adjacent"
    seg = segment_of(pool, a)
    assert [b.size for b in seg.blocks] == [4 * KiB] * 3 + [SMALL_SEGMENT - 12 * KiB], f"split: {seg.blocks}"
    freed = set()
    for name in order.split(","):
        pool.free(blocks[name])
        freed.add(name)
        check_pool(pool, f"after freeing {sorted(freed)}")
        seg = segment_of(pool, a)
        # Expected layout: runs of freed neighbours (and C with the free rest) merge into one free block.
        expected = []
        for part in "ABC":
            in_use = part not in freed
            if expected and not in_use and not expected[-1][1]:
                expected[-1] = (expected[-1][0] + 4 * KiB, False)
            else:
                expected.append((4 * KiB, in_use))
        rest = SMALL_SEGMENT - 12 * KiB
        if expected[-1][1]:
            expected.append((rest, False))
        else:
            expected[-1] = (expected[-1][0] + rest, False)
        actual = [(b.size, b.in_use) for b in seg.blocks]
        assert actual == expected, f"freeing {order} up to {name}: blocks {actual}, expected {expected}"
    assert [(b.size, b.in_use) for b in segment_of(pool, a).blocks] == [(SMALL_SEGMENT, False)], "not coalesced"
    check_everything_free(pool, f"split and coalesce {order}")


def test_best_fit_merges_a_free_neighbour_of_another_stream():
    pool = Pool("best_fit")
    a = pool.allocate(4 * KiB, stream=0)
    b = pool.allocate(8 * KiB, stream=0)
    c = pool.allocate(512, stream=7)  # takes stream 0's free rest of the segment, after an event wait
    pool.free(a)
    pool.free(b)  # a and b merge: one free 12 KiB block of stream 0, before c
    waits_before = len(pool.waits())
    pool.free(c)  # c's free neighbours: stream 0's 12 KiB before it, stream 7's rest after it
    blocks = [(blk.size, blk.in_use) for blk in segment_of(pool, a).blocks]
    assert blocks == [(SMALL_SEGMENT, False)], (
        f"freeing c on stream 7 should merge it with both free neighbours (the one before it is stream 0's), "
        f"got blocks {blocks}"
    )
    assert pool.waits()[waits_before:] == [(7, 0)], f"merging with stream 0's block waits on it: {pool.waits()}"
    check_everything_free(pool, "merge across streams")


def test_best_fit_coalesces_across_streams():
    """Neighbours freed on different streams merge (after an event wait), so freeing everything gives whole
    segments back, whatever the streams."""
    pool = Pool("best_fit")
    rng = random.Random(5)
    held = []
    for i in range(200):
        size = rng.choice([512, 3000, 64 * KiB, 700 * KiB, 2 * MiB, 3 * MiB + 7, 12 * MiB])
        held.append(pool.allocate(size, stream=1 + i % 3))
    rng.shuffle(held)
    for address in held:
        pool.free(address)
    assert pool.stats()["cross_stream_reuses"] > 0, "this workload should merge blocks of different streams"
    assert any(waiter != on for waiter, on in pool.waits()), "merging across streams should wait on an event"
    check_everything_free(pool, "three streams")


# ---------------------------------------------------------------------------------------------------------------
# pow2


def test_pow2_rounds_every_request_to_a_power_of_two():
    pool = Pool("pow2")
    for n in (1, 511, 512, 513, 1000, 4097, SMALL_REQUEST, SMALL_REQUEST + 1, 10 * MiB, 64 * MiB + 1):
        address = pool.allocate(n)
        assert pool.block_size(address) == pow2_block(n), (
            f"pow2 block for {n} bytes is {pool.block_size(address)}, expected {pow2_block(n)}"
        )
        stats = check_pool(pool, f"pow2 request of {n}")
        assert stats["reserved_bytes"] >= stats["allocated_bytes"] >= stats["requested_bytes"], f"{stats}"


def test_pow2_costs_more_memory_than_best_fit():
    """Sizes just above a power of two (1.1 * 2^k) nearly double under pow2 rounding; best fit loses far less."""
    rng = random.Random(3)
    sizes = [int(1.1 * 2**k) for k in range(9, 25) for _ in range(3)]
    rng.shuffle(sizes)
    ratio = {}
    for kind in KINDS:
        pool = Pool(kind)
        held = [pool.allocate(n) for n in sizes]
        stats = check_pool(pool, f"{kind} overhead workload")
        ratio[kind] = stats["reserved_bytes_peak"] / stats["requested_bytes_peak"]
        for address in held:
            pool.free(address)
        check_everything_free(pool, f"{kind} overhead workload")
    rounded = sum(pow2_block(n) for n in sizes) / sum(sizes)
    assert ratio["pow2"] == pytest.approx(rounded), (
        f"pow2 reserved/requested {ratio['pow2']:.3f} should be the rounding's {rounded:.3f} (one block per request)"
    )
    assert ratio["pow2"] > ratio["best_fit"], (
        f"pow2 should reserve more per requested byte than best_fit: {ratio['pow2']:.3f} vs {ratio['best_fit']:.3f}"
    )


# ---------------------------------------------------------------------------------------------------------------
# Streams (host backend: an event completes only on complete_events())


@pytest.mark.parametrize("kind", KINDS)
def test_freed_block_is_reused_at_once_on_its_stream(kind):
    pool = Pool(kind)
    a = pool.allocate(3000, stream=1)
    pool.free(a)
    assert pool.allocate(3000, stream=1) == a, "a block freed on stream 1 should be reused at once on stream 1"
    assert pool.waits() == [], f"reuse on the same stream needs no event wait, got {pool.waits()}"
    stats = check_pool(pool, "same-stream reuse")
    assert (stats["device_allocs"], stats["cache_hits"]) == (1, 1), f"{stats}"


@pytest.mark.parametrize("size", [3000, 3 * MiB])
def test_best_fit_other_stream_takes_free_memory_after_an_event_wait(size):
    pool = Pool("best_fit")
    a = pool.allocate(size, stream=1)
    pool.free(a)
    b = pool.allocate(size, stream=2)
    assert b == a, f"stream 2 should get stream 1's free memory ({a:#x}), got {b:#x}"
    assert pool.waits() == [(2, 1)], f"taking stream 1's block on stream 2 must wait on stream 1, got {pool.waits()}"
    stats = check_pool(pool, "cross-stream reuse")
    assert stats["device_allocs"] == 1 and stats["cross_stream_reuses"] == 1, f"{stats}"
    assert [blk.stream for blk in segment_of(pool, b).blocks if blk.address == b] == [2], "the block is stream 2's now"


def test_best_fit_prefers_the_streams_own_free_blocks():
    pool = Pool("best_fit")
    mine = pool.allocate(8 * KiB, stream=2)
    pool.allocate(512, stream=2)  # keeps the two free blocks apart
    others = pool.allocate(4 * KiB, stream=1)
    pool.allocate(512, stream=1)  # keeps `others` apart from the free rest of the segment
    pool.free(mine)
    pool.free(others)
    check_pool(pool, "two free blocks on two streams")
    waits_before = len(pool.waits())
    assert pool.allocate(4 * KiB, stream=2) == mine, (
        "stream 2 should reuse its own 8 KiB block rather than stream 1's 4 KiB one (which would cost an event wait)"
    )
    assert len(pool.waits()) == waits_before, f"reusing its own block needs no event wait: {pool.waits()}"
    assert pool.allocate(4 * KiB, stream=1) == others, "stream 1 should reuse its own block"


@pytest.mark.parametrize("kind", KINDS)
def test_record_stream_delays_reuse_until_events_complete(kind):
    pool = Pool(kind)
    a = pool.allocate(3000, stream=1)
    size = pool.block_size(a)
    pool.record_stream(a, 2)
    pool.record_stream(a, 3)
    pool.free(a)
    stats = check_pool(pool, "pending", live={}, pending={a: size})
    assert stats["pending_free_bytes"] == size and stats["allocated_bytes"] == 0, f"{stats}"
    b = pool.allocate(3000, stream=1)
    c = pool.allocate(3000, stream=2)
    assert a not in (b, c), "a block used on other streams must not be reused before their events complete"
    assert pool.empty_cache() == 0, "empty_cache must not release memory that is waiting on events"
    assert any(blk.address == a and blk.in_use for seg in pool.snapshot() for blk in seg.blocks), (
        "the pending block disappeared from the snapshot"
    )
    pool.free(c)
    pool.complete_events()
    stats = pool.stats()
    assert stats["pending_free_bytes"] == 0, f"after complete_events nothing should wait: {stats}"
    assert pool.allocate(3000, stream=1) == a, "after complete_events the block should be reusable"
    pool.free(a)
    pool.free(b)
    check_everything_free(pool, "record_stream")


@pytest.mark.parametrize("kind", KINDS)
def test_record_stream_on_the_blocks_own_stream_is_a_no_op(kind):
    pool = Pool(kind)
    a = pool.allocate(3000, stream=1)
    pool.record_stream(a, 1)
    pool.free(a)
    assert pool.stats()["pending_free_bytes"] == 0, "record_stream on the block's own stream must not delay reuse"
    assert pool.allocate(3000, stream=1) == a, "the block should be reused at once"
    assert pool.waits() == [], f"no event wait expected, got {pool.waits()}"


# ---------------------------------------------------------------------------------------------------------------
# Statistics


@pytest.mark.parametrize("kind", KINDS)
def test_stats_count_allocations_hits_and_device_calls(kind):
    pool = Pool(kind)
    assert (pool.kind, pool.backend) == (kind, "host"), f"Pool({kind!r}) is a {pool.kind} pool on {pool.backend}"
    a = pool.allocate(1000)
    s = pool.stats()
    assert (s["allocations"], s["cache_hits"], s["device_allocs"], s["segments"]) == (1, 0, 1, 1), f"{s}"
    assert (s["requested_bytes"], s["allocated_bytes"], s["active_blocks"]) == (1000, 1024, 1), f"{s}"
    pool.free(a)
    b = pool.allocate(1000)
    s = pool.stats()
    assert (s["allocations"], s["cache_hits"], s["device_allocs"]) == (2, 1, 1), f"reuse is a cache hit: {s}"
    c = pool.allocate(1000)
    s = pool.stats()
    # best_fit splits the segment it holds; pow2 needs one device allocation per live block
    expected = (3, 2, 1) if kind == "best_fit" else (3, 1, 2)
    assert (s["allocations"], s["cache_hits"], s["device_allocs"]) == expected, f"{s}"
    pool.free(b)
    pool.free(c)
    segments = pool.stats()["segments"]
    pool.empty_cache()
    s = pool.stats()
    assert s["device_frees"] == segments and s["segments"] == 0, f"{s}"
    assert s["allocated_bytes_peak"] == 2048 and s["requested_bytes_peak"] == 2000, f"{s}"


@pytest.mark.parametrize("kind", KINDS)
def test_reset_peak_stats_sets_peaks_to_current(kind):
    pool = Pool(kind)
    small = pool.allocate(1000)
    big = pool.allocate(5 * MiB)
    pool.free(big)
    s = pool.stats()
    assert s["allocated_bytes_peak"] > s["allocated_bytes"] and s["requested_bytes_peak"] > s["requested_bytes"], f"{s}"
    pool.reset_peak_stats()
    s = pool.stats()
    for key in ("allocated_bytes", "requested_bytes", "reserved_bytes"):
        assert s[f"{key}_peak"] == s[key], f"after reset_peak_stats, {key}_peak {s[f'{key}_peak']} != {s[key]}"
    pool.free(small)
    pool.empty_cache()
    s = pool.stats()
    assert s["reserved_bytes_peak"] > 0 == s["reserved_bytes"], f"the peak stays until the next reset: {s}"


@pytest.mark.parametrize("kind", KINDS)
def test_time_alloc_free_returns_a_positive_time(kind):
    pool = Pool(kind)
    ns = pool.time_alloc_free([512, 4 * KiB, 1 * MiB, 3 * MiB], live=3, rounds=20)
    assert isinstance(ns, float) and ns > 0, f"time_alloc_free returned {ns!r}"
    s = check_pool(pool, "after time_alloc_free", live={}, pending={})
    assert s["allocations"] == 4 * 21, f"one warm-up round and 20 timed rounds of 4 sizes: {s['allocations']}"
    with pytest.raises(ValueError, match="sizes"):
        pool.time_alloc_free([], live=0, rounds=1)


# ---------------------------------------------------------------------------------------------------------------
# Zero bytes and errors


@pytest.mark.parametrize("kind", KINDS)
def test_zero_bytes_and_free_of_null(kind):
    pool = Pool(kind)
    a = pool.allocate(100, stream=3)
    before = pool.stats()
    assert pool.allocate(0) == 0 and pool.allocate(0, stream=3) == 0, "allocate(0) should return 0"
    pool.free(0)
    assert pool.stats() == before, "0-byte requests and free(0) must not change any statistic"
    assert pool.block_size(0) == 0, "block_size(0) should be 0"
    pool.free(a)


@pytest.mark.parametrize("kind", KINDS)
def test_bad_pointers_raise_value_error(kind):
    pool = Pool(kind)
    a = pool.allocate(4 * KiB, stream=1)
    unknown = "was not allocated by this .* pool, or was already freed"
    with pytest.raises(ValueError, match="free: pointer .*" + unknown):
        pool.free(a + 512)  # inside a block, but not a block's start
    with pytest.raises(ValueError, match=unknown):
        pool.free(0x1000)
    with pytest.raises(ValueError, match="record_stream: pointer .*" + unknown):
        pool.record_stream(a + 512, 2)
    pool.record_stream(a, 2)
    pool.free(a)
    with pytest.raises(ValueError, match=unknown):
        pool.free(a)  # freed, waiting on stream 2's events
    with pytest.raises(ValueError, match=unknown):
        pool.record_stream(a, 3)
    pool.complete_events()
    with pytest.raises(ValueError, match=unknown):
        pool.free(a)
    assert pool.block_size(a) == 0, "block_size of a freed block should be 0"
    check_everything_free(pool, "after bad pointers")


def test_bad_arguments_raise_value_error():
    with pytest.raises(ValueError, match="kind must be 'best_fit' or 'pow2', got 'buddy'"):
        Pool("buddy")
    with pytest.raises(ValueError, match="backend.* must be 'host' or 'cuda', got 'tpu'"):
        Pool("best_fit", backend="tpu")


def _with_block(call):
    """call(pool, address) on a fresh pool holding one 4 KiB block."""

    def run():
        pool = Pool("best_fit")
        return call(pool, pool.allocate(4 * KiB, stream=1))

    return run


def _enter(context_manager) -> None:
    with context_manager:
        pass


# (call, exception, words the message must contain): every public entry of torchext.memory, every argument. Those
# with a `device` are checked before CUDA is needed, so they run on machines without a GPU too.
BAD_ARGUMENTS = {
    "allocate(2**64)": (lambda: Pool().allocate(2**64), OverflowError, r"Pool.allocate: `size` must be less than 2"),
    "allocate(2**63)": (lambda: Pool().allocate(2**63), OverflowError, r"`size` must be less than 2\*\*63, got 9223"),
    "allocate(-1)": (lambda: Pool().allocate(-1), ValueError, "Pool.allocate: `size` must be >= 0, got -1"),
    "allocate(1.5)": (lambda: Pool().allocate(1.5), TypeError, "Pool.allocate: `size` must be an int, got float 1.5"),
    "allocate('10')": (lambda: Pool().allocate("10"), TypeError, "`size` must be an int, got str '10'"),
    "allocate(True)": (lambda: Pool().allocate(True), TypeError, "`size` must be an int, got bool True"),
    "allocate(None)": (lambda: Pool().allocate(None), TypeError, "`size` must be an int, got NoneType None"),
    "allocate(tensor)": (lambda: Pool().allocate(torch.tensor(8)), TypeError, "`size` must be an int, got Tensor"),
    "allocate(stream=1.0)": (
        lambda: Pool().allocate(8, stream=1.0), TypeError,
        "Pool.allocate: `stream` must be None, an int or a torch.cuda.Stream, got float 1.0",
    ),
    "allocate(stream=True)": (lambda: Pool().allocate(8, stream=True), TypeError, "`stream` must be None, an int"),
    "allocate(stream=-1)": (lambda: Pool().allocate(8, stream=-1), ValueError, "`stream` must be >= 0, got -1"),
    "allocate(stream=2**64)": (lambda: Pool().allocate(8, stream=2**64), OverflowError, "`stream` must be less than"),
    "free(None)": (lambda: Pool().free(None), TypeError, "Pool.free: `address` must be an int, got NoneType None"),
    "free(1.0)": (lambda: Pool().free(1.0), TypeError, "Pool.free: `address` must be an int, got float"),
    "free('0')": (lambda: Pool().free("0"), TypeError, "`address` must be an int, got str '0'"),
    "free(False)": (lambda: Pool().free(False), TypeError, "`address` must be an int, got bool False"),
    "free(-512)": (lambda: Pool().free(-512), ValueError, "Pool.free: `address` must be >= 0, got -512"),
    "free(2**64)": (lambda: Pool().free(2**64), OverflowError, "Pool.free: `address` must be less than 2"),
    "record_stream(None, 2)": (
        lambda: Pool().record_stream(None, 2), TypeError, "Pool.record_stream: `address` must be an int, got NoneType"
    ),
    "record_stream(a, 'x')": (
        _with_block(lambda pool, a: pool.record_stream(a, "x")), TypeError,
        "Pool.record_stream: `stream` must be None, an int or a torch.cuda.Stream, got str 'x'",
    ),
    "record_stream(a, -2)": (
        _with_block(lambda pool, a: pool.record_stream(a, -2)), ValueError, "`stream` must be >= 0, got -2"
    ),
    "block_size(1.5)": (lambda: Pool().block_size(1.5), TypeError, "Pool.block_size: `address` must be an int"),
    "block_size(2**64)": (lambda: Pool().block_size(2**64), OverflowError, "Pool.block_size: `address` must be less"),
    "set_capacity(-1)": (lambda: Pool().set_capacity(-1), ValueError, "Pool.set_capacity: `capacity` must be >= 0"),
    "set_capacity(1.5)": (lambda: Pool().set_capacity(1.5), TypeError, "`capacity` must be an int, got float 1.5"),
    "set_capacity(2**64)": (lambda: Pool().set_capacity(2**64), OverflowError, "`capacity` must be less than 2"),
    "time_alloc_free(512)": (
        lambda: Pool().time_alloc_free(512), TypeError, "Pool.time_alloc_free: `sizes` must be a list of ints, got int"
    ),
    "time_alloc_free([1.5])": (
        lambda: Pool().time_alloc_free([512, 1.5]), TypeError, r"`sizes\[1\]` must be an int, got float 1.5"
    ),
    "time_alloc_free([-1])": (lambda: Pool().time_alloc_free([-1]), ValueError, r"`sizes\[0\]` must be >= 0"),
    "time_alloc_free([])": (lambda: Pool().time_alloc_free([]), ValueError, "`sizes` must not be empty"),
    "time_alloc_free(live=-1)": (
        lambda: Pool().time_alloc_free([512], live=-1), ValueError, "`live` must be >= 0, got -1"
    ),
    "time_alloc_free(rounds=0)": (
        lambda: Pool().time_alloc_free([512], rounds=0), ValueError, "`rounds` must be >= 1, got 0"
    ),
    "time_alloc_free(stream='s')": (
        lambda: Pool().time_alloc_free([512], stream="s"), TypeError, "Pool.time_alloc_free: `stream` must be None"
    ),
    "Pool(kind=1)": (lambda: Pool(1), TypeError, "torchext.memory.Pool: `kind` must be a str, got int 1"),
    "Pool(backend=None)": (lambda: Pool(backend=None), TypeError, "Pool: `backend` must be a str, got NoneType"),
    "Pool(device='0')": (lambda: Pool(device="0"), TypeError, "Pool: `device` must be an int, got str '0'"),
    "Pool(capacity=-1)": (lambda: Pool(capacity=-1), ValueError, "Pool: `capacity` must be >= 0"),
    "Pool(capacity=1.5)": (lambda: Pool(capacity=1.5), TypeError, "Pool: `capacity` must be an int, got float"),
    "Pool(capacity=2**64)": (lambda: Pool(capacity=2**64), OverflowError, "`capacity` must be less than 2"),
    "device_pool(1.5)": (
        lambda: memory.device_pool(1.5), TypeError,
        "device_pool: `device` must be None, an int, a str or a torch.device, got float 1.5",
    ),
    "device_pool(True)": (lambda: memory.device_pool(True), TypeError, "device_pool: `device` must be None, an int"),
    "device_pool(-1)": (lambda: memory.device_pool(-1), ValueError, "device_pool: `device` must be >= 0, got -1"),
    "device_pool('cpu')": (lambda: memory.device_pool("cpu"), ValueError, "`device` must be a CUDA device, got cpu"),
    "device_pool('gpu7')": (lambda: memory.device_pool("gpu7"), ValueError, "device_pool: `device` 'gpu7' is not a"),
    "stats([0])": (lambda: memory.stats([0]), TypeError, "torchext.memory.stats: `device` must be None, an int"),
    "reset_peak_stats(1.5)": (lambda: memory.reset_peak_stats(1.5), TypeError, "reset_peak_stats: `device` must be"),
    "empty_cache(cpu)": (
        lambda: memory.empty_cache(torch.device("cpu")), ValueError, "empty_cache: `device` must be a CUDA device"
    ),
    "pool_scope(1.5)": (lambda: _enter(memory.pool_scope(1.5)), TypeError, "pool_scope: `device` must be None"),
    "enable_pool(1)": (lambda: memory.enable_pool(1), TypeError, "enable_pool: `kind` must be a str, got int 1"),
    "enable_pool('buddy')": (
        lambda: memory.enable_pool("buddy"), ValueError, r"enable_pool: `kind` must be one of \('best_fit', 'pow2'\)"
    ),
    "load_trace(None)": (lambda: memory.load_trace(None), TypeError, "load_trace: `path` must be a str or a path"),
    "replay_trace(allocate=None)": (
        lambda: memory.replay_trace([], None, print), TypeError, "replay_trace: `allocate` must be callable, got None"
    ),
    "replay_trace(free=1)": (
        lambda: memory.replay_trace([], print, 1), TypeError, "replay_trace: `free` must be callable, got int 1"
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD_ARGUMENTS)
def test_bad_argument_raises_a_clear_error(case):
    call, exception, words = BAD_ARGUMENTS[case]
    with pytest.raises(exception, match=words):
        call()


def test_free_of_zero_is_a_no_op_and_of_none_a_type_error():
    """The rule of Pool.free's docstring: 0 is the address of a 0-byte allocation, so free(allocate(0)) does nothing;
    None is never an address."""
    pool = Pool("best_fit")
    a = pool.allocate(100)
    before = pool.stats()
    pool.free(pool.allocate(0))
    assert pool.stats() == before, "free(allocate(0)) must not change any statistic"
    with pytest.raises(TypeError, match="`address` must be an int"):
        pool.free(None)
    assert pool.stats() == before, "a rejected free(None) must not change any statistic"
    pool.free(a)


@pytest.mark.skipif(_loader.built_with_cuda(), reason="checks the CPU-only build")
def test_cuda_backend_needs_a_cuda_build():
    with pytest.raises(RuntimeError, match="needs a torchext build with CUDA"):
        Pool("best_fit", backend="cuda")


# ---------------------------------------------------------------------------------------------------------------
# Out of memory (the host backend's capacity)


@pytest.mark.parametrize("kind", KINDS)
def test_oom_raises_with_the_pool_statistics_and_the_pool_keeps_working(kind):
    pool = Pool(kind, capacity=32 * MiB)
    held = pool.allocate(8 * MiB)
    write_pattern(held, pool.block_size(held), b"\xa5" * EDGE)
    with pytest.raises(torch.OutOfMemoryError) as info:
        pool.allocate(64 * MiB)
    message = str(info.value)
    for word in ("out of memory", "64.00 MiB", "reserved", "allocated", kind):
        assert word in message, f"the OOM message should mention {word!r}: {message}"
    assert pool.last_error() in message, "last_error() should hold the message"
    s = pool.stats()
    assert (s["ooms"], s["oom_retries"]) == (1, 1), f"{s}"
    assert s["device_allocs"] >= 2, f"failed device allocations count too: {s}"
    check_pool(pool, "after OOM")
    others = [pool.allocate(n) for n in (100, 3 * MiB, 1 * MiB)]
    for address in others:
        pool.free(address)
    check_pattern(held, pool.block_size(held), b"\xa5" * EDGE, "block held across an OOM")
    pool.free(held)
    check_everything_free(pool, "after OOM")


def test_last_error_is_the_calling_threads():
    """Each thread reads the reason of its own last failed allocation, not that of another thread failing since (as
    cudaGetLastError is per thread); a thread that never failed reads ""."""
    pool = Pool("best_fit", capacity=16 * MiB)
    seen = {}

    def in_thread(name: str, size: int) -> None:
        def run() -> None:
            try:
                pool.allocate(size)
            except torch.OutOfMemoryError as e:
                seen[name + " raised"] = str(e)
            seen[name] = pool.last_error()

        thread = threading.Thread(target=run)
        thread.start()
        thread.join()

    with pytest.raises(torch.OutOfMemoryError):
        pool.allocate(40 * MiB)  # this thread first
    in_thread("other", 24 * MiB)  # then another thread
    in_thread("never failed", 0)
    assert "tried to allocate 24.00 MiB" in seen["other"] and seen["other"] in seen["other raised"], f"[other] {seen}"
    assert "tried to allocate 40.00 MiB" in pool.last_error(), f"[this thread] last_error: {pool.last_error()}"
    assert seen["never failed"] == "", f"[a thread that never failed] last_error: {seen['never failed']!r}"


@pytest.mark.parametrize("kind", KINDS)
def test_oom_frees_cached_segments_and_retries(kind):
    # Cached blocks the request cannot use: small ones (best_fit gives free large segments back before it grows,
    # so only small segments are still cached when the device runs out) or, for pow2, smaller power-of-two blocks.
    pool = Pool(kind, capacity=40 * MiB)
    size = 1 * MiB if kind == "best_fit" else 16 * MiB
    cached = [pool.allocate(size), pool.allocate(size)]
    if kind == "best_fit":
        cached += [pool.allocate(size) for _ in range(14)]  # 16 x 1 MiB: 8 small segments of 2 MiB
    for address in cached:
        pool.free(address)
    before = pool.stats()
    reserved = 16 * MiB if kind == "best_fit" else 32 * MiB
    assert before["reserved_bytes"] == reserved and before["device_frees"] == 0, f"{before}"
    # 30 MiB fits none of the cached blocks, and fits the device only once they are given back.
    address = pool.allocate(30 * MiB if kind == "best_fit" else 20 * MiB)
    s = check_pool(pool, "after the retry")
    assert (s["oom_retries"], s["ooms"]) == (1, 0), f"one retry, no failure expected: {s}"
    assert s["device_frees"] == (8 if kind == "best_fit" else 2) and s["segments"] == 1, (
        f"all cached segments should have been released: {s}"
    )
    assert s["reserved_bytes"] == pool.block_size(address), f"{s}"
    pool.free(address)
    check_everything_free(pool, "after the retry")


@pytest.mark.parametrize("kind", KINDS)
def test_oom_waits_for_record_stream_events(kind):
    """Out of memory with a block waiting on record_stream events: the retry synchronizes the device, which
    completes the events, and the request gets the block."""
    pool = Pool(kind, capacity=40 * MiB)
    a = pool.allocate(24 * MiB, stream=1)
    pool.record_stream(a, 2)
    pool.free(a)
    assert pool.stats()["pending_free_bytes"] > 0
    assert pool.allocate(24 * MiB, stream=1) == a, "the retry should synchronize and reuse the pending block"
    s = check_pool(pool, "after the synchronizing retry")
    assert (s["oom_retries"], s["ooms"], s["pending_free_bytes"]) == (1, 0, 0), f"{s}"
    pool.free(a)
    check_everything_free(pool, "after the synchronizing retry")


@pytest.mark.parametrize("kind", KINDS)
def test_request_larger_than_any_device_raises_oom(kind):
    pool = Pool(kind)
    with pytest.raises(torch.OutOfMemoryError, match="out of memory"):
        pool.allocate(2**63 - 1)
    assert pool.stats()["ooms"] == 1
    check_everything_free(pool, "after an impossible request")


# ---------------------------------------------------------------------------------------------------------------
# Two bugs these tests found (both fixed): a timing loop that lost blocks when an allocation failed, and negative
# figures in out-of-memory messages.


@pytest.mark.parametrize("kind", KINDS)
def test_time_alloc_free_frees_its_blocks_when_an_allocation_fails(kind):
    """When an allocation in the timing loop throws (OOM), the blocks it holds are freed (no caller knows them)."""
    pool = Pool(kind, capacity=4 * MiB)
    with pytest.raises(torch.OutOfMemoryError):
        pool.time_alloc_free([1 * MiB] * 8, live=8, rounds=1)
    s = pool.stats()
    assert (s["active_blocks"], s["allocated_bytes"]) == (0, 0), (
        f"time_alloc_free left {s['active_blocks']} blocks ({s['allocated_bytes']} bytes) allocated after its OOM"
    )


@pytest.mark.parametrize("kind", KINDS)
def test_oom_message_never_shows_negative_sizes(kind):
    """Sizes of 2^63 bytes and more, and a host capacity set below what is already reserved, print as positive
    figures in the OOM message."""
    pool = Pool(kind)
    with pytest.raises(torch.OutOfMemoryError) as info:
        pool.allocate(2**63 - 1)
    assert "-" not in str(info.value).split("Pool (")[0], f"negative size in the OOM message: {info.value}"
    pool = Pool(kind, capacity=64 * MiB)
    pool.allocate(40 * MiB)
    pool.set_capacity(16 * MiB)
    with pytest.raises(torch.OutOfMemoryError) as info:
        pool.allocate(30 * MiB)
    assert "-" not in str(info.value).split("Pool (")[0], f"negative free memory in the OOM message: {info.value}"


# ---------------------------------------------------------------------------------------------------------------
# The device-only API on a machine without a GPU


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the errors on a machine without a GPU")
def test_device_pool_api_needs_a_gpu():
    with pytest.raises(RuntimeError, match=r"torchext\.memory\.enable_pool needs a"):
        memory.enable_pool()
    with pytest.raises(RuntimeError, match=r"torchext\.memory\.device_pool needs a"):
        memory.device_pool()
    with pytest.raises(RuntimeError, match=r"torchext\.memory\.pool_scope needs a"):
        with memory.pool_scope():
            pass
    with pytest.raises(RuntimeError, match=r"torchext\.memory\.stats needs a"):
        memory.stats()
    with pytest.raises(RuntimeError, match=r"torchext\.memory\.empty_cache needs a"):
        memory.empty_cache(0)
    with pytest.raises(ValueError, match="kind"):
        memory.enable_pool("buddy")
    assert memory.enabled_kind() is None and not memory.is_enabled(), "no pool should be enabled"


# ---------------------------------------------------------------------------------------------------------------
# The recorded ResNet-18 training steps (benchmarks/results/resnet18_alloc_trace.json.gz), replayed on the host


TRACE = os.path.join(ROOT, "benchmarks", "results", "resnet18_alloc_trace.json.gz")


@pytest.mark.skipif(not os.path.exists(TRACE), reason="no recorded trace")
def test_resnet18_trace_replay_reserved_stays_within_5_percent_of_requested():
    """The pool's policy on real training steps: peak reserved / peak requested <= 1.05 (the benchmark reports the
    same figure on the GPU beside PyTorch's allocator), and the power-of-two baseline pays visibly more."""
    from torchext.memory import load_trace, replay_trace

    events = load_trace(TRACE)["events"]
    ratios = {}
    for kind in KINDS:
        pool = Pool(kind)
        peak = replay_trace(events, pool.allocate, pool.free)
        ratios[kind] = pool.stats()["reserved_bytes_peak"] / peak
        check_everything_free(pool, f"{kind} after the trace")
    assert ratios["best_fit"] <= 1.05, f"best_fit peak reserved / peak requested = {ratios['best_fit']:.3f}"
    assert ratios["pow2"] > ratios["best_fit"] + 0.1, f"pow2 should cost visibly more: {ratios}"


# ---------------------------------------------------------------------------------------------------------------
# CUDA graphs: private pools (cuda_ops/pool.h). The host backend's set_capture_underway makes every call a capture
# forbids (event records, queries and waits, synchronization, releases of memory) raise, so each test below that runs
# "under capture" also proves the pool made none of them.

CAPTURE_STREAM = 11  # the stream "capturing" into the graph
OTHER_STREAM = 22  # a stream outside the capture
GRAPH_A, GRAPH_B = (1, 0), (0, 2)  # private pool ids as torch makes them: by a graph (first) or graph_pool_handle


@contextlib.contextmanager
def capture(pool: Pool, pool_id=GRAPH_A, streams=(CAPTURE_STREAM,)):
    """What torch.cuda.graph does around a capture: route the capturing streams to the private pool, capture, stop
    routing. The simulated device refuses forbidden calls in between."""
    pool.begin_allocate_to_pool(pool_id, list(streams))
    pool.set_capture_underway(True)
    try:
        yield
    finally:
        pool.set_capture_underway(False)
        pool.end_allocate_to_pool(pool_id)


def segment_pool(pool: Pool, address: int) -> tuple[int, int]:
    """The pool id of the segment holding `address` (DEVICE_POOL for the device pool's)."""
    for seg in pool.snapshot():
        if seg.address <= address < seg.address + seg.size:
            return seg.pool
    raise AssertionError(f"no segment holds {address:#x}")


@pytest.mark.parametrize("kind", KINDS)
def test_capture_routes_the_capturing_streams_to_the_private_pool(kind):
    pool = Pool(kind)
    with capture(pool):
        inside = pool.allocate(1000, CAPTURE_STREAM)
        outside = pool.allocate(1000, OTHER_STREAM)
        s = check_pool(pool, "during capture", capture_underway=True)
    after = pool.allocate(1000, CAPTURE_STREAM)
    assert segment_pool(pool, inside) == GRAPH_A, "[capturing stream] not served from the private pool"
    assert segment_pool(pool, outside) == DEVICE_POOL, "[stream outside the capture] served from the private pool"
    assert segment_pool(pool, after) == DEVICE_POOL, "[capturing stream after the capture] still routed"
    assert s["graph_pools"] == 1 and s["graph_pool_bytes"] == (SMALL_SEGMENT if kind == "best_fit" else 1024), s
    assert pool.pool_use_count(GRAPH_A) == 1
    for address in (inside, outside, after):
        pool.free(address)
    check_pool(pool, "after the frees")


@pytest.mark.parametrize("kind", KINDS)
def test_capture_reuses_memory_freed_during_the_capture(kind):
    """Within one capture the graph orders a free and a later allocation on the same stream: the block is reused."""
    pool = Pool(kind)
    with capture(pool):
        a = pool.allocate(4 * KiB, CAPTURE_STREAM)
        pool.free(a)
        hits = pool.stats()["cache_hits"]
        b = pool.allocate(4 * KiB, CAPTURE_STREAM)
        assert b == a, f"[same stream, same capture] freed block {a:#x} not reused (got {b:#x})"
        assert pool.stats()["cache_hits"] == hits + 1
        c = pool.allocate(4 * KiB, OTHER_STREAM)
        assert segment_pool(pool, c) == DEVICE_POOL
    pool.free(b)
    pool.free(c)


@pytest.mark.parametrize("kind", KINDS)
def test_private_and_device_pools_never_share_memory(kind):
    pool = Pool(kind)
    before = pool.allocate(64 * KiB, CAPTURE_STREAM)
    pool.free(before)  # cached in the device pool, on the stream about to capture
    with capture(pool):
        a = pool.allocate(64 * KiB, CAPTURE_STREAM)
        assert a != before and segment_pool(pool, a) == GRAPH_A, "[capture] took memory of the device pool"
        pool.free(a)  # freed during the capture: stays the graph's
    b = pool.allocate(64 * KiB, CAPTURE_STREAM)
    assert b == before, "[after the capture] the device pool's own cached block should serve the request"
    c = pool.allocate(64 * KiB, CAPTURE_STREAM)
    assert c != a and segment_pool(pool, c) == DEVICE_POOL, "[after the capture] the device pool took graph memory"
    for address in (b, c):
        pool.free(address)
    check_pool(pool, "end")


@pytest.mark.parametrize("kind", KINDS)
def test_concurrent_captures_get_separate_pools(kind):
    pool = Pool(kind)
    pool.begin_allocate_to_pool(GRAPH_A, [CAPTURE_STREAM])
    pool.begin_allocate_to_pool(GRAPH_B, [OTHER_STREAM])
    pool.set_capture_underway(True)
    a = pool.allocate(8 * KiB, CAPTURE_STREAM)
    pool.free(a)
    b = pool.allocate(8 * KiB, OTHER_STREAM)
    pool.set_capture_underway(False)
    pool.end_allocate_to_pool(GRAPH_A)
    pool.end_allocate_to_pool(GRAPH_B)
    assert segment_pool(pool, b) == GRAPH_B and b != a, "[two captures] one pool's free memory served the other"
    assert pool.stats()["graph_pools"] == 2
    pool.free(b)
    for graph in (GRAPH_A, GRAPH_B):
        pool.release_pool(graph)
    s = check_pool(pool, "after both releases", live={}, pending={})
    assert s["graph_pools"] == s["graph_pool_bytes"] == s["reserved_bytes"] == 0, s


@pytest.mark.parametrize("kind", KINDS)
def test_graph_memory_stays_reserved_until_release_and_last_free(kind):
    """Blocks freed after the capture (during replays the graph owns the addresses) stay in the private pool; once
    the graph releases the pool and its last tensor is freed, the memory goes back to the device."""
    pool = Pool(kind)
    with capture(pool):
        output = pool.allocate(3 * MiB, CAPTURE_STREAM)  # a static output the user keeps
        scratch = pool.allocate(5 * KiB, CAPTURE_STREAM)
    pool.free(scratch)  # after the capture
    reserved = pool.stats()["reserved_bytes"]
    assert pool.empty_cache() == 0, "empty_cache released a graph's memory"
    s = check_pool(pool, "after capture")
    assert s["reserved_bytes"] == s["graph_pool_bytes"] == reserved and s["graph_pools"] == 1, s
    again = pool.allocate(5 * KiB, CAPTURE_STREAM)
    assert segment_pool(pool, again) == DEVICE_POOL, "a request outside any capture got graph memory"
    pool.free(again)
    pool.empty_cache()
    pool.release_pool(GRAPH_A)  # the graph is destroyed; its output is still alive
    assert pool.pool_use_count(GRAPH_A) == 0
    s = check_pool(pool, "released, output alive")
    assert s["graph_pools"] == 1 and s["graph_pool_bytes"] == reserved, s
    frees = s["device_frees"]
    pool.free(output)
    s = check_pool(pool, "released and freed", live={}, pending={})
    assert s["graph_pools"] == s["graph_pool_bytes"] == s["reserved_bytes"] == 0, s
    assert s["device_frees"] == frees + 2, f"the graph's two segments were not given back: {s}"


@pytest.mark.parametrize("kind", KINDS)
def test_shared_pool_use_counts_and_reuse_across_captures(kind):
    """Two graphs sharing a pool (pool=g1.pool()): each capture adds a use, each graph's release drops one; the
    second capture reuses what the first freed."""
    pool = Pool(kind)
    with capture(pool):
        kept = pool.allocate(MiB, CAPTURE_STREAM)
        temp = pool.allocate(16 * KiB, CAPTURE_STREAM)
    pool.free(temp)  # a block of graph 1 freed after its capture
    assert pool.pool_use_count(GRAPH_A) == 1
    with capture(pool):
        reused = pool.allocate(16 * KiB, CAPTURE_STREAM)
    assert reused == temp, "[shared pool] the second capture did not reuse the first one's freed block"
    assert pool.pool_use_count(GRAPH_A) == 2
    pool.release_pool(GRAPH_A)
    assert pool.pool_use_count(GRAPH_A) == 1
    pool.free(kept)
    pool.free(reused)
    assert pool.stats()["graph_pools"] == 1, "a pool still used by a graph was given back"
    pool.release_pool(GRAPH_A)
    assert pool.pool_use_count(GRAPH_A) == 0
    s = check_pool(pool, "all released", live={}, pending={})
    assert s["graph_pools"] == s["reserved_bytes"] == 0, s
    with pytest.raises(ValueError, match="no private pool"):
        pool.release_pool(GRAPH_A)


@pytest.mark.parametrize("kind", KINDS)
def test_create_or_incref_pool_holds_a_pool_without_capture(kind):
    pool = Pool(kind)
    pool.create_or_incref_pool(GRAPH_B)
    pool.create_or_incref_pool(GRAPH_B)
    assert pool.pool_use_count(GRAPH_B) == 2 and pool.stats()["graph_pools"] == 1
    pool.begin_allocate_to_pool(GRAPH_B, [OTHER_STREAM])  # torch.cuda.use_mem_pool: routing without a capture
    a = pool.allocate(100, OTHER_STREAM)
    pool.end_allocate_to_pool(GRAPH_B)
    assert segment_pool(pool, a) == GRAPH_B and pool.pool_use_count(GRAPH_B) == 3
    pool.free(a)
    for _ in range(3):
        pool.release_pool(GRAPH_B)
    assert pool.stats()["graph_pools"] == 0 and pool.stats()["reserved_bytes"] == 0


@pytest.mark.parametrize("kind", KINDS)
def test_record_stream_during_capture_defers_its_events(kind):
    """A block used on another stream and freed during the capture is not reused in it, and its events are recorded
    only after the capture (an event recorded on a capturing stream could never be queried)."""
    pool = Pool(kind)
    with capture(pool):
        graph_block = pool.allocate(4 * KiB, CAPTURE_STREAM)
        pool.record_stream(graph_block, 33)
        pool.free(graph_block)
        other = pool.allocate(4 * KiB, CAPTURE_STREAM)
        assert other != graph_block, "[record_stream in capture] block reused before its other stream was done"
        device_block = pool.allocate(4 * KiB, OTHER_STREAM)
        pool.record_stream(device_block, 33)
        pool.free(device_block)
        s = check_pool(pool, "in capture", capture_underway=True)
        assert s["pending_free_bytes"] == 8 * KiB, s
    s = pool.stats()  # the first call after the capture records the events
    assert s["pending_free_bytes"] == 8 * KiB, s
    pool.complete_events()
    s = check_pool(pool, "after the events")
    assert s["pending_free_bytes"] == 0, s
    pool.free(other)
    pool.release_pool(GRAPH_A)
    check_everything_free(pool, "end")


def test_device_pool_merges_across_streams_only_after_the_capture():
    pool = Pool("best_fit")
    a = pool.allocate(4 * KiB, 1)
    b = pool.allocate(4 * KiB, 2)  # the rest of stream 1's segment, through an event wait
    assert segment_pool(pool, a) == segment_pool(pool, b) == DEVICE_POOL and len(pool.snapshot()) == 1
    waits = len(pool.waits())
    with capture(pool):
        pool.free(a)
        pool.free(b)
        c = pool.allocate(4 * KiB, 3)  # not capturing: the device pool, but no free block of another stream
        assert segment_pool(pool, c) == DEVICE_POOL and c not in (a, b), "[capture] took another stream's block"
        (seg,) = [s for s in pool.snapshot() if s.address <= a < s.address + s.size]
        assert [blk.in_use for blk in seg.blocks] == [False, False], f"streams merged during the capture: {seg}"
        check_pool(pool, "in capture", capture_underway=True)
    assert len(pool.waits()) == waits, "an event wait was issued during the capture"
    pool.free(c)
    check_everything_free(pool, "after the capture")  # stats() merged them


def test_oom_during_capture_fails_at_once_and_the_pool_recovers():
    pool = Pool("best_fit", capacity=8 * MiB)
    cached = pool.allocate(6 * MiB, OTHER_STREAM)
    pool.free(cached)  # 6 MiB cached in the device pool, free
    with capture(pool):
        with pytest.raises(torch.OutOfMemoryError, match="during CUDA graph capture"):
            pool.allocate(4 * MiB, CAPTURE_STREAM)  # would need the cached segment released: not during capture
        s = pool.stats()
        assert s["ooms"] == 1 and s["oom_retries"] == 0 and s["device_frees"] == 0, s
    a = pool.allocate(4 * MiB, CAPTURE_STREAM)  # after the capture the cache goes back and the request succeeds
    pool.free(a)
    pool.release_pool(GRAPH_A)
    check_everything_free(pool, "end")


@pytest.mark.parametrize("kind", KINDS)
def test_pool_released_during_another_capture_goes_back_after_it(kind):
    pool = Pool(kind)
    with capture(pool, GRAPH_A):
        pool.allocate(2 * KiB, CAPTURE_STREAM)  # kept by the graph until release (never freed by the test)
    with capture(pool, GRAPH_B, streams=(OTHER_STREAM,)):
        b = pool.allocate(2 * KiB, OTHER_STREAM)
        pool.release_pool(GRAPH_A)  # graph A destroyed mid-capture: no cudaFree now (the backend would raise)
        assert pool.stats()["graph_pools"] == 2
    # Graph A's block is still live (its owner never freed it), so its pool stays; graph B's goes once released.
    pool.free(b)
    pool.release_pool(GRAPH_B)
    s = pool.stats()
    assert s["graph_pools"] == 1 and pool.pool_use_count(GRAPH_A) == 0, s


@pytest.mark.parametrize("kind", KINDS)
def test_pool_released_during_a_capture_with_nothing_live_goes_back_after_it(kind):
    pool = Pool(kind)
    with capture(pool, GRAPH_A):
        a = pool.allocate(2 * KiB, CAPTURE_STREAM)
    pool.free(a)
    with capture(pool, GRAPH_B, streams=(OTHER_STREAM,)):
        pool.release_pool(GRAPH_A)
        assert pool.stats()["graph_pools"] == 2, "a pool went back to the device during a capture"
    s = pool.stats()
    assert s["graph_pools"] == 1 and pool.pool_use_count(GRAPH_B) == 1, s
    pool.release_pool(GRAPH_B)
    s = pool.stats()
    assert s["graph_pools"] == s["reserved_bytes"] == 0, s


@pytest.mark.parametrize(
    "call, exception, words",
    [
        (lambda p: p.begin_allocate_to_pool(DEVICE_POOL, [1]), ValueError, "names the device pool"),
        (lambda p: p.create_or_incref_pool((0, 0)), ValueError, "names the device pool"),
        (lambda p: p.end_allocate_to_pool(GRAPH_A), ValueError, "no allocations go to private pool (1, 0)"),
        (lambda p: p.release_pool(GRAPH_B), ValueError, "no private pool (0, 2)"),
        (lambda p: p.begin_allocate_to_pool(GRAPH_A, 7), TypeError, "`streams` must be a list"),
        (lambda p: p.begin_allocate_to_pool(5, [1]), TypeError, "`pool` must be a pair of ints"),
        (lambda p: p.pool_use_count((1, -1)), ValueError, "`pool[1]` must be >= 0"),
        (lambda p: p.release_pool(("a", 1)), TypeError, "`pool[0]` must be an int"),
        (lambda p: p.set_capture_underway(1), TypeError, "`underway` must be a bool"),
    ],
)
def test_bad_private_pool_calls_raise(call, exception, words):
    pool = Pool()
    with pytest.raises(exception) as info:
        call(pool)
    assert words in str(info.value), str(info.value)


def test_beginning_the_same_capture_twice_raises():
    pool = Pool()
    pool.begin_allocate_to_pool(GRAPH_A, [1])
    with pytest.raises(ValueError, match=r"already go to private pool \(1, 0\)"):
        pool.begin_allocate_to_pool(GRAPH_A, [2])
    pool.end_allocate_to_pool(GRAPH_A)
    assert pool.pool_use_count(GRAPH_A) == 1


def test_the_host_backend_refuses_forbidden_calls_during_capture():
    """The harness itself: a pool that does not know of the capture releases memory in empty_cache, and the
    simulated device raises; told of it (begin_allocate_to_pool), the pool releases nothing."""
    pool = Pool()
    pool.free(pool.allocate(1000))
    pool.set_capture_underway(True)
    with pytest.raises(RuntimeError, match=r"release \(cudaFree\) during CUDA graph capture"):
        pool.empty_cache()
    pool.set_capture_underway(False)
    pool = Pool()  # the failed release left that one half-way
    pool.free(pool.allocate(1000))
    with capture(pool):
        assert pool.empty_cache() == 0, "empty_cache during a capture must release nothing"
    assert pool.empty_cache() == SMALL_SEGMENT


class CaptureModel(Model):
    """Model with captures. During a capture the pool queries no events, so blocks whose events complete stay pending
    until the capture ends; a block freed after record_stream during a capture gets its events only after it, so
    complete_events() cannot complete it before."""

    def __init__(self, pool: Pool, rng: random.Random):
        super().__init__(pool, rng)
        self.deferred: set[int] = set()  # freed during the capture, events not recorded yet
        self.completed: set[int] = set()  # events completed during the capture, not seen by the pool yet
        self.capturing = False

    def free(self, address: int) -> None:
        used = bool(self.live[address].used_on)
        super().free(address)
        if used and self.capturing:
            self.deferred.add(address)

    def complete_events(self) -> None:
        self.pool.complete_events()
        if self.capturing:
            self.completed |= set(self.pending) - self.deferred
        else:
            self.pool.stats()  # the pool sees them now, before a capture could begin
            self.pending = {a: n for a, n in self.pending.items() if a in self.deferred}

    def capture_ended(self) -> None:
        self.capturing = False
        self.pool.stats()  # queries the events and records the deferred ones
        self.pending = {a: n for a, n in self.pending.items() if a not in self.completed}
        self.completed.clear()
        self.deferred.clear()

    def check(self, what: str) -> dict:
        return check_pool(self.pool, what, self.live, self.pending, capture_underway=self.capturing)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("kind", KINDS)
def test_random_workload_with_captures_keeps_invariants(kind, seed):
    """Random allocations, frees and record_stream on capturing and other streams, with captures into two private
    pools beginning, ending and being released at random: the invariants hold, each block comes from the pool its
    stream was routed to, no forbidden call is made during a capture, and everything goes back in the end."""
    rng = random.Random(seed)
    pool = Pool(kind)
    model = CaptureModel(pool, rng)
    graphs = {GRAPH_A: 101, GRAPH_B: 102}  # pool id -> its capture stream
    streams = (*STREAM_IDS, *graphs.values())
    capturing: set = set()
    uses = dict.fromkeys(graphs, 0)
    expected_pool: dict[int, tuple[int, int]] = {}
    try:
        run_captures(pool, model, rng, graphs, streams, capturing, uses, expected_pool)
    finally:
        pool.set_capture_underway(False)  # a failed check must not leave a pool that cannot be destroyed
    for graph in list(capturing):
        pool.end_allocate_to_pool(graph)
    model.capture_ended()
    model.free_all()
    for graph, n in uses.items():
        for _ in range(n):
            pool.release_pool(graph)
    s = model.check("all freed and released")
    assert s["graph_pools"] == s["graph_pool_bytes"] == 0, s
    check_everything_free(pool, "end")


def run_captures(pool, model, rng, graphs, streams, capturing, uses, expected_pool) -> None:
    for step in range(500):
        r = rng.random()
        if r < 0.05:
            graph = rng.choice(list(graphs))
            if graph in capturing:
                capturing.discard(graph)
                pool.set_capture_underway(bool(capturing))
                pool.end_allocate_to_pool(graph)
                if not capturing:
                    model.capture_ended()
            else:
                pool.begin_allocate_to_pool(graph, [graphs[graph]])
                capturing.add(graph)
                uses[graph] += 1
                model.capturing = True
                pool.set_capture_underway(True)
            assert pool.pool_use_count(graph) == uses[graph], f"step {step}: use count of {graph}"
        elif r < 0.07:
            held = [g for g, n in uses.items() if n > 0 and g not in capturing]
            if held:
                graph = rng.choice(held)
                pool.release_pool(graph)
                uses[graph] -= 1
        elif r < 0.5:
            stream = rng.choice(streams)
            size = min(random_size(rng), 8 * MiB)
            address = model.allocate(size, stream)
            if size:
                routed = [g for g in capturing if graphs[g] == stream]
                expected_pool[address] = routed[0] if routed else DEVICE_POOL
                assert segment_pool(pool, address) == expected_pool[address], (
                    f"step {step}: a request on stream {stream} came from the wrong pool"
                )
        elif r < 0.85 and model.live:
            model.free(rng.choice(list(model.live)))
        elif r < 0.92 and model.live:
            model.record_stream(rng.choice(list(model.live)), rng.choice(streams))
        else:
            model.complete_events()
        if step % 25 == 0:
            model.check(f"step {step}")
