"""A quick check of conv2d's input gradient on the GPU, for a device call with little time left (bench_conv2d.py is
the full bench): for five resnet18_cifar shapes (batch 512, bf16, channels-last, 3x3, padding 1), torchext's and
cuDNN's grad_input against a float64 reference (max |error| / max |reference|), and the forward and input-gradient
times of both, side by side (benchmarks/common.py's time_interleaved: L2 flushed, median of 15). One line per shape.

    python benchmarks/probe_conv2d_dgrad.py
"""

import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import time_interleaved  # noqa: E402

# (C, H = W, K, stride) at batch 512
SHAPES = [(512, 4, 512, 1), (256, 8, 256, 1), (64, 32, 128, 2), (128, 16, 128, 1), (3, 32, 64, 1)]
INPUT_ONLY = [True, False, False]


def probe(c, h, k, st):
    op, back, cl = torch.ops.torchext, torch.ops.aten.convolution_backward.default, torch.channels_last
    x = torch.randn(512, c, h, h, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=cl)
    w = (torch.randn(k, c, 3, 3, device="cuda", dtype=torch.bfloat16) / (9 * c) ** 0.5).contiguous(memory_format=cl)
    g = torch.randn_like(F.conv2d(x, w, None, st, 1))
    strides = [st, st]

    def cudnn_dx(gy, xx, ww):
        return back(gy, xx, ww, None, strides, [1, 1], [1, 1], False, [0, 0], 1, INPUT_ONLY)[0]

    def ours_dx():
        return op.conv2d_backward(g, x, w, strides, [1, 1], [1, 1], 1, INPUT_ONLY, None)[0]

    ref = cudnn_dx(g.double(), x.double(), w.double())

    def rel_err(dx):
        return ((dx.double() - ref).abs().max() / ref.abs().max()).item()

    fns = [
        lambda: F.conv2d(x, w, None, st, 1),
        lambda: op.conv2d(x, w, None, strides, [1, 1], [1, 1], 1, "none", None),
        lambda: cudnn_dx(g, x, w),
        ours_dx,
    ]
    t = time_interleaved(fns, "cuda", warmup=3, reps=15)
    print(
        f"{c}x{h}->{k} s{st}: dx rel err torchext {rel_err(ours_dx()):.2e} cudnn {rel_err(cudnn_dx(g, x, w)):.2e}; "
        f"us fwd cudnn {t[0].p50:.1f} ours {t[1].p50:.1f}; bwd_input cudnn {t[2].p50:.1f} ours {t[3].p50:.1f}",
        flush=True,
    )


def main():
    import torchext  # noqa: F401  (registers the ops)

    torch.backends.cudnn.benchmark = True
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    for shape in SHAPES:
        probe(*shape)


if __name__ == "__main__":
    main()
