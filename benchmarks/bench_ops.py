"""Benchmarks every torchext op against stock PyTorch in the same process, forward, backward and forward+backward,
and appends tidy rows to a CSV (benchmarks/common.py). Then prints the report (benchmarks/report.py).

    python benchmarks/bench_ops.py                   # CUDA if present, else a small CPU run
    python benchmarks/bench_ops.py --ops softmax,cross_entropy --out /tmp/ops.csv

Napkin math, per element of s bytes (what the bandwidth rows count; a kernel can't beat copy bandwidth):
  copy, activation forward, softmax forward:       read 1 + write 1  = 2s
  activation / softmax backward:                   read 2 + write 1  = 3s
  cross_entropy forward + backward (N x C logits): read 1 forward, read 1 + write 1 backward = 3s per logit
                                                   (plus 8 bytes of target and 4 of lse per row, each way)
"""

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import report  # noqa: E402
from common import CsvWriter, device_time_fn, environment, time_fn  # noqa: E402

import torchext  # noqa: E402

ACTIVATIONS = {
    "relu": (torchext.ops.relu, torch.relu),
    "leaky_relu": (lambda x: torchext.ops.leaky_relu(x, 0.01), lambda x: F.leaky_relu(x, 0.01)),
    "sigmoid": (torchext.ops.sigmoid, torch.sigmoid),
    "tanh": (torchext.ops.tanh, torch.tanh),
    "gelu": (torchext.ops.gelu, F.gelu),
    "gelu_tanh": (lambda x: torchext.ops.gelu(x, "tanh"), lambda x: F.gelu(x, approximate="tanh")),
    "silu": (torchext.ops.silu, F.silu),
}
SOFTMAX = {
    "softmax": (torchext.ops.softmax, lambda x: torch.softmax(x, -1)),
    "log_softmax": (torchext.ops.log_softmax, lambda x: torch.log_softmax(x, -1)),
}


def randn(shape, dtype, device, requires_grad=False):
    return torch.randn(shape, dtype=dtype, device=device).requires_grad_(requires_grad)


class Bench:
    def __init__(self, writer: CsvWriter, device: str, reps: int):
        self.w, self.device, self.reps = writer, device, reps

    def time(self, fn):
        return time_fn(fn, self.device, reps=self.reps)

    def copy(self, n, dtype):
        x, y = randn((n,), dtype, self.device), torch.empty(n, dtype=dtype, device=self.device)
        self.w.timing("copy", "torch", "fwd", (n,), dtype, self.time(lambda: y.copy_(x)), 2 * n * x.element_size())

    def elementwise(self, name, fns, shape, dtype):
        """fwd (2s per element), bwd through autograd (3s) and fwd+bwd, for each provider."""
        x = randn(shape, dtype, self.device, requires_grad=True)
        g = randn(shape, dtype, self.device)
        n, s = x.numel(), x.element_size()
        for provider, fn in zip(("torchext", "torch"), fns):
            with torch.no_grad():
                self.w.timing(name, provider, "fwd", shape, dtype, self.time(lambda: fn(x)), 2 * n * s)
            y = fn(x)
            bwd = self.time(lambda: torch.autograd.grad(y, x, g, retain_graph=True))
            self.w.timing(name, provider, "bwd", shape, dtype, bwd, 3 * n * s)
            del y
            both = self.time(lambda: torch.autograd.grad(fn(x), x, g))
            self.w.timing(name, provider, "fwd+bwd", shape, dtype, both, 5 * n * s)

    def loss(self, name, fns, x_shape, make_target, dtype, tensor_target=False, unchecked=False):
        """fwd and fwd+bwd of a loss reduced to a scalar. Bytes per input element: forward reads the input (and a
        same-shaped float target); backward reads them again and writes the gradient. With unchecked, torchext is
        also run with TORCHEXT_CHECK_TARGETS=0 (no device-side target check read back), as provider
        'torchext-unchecked'. 'torchext' runs the default check mode: deferred (no synchronization) since
        csrc/target_checks.h; ops_gpu.csv rows dated before it were measured with a synchronization per call."""
        x = randn(x_shape, dtype, self.device, requires_grad=True)
        target = make_target(x)
        n, s = x.numel(), x.element_size()
        reads = 2 if tensor_target else 1
        providers = [("torchext", fns[0]), ("torch", fns[1])]
        if unchecked and self.device != "cpu":
            providers.append(("torchext-unchecked", fns[0]))
        for provider, fn in providers:
            if provider == "torchext-unchecked":
                os.environ["TORCHEXT_CHECK_TARGETS"] = "0"
            with torch.no_grad():
                self.w.timing(name, provider, "fwd", x_shape, dtype, self.time(lambda: fn(x, target)), reads * n * s)
            step = lambda: torch.autograd.grad(fn(x, target), x)  # noqa: E731
            self.w.timing(name, provider, "fwd+bwd", x_shape, dtype, self.time(step), (2 * reads + 1) * n * s)
            if self.device != "cpu":
                self.w.device_time(name, provider, "fwd+bwd", x_shape, dtype, device_time_fn(step, self.device))
            os.environ.pop("TORCHEXT_CHECK_TARGETS", None)


def main(argv=None):
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default=default_device)
    p.add_argument("--out", default=None, help="CSV to append to (default benchmarks/results/ops_<device>.csv)")
    p.add_argument("--ops", default="copy,activations,softmax,cross_entropy,losses")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--elements", type=int, default=None, help="elements per elementwise/softmax input")
    args = p.parse_args(argv)

    gpu = args.device != "cpu"
    if gpu and not torch.cuda.is_available():
        raise SystemExit("--device cuda asked for, but torch sees no CUDA device")
    if gpu and not torchext._loader.built_with_cuda():
        raise SystemExit("torchext was built without CUDA (TORCHEXT_CUDA=0 or no toolkit); rebuild to benchmark GPUs")
    here = os.path.dirname(os.path.abspath(__file__))
    out = args.out or os.path.join(here, "results", f"ops_{'gpu' if gpu else 'cpu'}.csv")
    env = environment(args.device)
    writer = CsvWriter(out, env)
    b = Bench(writer, args.device, args.reps if gpu else min(args.reps, 10))
    ops = set(args.ops.split(","))
    # Sizes: 2^28 float32 elements (1 GiB) on a GPU, as the targets say; a quick size on CPU.
    n = args.elements or (1 << 28 if gpu else 1 << 20)
    f32, bf16 = torch.float32, torch.bfloat16
    dtypes = (f32, bf16) if gpu else (f32,)

    if "copy" in ops:
        for dt in dtypes:
            b.copy(n, dt)
    if "activations" in ops:
        for name, fns in ACTIVATIONS.items():
            for dt in dtypes:
                b.elementwise(name, fns, (n,), dt)
    if "softmax" in ops:
        for width in (10, 1024, 32768):
            for name, fns in SOFTMAX.items():
                for dt in dtypes:
                    b.elementwise(name, fns, (n // width, width), dt)
    if "cross_entropy" in ops:
        shapes = [(512, 10), (65536, 10), (1048576, 10), (8192, 32768)] if gpu else [(65536, 10), (256, 4096)]
        for shape in shapes:
            for dt in dtypes:
                b.loss(
                    "cross_entropy",
                    (torchext.ops.cross_entropy, F.cross_entropy),
                    shape,
                    lambda x: torch.randint(0, x.shape[1], (x.shape[0],), device=x.device),
                    dt,
                    unchecked=True,
                )
    if "losses" in ops:
        m = n // 16
        for dt in dtypes:
            b.loss("mse_loss", (torchext.ops.mse_loss, F.mse_loss), (m,), lambda x: torch.randn_like(x), dt, True)
            b.loss(
                "binary_cross_entropy_with_logits",
                (torchext.ops.binary_cross_entropy_with_logits, F.binary_cross_entropy_with_logits),
                (m,),
                lambda x: torch.rand_like(x),
                dt,
                True,
            )
            for shape in ((65536, 10), (4096, 1000)):
                b.loss(
                    "multi_margin_loss",
                    (torchext.ops.multi_margin_loss, F.multi_margin_loss),
                    shape,
                    lambda x: torch.randint(0, x.shape[1], (x.shape[0],), device=x.device),
                    dt,
                )
    writer.close()
    print(report.render(out, date=env["date"]))


if __name__ == "__main__":
    main()
