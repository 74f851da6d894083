"""Benchmarks torchext's conv2d ladder against cuDNN, per convolution of ResNet-18, in one process.

Every convolution shape of torchext.models.resnet18_cifar (batch 512, 32x32) and of torchvision's resnet18 (batch 128,
224x224), channels-last, each pass timed side by side with cuDNN (torch.backends.cudnn.benchmark = True, so cuDNN
picks its fastest algorithm per shape first), then summed over one training step's convolutions weighted by how
often each shape occurs. Tidy rows go to a CSV (benchmarks/common.py's format) and a Markdown report to stdout.

    python benchmarks/bench_conv2d.py > benchmarks/results/conv2d_gpu.md         # bf16 + fp32, ~2 min on an H100
    python benchmarks/bench_conv2d.py --dtypes bfloat16 --models cifar          # the headline target only (~15 s)
    python benchmarks/bench_conv2d.py --dtypes bfloat16 --models cifar --shapes 512x512x4x4-512x3x3s1p1

What is measured (op, provider, mode, shape, dtype as in the CSV):
  op          'conv2d'; shape N x C x H x W -> K x R x S / stride / padding (e.g. 512x64x32x32-64x3x3s1p1)
  provider    'cudnn' (torch.nn.functional.conv2d and aten.convolution_backward), 'torchext' (the default choice,
              variant=None) or 'torchext-<variant>' (one rung of the ladder, --variants)
  mode        fwd (the forward), bwd_input (grad_input alone), bwd_weight (grad_weight alone), fwd+bwd (the three
              in sequence, as one training step runs them; the stem's without grad_input, which a step does not
              compute for the images, and the step sums leave the stem's bwd_input out for the same reason)
  metric      time (us, CUDA events, L2 flushed before every call, median of --reps), throughput (TFLOP/s =
              2 N P Q K C R S per pass / time), max_rel_err (each pass's result, output, grad_input and grad_weight,
              against a float64 reference of the same inputs: max |error| / max |reference|; cuDNN's rows give the
              rounding to expect, and a wrong kernel is not timed), unsupported (the variant raised for these
              arguments)
  dtype       bfloat16, float16, float32 (tf32 off for cuDNN and torchext alike: the CUDA-core path) or tf32

The weighted sums ('step' rows, shape = the model's name) add count x time over the model's shapes, for the 3x3
convolutions alone (op 'conv2d_3x3', the issue's target) and for all of them (op 'conv2d_all'); the ratio reported
is cuDNN time / torchext time (above 1: torchext faster).
"""

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import CsvWriter, environment, time_interleaved  # noqa: E402

# (count per training step, C, K, H, R, stride, padding) at the model's batch; W = H, S = R.
RESNET18_CIFAR = [
    (1, 3, 64, 32, 3, 1, 1),
    (4, 64, 64, 32, 3, 1, 1),
    (1, 64, 128, 32, 3, 2, 1),
    (3, 128, 128, 16, 3, 1, 1),
    (1, 64, 128, 32, 1, 2, 0),
    (1, 128, 256, 16, 3, 2, 1),
    (3, 256, 256, 8, 3, 1, 1),
    (1, 128, 256, 16, 1, 2, 0),
    (1, 256, 512, 8, 3, 2, 1),
    (3, 512, 512, 4, 3, 1, 1),
    (1, 256, 512, 8, 1, 2, 0),
]
RESNET18_IMAGENET = [
    (1, 3, 64, 224, 7, 2, 3),
    (4, 64, 64, 56, 3, 1, 1),
    (1, 64, 128, 56, 3, 2, 1),
    (3, 128, 128, 28, 3, 1, 1),
    (1, 64, 128, 56, 1, 2, 0),
    (1, 128, 256, 28, 3, 2, 1),
    (3, 256, 256, 14, 3, 1, 1),
    (1, 128, 256, 28, 1, 2, 0),
    (1, 256, 512, 14, 3, 2, 1),
    (3, 512, 512, 7, 3, 1, 1),
    (1, 256, 512, 14, 1, 2, 0),
]
MODELS = {"cifar": ("resnet18_cifar", 512, RESNET18_CIFAR), "imagenet": ("resnet18", 128, RESNET18_IMAGENET)}
MODES = ("fwd", "bwd_input", "bwd_weight", "fwd+bwd")


def shape_name(n, c, k, h, r, stride, pad):
    return f"{n}x{c}x{h}x{h}-{k}x{r}x{r}s{stride}p{pad}"


def out_size(h, r, stride, pad):
    return (h + 2 * pad - r) // stride + 1


class Problem:
    """One convolution's tensors (channels-last, fresh random values) and the calls of each provider."""

    def __init__(self, n, c, k, h, r, stride, pad, dtype, device):
        self.stride, self.pad = (stride, stride), (pad, pad)
        cl = torch.channels_last
        self.x = torch.randn(n, c, h, h, device=device, dtype=dtype).contiguous(memory_format=cl)
        self.w = (torch.randn(k, c, r, r, device=device, dtype=dtype) / (c * r * r) ** 0.5).contiguous(memory_format=cl)
        p = out_size(h, r, stride, pad)
        self.gy = torch.randn(n, k, p, p, device=device, dtype=dtype).contiguous(memory_format=cl)
        self.flops = 2.0 * n * p * p * k * c * r * r
        # The stem (3 input channels) convolves the images, which need no gradient: a training step runs its forward
        # and weight gradient only, so its fwd+bwd leaves the input gradient out and the step's sums skip it.
        self.input_grad = c != 3

    def calls(self, provider, x=None, w=None, gy=None):
        """(forward(), backward(output_mask)) of cuDNN ('cudnn') or of a torchext variant (None: the default), on
        this problem's tensors or on the x, w, gy given (the float64 reference)."""
        x, w, gy = (self.x if x is None else x), (self.w if w is None else w), (self.gy if gy is None else gy)
        st, pd = self.stride, self.pad
        if provider == "cudnn":
            back = torch.ops.aten.convolution_backward.default
            return (
                lambda: F.conv2d(x, w, None, st, pd),
                lambda mask: back(gy, x, w, None, st, pd, (1, 1), False, (0, 0), 1, mask),
            )
        conv, back = torch.ops.torchext.conv2d.default, torch.ops.torchext.conv2d_backward.default
        return (
            lambda: conv(x, w, None, list(st), list(pd), [1, 1], 1, "none", provider),
            lambda mask: back(gy, x, w, list(st), list(pd), [1, 1], 1, mask, provider),
        )

    def errors(self, variant="cudnn"):
        """{pass: max |result - float64 reference| / max |reference|} for the forward's output, grad_input (not for
        the stem) and grad_weight of cuDNN ('cudnn') or of a torchext variant (None: the default), each pass computed
        alone as the timings run it; the reference is torch's convolution of the same inputs in float64. A pass the
        variant refuses ("does not support") is left out; anything else raised propagates."""

        def passes(fwd, bwd):
            yield "fwd", fwd
            if self.input_grad:
                yield "bwd_input", lambda: bwd([True, False, False])[0]
            yield "bwd_weight", lambda: bwd([False, True, False])[1]

        ref_calls = self.calls("cudnn", self.x.double(), self.w.double(), self.gy.double())
        refs = {name: fn() for name, fn in passes(*ref_calls)}
        errs = {}
        for name, fn in passes(*self.calls(variant)):
            try:
                out = fn()
            except ValueError as e:
                if name == "fwd" or "does not support" not in str(e):
                    raise
                continue
            ref = refs[name]
            errs[name] = ((out.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
        return errs

    def cudnn(self, mode):
        return by_mode(mode, *self.calls("cudnn"), self.input_grad)

    def torchext(self, mode, variant):
        return by_mode(mode, *self.calls(variant), self.input_grad)


def _runs(fn):
    """Whether fn() runs (a named rung may refuse one pass with a ValueError saying so)."""
    try:
        fn()
        return True
    except ValueError as e:
        if "does not support" not in str(e):
            raise
        return False


def by_mode(mode, fwd, bwd, input_grad=True):
    """The call `mode` times, from a provider's forward fwd() and backward bwd(output_mask); fwd+bwd computes the
    input gradient where input_grad (not for the stem)."""
    if mode == "fwd":
        return fwd
    if mode == "bwd_input":
        return lambda: bwd([True, False, False])
    if mode == "bwd_weight":
        return lambda: bwd([False, True, False])

    def step():
        fwd()
        bwd([input_grad, True, False])

    return step


def flops_of(mode, flops, input_grad=True):
    return flops * ((3 if input_grad else 2) if mode == "fwd+bwd" else 1)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="cifar,imagenet", help="cifar (resnet18_cifar) and/or imagenet (resnet18)")
    p.add_argument("--dtypes", default="bfloat16,float32", help="among bfloat16, float16, float32, tf32")
    p.add_argument(
        "--variants", default="implicit_mma,implicit_wgmma", help="ladder rungs timed besides the default (comma list)"
    )
    p.add_argument("--shapes", default="", help="only these shapes (comma list of the report's names); no step sums")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--out", default="benchmarks/results/conv2d_gpu.csv")
    args = p.parse_args(argv)
    known = {
        shape_name(MODELS[m][1], c, k, h, r, st, pd)
        for m in args.models.split(",")
        for _, c, k, h, r, st, pd in MODELS[m][2]
    }
    only = {name for name in args.shapes.split(",") if name}
    unknown = sorted(only - known)
    if unknown:
        p.error(
            f"--shapes: {', '.join(unknown)} not among the shapes of --models {args.models}: {', '.join(sorted(known))}"
        )

    import torchext  # noqa: F401  (registers the ops)

    device = "cuda"
    torch.backends.cudnn.benchmark = True
    env = environment(device)
    writer = CsvWriter(args.out, env)
    variants = [None] + [v for v in args.variants.split(",") if v]
    names = {"cudnn": "cudnn", None: "torchext"}
    names.update({v: f"torchext-{v}" for v in variants if v})
    print(f"# conv2d against cuDNN ({env['gpu']}, torch {env['torch']}, CUDA {env['cuda']}, {env['date']})\n")
    print("Ratio = cuDNN time / torchext time (above 1: torchext faster). Times in us, median of", args.reps, "\n")

    for dname in args.dtypes.split(","):
        tf32 = dname == "tf32"
        dtype = torch.float32 if dname in ("float32", "tf32") else getattr(torch, dname)
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        for mkey in args.models.split(","):
            model, batch, shapes = MODELS[mkey]
            totals = {}  # (op, provider, mode) -> weighted time
            worst = {}  # (provider, pass) -> largest max_rel_err over the shapes
            print(f"## {model}, batch {batch}, {dname}, channels-last\n")
            print(
                "| shape | count | mode | cuDNN us | " + " | ".join(f"{names[v]} us" for v in variants) + " | ratio |"
            )
            print("|---|---|---|---|" + "---|" * len(variants) + "---|")
            for count, c, k, h, r, stride, pad in shapes:
                shape = shape_name(batch, c, k, h, r, stride, pad)
                if only and shape not in only:
                    continue
                prob = Problem(batch, c, k, h, r, stride, pad, dtype, device)
                usable = []
                for v in ["cudnn"] + variants:
                    try:
                        errs = prob.errors(v)
                    except (ValueError, NotImplementedError, RuntimeError) as e:
                        if v == "cudnn":
                            raise
                        writer.row("conv2d", names[v], "fwd", [shape], dname, "unsupported", str(e)[:80], 0, 0, 0)
                        continue
                    for mode, err in errs.items():
                        writer.row("conv2d", names[v], mode, [shape], dname, "max_rel_err", "", err, err, err)
                        worst[(names[v], mode)] = max(worst.get((names[v], mode), 0.0), err)
                    if v != "cudnn":
                        usable.append(v)
                runnable = list(usable)
                for mode in MODES:
                    # A named rung may refuse a pass (implicit_wgmma: backward_weight); the default never does.
                    usable = [v for v in runnable if v is None or _runs(prob.torchext(mode, v))]
                    fns = [prob.cudnn(mode)] + [prob.torchext(mode, v) for v in usable]
                    times = time_interleaved(fns, device, warmup=3, reps=args.reps)
                    fl = flops_of(mode, prob.flops, prob.input_grad)
                    writer.timing("conv2d", "cudnn", mode, [shape], dname, times[0], flops=fl)
                    for v, t in zip(usable, times[1:], strict=True):
                        writer.timing("conv2d", names[v], mode, [shape], dname, t, flops=fl)
                    ops = ["conv2d_all"] + (["conv2d_3x3"] if r == 3 else [])
                    if mode == "bwd_input" and not prob.input_grad:
                        ops = []  # no training step computes it
                    for op in ops:
                        for prov, t in [("cudnn", times[0])] + [
                            (names[v], tt) for v, tt in zip(usable, times[1:], strict=True)
                        ]:
                            totals[(op, prov, mode)] = totals.get((op, prov, mode), 0.0) + count * t.p50
                    cells = []
                    for v in variants:
                        cells.append(f"{times[1 + usable.index(v)].p50:.1f}" if v in usable else "n/a")
                    ratio = times[0].p50 / times[1].p50 if None in usable else float("nan")
                    tflops = fl / times[1].p50 / 1e6 if None in usable else float("nan")
                    print(
                        f"| {shape} | {count} | {mode} | {times[0].p50:.1f} | "
                        + " | ".join(cells)
                        + f" | {ratio:.2f} ({tflops:.0f} TFLOP/s) |"
                    )
                del prob
                torch.cuda.empty_cache()
            print("\nLargest error against float64 over these shapes (max |error| / max |reference|):\n")
            print("| provider | " + " | ".join(MODES[:3]) + " |")
            print("|---|" + "---|" * 3)
            for prov in ["cudnn"] + [names[v] for v in variants]:
                cells = [f"{worst[(prov, m)]:.2e}" if (prov, m) in worst else "n/a" for m in MODES[:3]]
                print(f"| {prov} | " + " | ".join(cells) + " |")
            if only:
                continue  # a subset: no step sums
            print(f"\n### {model} {dname}: one training step's convolutions, count-weighted\n")
            print("| convolutions | mode | cuDNN us | torchext us | ratio |")
            print("|---|---|---|---|---|")
            for op in ("conv2d_3x3", "conv2d_all"):
                for mode in MODES:
                    ref = totals.get((op, "cudnn", mode))
                    ours = totals.get((op, "torchext", mode))
                    if ref is None or ours is None:
                        continue
                    for prov, val in (("cudnn", ref), ("torchext", ours)):
                        writer.row(op, prov, mode, [model], dname, "step_time", "us", val, val, val)
                    print(f"| {op} | {mode} | {ref:.0f} | {ours:.0f} | {ref / ours:.3f} |")
            print()
    writer.close()


if __name__ == "__main__":
    main()
