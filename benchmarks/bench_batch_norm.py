"""Benchmarks torchext's batch norm family against eager PyTorch and torch.compile of the same PyTorch function.

ResNet's batch-norm shapes at batch 512, bf16, channels-last (64x32x32, 128x16x16, 256x8x8, 512x4x4): training-mode
forward + backward of BN + ReLU and of BN + residual add + ReLU; and BN alone at 64x32x32 in float32 and bfloat16.
The PyTorch function is tests/test_batch_norm.py's reference (torch_batch_norm), run eagerly and compiled
(torch.compile, inductor, static shapes). Tidy rows go to a CSV (benchmarks/common.py's format), a Markdown report to
stdout.

    python benchmarks/bench_batch_norm.py > benchmarks/results/batch_norm_gpu.md   # about 2 minutes on an H100,
                                                                                     # most of it torch.compile's
    python benchmarks/bench_batch_norm.py --no-compile --shapes 64x32x32             # quick

What is measured (op, provider, mode, shape, dtype as in the CSV):
  op        batch_norm_relu, batch_norm_add_relu, batch_norm; shape N x C x H x W
  provider  'eager' (torch), 'compile' (torch.compile of the same function), 'torchext' (variant None) or
            'torchext-<variant>' (one rung of the ladder, --variants)
  mode      fwd+bwd: one training step of the layer, forward then torch.autograd.grad of input, weight and bias (and
            residual) for a fixed grad_output
  metric    gpu_time (us: the summed duration of the step's kernels from the profiler, median of --profile-reps; the
            headline, free of host launch gaps), time (us: CUDA events around the step, L2 flushed before each, median
            of --reps), bandwidth (GB/s of the minimum bytes over gpu_time), max_rel_err (forward output against
            eager's, a guard against timing a wrong kernel)

Minimum bytes of one fwd+bwd step, E elements of s bytes: forward reads x and writes y, backward reads grad_out and x
and writes grad_input: 5 E s for BN and BN + ReLU; the residual adds a read forward and a write backward: 7 E s. (The
relu mask, E / 8 bytes each way, and the multi-pass kernels' second reads are not counted: they are the cost of the
design, docs/batch_norm.md.) At 64x32x32, batch 512, bf16: E s = 67 MB.
"""

import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
from common import CsvWriter, device_kernels, device_time_fn, environment, time_interleaved  # noqa: E402

SHAPES = ("64x32x32", "128x16x16", "256x8x8", "512x4x4")
FUSED = ("batch_norm_relu", "batch_norm_add_relu")
KIND = {"batch_norm": "plain", "batch_norm_relu": "relu", "batch_norm_add_relu": "add_relu"}


def parse_shape(text: str, batch: int) -> tuple:
    c, h, w = (int(v) for v in text.split("x"))
    return (batch, c, h, w)


class Problem:
    """One layer's tensors (channels-last, random) and a fwd+bwd step per provider."""

    def __init__(self, op, shape, dtype, device="cuda"):
        cl = torch.channels_last
        self.kind = KIND[op]
        self.x = torch.randn(shape, device=device, dtype=dtype).contiguous(memory_format=cl).requires_grad_()
        add = self.kind == "add_relu"
        self.r = torch.randn_like(self.x).requires_grad_() if add else None
        self.g = torch.randn_like(self.x)
        c = shape[1]
        self.w = (torch.rand(c, device=device) + 0.5).requires_grad_()
        self.b = torch.randn(c, device=device).requires_grad_()
        self.rm, self.rv = torch.zeros(c, device=device), torch.ones(c, device=device)
        self.inputs = [t for t in (self.x, self.r, self.w, self.b) if t is not None]
        self.nbytes = (7 if add else 5) * self.x.numel() * self.x.element_size()

    def forward(self, provider, variant=None, compiled=None):
        from test_batch_norm import torch_batch_norm

        import torchext.ops as tops

        x, r, w, b, rm, rv = self.x, self.r, self.w, self.b, self.rm, self.rv
        if provider == "eager":
            return lambda: torch_batch_norm(self.kind, x, r, w, b, rm, rv, True)
        if provider == "compile":
            return lambda: compiled(self.kind, x, r, w, b, rm, rv, True)
        if self.kind == "plain":
            return lambda: tops.batch_norm(x, w, b, rm, rv, True, kernel=variant)
        if self.kind == "relu":
            return lambda: tops.batch_norm_relu(x, w, b, rm, rv, True, kernel=variant)
        return lambda: tops.batch_norm_add_relu(x, r, w, b, rm, rv, True, kernel=variant)

    def step(self, forward):
        def run():
            torch.autograd.grad(forward(), self.inputs, self.g)

        return run


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--shapes", default=",".join(SHAPES), help="C x H x W list (batch from --batch)")
    p.add_argument("--variants", default="", help="ladder rungs timed besides the default (comma list: simple, ...)")
    p.add_argument("--no-compile", action="store_true", help="leave out torch.compile (saves its compile time)")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--profile-reps", type=int, default=10)
    p.add_argument("--kernels", action="store_true", help="print each provider's kernels (name, calls, us) per run")
    p.add_argument("--out", default="benchmarks/results/batch_norm_gpu.csv")
    args = p.parse_args(argv)

    from test_batch_norm import torch_batch_norm

    import torchext  # noqa: F401  (registers the ops)

    device = "cuda"
    env = environment(device)
    writer = CsvWriter(args.out, env)
    providers = ["eager"] + ([] if args.no_compile else ["compile"]) + ["torchext"]
    variants = [v for v in args.variants.split(",") if v]
    providers += [f"torchext-{v}" for v in variants]
    shapes = [parse_shape(s, args.batch) for s in args.shapes.split(",")]
    runs = [(op, shape, torch.bfloat16) for shape in shapes for op in FUSED]
    if any(s[1:] == (64, 32, 32) for s in shapes):
        big = next(s for s in shapes if s[1:] == (64, 32, 32))
        runs += [("batch_norm", big, torch.float32), ("batch_norm", big, torch.bfloat16)]

    print(f"# batch norm fwd+bwd ({env['gpu']}, torch {env['torch']}, CUDA {env['cuda']}, {env['date']})\n")
    print("Training mode, channels-last, one forward and backward of the layer. GPU time: the step's kernels summed")
    print("(profiler), median of", args.profile_reps, "; ratio = baseline GPU time / torchext's (above 1: torchext")
    print("faster); GB/s over the minimum bytes (5 E s, 7 E s with the residual). Wall-clock: CUDA events around the")
    print("step (forward and torch.autograd.grad from Python), L2 flushed, median of", args.reps, "; it includes the")
    print("host's time (Python, autograd, launches), which in a model overlaps the GPU's work on earlier layers.\n")
    header = "| op | shape | dtype | " + " | ".join(f"{name} us" for name in providers)
    header += " | vs eager | vs compile | torchext GB/s | wall-clock us (" + " / ".join(providers) + ") |"
    print(header)
    print("|" + "---|" * (len(providers) + 7))
    for op, shape, dtype in runs:
        # A fresh compiled function per run: one shared function recompiles for every shape, op and grad mode and
        # hits dynamo's recompile limit (8), after which it silently runs eagerly.
        compiled = None
        if not args.no_compile:
            torch._dynamo.reset()
            compiled = torch.compile(torch_batch_norm, dynamic=False)
        prob = Problem(op, shape, dtype)
        dname = str(dtype).replace("torch.", "")
        fwd = {
            name: prob.forward(
                "torchext" if name.startswith("torchext") else name,
                name.split("-", 1)[1] if name.startswith("torchext-") else None,
                compiled,
            )
            for name in providers
        }
        with torch.no_grad():
            ref = fwd["eager"]().float()
            for name in providers[1:]:
                err = ((fwd[name]().float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
                writer.row(op, name, "fwd", shape, dname, "max_rel_err", "", err, err, err)
        steps = [prob.step(fwd[name]) for name in providers]
        for step in steps:  # compiles (torch.compile) and warms up outside the timed region
            step()
        times = time_interleaved(steps, device, warmup=3, reps=args.reps)
        gpu, wall = {}, {}
        for name, step, t in zip(providers, steps, times, strict=True):
            wall[name] = t
            writer.timing(op, name, "fwd+bwd", shape, dname, t, nbytes=prob.nbytes)
            gpu[name] = device_time_fn(step, device, warmup=1, reps=args.profile_reps)
            writer.device_time(op, name, "fwd+bwd", shape, dname, gpu[name])
            rate = prob.nbytes / 1e3
            writer.row(op, name, "fwd+bwd", shape, dname, "gpu_bandwidth", "GB/s", rate / gpu[name].p50,
                       rate / gpu[name].p80, rate / gpu[name].p20)  # fmt: skip
        if args.kernels:
            for name, step in zip(providers, steps, strict=True):
                for kname, calls, us in device_kernels(step, device):
                    print(f"<!-- kernels {op} {'x'.join(map(str, shape))} {dname} {name}: {calls:g} x {us:.1f} us "
                          f"{kname[:110]} -->")
        ours = gpu["torchext"].p50
        vs_eager = gpu["eager"].p50 / ours
        vs_compile = f"{gpu['compile'].p50 / ours:.2f}" if "compile" in gpu else "n/a"
        cells = " | ".join(f"{gpu[name].p50:.1f}" for name in providers)
        print(
            f"| {op} | {'x'.join(map(str, shape))} | {dname} | {cells} | {vs_eager:.2f} | {vs_compile} | "
            f"{prob.nbytes / 1e3 / ours:.0f} | {' / '.join(f'{wall[name].p50:.0f}' for name in providers)} |"
        )
        del prob, fwd, steps
        torch.cuda.empty_cache()
    writer.close()


if __name__ == "__main__":
    main()
