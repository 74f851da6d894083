"""Fake kernels against the real ones. For every torchext op (every schema in csrc/ops.cpp, forwards and *_backward)
x every layout a user can hand it (contiguous, channels-last 2-D and 3-D, transposed, sliced, expanded, at a storage
offset, empty) x dtype, the fake kernel's results (under FakeTensorMode) have exactly the real kernel's sizes,
strides, storage offset, dtype and device: what torch.compile's inductor asserts at run time (`assert_size_stride`).
torch.library.opcheck (schema, fake, autograd registration, aot_dispatch) runs over the same samples, in float32.

The layout rule each op follows is in docs/compile.md. Shapes are small: the whole file takes a few seconds per
device."""

import pytest
import torch
from conftest import DTYPES, gpu, make_tensor
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.library import opcheck
from torch.testing._internal.optests.generate_tests import DEFAULT_TEST_UTILS
from torch.utils._pytree import tree_map

import torchext  # noqa: F401 - registers the ops

ops = torch.ops.torchext

SHAPE = (2, 3, 4, 5)
# (case id, make_tensor layout, shape): the layouts of a 4-D operand; channels_last_3d needs 5 dimensions.
LAYOUTS_4D = (
    ("contiguous", "contiguous", SHAPE),
    ("channels_last", "channels_last", SHAPE),
    ("channels_last_3d", "channels_last_3d", (2, 3, 2, 3, 4)),
    ("transposed", "transposed", SHAPE),
    ("sliced", "strided", SHAPE),
    ("expanded", "expanded", SHAPE),
    ("offset", "offset", SHAPE),
    ("empty", "contiguous", (2, 0, 4, 5)),
    ("empty_channels_last", "channels_last", (2, 0, 4, 5)),
)
# The layouts of a matrix (N, C) operand.
LAYOUTS_2D = (
    ("contiguous", "contiguous", (6, 5)),
    ("transposed", "transposed", (6, 5)),
    ("sliced", "strided", (6, 5)),
    ("expanded", "expanded", (6, 5)),
    ("offset", "offset", (6, 5)),
    ("empty", "contiguous", (0, 5)),
)

# Elementwise ops: extra positional arguments and keyword arguments, forward and backward alike; the backward's
# saved tensor (output or self) is just another tensor of the same shape here.
ELEMENTWISE = {
    "relu": ((), {}),
    "leaky_relu": ((0.2,), {}),
    "sigmoid": ((), {}),
    "tanh": ((), {}),
    "gelu": ((), {"approximate": "tanh"}),
    "silu": ((), {}),
    "softmax": ((), {}),
    "log_softmax": ((), {}),
}


def _elementwise_forward(name):
    extra, kwargs = ELEMENTWISE[name]

    def samples(device, dtype):
        for case, layout, shape in LAYOUTS_4D:
            yield case, (make_tensor(shape, dtype, device, layout), *extra), kwargs

    return samples


def _elementwise_backward(name):
    extra, kwargs = ELEMENTWISE[name]

    def samples(device, dtype):
        # The gradient's layout comes from the saved tensor, whatever grad_output's: each layout on each side.
        for case, layout, shape in LAYOUTS_4D:
            base = "channels_last" if layout == "contiguous" and case != "empty" else "contiguous"
            for g_layout, s_layout in ((base, layout), (layout, base), (layout, layout)):
                g = make_tensor(shape, dtype, device, g_layout)
                saved = make_tensor(shape, dtype, device, s_layout)
                yield f"grad {g_layout}, saved {s_layout} ({case})", (g, saved, *extra), kwargs

    return samples


def _add(device, dtype):
    # The result's layout comes from self, whatever other's: each layout on each side, as for the backward ops.
    for case, layout, shape in LAYOUTS_4D:
        base = "channels_last" if layout == "contiguous" and case != "empty" else "contiguous"
        for a_layout, b_layout in ((base, layout), (layout, base), (layout, layout)):
            a = make_tensor(shape, dtype, device, a_layout)
            yield f"self {a_layout}, other {b_layout} ({case})", (a, make_tensor(shape, dtype, device, b_layout)), {}


def _fork(device, dtype):
    # n views of self: the fake's are views of the fake self with its sizes, strides and offset.
    for case, layout, shape in LAYOUTS_4D:
        for n in (1, 2, 3):
            yield f"{case}, n={n}", (make_tensor(shape, dtype, device, layout), n), {}


def _reductions(case, *reductions):
    """The reductions to sample; for an empty input 'sum' stands in for 'mean', whose 0/0 = NaN (as torch's) opcheck
    cannot compare."""
    if case.startswith("empty"):
        return tuple(dict.fromkeys("sum" if r == "mean" else r for r in reductions))
    return reductions


def _pointwise_loss(name):
    def samples(device, dtype):
        for case, layout, shape in LAYOUTS_4D:
            for reduction in _reductions(case, "none", "mean", "sum"):
                x = make_tensor(shape, dtype, device, layout)
                y = make_tensor(shape, dtype, device, "contiguous", low=0.0, high=1.0)
                w = make_tensor(shape, dtype, device, layout, low=0.1, high=1.0)
                if name == "mse_loss":
                    yield f"{case} {reduction}", (x, y, None, reduction), {}
                    yield f"{case} {reduction} target+weight {layout}", (x, w, w, reduction), {}
                else:
                    pos_weight = make_tensor(shape[-1:], dtype, device, low=0.5, high=2.0)
                    yield f"{case} {reduction}", (x, y, None, None, reduction), {}
                    yield f"{case} {reduction} weighted", (x, y, w, pos_weight, reduction), {}

    return samples


def _pointwise_loss_backward(name):
    def samples(device, dtype):
        for case, layout, shape in LAYOUTS_4D:
            for reduction in _reductions(case, "none", "mean"):
                x = make_tensor(shape, dtype, device, layout)
                y = make_tensor(shape, dtype, device, layout, low=0.0, high=1.0)
                g = make_tensor(shape, dtype, device, layout) if reduction == "none" else make_tensor((), dtype, device)
                if name == "mse_loss_backward":
                    yield f"{case} {reduction}", (g, x, y, None, reduction), {}
                else:
                    for wrt_target in (False, True):
                        args = (g, x, y, None, None, reduction, wrt_target)
                        yield f"{case} {reduction} wrt_target={wrt_target}", args, {}

    return samples


def _targets(rows, classes, device):
    return torch.randint(0, classes, (rows,), device=device)


def _cross_entropy(device, dtype):
    for case, layout, shape in LAYOUTS_2D:
        rows, classes = shape
        x, t = make_tensor(shape, dtype, device, layout), _targets(rows, classes, device)
        w = make_tensor((classes,), dtype, device, low=0.5, high=2.0)
        for reduction in _reductions(case, "none", "mean"):
            yield f"{case} {reduction}", (x, t, None, reduction, -100, 0.0), {}
        yield f"{case} weighted sum smoothed", (x, t, w, "sum", 1, 0.1), {}


def _cross_entropy_backward(device, dtype):
    for case, layout, shape in LAYOUTS_2D:
        rows, classes = shape
        x, t = make_tensor(shape, dtype, device, layout), _targets(rows, classes, device)
        for reduction in _reductions(case, "none", "mean"):
            _, lse, total_weight = ops.cross_entropy.default(x, t, None, reduction, -100, 0.1)
            g = make_tensor((rows,) if reduction == "none" else (), dtype, device, layout)
            yield f"{case} {reduction}", (g, x, t, None, reduction, -100, 0.1, lse, total_weight), {}


def _multi_margin_loss(device, dtype):
    for case, layout, shape in LAYOUTS_2D:
        rows, classes = shape
        x, t = make_tensor(shape, dtype, device, layout), _targets(rows, classes, device)
        w = make_tensor((classes,), dtype, device, low=0.5, high=2.0)
        yield f"{case} none p=1", (x, t, 1, 1.0, None, "none"), {}
        (reduction,) = _reductions(case, "mean")
        yield f"{case} {reduction} p=2 weighted", (x, t, 2, 0.5, w, reduction), {}


def _multi_margin_loss_backward(device, dtype):
    for case, layout, shape in LAYOUTS_2D:
        rows, classes = shape
        x, t = make_tensor(shape, dtype, device, layout), _targets(rows, classes, device)
        yield f"{case} none", (make_tensor((rows,), dtype, device, layout), x, t, 1, 1.0, None, "none"), {}
        (reduction,) = _reductions(case, "mean")
        yield f"{case} {reduction} p=2", (make_tensor((), dtype, device), x, t, 2, 0.5, None, reduction), {}


def _matmul(device, dtype):
    a_cases = (*LAYOUTS_2D, ("batched", "contiguous", (3, 6, 5)), ("batched transposed", "transposed", (3, 6, 5)))
    for case, layout, shape in a_cases:
        b = make_tensor((5, 4), dtype, device)
        yield f"a {case}", (make_tensor(shape, dtype, device, layout), b, None), {}
    for case, layout, shape in (*LAYOUTS_2D, ("batched expanded", "expanded", (3, 6, 5))):
        # b is (K, N) = (5, 6), or (3, 5, 6) broadcast against a's batch dimensions: the transpose of the case.
        a = make_tensor(SHAPE, dtype, device)
        yield f"b {case}.mT (a 4-D)", (a, make_tensor(shape, dtype, device, layout).mT, None), {}
    a = make_tensor(SHAPE, dtype, device, "channels_last")
    yield "a channels_last", (a, make_tensor((5, 4), dtype, device), None), {}
    yield "k = 0", (make_tensor((3, 0), dtype, device), make_tensor((0, 4), dtype, device), None), {}
    if device == "cpu":
        yield "variant cpu", (make_tensor((3, 5), dtype, device), make_tensor((5, 4), dtype, device), "cpu"), {}


def _linear(device, dtype):
    inputs = (*LAYOUTS_4D, *LAYOUTS_2D)
    for case, layout, shape in inputs:
        k = shape[-1]
        x = make_tensor(shape, dtype, device, layout)
        for w_layout, activation in (("contiguous", "none"), ("transposed", "gelu"), ("strided", "relu")):
            w = make_tensor((7, k), dtype, device, w_layout)
            b = make_tensor((7,), dtype, device)
            yield f"input {case}, weight {w_layout}, {activation}", (x, w, b, activation), {}
        yield f"input {case}, no bias, silu", (x, make_tensor((7, k), dtype, device), None, "silu"), {}


def _linear_backward(device, dtype):
    masks = ([True, True, True], [True, False, False], [False, True, True])
    for case, layout, shape in (*LAYOUTS_4D, *LAYOUTS_2D):
        k = shape[-1]
        x = make_tensor(shape, dtype, device, layout)
        w = make_tensor((7, k), dtype, device)
        for activation, bias in (("none", True), ("gelu", True), ("relu", False)):
            b = make_tensor((7,), dtype, device) if bias else None
            out, saved = ops.linear.default(x, w, b, activation)
            g_layout = layout if layout in ("channels_last", "strided", "transposed", "expanded") else "contiguous"
            g = make_tensor(out.shape, dtype, device, g_layout)
            for mask in masks:
                args = (g, x, w, out, saved, activation, bias, mask)
                yield f"input {case}, grad_out {g_layout}, {activation}, bias={bias}, mask {mask}", args, {}


def _conv2d_operands(device, dtype):
    """(case, input, weight) over every input layout, with weights contiguous and channels-last, a groups-2 strided
    convolution, and an empty batch."""
    for case, layout, shape in LAYOUTS_4D:
        if len(shape) != 4 or shape[1] == 0:
            continue
        w_layout = "channels_last" if case == "contiguous" else "contiguous"
        yield (
            f"input {case}, weight {w_layout}",
            make_tensor(shape, dtype, device, layout),
            make_tensor((4, 3, 3, 2), dtype, device, w_layout),
        )
    yield (
        "input (2, 1, 4, 5), weight channels_last",
        make_tensor((2, 1, 4, 5), dtype, device),
        make_tensor((3, 1, 1, 1), dtype, device, "channels_last"),
    )
    yield (
        "empty batch, channels_last",
        make_tensor((0, 3, 4, 5), dtype, device, "channels_last"),
        make_tensor((4, 3, 3, 2), dtype, device),
    )


_CONV2D_OPTIONS = (([1, 1], [1, 0], [1, 1], 1), ([2, 1], [0, 2], [1, 2], 1))


def _conv2d(device, dtype):
    for case, x, w in _conv2d_operands(device, dtype):
        for i, options in enumerate(_CONV2D_OPTIONS):
            bias = make_tensor((w.shape[0],), dtype, device) if i == 0 else None
            yield f"{case}, options {i}", (x, w, bias, *options, "relu" if i else "none", None), {}
    x, w = make_tensor((2, 4, 5, 5), dtype, device, "channels_last"), make_tensor((6, 2, 3, 3), dtype, device)
    yield "groups 2", (x, w, None, [2, 2], [1, 1], [1, 1], 2, "none", None), {}


def _conv2d_stats(device, dtype):
    for case, args, kwargs in _conv2d(device, dtype):
        yield case, args[:7] + args[8:], kwargs


def _conv2d_backward(device, dtype):
    masks = ([True, True, True], [True, False, False], [False, True, True])
    for case, (x, w, _, stride, padding, dilation, groups, _, variant), _ in _conv2d(device, dtype):
        out = ops.conv2d.default(x, w, None, stride, padding, dilation, groups, "none", variant)
        for g_layout in ("contiguous", "channels_last"):
            g = make_tensor(out.shape, dtype, device, g_layout)
            for mask in masks:
                args = (g, x, w, stride, padding, dilation, groups, mask, None)
                yield f"{case}, grad_output {g_layout}, mask {mask}", args, {}
        if dtype in (torch.float16, torch.bfloat16):  # the float32 master weight's gradient
            args = (g, x, w, stride, padding, dilation, groups, masks[0], None, torch.float32)
            yield f"{case}, grad_weight_dtype float32", args, {}


def _batch_norm_operands(device, dtype):
    """(case, input, parameters, training) over every input layout (and 2-D and 3-D inputs), training with the
    running buffers, without any parameter, and eval."""
    pdt = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    for case, layout, shape in (*LAYOUTS_4D, ("3-D", "contiguous", (2, 3, 7)), *LAYOUTS_2D[:2]):
        x = make_tensor(shape, dtype, device, layout)
        c = shape[1]
        w, b = make_tensor((c,), pdt, device), make_tensor((c,), pdt, device)
        rm, rv = make_tensor((c,), pdt, device), make_tensor((c,), pdt, device, low=0.5, high=2.0)
        yield f"{case} training", x, (w, b, rm, rv), True
        if not case.startswith("empty"):
            yield f"{case} eval", x, (w, b, rm, rv), False
    yield "no parameters", make_tensor(SHAPE, dtype, device, "channels_last"), (None, None, None, None), True


def _batch_norm(relu, residual):
    def samples(device, dtype):
        for case, x, params, training in _batch_norm_operands(device, dtype):
            lead = (x, make_tensor(x.shape, dtype, device, "contiguous")) if residual else (x,)
            yield case, (*lead, *params, training, 0.1, 1e-5, None, None, None), {}
        x = make_tensor(SHAPE, dtype, device, "channels_last")
        stats = torch.float64 if dtype == torch.float64 else torch.float32
        s, ss = x.to(stats).sum((0, 2, 3)), x.to(stats).square().sum((0, 2, 3))
        lead = (x, make_tensor(x.shape, dtype, device, "channels_last")) if residual else (x,)
        yield "sums given", (*lead, None, None, None, None, True, 0.1, 1e-5, s, ss, None), {}
        count = torch.zeros((), dtype=torch.long, device=device)  # written in place, declared so by the schema
        yield "num_batches_tracked", (*lead, None, None, None, None, True, 0.1, 1e-5, None, None, None, count), {}

    return samples


def _batch_norm_backward(device, dtype):
    masks = ([True, True, True, False], [True, False, False, False], [False, True, True, False], [True] * 4)
    for case, x, (w, b, rm, rv), training in _batch_norm_operands(device, dtype):
        _, mask, save_mean, save_invstd = ops.batch_norm_relu.default(x, w, b, rm, rv, training, 0.1, 1e-5)
        g_layout = "channels_last" if x.dim() == 4 and not case.startswith("channels_last") else "contiguous"
        g = make_tensor(x.shape, dtype, device, g_layout)
        for output_mask in masks:
            args = (g, x, w, save_mean, save_invstd, mask, training, 1e-5, output_mask, None)
            yield f"{case}, grad_out {g_layout}, mask {output_mask}", args, {}
        yield f"{case}, no relu", (g, x, w, save_mean, save_invstd, None, training, 1e-5, masks[0], None), {}
def _pool_inputs(device, dtype, allow_empty_c=False):
    """(case, input): every 4-D layout (C = 0 only where the op allows it), unbatched inputs and an empty batch."""
    for case, layout, shape in LAYOUTS_4D:
        if len(shape) == 4 and (shape[1] > 0 or allow_empty_c):
            yield f"input {case}", make_tensor(shape, dtype, device, layout)
    yield "unbatched", make_tensor((3, 4, 5), dtype, device)
    yield "unbatched transposed", make_tensor((3, 4, 5), dtype, device, "transposed")
    yield "empty batch channels_last", make_tensor((0, 3, 4, 5), dtype, device, "channels_last")


_MAX_POOL2D_OPTIONS = (([3, 3], [2, 2], [1, 1], [1, 1], True), ([2, 1], [], [0, 0], [1, 2], False))
_AVG_POOL2D_OPTIONS = (([3, 3], [2, 2], [1, 1], True, False, None), ([2, 1], [], [0, 0], False, True, 3))


def _max_pool2d(device, dtype):
    for case, x in _pool_inputs(device, dtype):
        for i, options in enumerate(_MAX_POOL2D_OPTIONS):
            yield f"{case}, options {i}", (x, *options), {}


def _max_pool2d_backward(device, dtype):
    for case, (x, *options), _ in _max_pool2d(device, dtype):
        out, indices = ops.max_pool2d.default(x, *options)
        for g_layout in ("contiguous", "channels_last") if out.dim() == 4 else ("contiguous",):
            g = make_tensor(out.shape, dtype, device, g_layout)
            yield f"{case}, grad_output {g_layout}", (g, x, *options, indices), {}


def _avg_pool2d(device, dtype):
    for case, x in _pool_inputs(device, dtype):
        for i, options in enumerate(_AVG_POOL2D_OPTIONS):
            yield f"{case}, options {i}", (x, *options), {}


def _avg_pool2d_backward(device, dtype):
    for case, (x, *options), _ in _avg_pool2d(device, dtype):
        out = ops.avg_pool2d.default(x, *options)
        for g_layout in ("contiguous", "channels_last") if out.dim() == 4 else ("contiguous",):
            yield f"{case}, grad_output {g_layout}", (make_tensor(out.shape, dtype, device, g_layout), x, *options), {}


def _adaptive_avg_pool2d(device, dtype):
    for case, x in _pool_inputs(device, dtype, allow_empty_c=True):
        for size in ([1, 1], [3, 7]):
            yield f"{case}, output_size {size}", (x, size), {}


def _adaptive_avg_pool2d_backward(device, dtype):
    for case, (x, size), _ in _adaptive_avg_pool2d(device, dtype):
        g_layout = "channels_last" if x.dim() == 4 and size == [3, 7] else "contiguous"
        yield f"{case}, grad_output {g_layout}", (make_tensor((*x.shape[:-2], *size), dtype, device, g_layout), x), {}


def _sgd_(device, dtype):
    # A mutating op with no result: the fake returns None as the real does, and opcheck checks the schema's
    # mutation annotations (params and momentum_buffers written, grads not).
    for layout in ("contiguous", "channels_last"):
        ps = [make_tensor((2, 3, 4, 5), dtype, device, layout), make_tensor((7,), dtype, device, "contiguous")]
        gs = [make_tensor(p.shape, dtype, device, layout if p.dim() == 4 else "contiguous") for p in ps]
        bs = [torch.zeros_like(p) for p in ps]
        yield f"momentum, {layout}", (ps, gs, bs, 0.1, 0.9, 0.0, 1e-4, True, False, False), {}
        yield f"no momentum, {layout}", ([p.clone() for p in ps], gs, [], 0.1), {}


SAMPLES = {
    **{name: _elementwise_forward(name) for name in ELEMENTWISE},
    **{f"{name}_backward": _elementwise_backward(name) for name in ELEMENTWISE},
    "add": _add,
    "fork": _fork,
    "mse_loss": _pointwise_loss("mse_loss"),
    "mse_loss_backward": _pointwise_loss_backward("mse_loss_backward"),
    "binary_cross_entropy_with_logits": _pointwise_loss("binary_cross_entropy_with_logits"),
    "binary_cross_entropy_with_logits_backward": _pointwise_loss_backward("binary_cross_entropy_with_logits_backward"),
    "cross_entropy": _cross_entropy,
    "cross_entropy_backward": _cross_entropy_backward,
    "multi_margin_loss": _multi_margin_loss,
    "multi_margin_loss_backward": _multi_margin_loss_backward,
    "matmul": _matmul,
    "matmul_kernel": _matmul,
    "linear": _linear,
    "linear_backward": _linear_backward,
    "conv2d": _conv2d,
    "conv2d_stats": _conv2d_stats,
    "conv2d_backward": _conv2d_backward,
    "batch_norm": _batch_norm(relu=False, residual=False),
    "batch_norm_relu": _batch_norm(relu=True, residual=False),
    "batch_norm_add_relu": _batch_norm(relu=True, residual=True),
    "batch_norm_backward": _batch_norm_backward,
    "max_pool2d": _max_pool2d,
    "max_pool2d_backward": _max_pool2d_backward,
    "avg_pool2d": _avg_pool2d,
    "avg_pool2d_backward": _avg_pool2d_backward,
    "adaptive_avg_pool2d": _adaptive_avg_pool2d,
    "adaptive_avg_pool2d_backward": _adaptive_avg_pool2d_backward,
    "sgd_": _sgd_,
}


def torchext_op_names():
    """Every op the torchext library defines (its schemas in csrc/ops.cpp)."""
    return sorted(s.name.split("::")[1] for s in torch._C._jit_get_all_schemas() if s.name.startswith("torchext::"))


def test_every_op_has_samples():
    missing = set(torchext_op_names()) - set(SAMPLES)
    assert not missing, f"[ops without fake-parity samples] {sorted(missing)}: add them to SAMPLES"


def _params():
    out = []
    for device, dtypes in DTYPES.items():
        for dtype in dtypes:
            marks = [gpu] if device == "cuda" else []
            for name in SAMPLES:
                out.append(pytest.param(name, device, dtype, id=f"{name}-{device}-{str(dtype)[6:]}", marks=marks))
    return out


def assert_same_metadata(fake, real, what: str) -> None:
    """The fake result describes the real one exactly: sizes, strides, storage offset, dtype, device (and equal
    values for results that are not tensors)."""
    if isinstance(real, (tuple, list)):
        assert isinstance(fake, (tuple, list)) and len(fake) == len(real), f"[{what}] fake {fake!r}, real {real!r}"
        for i, (f, r) in enumerate(zip(fake, real)):
            assert_same_metadata(f, r, f"{what}, result {i}")
        return
    if not isinstance(real, torch.Tensor):
        assert fake == real, f"[{what}] fake result {fake!r} != real {real!r}"
        return
    assert isinstance(fake, torch.Tensor), f"[{what}] fake returned {type(fake).__name__}, real a tensor"
    for attr in ("shape", "dtype", "device"):
        assert getattr(fake, attr) == getattr(real, attr), (
            f"[{what}] {attr}: fake {getattr(fake, attr)} != real {getattr(real, attr)}"
        )
    assert fake.stride() == real.stride(), (
        f"[{what}] strides of a {tuple(real.shape)} result: fake {fake.stride()} != real {real.stride()}"
    )
    assert fake.storage_offset() == real.storage_offset(), (
        f"[{what}] storage offset: fake {fake.storage_offset()} != real {real.storage_offset()}"
    )


def _run_fake(op, args, kwargs):
    with FakeTensorMode() as mode:
        fake_args, fake_kwargs = tree_map(
            lambda a: mode.from_tensor(a) if isinstance(a, torch.Tensor) else a, (args, kwargs)
        )
        return op(*fake_args, **fake_kwargs)


@pytest.mark.parametrize("name, device, dtype", _params())
def test_fake_matches_real(name, device, dtype):
    op = getattr(ops, name).default
    count = 0
    for case, args, kwargs in SAMPLES[name](device, dtype):
        if name == "matmul_kernel" and device != "cpu":
            with pytest.raises(NotImplementedError, match="cannot be traced"):
                _run_fake(op, args, kwargs)
            continue
        real = op(*args, **kwargs)
        assert_same_metadata(_run_fake(op, args, kwargs), real, f"{name} {case}")
        count += 1
    assert count > 0 or name == "matmul_kernel", f"[{name}] no samples ran"


# The arguments each forward op differentiates (opcheck's autograd test needs inputs that require grad; the
# losses raise for a weight's gradient): index 0 unless listed. Backward ops and matmul_kernel get none.
_GRAD_ARGS = {
    "add": (0, 1),
    "mse_loss": (0, 1),
    "binary_cross_entropy_with_logits": (0, 1),
    "matmul": (0, 1),
    "matmul_kernel": (),
    "linear": (0, 1, 2),
    "conv2d": (0, 1, 2),
    "conv2d_stats": (0, 1, 2),
    "batch_norm": (0, 1, 2),
    "batch_norm_relu": (0, 1, 2),
    "batch_norm_add_relu": (0, 1, 2, 3),
    "sgd_": (),  # not differentiable: optimizers call it under no_grad
}
# AOTAutograd compiles tensor programs: matmul_kernel's str result has nothing to trace there.
_OPCHECK_UTILS = {"matmul_kernel": tuple(u for u in DEFAULT_TEST_UTILS if not u.startswith("test_aot_dispatch"))}
# opcheck traces each sample several times (about 0.1 s a sample): it runs on at most this many samples per op,
# taken evenly across the op's list (so across its layouts).
_OPCHECK_SAMPLES = 10


def _opcheck_params():
    return [
        pytest.param(name, device, id=f"{name}-{device}", marks=[gpu] if device == "cuda" else [])
        for device in DTYPES
        for name in SAMPLES
    ]


@pytest.mark.parametrize("name, device", _opcheck_params())
def test_opcheck(name, device):
    if name == "matmul_kernel" and device != "cpu":
        pytest.skip("matmul_kernel's CUDA result cannot be traced (its fake raises; test_fake_matches_real checks)")
    op = getattr(ops, name).default
    grad_args = () if name.endswith("_backward") else _GRAD_ARGS.get(name, (0,))
    samples = list(SAMPLES[name](device, torch.float32))
    for case, args, kwargs in samples[:: -(-len(samples) // _OPCHECK_SAMPLES)]:
        args = tuple(
            a.detach().requires_grad_() if i in grad_args and isinstance(a, torch.Tensor) else a
            for i, a in enumerate(args)
        )
        try:
            opcheck(op, args, kwargs, test_utils=_OPCHECK_UTILS.get(name, DEFAULT_TEST_UTILS))
        except Exception as e:
            raise AssertionError(f"[opcheck {name} {case}] {e}") from e
