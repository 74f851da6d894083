"""torchext.optim.SGD and the op under it, torch.ops.torchext.sgd_: the same updates as torch.optim.SGD over several
steps (every option), state_dict in both directions, a tensor learning rate, bad arguments, and on the GPU the
multi-tensor packing (more tensors and chunks than one launch holds), unaligned tensors, half types and CUDA graphs."""

import copy

import pytest
import torch
from conftest import device_params, gpu

import torchext
from torchext.optim import SGD

OPTIONS = [
    dict(momentum=0.0),
    dict(momentum=0.9),
    dict(momentum=0.9, nesterov=True, weight_decay=5e-4),
    dict(momentum=0.5, dampening=0.3, weight_decay=1e-2),
    dict(momentum=0.9, maximize=True, weight_decay=1e-3),
    dict(momentum=0.0, weight_decay=1e-2, maximize=True),
]


def _params(device, dtype, sizes=((3, 5), (7,), (1,), (0,), (2, 3, 4, 5)), seed=0):
    g = torch.Generator().manual_seed(seed)
    ps = [torch.randn(s, generator=g, dtype=torch.float64).to(device=device, dtype=dtype) for s in sizes]
    # A channels-last weight: param, grad and buffer share its layout.
    cl = torch.randn(4, 3, 3, 3, generator=g, dtype=torch.float64).to(device=device, dtype=dtype)
    ps.append(cl.to(memory_format=torch.channels_last))
    return [torch.nn.Parameter(p) for p in ps]


def _set_grads(params, step, skip=()):
    g = torch.Generator().manual_seed(100 + step)
    for i, p in enumerate(params):
        if i in skip:
            p.grad = None
            continue
        p.grad = torch.randn(p.shape, generator=g, dtype=torch.float64).to(device=p.device, dtype=p.dtype)


def _run(opt_cls, params, options, steps=4, lr=0.1):
    opt = opt_cls(params, lr=lr, **options)
    for step in range(steps):
        # The second param has no gradient in step 1: it is skipped, and its buffer starts one step later.
        _set_grads(params, step, skip=(1,) if step == 1 else ())
        opt.step()
    return opt


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_sgd_matches_torch_float64(device, options):
    ours = _params(device, torch.float64)
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    o = _run(SGD, ours, options)
    t = _run(lambda ps, **kw: torch.optim.SGD(ps, foreach=False, **kw), theirs, options)
    for a, b in zip(ours, theirs, strict=True):
        assert a.stride() == b.stride()
        torch.testing.assert_close(a, b, rtol=1e-14, atol=1e-14)
    for a, b in zip(ours, theirs, strict=True):
        sa, sb = o.state[a].get("momentum_buffer"), t.state[b].get("momentum_buffer")
        assert (sa is None) == (sb is None)
        if sa is not None:
            torch.testing.assert_close(sa, sb, rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("options", OPTIONS[1:3], ids=["momentum", "nesterov"])
def test_sgd_float32_against_float64(device, options):
    """float32: within a few float32 roundings of the float64 update, as torch's own float32 step is."""
    ours = _params(device, torch.float32)
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    ref = [torch.nn.Parameter(p.detach().double()) for p in ours]
    _run(SGD, ours, options)
    _run(torch.optim.SGD, theirs, options)
    _run(torch.optim.SGD, ref, options)
    for a, b, r in zip(ours, theirs, ref, strict=True):
        err, torch_err = (
            (a.double() - r).abs().max().item() if a.numel() else 0,
            ((b.double() - r).abs().max().item() if b.numel() else 0),
        )
        assert err <= max(2 * torch_err, 1e-6), (err, torch_err)


@pytest.mark.parametrize("device", device_params())
def test_sgd_state_dict_both_ways(device):
    """A state saved by torch.optim.SGD continues in torchext's SGD, and the reverse, as if the class had not
    changed."""
    options = dict(momentum=0.9, nesterov=True, weight_decay=5e-4)
    for first, second in ((torch.optim.SGD, SGD), (SGD, torch.optim.SGD)):
        a = _params(device, torch.float64)
        b = [torch.nn.Parameter(p.detach().clone()) for p in a]
        oa = _run(lambda ps, **kw: torch.optim.SGD(ps, foreach=False, **kw), a, options, steps=6)
        ob = _run(first, b, options, steps=3)
        ob2 = second(b, lr=0.1, **options)
        ob2.load_state_dict(copy.deepcopy(ob.state_dict()))
        for step in range(3, 6):
            _set_grads(b, step, skip=(1,) if step == 1 else ())
            ob2.step()
        for x, y in zip(a, b, strict=True):
            torch.testing.assert_close(x, y, rtol=1e-14, atol=1e-14)
        assert set(ob2.state_dict()["state"]) == set(oa.state_dict()["state"])


@pytest.mark.parametrize("device", device_params())
def test_sgd_tensor_lr(device):
    """lr as a tensor (as torchext.graphs' captured steps use it): the same update as the float."""
    a = _params(device, torch.float64)
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    oa = SGD(a, lr=0.05, momentum=0.9)
    ob = SGD(b, lr=torch.tensor(0.05, dtype=torch.float64, device=device), momentum=0.9)
    for step in range(3):
        _set_grads(a, step)
        _set_grads(b, step)
        oa.step()
        ob.step()
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


def test_sgd_closure_and_refused_options():
    p = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))

    def closure():
        p.grad = torch.full_like(p, 2.0)
        return torch.tensor(7.0)

    opt = SGD([p], lr=0.5)
    assert opt.step(closure).item() == 7.0
    torch.testing.assert_close(p.detach(), torch.zeros(3, dtype=torch.float64))
    for kw in (dict(foreach=True), dict(fused=True), dict(differentiable=True)):
        with pytest.raises(ValueError, match="torchext.optim.SGD"):
            SGD([p], lr=0.1, **kw)
    with pytest.raises(ValueError, match="Nesterov"):
        SGD([p], lr=0.1, nesterov=True)  # torch.optim.SGD's own validation
    p.grad = torch.ones(3, dtype=torch.float64).to_sparse()
    with pytest.raises(RuntimeError, match="sparse"):
        SGD([p], lr=0.1).step()


def _op_args(n=2, dtype=torch.float32, momentum=0.9):
    ps = [torch.zeros(4, dtype=dtype) for _ in range(n)]
    gs = [torch.ones(4, dtype=dtype) for _ in range(n)]
    bs = [torch.zeros(4, dtype=dtype) for _ in range(n)] if momentum else []
    return ps, gs, bs


@pytest.mark.parametrize(
    "mutate, exc, match",
    [
        (lambda a: a[1].pop(), ValueError, r"`grads` must hold one tensor per param \(2\), got 1"),
        (lambda a: a[2].pop(), ValueError, r"`momentum_buffers` must hold one tensor per param"),
        (lambda a: a[1].__setitem__(1, torch.ones(5)), ValueError, r"`grads\[1\]` must have the same shape"),
        (
            lambda a: a[1].__setitem__(0, torch.ones(4, dtype=torch.float64)),
            TypeError,
            r"`grads\[0\]` must have the same dtype",
        ),
        (
            lambda a: a[0].__setitem__(1, torch.zeros(4, dtype=torch.float64)),
            TypeError,
            r"`params\[1\]` must have the same dtype",
        ),
        (lambda a: a[0].__setitem__(1, torch.zeros(8)[::2]), ValueError, r"`params\[1\]` must be dense"),
        (lambda a: a[2].__setitem__(0, torch.zeros(8)[::2]), ValueError, r"`momentum_buffers\[0\]` must be dense"),
        (lambda a: a[0].__setitem__(0, torch.zeros(4, dtype=torch.int64)), TypeError, r"`params\[0\]` must be float32"),
    ],
)
def test_sgd_op_bad_arguments(mutate, exc, match):
    args = list(_op_args())
    mutate(args)
    with pytest.raises(exc, match=match):
        torch.ops.torchext.sgd_(*args, 0.1, 0.9)


def test_sgd_op_bad_momentum_lists_and_lr_tensor():
    ps, gs, bs = _op_args(momentum=0.9)
    with pytest.raises(ValueError, match=r"`momentum_buffers` must be empty when momentum == 0"):
        torch.ops.torchext.sgd_(ps, gs, bs, 0.1, 0.0)
    with pytest.raises(ValueError, match=r"`lr_tensor` must hold one element"):
        torch.ops.torchext.sgd_(ps, gs, bs, 0.1, 0.9, lr_tensor=torch.ones(2))
    with pytest.raises(TypeError, match=r"`lr_tensor` must be float32 or float64"):
        torch.ops.torchext.sgd_(ps, gs, bs, 0.1, 0.9, lr_tensor=torch.ones((), dtype=torch.int64))
    # Nothing was written by the refused calls.
    assert all(bool((p == 0).all()) for p in ps)


def test_sgd_op_grad_in_another_layout():
    """A gradient whose strides differ from its param's (a contiguous grad of a channels-last weight) is read in the
    param's layout."""
    p = torch.randn(2, 3, 4, 5, dtype=torch.float64).to(memory_format=torch.channels_last)
    g = torch.randn(2, 3, 4, 5, dtype=torch.float64)
    expect = p - 0.5 * g
    torch.ops.torchext.sgd_([p], [g], [], 0.5)
    assert p.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(p, expect, rtol=0, atol=0)


def test_sgd_opcheck():
    ps, gs, bs = _op_args(3, torch.float64)
    torch.library.opcheck(torch.ops.torchext.sgd_.default, (ps, gs, bs, 0.1, 0.9, 0.0, 1e-4, True, False, True))


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_sgd_cuda_packing_and_alignment(dtype):
    """More tensors (103) and more 64 Ki-element chunks (a 25 M-element tensor: 382) than one launch holds, tensors at
    odd storage offsets (the scalar path) beside aligned ones, against the same update in float64 with the buffer
    rounded to the dtype as the kernel stores it."""
    g = torch.Generator().manual_seed(0)
    sizes = [int(s) for s in torch.randint(1, 3000, (100,), generator=g)] + [25_000_003, 65536, 65537]
    flat = torch.randn(sum(sizes) + len(sizes), generator=g).cuda().to(dtype)
    params, offset = [], 0
    for i, s in enumerate(sizes):
        offset += i % 2  # every other tensor starts one element past an aligned address
        params.append(flat[offset : offset + s])
        offset += s
    grads = [torch.randn(s, generator=g).cuda().to(dtype) for s in sizes]
    bufs = [torch.randn(s, generator=g).cuda().to(dtype) for s in sizes]
    ref_p = [p.double() for p in params]
    ref_b = [b.double() for b in bufs]
    lr, momentum, wd = 0.1, 0.9, 1e-3
    torch.ops.torchext.sgd_(params, grads, bufs, lr, momentum, 0.0, wd, True, False, False)
    for p, b, rp, rb, gr in zip(params, bufs, ref_p, ref_b, grads, strict=True):
        d = gr.double() + wd * rp
        nb = (momentum * rb + d).to(dtype).double()
        torch.testing.assert_close(b.double(), nb, rtol=0, atol=2 * nb.abs().max().item() * torch.finfo(dtype).eps)
        expect = rp - lr * (d + momentum * nb)
        torch.testing.assert_close(p.double(), expect, rtol=2 * torch.finfo(dtype).eps, atol=2 * torch.finfo(dtype).eps)


@gpu
def test_sgd_cuda_graph_follows_lr_tensor():
    """A step captured in a CUDA graph reads the learning rate tensor at replay: the replayed steps equal eager steps
    with the lr the tensor held."""
    torch.manual_seed(0)
    a = [torch.nn.Parameter(torch.randn(1000, device="cuda")) for _ in range(3)]
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    for p in a + b:
        p.grad = torch.ones_like(p)
    lr = torch.tensor(0.1, device="cuda")
    oa = SGD(a, lr=lr, momentum=0.9)
    oa.step()  # the buffers exist before capture
    ob = SGD(b, lr=0.1, momentum=0.9)
    ob.step()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s), torch.cuda.graph(graph):
        oa.step()
    torch.cuda.current_stream().wait_stream(s)
    for value in (0.1, 0.02, 0.5):
        lr.fill_(value)
        graph.replay()
        for group in ob.param_groups:
            group["lr"] = value
        ob.step()
    torch.cuda.synchronize()
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-6)


def test_sgd_step_bumps_versions_like_torch():
    """A backward whose graph saved a weight before the step raises afterwards, as with torch.optim.SGD (the op bumps
    the version counters of the params and buffers it writes), instead of using the updated weight."""
    for cls in (torch.optim.SGD, SGD):
        w = torch.nn.Parameter(torch.randn(3, 3, dtype=torch.float64))
        x = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
        w.grad = torch.ones_like(w)
        opt = cls([w], lr=0.1, momentum=0.9)
        y = (x @ w).sum()
        before = w._version
        opt.step()
        assert w._version > before, cls
        if cls is SGD:  # torch's first buffer is a fresh clone (version 0); ours is written by the op
            assert opt.state[w]["momentum_buffer"]._version > 0
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.backward()


def test_sgd_op_refuses_params_requiring_grad_in_grad_mode():
    p = torch.nn.Parameter(torch.zeros(4, dtype=torch.float64))
    g = torch.ones(4, dtype=torch.float64)
    with pytest.raises(RuntimeError, match=r"`params\[0\]` requires grad and grad mode is on"):
        torch.ops.torchext.sgd_([p], [g], [], 0.1)
    with torch.no_grad():
        torch.ops.torchext.sgd_([p], [g], [], 0.1)
    assert bool((p.detach() == -0.1).all())


def test_sgd_refused_step_leaves_no_buffer():
    """A step the op refuses (here a param listed twice) stores no momentum buffer: the next step starts from the
    gradient, as torch's first step does."""
    p = torch.nn.Parameter(torch.zeros(4, dtype=torch.float64))
    p.grad = torch.ones(4, dtype=torch.float64)
    opt = SGD([{"params": [p]}], lr=0.1, momentum=0.9)
    opt.param_groups[0]["params"].append(p)  # as a second param group entry would; torch warns at construction
    with pytest.raises(ValueError, match=r"`params\[1\]` is the same tensor as `params\[0\]`"):
        opt.step()
    assert "momentum_buffer" not in opt.state[p]
    opt.param_groups[0]["params"].pop()
    opt.step()
    torch.testing.assert_close(opt.state[p]["momentum_buffer"], p.grad)


def test_sgd_group_options_and_empty_lists():
    p = torch.nn.Parameter(torch.zeros(4, dtype=torch.float64))
    p.grad = torch.ones(4, dtype=torch.float64)
    opt = SGD([p], lr=0.1)
    opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))], "foreach": True})
    with pytest.raises(ValueError, match="`foreach=True` is not supported"):
        opt.step()
    torchext.ops.sgd_([], [], [], 0.1)  # nothing to update: no error


def test_sgd_op_compiles_fullgraph_with_inductor():
    """sgd_ inside a compiled function (inductor, fullgraph): the params and buffers it writes in place come out as
    eager's, channels-last included."""
    torch._dynamo.reset()
    a = _params("cpu", torch.float64)[-1:] + [torch.randn(7, dtype=torch.float64)]
    a = [p.detach() for p in a]
    b = [p.clone() for p in a]
    grads = [torch.randn_like(p) for p in a]
    bufs_a = [torch.randn_like(p) for p in a]
    bufs_b = [t.clone() for t in bufs_a]

    def step(ps, gs, bs):
        torch.ops.torchext.sgd_(ps, gs, bs, 0.1, 0.9, 0.0, 1e-3, True, False, False)

    torch.compile(step, backend="inductor", fullgraph=True)(a, grads, bufs_a)
    step(b, grads, bufs_b)
    for x, y in zip(a + bufs_a, b + bufs_b, strict=True):
        assert x.stride() == y.stride()
        torch.testing.assert_close(x, y, rtol=1e-14, atol=1e-14)
