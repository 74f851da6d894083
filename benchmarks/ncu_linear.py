"""One Linear 8192x4096->4096 bf16 forward+backward step of PyTorch (nn.Linear, then ReLU) and one of torchext
(torchext.nn.Linear(activation="relu")), inside a profiler range, for Nsight Compute:

    ncu --profile-from-start off -k regex:"nvjet|wgmma|gemm|sm90" --section SpeedOfLight --section LaunchStats \
        --section WarpStateStats python benchmarks/ncu_linear.py

Warm-up steps of both run first, outside the range. Output of one run: benchmarks/results/ncu_linear_h200.txt.
"""

import torch

import torchext

torch.manual_seed(0)
M, K, N = 8192, 4096, 4096
dt = torch.bfloat16
x = torch.randn(M, K, device="cuda", dtype=dt, requires_grad=True)
lin = torch.nn.Linear(K, N, device="cuda", dtype=dt)
te = torchext.nn.Linear.from_torch(lin, activation="relu")
g = torch.randn(M, N, device="cuda", dtype=dt)


def step_torch():
    torch.relu(lin(x)).backward(g)


def step_torchext():
    te(x).backward(g)


for _ in range(3):
    step_torch()
    step_torchext()
torch.cuda.synchronize()
torch.cuda.profiler.start()
step_torch()
step_torchext()
torch.cuda.synchronize()
torch.cuda.profiler.stop()
