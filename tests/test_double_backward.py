"""Double backward (create_graph=True) of every torchext op: gradgradcheck in float64 for every op and option, second
derivatives (Hessian-vector products) against torch's own, errors where a derivative is not implemented, the fused
first-order backward kept when create_graph=False, and a property test against torch over random shapes."""

from functools import partial

import pytest
import torch
import torch.nn.functional as F
from conftest import device_params, make_tensor
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.autograd import gradgradcheck
from torch.utils._python_dispatch import TorchDispatchMode

import torchext.functional as TF

REDUCTIONS = ("none", "mean", "sum")

# name -> (torchext function, torch function), for the ops of one tensor.
UNARY = {
    "relu": (TF.relu, F.relu),
    "leaky_relu": (TF.leaky_relu, F.leaky_relu),
    "leaky_relu_0.3": (lambda x: TF.leaky_relu(x, 0.3), lambda x: F.leaky_relu(x, 0.3)),
    "sigmoid": (TF.sigmoid, torch.sigmoid),
    "tanh": (TF.tanh, torch.tanh),
    "gelu": (TF.gelu, F.gelu),
    "gelu_tanh": (lambda x: TF.gelu(x, approximate="tanh"), lambda x: F.gelu(x, approximate="tanh")),
    "silu": (TF.silu, F.silu),
    "softmax": (lambda x: TF.softmax(x, dim=-1), lambda x: F.softmax(x, dim=-1)),
    "log_softmax": (lambda x: TF.log_softmax(x, dim=-1), lambda x: F.log_softmax(x, dim=-1)),
}
ELEMENTWISE = [name for name in UNARY if "softmax" not in name]


def f64(shape, device, low=-3.0, high=3.0, requires_grad=True, layout="contiguous"):
    return make_tensor(shape, torch.float64, device, layout, low=low, high=high, requires_grad=requires_grad)


def _targets(n, classes, device, ignore_index=None):
    t = torch.randint(0, classes, (n,), device=device)
    if ignore_index is not None:
        t[::3] = ignore_index
    return t


def second_derivatives(fn, inputs, seed=1):
    """d/d(inputs) of <v, d<u, fn(inputs)>/d(inputs)>: Hessian-vector products, plus the gradient with respect to the
    first-order grad_output u, for random u and v."""
    gen = torch.Generator().manual_seed(seed)
    out = fn(*inputs)
    u = torch.randn(out.shape, generator=gen, dtype=out.dtype).to(out.device).requires_grad_(True)
    grads = torch.autograd.grad(out, inputs, u, create_graph=True)
    vs = [torch.randn(g.shape, generator=gen, dtype=g.dtype).to(g.device) for g in grads]
    dot = sum((g * v).sum() for g, v in zip(grads, vs))
    return torch.autograd.grad(dot, (*inputs, u), allow_unused=True, materialize_grads=True)


def assert_same_second_derivatives(ours_fn, torch_fn, inputs, what):
    ours = second_derivatives(ours_fn, inputs)
    theirs = second_derivatives(torch_fn, inputs)
    names = [f"input {i}" for i in range(len(inputs))] + ["grad_output"]
    for name, a, b in zip(names, ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11, msg=lambda m, name=name: f"[{what}: d2/d {name}] {m}")


# ---------------------------------------------------------------------------------------------------------------
# The regression: second derivatives were silently zero.


def test_sigmoid_second_derivative_is_not_zero():
    x = torch.tensor([0.5, -1.0], dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(TF.sigmoid(x).pow(2).sum(), x, create_graph=True)
    (gg,) = torch.autograd.grad(g.sum(), x)
    expected = torch.tensor([0.0388, 0.1262], dtype=torch.float64)
    torch.testing.assert_close(gg, expected, atol=1e-4, rtol=0, msg="[d2/dx2 sum(sigmoid(x)^2)] vs torch's values")


# ---------------------------------------------------------------------------------------------------------------
# gradgradcheck: every op and option, float64.


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("name", UNARY)
def test_unary_gradgradcheck(name, device):
    fn = UNARY[name][0]
    for shape in ((3, 5), (4,)):
        assert gradgradcheck(fn, (f64(shape, device),)), f"[{name} {shape}]"
    # A transposed input and the backward ops' own second derivatives along a grad_output that requires grad.
    assert gradgradcheck(fn, (f64((4, 3), device, layout="transposed"),)), f"[{name} transposed]"


@pytest.mark.parametrize("device", device_params())
def test_add_gradgradcheck(device):
    """add's backward passes grad_output to both inputs: its second derivative is zero, and the gradient with respect
    to grad_output is the identity, through the same Function."""
    for shape in ((3, 5), (4,)):
        assert gradgradcheck(TF.add, (f64(shape, device), f64(shape, device))), f"[add {shape}]"
    assert gradgradcheck(TF.add, (f64((4, 3), device, layout="transposed"), f64((4, 3), device))), "[add transposed]"


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_cross_entropy_gradgradcheck(device, reduction, weighted):
    classes = 5
    w = f64((classes,), device, 0.2, 2.0, requires_grad=False) if weighted else None
    t = _targets(7, classes, device, ignore_index=-100)
    for label_smoothing in (0.0, 0.2):
        x = f64((7, classes), device)
        fn = partial(TF.cross_entropy, target=t, weight=w, reduction=reduction, label_smoothing=label_smoothing)
        assert gradgradcheck(fn, (x,)), f"[cross_entropy {reduction} weighted={weighted} eps={label_smoothing}]"
    # ignore_index other than the default, and (N, C, d) input.
    t3 = _targets(6, classes, device, ignore_index=2).reshape(2, 3)
    x3 = f64((2, classes, 3), device)
    fn = lambda x: TF.cross_entropy(x, t3, w, ignore_index=2, reduction=reduction, label_smoothing=0.1)  # noqa: E731
    assert gradgradcheck(fn, (x3,)), f"[cross_entropy (N, C, d) ignore_index=2 {reduction} weighted={weighted}]"


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("activation", [None, "relu", "gelu", "gelu_tanh", "silu"])
def test_linear_gradgradcheck(device, activation):
    x, w, b = f64((2, 3, 4), device), f64((5, 4), device), f64((5,), device)
    assert gradgradcheck(lambda x, w, b: TF.linear(x, w, b, activation), (x, w, b)), f"[linear {activation} bias]"
    assert gradgradcheck(lambda x, w: TF.linear(x, w, None, activation), (x, w)), f"[linear {activation} no bias]"
    # One operand requiring grad: the other is saved as a stand-in without its values.
    w_const = w.detach()
    assert gradgradcheck(lambda x: TF.linear(x, w_const, b.detach(), activation), (x,)), f"[linear {activation} input]"
    x_const = f64((4,), device, requires_grad=False)
    assert gradgradcheck(lambda w: TF.linear(x_const, w, None, activation), (w,)), f"[linear {activation} weight, 1-D]"


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("activation", ["none", "relu", "gelu", "silu"])
def test_linear_backward_op_gradgradcheck(device, activation):
    """linear_backward called directly is differentiable too (its Autograd kernel composes it when a graph is
    recorded)."""
    x, w = f64((3, 4), device), f64((5, 4), device)
    out, saved = torch.ops.torchext.linear(x.detach(), w.detach(), None, activation)
    g = f64(out.shape, device)
    saved = saved.requires_grad_(saved.numel() > 0)

    def fn(g, x, w, saved):
        return torch.ops.torchext.linear_backward(g, x, w, out, saved, activation, False, [True, True, False])[:2]

    assert gradgradcheck(fn, (g, x, w, saved)), f"[linear_backward {activation}]"


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_mse_loss_gradgradcheck(device, reduction):
    x, y = f64((3, 4), device), f64((3, 4), device)
    w = f64((3, 4), device, 0.1, 2.0, requires_grad=False)
    assert gradgradcheck(lambda x, y: TF.mse_loss(x, y, reduction=reduction), (x, y)), f"[mse_loss {reduction}]"
    fn = lambda x, y: TF.mse_loss(x, y, reduction=reduction, weight=w)  # noqa: E731
    assert gradgradcheck(fn, (x, y)), f"[mse_loss {reduction} weighted]"


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_binary_cross_entropy_with_logits_gradgradcheck(device, reduction):
    x, y = f64((3, 4), device), f64((3, 4), device, 0.0, 1.0)
    w = f64((3, 4), device, 0.1, 2.0, requires_grad=False)
    pw = f64((4,), device, 0.5, 3.0, requires_grad=False)
    for weight, pos_weight in ((None, None), (w, None), (None, pw), (w, pw)):
        fn = partial(TF.binary_cross_entropy_with_logits, weight=weight, reduction=reduction, pos_weight=pos_weight)
        what = f"[bce_with_logits {reduction} weight={weight is not None} pos_weight={pos_weight is not None}]"
        assert gradgradcheck(fn, (x, y)), what


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("p", [1, 2])
def test_multi_margin_loss_gradgradcheck(device, reduction, p):
    w = f64((5,), device, 0.2, 2.0, requires_grad=False)
    t = torch.tensor([0, 3, 4, 1], device=device)
    for weight in (None, w):
        x = f64((4, 5), device, -1.0, 1.0)
        fn = partial(TF.multi_margin_loss, target=t, p=p, margin=0.8, weight=weight, reduction=reduction)
        assert gradgradcheck(fn, (x,)), f"[multi_margin_loss p={p} {reduction} weighted={weight is not None}]"
    x1 = f64((5,), device, -1.0, 1.0)
    fn = lambda x: TF.multi_margin_loss(x, torch.tensor(2, device=device), p=p, reduction=reduction)  # noqa: E731
    assert gradgradcheck(fn, (x1,)), f"[multi_margin_loss (C,) p={p} {reduction}]"


@pytest.mark.parametrize("device", device_params())
def test_matmul_gradgradcheck(device):
    for a_shape, b_shape in (((3, 4), (4, 2)), ((2, 3, 4), (4, 2)), ((2, 3, 4), (2, 4, 5))):
        a, b = f64(a_shape, device), f64(b_shape, device)
        assert gradgradcheck(TF.matmul, (a, b)), f"[matmul {a_shape} @ {b_shape}]"


@pytest.mark.parametrize("device", device_params())
def test_double_backward_with_empty_dimensions(device):
    """Zero rows through linear (its composed backward runs matmuls with k = 0), k = 0 and n = 0 through matmul:
    the derivatives are empty or zero tensors, no reshape error."""
    cases = {
        "linear, 0 rows": (lambda x, w: TF.linear(x, w, None, "gelu"), ((0, 4), (3, 4))),
        "matmul, k = 0": (TF.matmul, ((3, 0), (0, 4))),
        "matmul, n = 0": (TF.matmul, ((2, 3, 4), (4, 0))),
    }
    for what, (fn, shapes) in cases.items():
        inputs = [f64(shape, device) for shape in shapes]
        assert gradgradcheck(fn, inputs), f"[{what}]"
        for i, d2 in enumerate(second_derivatives(fn, inputs)):
            assert not d2.any(), f"[{what}: second derivative {i}] expected zeros, got {d2}"


# ---------------------------------------------------------------------------------------------------------------
# Second derivatives against torch's own.


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("name", UNARY)
def test_unary_second_derivatives_match_torch(name, device):
    ours, theirs = UNARY[name]
    assert_same_second_derivatives(ours, theirs, (f64((3, 6), device),), name)


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_losses_second_derivatives_match_torch(device, reduction):
    x, y, prob = f64((4, 5), device), f64((4, 5), device), f64((4, 5), device, 0.0, 1.0)
    w = f64((5,), device, 0.2, 2.0, requires_grad=False)
    t = _targets(4, 5, device, ignore_index=-100)
    ce = dict(weight=w, reduction=reduction, label_smoothing=0.1)
    assert_same_second_derivatives(
        lambda x: TF.cross_entropy(x, t, **ce), lambda x: F.cross_entropy(x, t, **ce), (x,), "cross_entropy"
    )
    assert_same_second_derivatives(
        lambda x, y: TF.mse_loss(x, y, reduction=reduction),
        lambda x, y: F.mse_loss(x, y, reduction=reduction),
        (x, y),
        "mse_loss",
    )
    bce = dict(weight=w, pos_weight=w.flip(0), reduction=reduction)
    assert_same_second_derivatives(
        lambda x, y: TF.binary_cross_entropy_with_logits(x, y, **bce),
        lambda x, y: F.binary_cross_entropy_with_logits(x, y, **bce),
        (x, prob),
        "binary_cross_entropy_with_logits",
    )


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "silu"])
def test_linear_second_derivatives_match_torch(device, activation):
    act = {
        "relu": F.relu,
        "gelu": F.gelu,
        "gelu_tanh": lambda z: F.gelu(z, approximate="tanh"),
        "silu": F.silu,
    }[activation]
    x, w, b = f64((2, 3, 4), device), f64((5, 4), device), f64((5,), device)
    assert_same_second_derivatives(
        lambda x, w, b: TF.linear(x, w, b, activation), lambda x, w, b: act(F.linear(x, w, b)), (x, w, b), activation
    )


def test_gradient_penalty_matches_torch():
    """WGAN-GP: the norm of d critic / d input, trained through; the critic's parameter gradients match torch's."""
    x = f64((6, 4), "cpu")
    w1, b1, w2 = f64((8, 4), "cpu"), f64((8,), "cpu"), f64((1, 8), "cpu")

    def penalty_grads(linear, act):
        (g,) = torch.autograd.grad(linear(act(linear(x, w1, b1)), w2, None).sum(), x, create_graph=True)
        return torch.autograd.grad(((g.norm(dim=1) - 1) ** 2).mean(), (w1, b1, w2))

    ours = penalty_grads(TF.linear, TF.silu)
    theirs = penalty_grads(F.linear, F.silu)
    for name, a, b in zip(("w1", "b1", "w2"), ours, theirs):
        torch.testing.assert_close(
            a, b, rtol=1e-9, atol=1e-12, msg=lambda m, name=name: f"[gradient penalty d/d{name}] {m}"
        )


# ---------------------------------------------------------------------------------------------------------------
# Clear errors where a derivative is not implemented; first order unchanged.


def test_second_derivative_wrt_loss_weights_raises():
    x, y = f64((3, 4), "cpu"), f64((3, 4), "cpu", 0.0, 1.0)
    w = f64((3, 4), "cpu", 0.1, 2.0)
    cases = {
        "mse_loss": lambda: TF.mse_loss(x, y, weight=w),
        "binary_cross_entropy_with_logits": lambda: TF.binary_cross_entropy_with_logits(x, y, pos_weight=w[0]),
        "multi_margin_loss": lambda: TF.multi_margin_loss(x, torch.tensor([0, 3, 1]), p=2, weight=w[0]),
    }
    for op, loss_fn in cases.items():
        # The first-order gradient with respect to x alone is available; its derivative with respect to the weight
        # is not, and says so.
        (g,) = torch.autograd.grad(loss_fn(), x, create_graph=True)
        with pytest.raises(NotImplementedError, match=f"torchext::{op}_backward: .*`(pos_)?weight`"):
            torch.autograd.grad(g.pow(2).sum(), w)


def test_cross_entropy_backward_rejects_lse_grad():
    x = f64((3, 4), "cpu", requires_grad=False)
    t = torch.tensor([0, 3, 1])
    loss, lse, total_weight = torch.ops.torchext.cross_entropy(x, t, None, "sum", -100, 0.0)
    g = torch.ones((), dtype=torch.float64)
    lse = lse.clone().requires_grad_(True)
    out = torch.ops.torchext.cross_entropy_backward(g, x, t, None, "sum", -100, 0.0, lse, total_weight)
    with pytest.raises(NotImplementedError, match="`lse` is not implemented \\(a non-differentiable result"):
        torch.autograd.grad(out.sum(), lse)


class _OpLog(TorchDispatchMode):
    """The ops that run below autograd."""

    def __init__(self):
        super().__init__()
        self.names = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(func.name())
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("create_graph", [False, True])
def test_first_order_backward_stays_fused(create_graph):
    """With create_graph=False, backward runs the fused *_backward kernels and records no graph; with
    create_graph=True, linear's backward is composed from differentiable ops."""
    x, w = f64((3, 4), "cpu"), f64((5, 4), "cpu")
    y = TF.sigmoid(TF.linear(x, w, None, "gelu")).sum()
    with _OpLog() as log:
        grads = torch.autograd.grad(y, (x, w), create_graph=create_graph)
    assert "torchext::sigmoid_backward" in log.names, f"[ops run by backward] {sorted(log.names)}"
    if create_graph:
        assert {"torchext::gelu_backward", "torchext::matmul"} <= log.names, f"[composed backward] {log.names}"
        assert all(g.requires_grad for g in grads), "[create_graph=True] gradients must be differentiable"
    else:
        assert "torchext::linear_backward" in log.names, f"[fused backward] {sorted(log.names)}"
        assert "torchext::matmul" not in log.names, f"[fused backward] {sorted(log.names)}"
        assert not any(g.requires_grad for g in grads), "[create_graph=False] no graph may be recorded"


# ---------------------------------------------------------------------------------------------------------------
# Property test: random shapes (0-D to 4-D, empty dimensions) and values, double backward against torch.


@settings(max_examples=30, deadline=None)
@given(
    name=st.sampled_from(list(UNARY)),
    shape=st.lists(st.integers(0, 4), min_size=0, max_size=4),
    seed=st.integers(0, 2**31 - 1),
    scale=st.sampled_from([0.5, 3.0, 20.0]),
)
def test_double_backward_matches_torch_property(name, shape, seed, scale):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1) * scale
    if name in ELEMENTWISE and x.numel() > 0:
        x.view(-1)[0] = 0.0  # the kinks of relu and leaky_relu: the same one-sided derivative as torch
    x.requires_grad_(True)
    ours, theirs = UNARY[name]
    assert_same_second_derivatives(ours, theirs, (x,), f"{name} {tuple(shape)} scale {scale}")
