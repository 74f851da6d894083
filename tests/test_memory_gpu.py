"""The memory pool on a GPU: PyTorch running on it (each such test in a subprocess of its own, since the allocator
is chosen once per process), stream ordering that would catch premature reuse, out of memory and recovery, leaks,
a ResNet-18 training step with cudnn.benchmark, CUDA graphs on the pool (torch.cuda.graph, make_graphed_callables,
GraphedTrainStep, a pool shared by two graphs, memory reused across replays and given back with the graph), and the
multi-threaded stress test (tests/pool_stress.cu). Host-backend tests of the policies are in test_memory.py."""

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


def test_cuda_graph_training_step_on_the_pool_matches_eager_and_reuses_its_memory():
    """The whole-network example of PyTorch's CUDA graph docs on the pool: 20 replays give eager's losses and weights,
    the graph's memory comes from one private pool, and replays allocate nothing (reserved memory does not grow)."""
    r = run_child(
        """
        import copy
        memory.enable_pool()
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).cuda()
        loss_fn = torch.nn.CrossEntropyLoss()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # no state: the eager copy needs only the weights
        static_x = torch.randn(32, 64, device="cuda")
        static_y = torch.randint(0, 10, (32,), device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                optimizer.zero_grad(set_to_none=True)
                loss_fn(model(static_x), static_y).backward()
                optimizer.step()
        torch.cuda.current_stream().wait_stream(side)
        eager = copy.deepcopy(model)
        eager_optimizer = torch.optim.SGD(eager.parameters(), lr=0.1)
        before_capture = memory.stats()
        g = torch.cuda.CUDAGraph()
        optimizer.zero_grad(set_to_none=True)
        with torch.cuda.graph(g):
            static_loss = loss_fn(model(static_x), static_y)
            static_loss.backward()
            optimizer.step()
        captured = memory.stats()
        losses, eager_losses, reserved = [], [], []
        for i in range(20):
            x = torch.randn(32, 64, device="cuda")
            y = torch.randint(0, 10, (32,), device="cuda")
            static_x.copy_(x)
            static_y.copy_(y)
            g.replay()
            losses.append(static_loss.item())
            eager_optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(eager(x), y)
            loss.backward()
            eager_optimizer.step()
            eager_losses.append(loss.item())
            del x, y, loss
            reserved.append(torch.cuda.memory_reserved())
        weight_error = max((p - q).abs().max().item() for p, q in zip(model.parameters(), eager.parameters()))
        s = memory.stats()
        print(json.dumps({"losses": losses, "eager_losses": eager_losses, "reserved": reserved,
                          "weight_error": weight_error, "graph_pools": captured["graph_pools"],
                          "graph_pool_bytes": captured["graph_pool_bytes"],
                          "graph_pools_before": before_capture["graph_pools"],
                          "torch_allocated": torch.cuda.memory_allocated(), "allocated": s["allocated_bytes"],
                          "torch_reserved": torch.cuda.memory_reserved(), "reserved_now": s["reserved_bytes"]}))
        """
    )
    assert r["graph_pools_before"] == 0 and r["graph_pools"] == 1 and r["graph_pool_bytes"] > 0, r
    for i, (a, b) in enumerate(zip(r["losses"], r["eager_losses"], strict=True)):
        assert a == pytest.approx(b, rel=1e-4, abs=1e-5), f"[replay {i} loss] graph {a} vs eager {b}"
    assert r["weight_error"] < 1e-4, f"[weights after 20 steps] graph vs eager differ by {r['weight_error']}"
    assert max(r["reserved"]) == r["reserved"][0], f"[reserved over 20 replays] grew: {r['reserved']}"
    assert r["torch_allocated"] == r["allocated"] and r["torch_reserved"] == r["reserved_now"], r


def test_make_graphed_callables_on_the_pool_matches_eager():
    r = run_child(
        """
        import copy
        memory.enable_pool()
        torch.manual_seed(0)
        module = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)).cuda()
        reference = copy.deepcopy(module)
        graphed = torch.cuda.make_graphed_callables(module, (torch.randn(8, 16, device="cuda", requires_grad=True),))
        errors = []
        for i in range(5):
            x = torch.randn(8, 16, device="cuda", requires_grad=True)
            x_ref = x.detach().clone().requires_grad_()
            module.zero_grad(set_to_none=True)
            reference.zero_grad(set_to_none=True)
            out = graphed(x)
            (out * out).sum().backward()
            out_ref = reference(x_ref)
            (out_ref * out_ref).sum().backward()
            pairs = [(out, out_ref), (x.grad, x_ref.grad)]
            pairs += [(p.grad, q.grad) for p, q in zip(module.parameters(), reference.parameters())]
            errors.append(max((a - b).abs().max().item() for a, b in pairs))
        s = memory.stats()
        print(json.dumps({"errors": errors, "graph_pools": s["graph_pools"],
                          "graph_pool_bytes": s["graph_pool_bytes"]}))
        """
    )
    assert max(r["errors"]) < 1e-5, f"[make_graphed_callables: output, input and weight grads] {r['errors']}"
    assert r["graph_pools"] == 1 and r["graph_pool_bytes"] > 0, f"forward and backward graphs share one pool: {r}"


def test_graphed_train_step_on_the_pool_matches_eager():
    """torchext.graphs.GraphedTrainStep (what torchext-compare --cuda-graphs runs) with a torchext layer on the pool."""
    r = run_child(
        """
        import copy
        from torchext.graphs import GraphedTrainStep
        memory.enable_pool()
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 64), torchext.nn.GELU(),
                                    torch.nn.Linear(64, 10)).cuda()
        reference = copy.deepcopy(model)
        criterion = torch.nn.CrossEntropyLoss()
        lr = 0.05
        optimizer = torch.optim.SGD(model.parameters(), lr=torch.tensor(lr, device="cuda"), momentum=0.9, fused=True)
        reference_optimizer = torch.optim.SGD(reference.parameters(), lr=torch.tensor(lr, device="cuda"),
                                              momentum=0.9, fused=True)
        x0 = torch.randn(16, 3, 8, 8, device="cuda")
        y0 = torch.randint(0, 10, (16,), device="cuda")
        step = GraphedTrainStep(model, criterion, optimizer, x0, y0)
        losses, eager_losses = [], []
        for i in range(8):
            x = torch.randn(16, 3, 8, 8, device="cuda")
            y = torch.randint(0, 10, (16,), device="cuda")
            losses.append(step(x, y).item())
            reference_optimizer.zero_grad(set_to_none=True)
            loss = criterion(reference(x), y)
            loss.backward()
            reference_optimizer.step()
            eager_losses.append(loss.item())
        weight_error = max((p - q).abs().max().item() for p, q in zip(model.parameters(), reference.parameters()))
        s = memory.stats()
        print(json.dumps({"losses": losses, "eager_losses": eager_losses, "weight_error": weight_error,
                          "graph_pools": s["graph_pools"]}))
        """
    )
    for i, (a, b) in enumerate(zip(r["losses"], r["eager_losses"], strict=True)):
        assert a == pytest.approx(b, rel=1e-4, abs=1e-5), f"[GraphedTrainStep step {i} loss] graph {a} vs eager {b}"
    assert r["weight_error"] < 1e-4, f"[weights after 8 steps] graph vs eager differ by {r['weight_error']}"
    assert r["graph_pools"] == 1, r


def test_two_graphs_share_a_pool_and_releasing_them_gives_it_back():
    """g2 captured into g1's pool (pool=g1.pool()) reads g1's outputs; replayed in capture order both stay right.
    The pool lives while either graph or one of its tensors does, and then goes back to the device."""
    r = run_child(
        """
        import gc
        memory.enable_pool()
        x = torch.randn(1 << 16, device="cuda")
        def reference(v):
            a = v * 2
            y1 = (a + 1).sin()
            return a, y1, y1 * 3 + a
        g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.cuda.graph(g1):
            a = x * 2
            t = a + 1  # a temporary, freed during the capture
            y1 = t.sin()
            del t
        with torch.cuda.graph(g2, pool=g1.pool()):
            y2 = y1 * 3 + a
        torch.cuda.synchronize()
        shared = memory.stats()
        errors = []
        for i in range(10):
            x.copy_(torch.randn(1 << 16, device="cuda"))
            g1.replay()
            g2.replay()
            errors.append(max((u - v).abs().max().item() for u, v in zip((a, y1, y2), reference(x))))
        torch.cuda.synchronize()
        after_replays = memory.stats()
        del g1
        gc.collect()
        g2.replay()
        errors.append((y2 - reference(x)[2]).abs().max().item())
        one_graph = memory.stats()
        g2.reset()
        del g2
        gc.collect()
        graphs_gone = memory.stats()
        del a, y1, y2
        gc.collect()
        torch.cuda.synchronize()
        tensors_gone = memory.stats()
        print(json.dumps({"errors": errors, "shared": shared, "after_replays": after_replays,
                          "one_graph": one_graph, "graphs_gone": graphs_gone, "tensors_gone": tensors_gone}))
        """
    )
    assert max(r["errors"]) < 1e-5, f"[shared pool replays vs eager] {r['errors']}"
    shared, gone = r["shared"], r["tensors_gone"]
    assert shared["graph_pools"] == 1 and shared["graph_pool_bytes"] > 0, f"two graphs, one pool: {shared}"
    assert r["after_replays"]["graph_pool_bytes"] == shared["graph_pool_bytes"], "replays grew the graphs' pool"
    assert r["one_graph"]["graph_pools"] == 1, "the pool went away while g2 still uses it"
    assert r["graphs_gone"]["graph_pools"] == 1, "the pool went away while its tensors are alive"
    assert gone["graph_pools"] == 0 and gone["graph_pool_bytes"] == 0, f"the pool was not given back: {gone}"
    held = r["graphs_gone"]  # only frees since: the device pool's segments stay, the private pool's go
    assert gone["reserved_bytes"] == held["reserved_bytes"] - held["graph_pool_bytes"], (held, gone)


def test_graph_memory_is_given_back_when_the_graph_and_its_outputs_are_gone():
    r = run_child(
        """
        import gc
        memory.enable_pool()
        x = torch.randn(1 << 20, device="cuda")
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = (x * 2).relu() + x.exp()
        g.replay()
        ok = bool(torch.allclose(y, (x * 2).relu() + x.exp()))
        torch.cuda.synchronize()
        held = memory.stats()  # from here on only frees: the device pool's segments stay
        g.reset()
        gc.collect()
        reset = memory.stats()
        del y
        gc.collect()
        freed = memory.stats()
        print(json.dumps({"held": held, "reset": reset, "freed": freed, "ok": ok}))
        """
    )
    held, reset, freed = r["held"], r["reset"], r["freed"]
    assert r["ok"], "the graph's output is wrong"
    assert held["graph_pools"] == 1 and held["graph_pool_bytes"] >= 4 << 20, held
    assert reset["graph_pools"] == 1, "the output is alive: the pool must stay"
    assert freed["graph_pools"] == 0 and freed["graph_pool_bytes"] == 0, freed
    assert freed["reserved_bytes"] == held["reserved_bytes"] - held["graph_pool_bytes"], (held, freed)


def test_capture_with_record_stream_and_a_side_stream_on_the_pool():
    """Work forked to a second stream inside the capture, a tensor used there and freed (record_stream): the capture
    succeeds, replays are right, and the block's events are recorded only after the capture."""
    r = run_child(
        """
        memory.enable_pool()
        x = torch.randn(1 << 16, device="cuda")
        side = torch.cuda.Stream()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            t = x * 2
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                u = t + 1
            t.record_stream(side)
            del t
            torch.cuda.current_stream().wait_stream(side)
            y = u.cos()
        errors = []
        for _ in range(5):
            x.copy_(torch.randn(1 << 16, device="cuda"))
            g.replay()
            errors.append((y - (x * 2 + 1).cos()).abs().max().item())
        torch.cuda.synchronize()
        s = memory.stats()
        print(json.dumps({"errors": errors, "pending": s["pending_free_bytes"], "graph_pools": s["graph_pools"]}))
        """
    )
    assert max(r["errors"]) < 1e-5, r["errors"]
    assert r["graph_pools"] == 1 and r["pending"] == 0, r


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
    of the pool (record_stream, block_size, stats, snapshot, empty_cache, reset_peak_stats, last_error, kind, routing
    to private pools)."""
    r = run_stress(stress_binary, kind, "4", "4", "20000", str(64 << 20), "100")
    assert r["calls"] and all(r["calls"].values()), f"methods never called: {r['calls']}"
