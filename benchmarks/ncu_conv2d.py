"""One convolution pass, run a few times, for Nsight Compute: `ncu -k regex:conv2d python benchmarks/ncu_conv2d.py
--variant implicit_wgmma --pass fwd` (ResNet-18's 64 -> 64 3x3 layer at 32x32, batch 512, bf16, channels-last by
default). --variant cudnn runs torch's convolution instead."""

import argparse

import torch
import torch.nn.functional as F

import torchext  # noqa: F401  (registers the ops)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variant", default="implicit_wgmma")
    p.add_argument("--pass", dest="pass_", default="fwd", choices=["fwd", "bwd_input", "bwd_weight"])
    p.add_argument("--shape", default="512,64,32,32,64,3,1,1", help="N,C,H,W,K,R,stride,padding")
    p.add_argument("--iters", type=int, default=3)
    a = p.parse_args()
    n, c, h, w, k, r, st, pd = (int(v) for v in a.shape.split(","))
    cl = torch.channels_last
    x = torch.randn(n, c, h, w, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=cl)
    wt = torch.randn(k, c, r, r, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=cl) * 0.05
    y = F.conv2d(x, wt, None, st, pd)
    g = torch.randn_like(y)
    torch.backends.cudnn.benchmark = False  # one kernel per call (benchmark mode would try many under ncu)
    op = torch.ops.torchext
    mask = {"fwd": None, "bwd_input": [True, False, False], "bwd_weight": [False, True, False]}[a.pass_]
    for _ in range(a.iters):
        if a.variant == "cudnn":
            if mask is None:
                F.conv2d(x, wt, None, st, pd)
            else:
                torch.ops.aten.convolution_backward(g, x, wt, None, [st, st], [pd, pd], [1, 1], False, [0, 0], 1, mask)
        elif mask is None:
            op.conv2d(x, wt, None, [st, st], [pd, pd], [1, 1], 1, "none", a.variant)
        else:
            op.conv2d_backward(g, x, wt, [st, st], [pd, pd], [1, 1], 1, mask, a.variant)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
