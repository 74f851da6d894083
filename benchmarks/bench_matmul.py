"""Benchmarks torchext's matmul ladder, Linear and CPU GEMM against cuBLAS and PyTorch, in one process.

The ladder against cuBLAS, torchext.nn.Linear against torch.nn.Linear + activation, and the CPU GEMM against
torch's; tidy rows are appended to a CSV (benchmarks/common.py), then the report is printed
(benchmarks/report.py --matmul) and the plot drawn (benchmarks/plot_matmul.py).

    python benchmarks/bench_matmul.py > benchmarks/results/matmul_gpu.md     # full run, ~2 min on an H200
    python benchmarks/bench_matmul.py --quick --out /tmp/mm.csv              # ~1 min: the 4096 ladder, Linear, CPU
    python benchmarks/bench_matmul.py --cpu-only                             # CPU GEMM at 1024, no GPU needed

What is measured (op, provider, mode, shape, dtype as in the CSV):
  matmul ladder    op 'matmul', provider 'torchext-<kernel>' (torch.ops.torchext.matmul(a, b, kernel)),
                   'torchext' (kernel=None, the default choice) or 'torch' (torch.matmul, cuBLAS); mode the layout:
                   NN (a, b row-major, like torch.matmul(a, b)), NT (b = w.t()) or TN (a = x.t()), the layouts
                   linear's forward and backward use; shape M x N x K; dtype float32 (tf32 off), tf32 (float32
                   with torch.backends.cuda.matmul.allow_tf32 = True for torchext and cuBLAS alike), bfloat16,
                   float16. Rows: time (us), throughput (TFLOP/s = 2 M N K / time), max_rel_err (max |C - C_cuBLAS|
                   / max |C_cuBLAS|, a guard against timing a wrong kernel), 'unsupported' (matmul_kernel raised:
                   that kernel cannot run these inputs here) or 'skipped' (p50 = the predicted time of one call in
                   us: too slow for the budget). tf32 is run for the tensor-core kernels only: the CUDA-core
                   kernels ignore the flag, their float32 rows hold.
  linear           op 'linear_<act>', provider 'torchext' (torchext.nn.Linear.from_torch(lin, activation=act)) or
                   'torch' (lin then the activation, eager); mode fwd (under no_grad) or fwd+bwd (out.backward(g)
                   with a fixed random g; x requires grad, so backward computes grad_x, grad_w and grad_b; grads
                   set to None before each repeat); shape M x K x N (x is (M, K), the output (M, N)).
  cpu              op 'matmul' on the CPU, provider 'torchext' (the cache-blocked CPU GEMM) or 'torch'; the gpu column
                   says 'cpu (...)'. With a GPU, the 1024 float32 default-kernel row of the ladder is the CPU-vs-GPU
                   comparison.

Timing: benchmarks/common.py's timers (CUDA events, L2 flushed before every call, median and p20/p80). Where a ratio
is the result, the providers are timed side by side (time_interleaved: each repeat calls each once, in a rotating
order): the Linear table's two layers, and in the ladder cuBLAS with every kernel within 4x of its time (the slower
kernels are timed alone). The repeats are capped by time: one timed call first (warm-up and estimate), then as many
repeats as fit in --seconds (at least 5, at most --max-reps); a call slower than 0.2 s gets 2 repeats. A
configuration whose predicted call time (from the same kernel's largest measured size, scaled by the flops) exceeds
--max-call, or that would not finish before --budget seconds of wall time, is skipped and says so in the CSV. The
order puts the targets first (the 4096 ladder and its layouts, the Linear table), then CPU, then the other sizes, so
a tight budget cuts the tail.

Napkin math (H200 SXM: ~67 TFLOP/s FP32 CUDA cores, ~495 TF32 and ~990 BF16/FP16 dense tensor-core TFLOP/s;
cuBLAS reaches ~50 FP32, ~350-400 TF32, ~700 BF16/FP16 at 4096-8192): 8192^3 is 1.1 TFLOP, 1 s at 1 TFLOP/s (naive),
1.6 ms at 700 TFLOP/s. Linear 8192 x 4096 -> 4096 is 275 GFLOP forward, 825 GFLOP forward + backward.
"""

import argparse
import copy
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import report  # noqa: E402
from common import CsvWriter, budget_reps, device_time_fn, environment, time_fn, time_interleaved, time_once  # noqa: E402

try:
    import torchext
except ImportError as e:  # the report still gets torch's rows, and says why torchext's are missing
    torchext, TORCHEXT_ERROR = None, str(e)
else:
    TORCHEXT_ERROR = ""

KERNELS = ("naive", "smem_tiled", "register_blocked", "vectorized", "warp_tiled", "mma_sync", "wgmma")
TENSOR_CORE = ("mma_sync", "wgmma")
# label -> (torch dtype, allow_tf32)
DTYPES = {
    "float32": (torch.float32, False),
    "tf32": (torch.float32, True),
    "bfloat16": (torch.bfloat16, False),
    "float16": (torch.float16, False),
}
LAYOUTS = ("NN", "NT", "TN")
LINEAR_CASES = [  # (M, K, N, activations)
    (8192, 4096, 4096, ("relu", "gelu")),
    (512, 512, 10, ("relu",)),
    (4096, 784, 256, ("relu",)),
]
TORCH_ACT = {"relu": F.relu, "gelu": F.gelu}
LADDER_SIDE_BY_SIDE = 4.0  # kernels within this factor of cuBLAS's time are timed interleaved with it


def has_op(name: str) -> bool:
    if torchext is None:
        return False
    try:
        getattr(torch.ops.torchext, name)
        return True
    except Exception:
        return False


def log(msg: str):
    print(msg, file=sys.stderr, flush=True)


def operands(m, n, k, dtype, layout, device):
    """Fresh randn operands of C = A B in a layout: A (m, k) and B (k, n), each row-major (N) or a transposed view
    of a row-major tensor (T)."""
    a = (
        torch.randn(m, k, dtype=dtype, device=device)
        if layout[0] == "N"
        else torch.randn(k, m, dtype=dtype, device=device).t()
    )
    b = (
        torch.randn(k, n, dtype=dtype, device=device)
        if layout[1] == "N"
        else torch.randn(n, k, dtype=dtype, device=device).t()
    )
    return a, b


def rel_err(out, ref) -> float:
    ref = ref.float()
    return ((out.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


class Runner:
    def __init__(self, writer: CsvWriter, args, device: str):
        self.w, self.args, self.device = writer, args, device
        self.deadline = time.monotonic() + args.budget
        self.est = {}  # key -> (flops, us) of the largest call measured: predicts the other sizes

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def predict(self, key, flops):
        if key not in self.est:
            return None
        f0, us0 = self.est[key]
        return us0 * flops / f0

    def reps_for(self, est_us):
        """(warmup, reps) for calls of about est_us microseconds, within --seconds, --min-reps and --max-reps."""
        return budget_reps(est_us, self.args.seconds, self.args.min_reps, self.args.max_reps)

    def estimate(self, op, provider, mode, shape, dtype, fn, device=None, flops=0, key=None, writer=None):
        """One timed call of fn (warm-up and estimate), unless the budget rules it out: (us, first result), or None
        with a 'skipped' row written."""
        w, device = writer or self.w, device or self.device
        predicted = self.predict(key, flops) if key is not None else None
        if predicted is not None:
            _, reps = self.reps_for(predicted)
            cost_s = predicted * (reps + 1) / 1e6
            if predicted > self.args.max_call * 1e6 or cost_s > self.left():
                why = "slower than --max-call" if predicted > self.args.max_call * 1e6 else "over --budget"
                log(f"  skip {op} {provider} {mode} {shape} {dtype}: predicted {predicted / 1e3:.1f} ms/call, {why}")
                w.row(op, provider, mode, shape, dtype, "skipped", "us", predicted, predicted, predicted)
                return None
        elif self.left() < 0:
            log(f"  skip {op} {provider} {mode} {shape} {dtype}: over --budget")
            w.row(op, provider, mode, shape, dtype, "skipped", "us", math.nan, math.nan, math.nan)
            return None
        est, out = time_once(fn, device)
        if est > self.args.max_call * 1e6:  # the first call may carry one-off set-up (module loading, handles)
            est, out = time_once(fn, device)
        if key is not None and flops >= self.est.get(key, (0, 0))[0]:
            self.est[key] = (flops, est)
        if est > self.args.max_call * 1e6:
            log(f"  skip {op} {provider} {mode} {shape} {dtype}: one call took {est / 1e3:.1f} ms")
            w.row(op, provider, mode, shape, dtype, "skipped", "us", est, est, est)
            return None
        return est, out

    def measure(self, op, provider, mode, shape, dtype, fn, device=None, flops=0, key=None, writer=None):
        """Times fn alone with the budgeted timer and writes its rows; returns (Timing, first result) or None if
        skipped."""
        res = self.estimate(op, provider, mode, shape, dtype, fn, device, flops, key, writer)
        if res is None:
            return None
        est, out = res
        return self.time_alone(op, provider, mode, shape, dtype, fn, est, device, flops, writer), out

    def time_alone(self, op, provider, mode, shape, dtype, fn, est_us, device=None, flops=0, writer=None):
        """Times fn by itself (time_fn), repeats sized from its estimate, and writes its rows."""
        warmup, reps = self.reps_for(est_us)
        t = time_fn(fn, device or self.device, warmup=warmup, reps=reps)
        (writer or self.w).timing(op, provider, mode, shape, dtype, t, flops=flops)
        return t

    def time_side_by_side(self, op, mode, shape, dtype, fns, est_us, flops):
        """Times the providers' functions ({provider: fn}) interleaved (time_interleaved), repeats sized from est_us,
        the time of one call of each, and writes their rows."""
        warmup, reps = self.reps_for(est_us)
        for provider, t in zip(fns, time_interleaved(list(fns.values()), self.device, warmup=warmup, reps=reps)):
            self.w.timing(op, provider, mode, shape, dtype, t, flops=flops)

    def unsupported(self, op, provider, mode, shape, dtype, why, writer=None):
        log(f"  unsupported {op} {provider} {mode} {shape} {dtype}: {why}")
        (writer or self.w).row(op, provider, mode, shape, dtype, "unsupported", "", math.nan, math.nan, math.nan)

    # -- the ladder -------------------------------------------------------------------------------------------------
    def ladder(self, size, label, layout, kernels, with_default):
        """cuBLAS (torch.matmul) and the ladder's kernels at one size, dtype and layout. The kernels within
        LADDER_SIDE_BY_SIDE x cuBLAS's time (from one call each) are timed side by side with it (time_interleaved):
        timed one after the other, the same kernel read 760 and 673 TFLOP/s in one run (bf16 8192^3, a GPU at its
        power limit). The slower ones are timed alone: interleaved, they would set the repeats of all."""
        dtype, tf32 = DTYPES[label]
        torch.backends.cuda.matmul.allow_tf32 = tf32
        m = n = k = size
        shape, flops = (m, n, k), 2.0 * m * n * k
        a, b = operands(m, n, k, dtype, layout, self.device)
        log(f"matmul {label} {layout} {size}^3")
        fns = {"torch": lambda: torch.matmul(a, b)}
        providers = [(f"torchext-{kn}", kn) for kn in kernels] + ([("torchext", None)] if with_default else [])
        for provider, kn in providers:
            if not has_op("matmul"):
                self.unsupported("matmul", provider, layout, shape, label, TORCHEXT_ERROR or "no torchext::matmul")
                continue
            try:
                chosen = torch.ops.torchext.matmul_kernel(a, b, kn)
            except (RuntimeError, NotImplementedError, ValueError) as e:  # TORCH_CHECK raises RuntimeError
                self.unsupported("matmul", provider, layout, shape, label, str(e).splitlines()[0])
                continue
            if kn is None:
                self.w.row("matmul", provider, layout, shape, label, "kernel", str(chosen), 0, 0, 0)
            fns[provider] = lambda kn=kn: torch.ops.torchext.matmul(a, b, kn)
        est = {}  # provider -> (us of one call, its result)
        for provider, fn in fns.items():
            res = self.estimate(
                "matmul", provider, layout, shape, label, fn, flops=flops, key=(provider, layout, label)
            )
            if res is not None:
                est[provider] = res
        base = est["torch"][0] if "torch" in est else math.inf
        together = [p for p in est if est[p][0] <= LADDER_SIDE_BY_SIDE * base]
        if together:
            total = sum(est[p][0] for p in together)
            self.time_side_by_side("matmul", layout, shape, label, {p: fns[p] for p in together}, total, flops)
        for provider in est:
            if provider not in together:
                self.time_alone("matmul", provider, layout, shape, label, fns[provider], est[provider][0], flops=flops)
        ref = est["torch"][1] if "torch" in est else torch.matmul(a, b)
        for provider, (_, out) in est.items():
            if provider != "torch":
                err = rel_err(out, ref)
                self.w.row("matmul", provider, layout, shape, label, "max_rel_err", "", err, err, err)
        del est
        torch.backends.cuda.matmul.allow_tf32 = False

    # -- Linear + bias + activation ---------------------------------------------------------------------------------
    def linear(self, M, K, N, dtype, act):
        torch.backends.cuda.matmul.allow_tf32 = False
        op, shape, label = f"linear_{act}", (M, K, N), str(dtype).replace("torch.", "")
        log(f"{op} {M}x{K}->{N} {label}")
        lin = torch.nn.Linear(K, N, bias=True, device=self.device, dtype=dtype)
        x = torch.randn(M, K, dtype=dtype, device=self.device, requires_grad=True)
        g = torch.randn(M, N, dtype=dtype, device=self.device)
        providers = [("torch", lin, lambda: TORCH_ACT[act](lin(x)))]
        if torchext is not None and hasattr(torchext.nn, "Linear"):
            if hasattr(torchext.nn.Linear, "from_torch"):
                te = torchext.nn.Linear.from_torch(lin, activation=act)
            else:
                te = torchext.nn.Linear(K, N, bias=True, device=self.device, dtype=dtype, activation=act)
                te.load_state_dict(lin.state_dict())
            providers.insert(0, ("torchext", te, lambda: te(x)))
        else:
            self.unsupported(op, "torchext", "fwd+bwd", shape, label, TORCHEXT_ERROR or "no torchext.nn.Linear")
        # Both providers timed side by side (time_interleaved), per mode: the ratio is the result.
        steps, forwards = {}, {}
        for provider, mod, fwd in providers:
            params = list(mod.parameters())

            def step(fwd=fwd, params=params):
                for p in params:
                    p.grad = None
                x.grad = None
                fwd().backward(g)

            def forward(fwd=fwd):
                with torch.no_grad():
                    return fwd()

            steps[provider], forwards[provider] = step, forward
        outs = {provider: forward() for provider, forward in forwards.items()}
        for mode, fns, flops in (("fwd", forwards, 2.0 * M * K * N), ("fwd+bwd", steps, 6.0 * M * K * N)):
            if self.left() < 0:
                for provider in fns:
                    self.w.row(op, provider, mode, shape, label, "skipped", "us", math.nan, math.nan, math.nan)
                continue
            est = max(time_once(fn, self.device)[0] for fn in fns.values())
            self.time_side_by_side(op, mode, shape, label, fns, est * len(fns), flops)
        if self.args.gpu_time and self.left() > 10:
            for provider, step in steps.items():
                t = device_time_fn(step, self.device, warmup=1, reps=5)
                self.w.device_time(op, provider, "fwd+bwd", shape, label, t)
        if outs.get("torchext") is not None and outs.get("torch") is not None:
            err = rel_err(outs["torchext"], outs["torch"])
            self.w.row(op, "torchext", "fwd", shape, label, "max_rel_err", "", err, err, err)

    # -- CPU --------------------------------------------------------------------------------------------------------
    def cpu(self, size, writer):
        m = n = k = size
        shape, flops = (m, n, k), 2.0 * m * n * k
        a, b = torch.randn(m, k), torch.randn(k, n)
        log(f"matmul cpu float32 {size}^3 ({torch.get_num_threads()} threads)")
        res = self.measure(
            "matmul",
            "torch",
            "NN",
            shape,
            "float32",
            lambda: torch.matmul(a, b),
            device="cpu",
            flops=flops,
            writer=writer,
        )
        ref = res[1] if res else torch.matmul(a, b)
        if not has_op("matmul"):
            self.unsupported(
                "matmul", "torchext", "NN", shape, "float32", TORCHEXT_ERROR or "no torchext::matmul", writer=writer
            )
            return
        res = self.measure(
            "matmul",
            "torchext",
            "NN",
            shape,
            "float32",
            lambda: torch.ops.torchext.matmul(a, b, None),
            device="cpu",
            flops=flops,
            writer=writer,
        )
        if res:
            err = rel_err(res[1], ref)
            writer.row("matmul", "torchext", "NN", shape, "float32", "max_rel_err", "", err, err, err)


def warm_up_gpu(device, seconds=1.0):
    """Brings the clocks up before the first measurement: bf16 GEMMs for about `seconds`."""
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=device)
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        for _ in range(20):
            torch.matmul(a, a)
        torch.cuda.synchronize()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="4096 ladder (+ layouts), the Linear table, CPU: ~1 min")
    p.add_argument("--cpu-only", action="store_true", help="only the CPU GEMM comparison (no GPU needed)")
    p.add_argument("--out", default=None, help="CSV to append to (default benchmarks/results/matmul_<gpu|cpu>.csv)")
    p.add_argument("--plot", default=None, help="PNG to draw (default: next to the CSV, same name); 'none' to skip")
    p.add_argument("--sizes", default=None, help="ladder sizes, comma-separated (default 1024,2048,4096,8192)")
    p.add_argument("--dtypes", default=",".join(DTYPES), help="ladder dtypes among " + ",".join(DTYPES))
    p.add_argument("--kernels", default=",".join(KERNELS), help="ladder kernels")
    p.add_argument("--sections", default="ladder,layouts,linear,cpu", help="which parts to run")
    p.add_argument(
        "--budget",
        type=float,
        default=None,
        help="seconds of wall time for the measurements "
        "(default 200, quick 50); later configurations are skipped past it",
    )
    p.add_argument("--seconds", type=float, default=None, help="target time per measurement (default 0.5, quick 0.2)")
    p.add_argument("--min-reps", type=int, default=None, help="default 5, quick 3")
    p.add_argument("--max-reps", type=int, default=None, help="default 30, quick 10")
    p.add_argument(
        "--max-call",
        type=float,
        default=None,
        help="skip configurations predicted slower than this many seconds per call (default 1.5, quick 0.3)",
    )
    p.add_argument(
        "--no-gpu-time",
        dest="gpu_time",
        action="store_false",
        default=None,
        help="leave out the profiler (kernel-time) rows of Linear fwd+bwd (quick leaves them out)",
    )
    args = p.parse_args(argv)
    q = args.quick
    for name, full, quick in (
        ("budget", 200.0, 50.0),
        ("seconds", 0.5, 0.2),
        ("min_reps", 5, 3),
        ("max_reps", 30, 10),
        ("max_call", 1.5, 0.3),
        ("gpu_time", True, False),
    ):
        if getattr(args, name) is None:
            setattr(args, name, quick if q else full)
    sizes = [int(s) for s in (args.sizes or ("4096" if q else "1024,2048,4096,8192")).split(",")]
    dtypes = args.dtypes.split(",")
    kernels = [k for k in args.kernels.split(",") if k]
    sections = set(args.sections.split(","))
    gpu = not args.cpu_only
    if gpu and not torch.cuda.is_available():
        print("no CUDA device: running the CPU GEMM comparison only (--cpu-only)", file=sys.stderr)
        gpu = False
    if gpu and torchext is not None and not torchext._loader.built_with_cuda():
        raise SystemExit("torchext was built without CUDA (TORCHEXT_CUDA=0 or no toolkit); rebuild to benchmark GPUs")
    here = os.path.dirname(os.path.abspath(__file__))
    out = args.out or os.path.join(here, "results", f"matmul_{'gpu' if gpu else 'cpu'}.csv")
    env = environment("cuda" if gpu else "cpu")
    writer = CsvWriter(out, env)
    # CPU rows go to the same file with the CPU in the gpu column and the run's date, so one report reads both.
    cpu_env = dict(env, gpu=f"cpu ({os.cpu_count()} cores, {torch.get_num_threads()} threads)")
    cpu_writer = copy.copy(writer)  # shares the open file; only the environment columns differ
    cpu_writer.env = cpu_env
    if torchext is None:
        log(f"torchext not importable ({TORCHEXT_ERROR}); only torch's rows are measured")
    t_start = time.monotonic()
    r = Runner(writer, args, "cuda" if gpu else "cpu")
    if gpu:
        warm_up_gpu("cuda")
        main_size = 4096 if 4096 in sizes else sizes[0]
        if "ladder" in sections:
            for label in dtypes:
                ks = [k for k in kernels if k in TENSOR_CORE] if label == "tf32" else kernels
                r.ladder(main_size, label, "NN", ks, with_default=True)
        if "layouts" in sections:
            for label in dtypes:
                top = [k for k in ("warp_tiled",) + TENSOR_CORE if k in kernels]
                top = [k for k in top if k in TENSOR_CORE] if label == "tf32" else top
                for layout in ("NT", "TN"):
                    r.ladder(main_size, label, layout, top, with_default=True)
        if "linear" in sections:
            for M, K, N, acts in LINEAR_CASES:
                for dtype in (torch.bfloat16, torch.float32):
                    for act in acts:
                        r.linear(M, K, N, dtype, act)
    if "cpu" in sections:
        r.cpu(1024, cpu_writer)
        if gpu and not ("ladder" in sections and 1024 in sizes):
            # The classic comparison: the default GPU kernel on the same 1024 float32 problem (the full ladder
            # measures it below).
            r.ladder(1024, "float32", "NN", [], with_default=True)
    if gpu and "ladder" in sections:
        for size in [s for s in sizes if s != main_size]:
            for label in dtypes:
                ks = [k for k in kernels if k in TENSOR_CORE] if label == "tf32" else kernels
                r.ladder(size, label, "NN", ks, with_default=True)
    writer.close()
    log(f"measured in {time.monotonic() - t_start:.0f} s; rows in {out}")
    if args.plot != "none":
        try:
            import plot_matmul

            png = args.plot or os.path.splitext(out)[0] + ".png"
            if plot_matmul.plot(out, png, date=env["date"]):
                log(f"plot: {png}")
        except ImportError as e:
            log(f"no plot: {e}")
    print(report.render_matmul(out, date=env["date"]))


if __name__ == "__main__":
    main()
