"""The one timer and CSV format every torchext benchmark uses.

Timing on CUDA: CUDA events around each call, warm-up first, the L2 cache flushed (a 256 MiB write) before every
timed call so each run reads its inputs from device memory, and the median with the 20th and 80th percentiles of
many repeats. On CPU: time.perf_counter around each call, same statistics.

CSV: one tidy row per measurement, columns CSV_COLUMNS.
"""

import csv
import datetime
import os
import statistics
import time
from dataclasses import dataclass

import torch

CSV_COLUMNS = [
    "op",
    "provider",
    "mode",
    "shape",
    "dtype",
    "metric",
    "unit",
    "p50",
    "p20",
    "p80",
    "gpu",
    "torch",
    "cuda",
    "date",
    "version",
]


@dataclass
class Timing:
    p50: float  # microseconds
    p20: float
    p80: float


def quantiles(samples) -> Timing:
    """Median, 20th and 80th percentiles of samples (any unit)."""
    q = statistics.quantiles(samples, n=10, method="inclusive")
    return Timing(p50=statistics.median(samples), p20=q[1], p80=q[7])


def time_fn(fn, device: str, warmup: int = 5, reps: int = 30, flush_l2: bool = True) -> Timing:
    """Times fn() on `device`; returns microseconds (time_interleaved with one function)."""
    return time_interleaved([fn], device, warmup=warmup, reps=reps, flush_l2=flush_l2)[0]


def time_interleaved(fns, device: str, warmup: int = 5, reps: int = 30, flush_l2: bool = True) -> list:
    """Times several functions side by side: each repeat calls every one of them once, in an order that rotates
    from repeat to repeat, so that a change in the machine's state (clocks, power, the host's load) reaches all of
    them alike. Returns one Timing per function, in microseconds. Used where a ratio between providers is the
    result (a Linear layer's step is bound by the host at small sizes, where block-wise timing drifted by 2x)."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    samples = [[] for _ in fns]
    if device == "cpu":
        for r in range(reps):
            for j in range(len(fns)):
                i = (r + j) % len(fns)
                t0 = time.perf_counter()
                fns[i]()
                samples[i].append((time.perf_counter() - t0) * 1e6)
        return [quantiles(s) for s in samples]
    torch.cuda.synchronize()
    flush = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device=device) if flush_l2 else None
    events = []  # (function index, start, end)
    for r in range(reps):
        for j in range(len(fns)):
            i = (r + j) % len(fns)
            if flush is not None:
                flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fns[i]()
            end.record()
            events.append((i, start, end))
    torch.cuda.synchronize()
    for i, start, end in events:
        samples[i].append(start.elapsed_time(end) * 1e3)
    return [quantiles(s) for s in samples]


def time_once(fn, device: str, flush_l2: bool = True):
    """One call of fn() timed like time_fn (L2 flushed first), no warm-up: (microseconds, fn's result). A
    budgeted benchmark runs it first, as its warm-up and to size the repeats (budget_reps)."""
    if device == "cpu":
        t0 = time.perf_counter()
        out = fn()
        return (time.perf_counter() - t0) * 1e6, out
    torch.cuda.synchronize()
    if flush_l2:
        torch.empty(256 * 1024 * 1024, dtype=torch.int8, device=device).zero_()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    out = fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3, out


def budget_reps(est_us: float, seconds: float, min_reps: int = 5, max_reps: int = 30, slow_s: float = 0.2):
    """(warmup, reps) for time_fn so that the repeats take about `seconds`, at least min_reps, at most max_reps; a
    call slower than slow_s gets no more warm-up and 2 repeats (the least that gives quantiles)."""
    if est_us > slow_s * 1e6:
        return 0, 2
    reps = int(seconds * 1e6 / max(est_us, 1.0))
    reps = max(min_reps, min(max_reps, reps))
    return (2 if est_us * 2 < seconds * 1e6 / 4 else 0), reps


def device_time_fn(fn, device: str, warmup: int = 3, reps: int = 10) -> Timing:
    """GPU time of fn(): the summed duration of the kernels and copies it puts on the device, read from the
    profiler, one profiling session per repeat (L2 flushed before each, outside the session). Unlike time_fn this
    leaves out the time the GPU sits idle waiting for the CPU (launch overhead, Python, synchronizations)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        fn()
    flush = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device=device)
    samples = []
    for _ in range(reps):
        flush.zero_()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        samples.append(sum(e.self_device_time_total for e in prof.key_averages() if e.device_type == DeviceType.CUDA))
    return quantiles(samples)


def device_kernels(fn, device: str, reps: int = 5) -> list:
    """The kernels fn() puts on the device, as (name, calls per fn(), mean us per call), longest total first: one
    profiling session over reps back-to-back calls (no L2 flush between them); for the reports' per-kernel
    breakdowns."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    rows = [
        (e.key, e.count / reps, e.self_device_time_total / max(e.count, 1))
        for e in prof.key_averages()
        if e.device_type == DeviceType.CUDA and e.self_device_time_total > 0
    ]
    return sorted(rows, key=lambda r: -r[1] * r[2])


def environment(device: str) -> dict:
    """What every CSV row records about the run: device name, torch, CUDA, date and torchext's version ("not
    built" when the package cannot be imported, so torch's own rows can still be written)."""
    try:
        import torchext

        version = torchext.__version__
    except ImportError:
        version = "not built"
    gpu = torch.cuda.get_device_name(torch.device(device)) if device != "cpu" else f"cpu ({os.cpu_count()} cores)"
    return {
        "gpu": gpu,
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "version": version,
    }


class CsvWriter:
    """Appends rows to a CSV file, writing the header when the file is new."""

    def __init__(self, path: str, env: dict):
        self.path, self.env = path, env
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        new = not os.path.exists(path) or os.path.getsize(path) == 0
        self._file = open(path, "a", newline="")
        self._writer = csv.DictWriter(self._file, fieldnames=CSV_COLUMNS)
        if new:
            self._writer.writeheader()

    def row(self, op, provider, mode, shape, dtype, metric, unit, p50, p20, p80):
        self._writer.writerow(
            dict(
                op=op,
                provider=provider,
                mode=mode,
                shape="x".join(str(s) for s in shape),
                dtype=str(dtype).replace("torch.", ""),
                metric=metric,
                unit=unit,
                p50=f"{p50:.6g}",
                p20=f"{p20:.6g}",
                p80=f"{p80:.6g}",
                **self.env,
            )
        )
        self._file.flush()

    def device_time(self, op, provider, mode, shape, dtype, t: Timing):
        self.row(op, provider, mode, shape, dtype, "gpu_time", "us", t.p50, t.p20, t.p80)

    def timing(self, op, provider, mode, shape, dtype, t: Timing, nbytes: int = 0, flops: float = 0):
        """A time row, and a rate row for each of the bytes moved (GB/s) and the flops done (TFLOP/s) that is given;
        a rate's p20 comes from the time's p80."""
        self.row(op, provider, mode, shape, dtype, "time", "us", t.p50, t.p20, t.p80)
        for amount, metric, unit, scale in ((nbytes, "bandwidth", "GB/s", 1e3), (flops, "throughput", "TFLOP/s", 1e6)):
            if amount:
                rate = amount / scale
                self.row(op, provider, mode, shape, dtype, metric, unit, rate / t.p50, rate / t.p80, rate / t.p20)

    def close(self):
        self._file.close()
