"""The memory pool on a GPU: PyTorch running on it (each such test in a subprocess of its own, since the allocator
is chosen once per process), stream ordering that would catch premature reuse, out of memory and recovery, leaks,
a ResNet-18 training step with cudnn.benchmark, CUDA graph capture refused cleanly, and the multi-threaded stress
test (tests/pool_stress.cu). Host-backend tests of the policies are in test_memory.py."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import HAS_CUDA

import torchext

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_child(body: str, env: dict = None, timeout: int = 300) -> dict:
    """Runs `body` in a fresh Python process (torch and torchext imported, the pool NOT yet enabled) and returns the
    dict it prints as JSON on its last line of output."""
    code = "import json, torch, torchext\nfrom torchext import memory\n" + textwrap.dedent(body)
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT, **(env or {})},
    )
    assert proc.returncode == 0, f"child process failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_pytorch_runs_on_the_pool_and_torch_cuda_stats_read_it():
    r = run_child(
        """
        memory.enable_pool()
        x = torch.randn(1000, 1000, device="cuda")
        y = (x @ x).relu_()
        torch.cuda.synchronize()
        s = memory.stats()
        out = {"kind": memory.enabled_kind(), "allocated": s["allocated_bytes"], "active": s["active_blocks"],
               "torch_allocated": torch.cuda.memory_allocated(), "torch_reserved": torch.cuda.memory_reserved(),
               "reserved": s["reserved_bytes"]}
        reference = (x.double() @ x.double()).relu().float()
        out["value_ok"] = bool(torch.allclose(y, reference, rtol=1e-3, atol=1e-2))
        del reference
        del x, y
        torch._C._cuda_clearCublasWorkspaces()  # cuBLAS keeps a workspace per handle and stream, allocated here too
        out["allocated_after_del"] = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out["peak_after_reset"] = torch.cuda.max_memory_allocated()
        torch.cuda.empty_cache()
        out["reserved_after_empty_cache"] = torch.cuda.memory_reserved()
        print(json.dumps(out))
        """
    )
    assert r["kind"] == "best_fit"
    assert r["value_ok"], "[x @ x relu] on the pool differs from the float64 reference"
    assert r["torch_allocated"] == r["allocated"] > 0, "[torch.cuda.memory_allocated] does not read the pool"
    assert r["torch_reserved"] == r["reserved"] >= r["allocated"], "[torch.cuda.memory_reserved] does not read the pool"
    assert r["allocated_after_del"] == 0, "[memory_allocated after del] blocks leaked"
    assert r["peak_after_reset"] == 0, "[reset_peak_memory_stats] did not reset the pool's peak"
    assert r["reserved_after_empty_cache"] == 0, "[torch.cuda.empty_cache] did not release the pool's segments"


def test_enable_pool_after_cuda_memory_was_allocated_raises():
    r = run_child(
        """
        x = torch.zeros(10, device="cuda")
        try:
            memory.enable_pool()
            out = {"raised": False}
        except RuntimeError as e:
            out = {"raised": True, "message": str(e)}
        out["still_works"] = float((x + 1).sum().item())
        print(json.dumps(out))
        """
    )
    assert r["raised"], "enable_pool after CUDA allocations must raise"
    assert "already allocated" in r["message"] and "enable_pool()" in r["message"], r["message"]
    assert r["still_works"] == 10.0


def test_enable_pool_rejects_a_second_kind():
    r = run_child(
        """
        memory.enable_pool("pow2")
        memory.enable_pool("pow2")  # same kind again: fine
        try:
            memory.enable_pool("best_fit")
            out = {"raised": False}
        except RuntimeError as e:
            out = {"raised": True, "message": str(e)}
        x = torch.ones(100, device="cuda")
        out["block"] = memory.device_pool().block_size(x.data_ptr())
        print(json.dumps(out))
        """
    )
    assert r["raised"] and "pow2" in r["message"], r
    assert r["block"] == 512, "[pow2 pool] a 400-byte tensor should get a 512-byte block"


# A kernel on `side` reads x after a long spin; meanwhile x is freed on the default stream and a new tensor of the
# same size is written there. Without record_stream the pool hands x's block straight back and the write lands
# before the read (the control shows this happens); with record_stream it must not. Nothing is allocated while the
# spin runs: a cudaMalloc there would block the host until the device is idle, and the test would prove nothing.
RECORD_STREAM_CHILD = """
    memory.enable_pool()
    n = 1 << 20
    side = torch.cuda.Stream()
    # Launch every kernel once first: CUDA loads a kernel's module on its first launch, and that waits for the
    # device, which would let the spin finish before the pool is asked for memory.
    warm = torch.full((n,), 1.0, device="cuda")
    torch.mul(warm, 1.0, out=torch.empty_like(warm))
    torch.cuda._sleep(1000)
    (warm == 1.0).all().item()
    del warm
    out = {}
    for use_record_stream in (True, False):
        torch.cuda.synchronize()
        memory.empty_cache()
        x = torch.full((n,), 1.0, device="cuda")
        address = x.data_ptr()
        with torch.cuda.stream(side):
            y = torch.empty(n, device="cuda")
        spare = torch.empty(2 * n, device="cuda")  # cached below: z can be served without a new segment
        del spare
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(200_000_000)
            torch.mul(x, 1.0, out=y)
        if use_record_stream:
            x.record_stream(side)
        del x
        z = torch.full((n,), 2.0, device="cuda")  # best fit: x's block if free, else a piece of the spare one
        same_block = z.data_ptr() == address
        torch.cuda.synchronize()
        out["record" if use_record_stream else "control"] = {
            "same_block": same_block, "y_ok": bool((y == 1.0).all().item())}
        del y, z
    print(json.dumps(out))
"""


def test_record_stream_prevents_premature_reuse():
    r = run_child(RECORD_STREAM_CHILD)
    assert not r["record"]["same_block"], "[record_stream] the block was reused while another stream still read it"
    assert r["record"]["y_ok"], "[record_stream] the other stream read overwritten data"
    # The control proves the test can fail: without record_stream the block is reused at once and the data read on
    # the side stream is overwritten.
    assert r["control"]["same_block"], "[control] expected the freed block to be reused on its own stream"
    assert not r["control"]["y_ok"], "[control] expected the premature reuse to corrupt the side stream's read"


def test_cross_stream_reuse_waits_for_the_previous_stream():
    r = run_child(
        """
        memory.enable_pool()
        n = 1 << 20
        s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
        warm = torch.full((n,), 1.0, device="cuda")  # load the kernels first (see RECORD_STREAM_CHILD)
        torch.mul(warm, 3.0, out=torch.empty_like(warm))
        torch.cuda._sleep(1000)
        (warm == 3.0).all().item()
        del warm
        torch.cuda.synchronize()
        memory.empty_cache()
        with torch.cuda.stream(s1):
            x = torch.full((n,), 1.0, device="cuda")
            y = torch.empty(n, device="cuda")
            address = x.data_ptr()
            torch.cuda._sleep(200_000_000)
            torch.mul(x, 3.0, out=y)         # runs on s1 after the spin
            del x                            # freed on s1, its stream
        before = memory.stats()["cross_stream_reuses"]
        with torch.cuda.stream(s2):
            z = torch.full((n,), 5.0, device="cuda")   # may take x's block, but only after s1's work
        same = z.data_ptr() == address
        torch.cuda.synchronize()
        print(json.dumps({"same": same, "y_ok": bool((y == 3.0).all().item()),
                          "reuses": memory.stats()["cross_stream_reuses"] - before}))
        """
    )
    assert r["y_ok"], "[cross-stream reuse] s2 overwrote the block before s1 finished reading it"
    assert r["same"] and r["reuses"] >= 1, f"expected s2 to take s1's freed block through an event wait: {r}"


def test_out_of_memory_raises_with_statistics_and_the_pool_recovers():
    r = run_child(
        """
        memory.enable_pool()
        total = torch.cuda.get_device_properties(0).total_memory
        out = {}
        try:
            torch.empty(2 * total, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError as e:
            out["message"] = str(e)
        # Fill the device with 1 GiB tensors, free every other one: 2 GiB fits only once cached 1 GiB segments have
        # been given back to the driver (before growing, or on the out-of-memory retry).
        chunks = []
        try:
            while True:
                chunks.append(torch.empty(1 << 30, dtype=torch.uint8, device="cuda"))
        except torch.OutOfMemoryError:
            pass
        out["chunks"] = len(chunks)
        frees_before = memory.stats()["device_frees"]
        del chunks[::2]
        big = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
        big.fill_(7)
        out["released"] = memory.stats()["device_frees"] - frees_before
        del big, chunks
        x = torch.randn(1000, device="cuda")
        out["works_after"] = bool(torch.isfinite(x).all().item())
        out["ooms"] = memory.stats()["ooms"]
        print(json.dumps(out))
        """
    )
    assert "reserved" in r["message"] and "allocated" in r["message"] and "fragmentation" in r["message"], r["message"]
    assert r["chunks"] > 4
    assert r["released"] >= 1, "[OOM] 2 GiB should have needed cached segments given back to the driver"
    assert r["works_after"]
    assert r["ooms"] >= 2


def test_no_leak_through_pytorch_tensors():
    r = run_child(
        """
        memory.enable_pool()
        g = torch.Generator().manual_seed(0)
        keep = torch.ones(10, device="cuda")
        base = memory.stats()
        for step in range(200):
            sizes = torch.randint(1, 1 << 22, (8,), generator=g).tolist()
            ts = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in sizes]
            m = torch.randn(64, 64, device="cuda")
            ts.append((m @ m).softmax(-1))
            del ts, m
        torch.cuda.synchronize()
        torch._C._cuda_clearCublasWorkspaces()  # cuBLAS keeps a workspace per handle and stream, allocated here too
        s = memory.stats()
        del keep
        memory.empty_cache()
        print(json.dumps({"base": base, "end": s, "after": memory.stats()}))
        """
    )
    assert r["end"]["allocated_bytes"] == r["base"]["allocated_bytes"], "allocated bytes grew: a block leaked"
    assert r["end"]["active_blocks"] == r["base"]["active_blocks"], "active blocks grew: a block leaked"
    assert r["after"]["reserved_bytes"] == 0, "segments left after freeing everything and empty_cache"


def test_resnet18_training_step_with_cudnn_benchmark():
    r = run_child(
        """
        memory.enable_pool()
        torch.backends.cudnn.benchmark = True
        from torchext.models import resnet18_cifar
        torch.manual_seed(0)
        model = resnet18_cifar().cuda().to(memory_format=torch.channels_last)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
        losses = []
        for step in range(3):
            x = torch.randn(128, 3, 32, 32, device="cuda").to(memory_format=torch.channels_last)
            t = torch.randint(0, 10, (128,), device="cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(x), t)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        s = memory.stats()
        print(json.dumps({"losses": losses, "peak_reserved": s["reserved_bytes_peak"],
                          "peak_allocated": s["allocated_bytes_peak"], "max_alloc": torch.cuda.max_memory_allocated()}))
        """
    )
    assert all(v == v and abs(v) < 100 for v in r["losses"]), f"non-finite loss: {r['losses']}"
    assert r["peak_allocated"] > 0 and r["max_alloc"] == r["peak_allocated"]


def test_cuda_graph_capture_is_refused_clearly():
    r = run_child(
        """
        memory.enable_pool()
        x = torch.randn(100, device="cuda")
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g):
                y = x * 2
            out = {"raised": False}
        except RuntimeError as e:
            out = {"raised": True, "message": str(e)}
        out["eager_after"] = float((x * 2 - 2 * x).abs().max().item())
        print(json.dumps(out))
        """
    )
    assert r["raised"], "capturing a CUDA graph on the pool must raise"
    assert "CUDA graph capture is not supported" in r["message"], r["message"]
    assert r["eager_after"] == 0.0


@pytest.mark.skipif(not hasattr(torch.cuda, "MemPool"), reason="torch.cuda.MemPool is not in this torch")
def test_pool_scope_routes_a_block_of_code_to_the_pool():
    r = run_child(
        """
        outside = torch.empty(1 << 20, device="cuda")
        with memory.pool_scope() as mp:
            inside = torch.empty(1 << 20, device="cuda")
            inside.fill_(3.0)
        s = memory.stats()
        print(json.dumps({"reserved": s["reserved_bytes"], "ok": bool((inside == 3.0).all().item()),
                          "enabled": memory.is_enabled()}))
        """
    )
    assert r["reserved"] > 0, "pool_scope did not take its segments from the pool"
    assert r["ok"] and not r["enabled"]


def test_standalone_cuda_pool_and_device_guard():
    """A standalone pool on the last device never touches device 0's context from another current device."""
    device = torch.cuda.device_count() - 1
    pool = torchext.memory.Pool("best_fit", backend="cuda", device=device)
    a = pool.allocate(1000, torch.cuda.current_stream(device))
    assert a % 512 == 0 and pool.block_size(a) == 1024
    pool.free(a)
    assert pool.empty_cache() == 2 << 20
    assert pool.stats()["reserved_bytes"] == 0


@pytest.fixture(scope="module")
def stress_binary(tmp_path_factory):
    """tests/pool_stress.cu's GPU build, with nvcc (cuda_ops' pool sources only, no torch). Its host build runs under
    ThreadSanitizer in tests/test_pool_tsan.py."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found")
    out = tmp_path_factory.mktemp("stress") / "pool_stress"
    subprocess.run(
        [
            nvcc,
            "-std=c++17",
            "-O2",
            "-I",
            os.path.join(ROOT, "cuda_ops"),
            os.path.join(ROOT, "tests", "pool_stress.cu"),
            os.path.join(ROOT, "cuda_ops", "pool.cpp"),
            os.path.join(ROOT, "cuda_ops", "pool_cuda.cu"),
            "-o",
            str(out),
        ],
        check=True,
    )
    return str(out)


def run_stress(binary: str, *args: str) -> dict:
    """pool_stress.cu's JSON line, after checking that it ran cleanly."""
    proc = subprocess.run([binary, *args], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["failures"] == 0 and r["reserved_after_empty_cache"] == 0, r
    assert r["verified_blocks"] > 0, r
    return r


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["best_fit", "pow2"])
def test_stress(stress_binary, kind):
    """4 threads x 4 streams x 10^6 random allocations each, 1 byte to 256 MiB (pool_stress.cu)."""
    iterations = os.environ.get("TORCHEXT_STRESS_ITERATIONS", "1000000")
    run_stress(stress_binary, kind, "4", "4", iterations, str(256 << 20))


@pytest.mark.parametrize("kind", ["best_fit", "pow2"])
def test_stress_every_method(stress_binary, kind):
    """4 threads x 4 streams, 20000 allocations each up to 64 MiB, and 10% of the calls to every other public method
    of the pool (record_stream, block_size, stats, snapshot, empty_cache, reset_peak_stats, last_error, kind)."""
    r = run_stress(stress_binary, kind, "4", "4", "20000", str(64 << 20), "100")
    assert r["calls"] and all(r["calls"].values()), f"methods never called: {r['calls']}"
