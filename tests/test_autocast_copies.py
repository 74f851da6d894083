"""Autocast copies (csrc/autocast_copies.h, docs/autocast_copies.md): torchext.optim.SGD(autocast_copies=dtype) writes
each float32 weight's low-precision copy in its step, and torchext's conv2d / conv2d_stats read it under CUDA autocast
instead of casting the weight. Training with the copies gives the same bits as training with the casts; the copy is
not used once the weight changed behind the optimizer's back (an in-place write, a new `.data`), after a captured step,
under torch.compile, or for a second derivative; and a graph that saved a copy keeps its value through a step."""

import copy

import pytest
import torch
from conftest import gpu

import torchext
from torchext.optim import SGD


def test_option_and_op_argument_are_checked():
    p = torch.nn.Parameter(torch.ones(3))
    with pytest.raises(ValueError, match="`autocast_copies` must be None, torch.float16 or torch.bfloat16"):
        SGD([p], lr=0.1, autocast_copies=torch.float32)
    with pytest.raises(ValueError, match=r"`autocast_copies` must be torch.float16 or torch.bfloat16"):
        torch.ops.torchext.sgd_([torch.zeros(2)], [torch.ones(2)], [], 0.1, autocast_copies=torch.float64)


def test_cpu_params_step_as_without_copies():
    """The CPU kernel has no copies to write (CPU autocast runs torchext's convolutions in float32): same update."""
    a = torch.nn.Parameter(torch.randn(4, 3))
    b = torch.nn.Parameter(a.detach().clone())
    for p in (a, b):
        p.grad = torch.ones_like(p)
    SGD([a], lr=0.1, momentum=0.9, autocast_copies=torch.bfloat16).step()
    SGD([b], lr=0.1, momentum=0.9).step()
    assert torch.equal(a, b)


class _Net(torch.nn.Module):
    """conv -> BN -> ReLU twice (the second convolution with statistics for its BatchNorm), pool, Linear."""

    def __init__(self):
        super().__init__()
        self.conv1 = torchext.nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn1 = torchext.nn.BatchNorm2d(16)
        self.conv2 = torchext.nn.Conv2dStats(16, 32, 3, padding=1, bias=False)
        self.bn2 = torchext.nn.BatchNorm2d(32)
        self.fc = torch.nn.Linear(32, 10)

    def forward(self, x, batch_norm=True):
        x = self.conv1(x)
        x = torch.relu(self.bn1(x) if batch_norm else x)
        out, s, ss = self.conv2(x)
        x = torch.relu(self.bn2(out, sum=s, sum_sq=ss) if batch_norm else out)
        return self.fc(x.mean((2, 3)))


def _pair(dtype=torch.bfloat16, seed=0):
    """(model with copies, its optimizer, model with casts, its optimizer): the same weights, channels-last."""
    torch.manual_seed(seed)
    a = _Net().cuda().to(memory_format=torch.channels_last)
    b = copy.deepcopy(a)
    kw = dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)
    return a, SGD(a.parameters(), autocast_copies=dtype, **kw), b, SGD(b.parameters(), **kw)


def _conv_weights(model):
    return [model.conv1.weight, model.conv2.weight]


def _batch(step, n=8):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(n, 3, 12, 12, generator=g).cuda().to(memory_format=torch.channels_last)
    return x, torch.randint(0, 10, (n,), generator=g).cuda()


def _train_step(model, opt, step, dtype):
    x, y = _batch(step)
    with torch.autocast("cuda", dtype=dtype):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.detach()


def _weight_casts(model, dtype):
    """How many float32 -> dtype casts of a convolution weight one forward + backward runs (profiler: aten::_to_copy
    calls whose input has a weight's shape)."""
    shapes = {tuple(m.weight.shape) for m in model.modules() if isinstance(m, torch.nn.Conv2d)}
    x, y = _batch(0)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        with torch.autocast("cuda", dtype=dtype):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
    model.zero_grad(set_to_none=True)
    return sum(1 for e in prof.events() if e.name == "aten::_to_copy" and e.input_shapes and
               tuple(e.input_shapes[0]) in shapes)  # fmt: skip


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_training_with_copies_gives_the_casts_bits(dtype):
    """Six steps with copies and six with autocast's casts: the same losses and parameters, bit for bit; and from the
    second step on, the forward reads the copies (no weight cast in the forward). With or without copies the weights'
    gradients come in float32 from the convolution's own node (no cast back)."""
    a, oa, b, ob = _pair(dtype)
    for step in range(6):
        la, lb = _train_step(a, oa, step, dtype), _train_step(b, ob, step, dtype)
        assert torch.equal(la, lb), f"step {step}: loss {la.item()} != {lb.item()}"
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb), name
    assert pa.dtype == torch.float32
    # Casts of conv weights in one forward + backward: none with copies; without, the weights' (2 convolutions).
    assert (_weight_casts(a, dtype), _weight_casts(b, dtype)) == (0, 2)


@gpu
@pytest.mark.parametrize(
    "change",
    ["in_place", "new_data", "data_copy_then_increment_version"],
)
def test_a_weight_changed_outside_the_step_is_cast_again(change):
    """After a step, a weight changed in place (version bump), given a new `.data` (another data pointer), or written
    through `.data` followed by torch.autograd.graph.increment_version: the forward uses the new values."""
    dtype = torch.bfloat16
    a, oa, b, ob = _pair(dtype)
    for step in range(2):
        _train_step(a, oa, step, dtype)
        _train_step(b, ob, step, dtype)
    new = torch.randn_like(a.conv1.weight)
    for model in (a, b):
        w = model.conv1.weight
        with torch.no_grad():
            if change == "in_place":
                w.copy_(new)
            elif change == "new_data":
                w.data = new.clone(memory_format=torch.channels_last)
            else:
                w.data.copy_(new)
                torch.autograd.graph.increment_version(w)
    x, _ = _batch(7)
    with torch.autocast("cuda", dtype=dtype):
        assert torch.equal(a(x), b(x))


@gpu
@pytest.mark.parametrize("penalty", ["input_gradient", "weight_gradient"])
def test_second_derivative_reaches_the_weights(penalty):
    """Gradient penalties (create_graph=True) with the copies fresh: on the input's gradient (the convolution's node
    casts the weight again, differentiably) and on the weights' gradients (conv2d_backward's node takes the float32
    grad_weight's gradient). The weights' gradients are the same with copies and without, and as close to stock
    torch's float64 result on the same parameters as stock's own under autocast (cuDNN and autocast's casts, 1.0-1.3%
    off in norm on an H200: bf16). Without the BatchNorms, whose second derivative is not this test's subject."""
    dtype = torch.bfloat16
    a, oa, b, ob = _pair(dtype)
    for step in range(2):
        _train_step(a, oa, step, dtype)
        _train_step(b, ob, step, dtype)
    for model in (a, b):
        model.zero_grad(set_to_none=True)  # the last step's gradients: .backward() below would add to them

    def stock_forward(model, x):
        x = torch.relu(torch.nn.functional.conv2d(x, model.conv1.weight, padding=1))
        x = torch.relu(torch.nn.functional.conv2d(x, model.conv2.weight, padding=1))
        return model.fc(x.mean((2, 3)))

    def penalty_grads(model, forward, autocast=True):
        x, _ = _batch(9)
        x = x.to(next(model.parameters()).dtype).requires_grad_(True)
        with torch.autocast("cuda", dtype=dtype, enabled=autocast):
            out = forward(model, x).float().square().sum()
        wrt = [x] if penalty == "input_gradient" else _conv_weights(model)
        g = torch.autograd.grad(out, wrt, create_graph=True)
        sum(t.float().square().sum() for t in g).backward()
        grads = [p.grad.clone() for p in _conv_weights(model)]
        model.zero_grad(set_to_none=True)
        return grads

    ours = lambda m, x: m(x, batch_norm=False)  # noqa: E731
    ga, gb, gs = penalty_grads(a, ours), penalty_grads(b, ours), penalty_grads(a, stock_forward)
    ref = penalty_grads(copy.deepcopy(a).double(), stock_forward, autocast=False)
    for wa, wb, ws, w64 in zip(ga, gb, gs, ref, strict=True):
        assert wa.dtype == torch.float32 and w64.abs().max() > 0
        assert torch.equal(wa, wb)
        err, err_stock = ((w.double() - w64).norm() / w64.norm() for w in (wa, ws))
        assert err <= 1.5 * err_stock + 1e-3, (err.item(), err_stock.item())


@gpu
def test_a_graph_that_saved_a_copy_keeps_it_through_a_step():
    """forward, step, backward: the step writes a new copy where a graph still holds the old one, so the backward
    computes with the weights of its forward, as with autocast's casts. The step updates the convolutions' weights
    only (a BatchNorm's backward reads its weight, which a step would change under the graph in both models)."""
    dtype = torch.bfloat16
    a, _, b, _ = _pair(dtype)
    kw = dict(lr=0.05, momentum=0.9)
    oa, ob = SGD(_conv_weights(a), autocast_copies=dtype, **kw), SGD(_conv_weights(b), **kw)
    for step in range(2):
        _train_step(a, oa, step, dtype)
        _train_step(b, ob, step, dtype)
    x, y = _batch(11)
    for model, opt in ((a, oa), (b, ob)):
        with torch.autocast("cuda", dtype=dtype):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward(retain_graph=True)
        opt.step()
        model.zero_grad(set_to_none=True)
        loss.backward()
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(pa.grad, pb.grad), name


@gpu
def test_a_captured_step_drops_the_copies():
    """A step captured in a CUDA graph changes the weights at each replay without a version bump: its params' copies
    are dropped for good, and eager forwards cast the weights again."""
    dtype = torch.bfloat16
    a, oa, b, ob = _pair(dtype)
    lr = torch.tensor(0.05, device="cuda")
    for group in oa.param_groups:
        group["lr"] = lr
    for step in range(2):
        _train_step(a, oa, step, dtype)
        _train_step(b, ob, step, dtype)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s), torch.cuda.graph(graph):
        oa.step()  # the gradients of the last eager step, kept: zero_grad ran before its backward
    torch.cuda.current_stream().wait_stream(s)
    graph.replay()
    torch.cuda.synchronize()
    x, _ = _batch(12)
    with torch.no_grad(), torch.autocast("cuda", dtype=dtype):
        out = a(x)
    with torch.no_grad():
        for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
            pb.copy_(pa)
    with torch.no_grad(), torch.autocast("cuda", dtype=dtype):
        assert torch.equal(out, b(x))


@gpu
def test_compiled_model_casts_as_usual():
    """Under torch.compile (AOTAutograd traces with fake tensors) the copies are not used: the compiled model's
    output equals the eager one's through autocast's casts."""
    dtype = torch.bfloat16
    a, oa, b, ob = _pair(dtype)
    for step in range(2):
        _train_step(a, oa, step, dtype)
        _train_step(b, ob, step, dtype)
    x, _ = _batch(13)
    compiled = torch.compile(a, backend="aot_eager", fullgraph=True)
    with torch.autocast("cuda", dtype=dtype):
        assert torch.equal(compiled(x), b(x))


@gpu
def test_weight_gradients_come_from_the_float_sums(dtype=torch.bfloat16):
    """Under CUDA autocast a float32 weight's gradient is the kernel's float32 sums, not those rounded to the autocast
    dtype and cast back (autocast's cast node): for conv2 (implicit GEMM) it differs from the rounded gradient, which
    it rounds to; conv1 (3 input channels: the cast path of conv2d_backward) gives the rounded one. With copies and
    without alike."""
    a, oa, b, ob = _pair(dtype)
    for model, opt in ((a, oa), (b, ob)):
        _train_step(model, opt, 0, dtype)  # model a now reads copies, b casts
    x, y = _batch(5)
    for model in (a, b):
        with torch.autocast("cuda", dtype=dtype):
            out = model.conv1(x)
            out2, _, _ = model.conv2(torch.relu(out))
        go = torch.randn_like(out2)
        gw1, gw2 = torch.autograd.grad(out2, (model.conv1.weight, model.conv2.weight), go)
        assert gw1.dtype == gw2.dtype == torch.float32
        ops = torch.ops.torchext
        x2 = torch.relu(out).detach()
        w2 = model.conv2.weight.detach().to(dtype)
        rounded = ops.conv2d_backward(go.to(dtype), x2, w2, [1, 1], [1, 1], [1, 1], 1, [False, True, False])[1]
        assert torch.equal(gw2.to(dtype), rounded) and not torch.equal(gw2, rounded.float())
        assert torch.equal(gw1, gw1.to(dtype).float())


@gpu
def test_a_step_without_copies_makes_them_stale():
    """Steps with copies, then a step of an SGD without them under torch.inference_mode() (no version bump): the
    forward must not read the copies the first optimizer wrote."""
    dtype = torch.bfloat16
    a, oa, b, ob = _pair(dtype)
    for step in range(2):
        _train_step(a, oa, step, dtype)
        _train_step(b, ob, step, dtype)
    plain_a, plain_b = (SGD(m.parameters(), lr=0.5) for m in (a, b))
    for model, opt in ((a, plain_a), (b, plain_b)):
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        with torch.inference_mode():
            opt.step()
    x, _ = _batch(14)
    with torch.no_grad(), torch.autocast("cuda", dtype=dtype):
        assert torch.equal(a(x), b(x))


@gpu
def test_copies_of_another_dtype_are_not_used():
    """Copies written in bfloat16, a forward under float16 autocast: the weights are cast to float16 as usual."""
    a, oa, b, ob = _pair(torch.bfloat16)
    for step in range(2):
        _train_step(a, oa, step, torch.bfloat16)
        _train_step(b, ob, step, torch.bfloat16)
    assert _weight_casts(a, torch.float16) == _weight_casts(b, torch.float16)
    x, _ = _batch(15)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
        assert torch.equal(a(x), b(x))


@gpu
def test_second_derivative_after_a_step_under_a_kept_graph_raises():
    """forward, step, then a second derivative through the old graph: the differentiable recast would read the new
    weight while the copy holds the old one, so it raises instead of mixing them."""
    dtype = torch.bfloat16
    a, _, _, _ = _pair(dtype)
    opt = SGD(_conv_weights(a), lr=0.05, momentum=0.9, autocast_copies=dtype)
    for step in range(2):
        _train_step(a, opt, step, dtype)
    x, _ = _batch(16)
    x.requires_grad_(True)
    with torch.autocast("cuda", dtype=dtype):
        out = a(x, batch_norm=False).float().square().sum()
    out.backward(retain_graph=True)
    opt.step()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(out, x, create_graph=True)
