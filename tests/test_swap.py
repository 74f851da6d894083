"""torchext.swap_modules: what is replaced, fused and left stock; parameters, state_dict keys and values kept; the
swapped model computes, differentiates and trains like the stock one (float64 on the CPU)."""

import copy
import io
import json
from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchext
import torchext.nn as tnn
from torchext import models
from torchext.swap import NO_KERNEL, SwapReport, swap_modules

F64 = torch.float64
# Unfused swaps run the same arithmetic up to the order of a GEMM's sums; fused ones too (bias, then activation).
RTOL, ATOL = 1e-10, 1e-12


def _stock_and_swapped(build, dtype=F64, **kwargs):
    stock = build().to(dtype)
    report = swap_modules(stock, inplace=False, **kwargs)
    return stock, report.model, report


def _assert_same_state(a: nn.Module, b: nn.Module, what: str, exact: bool = True):
    """Same keys, dtypes and devices; equal values (``exact``) or close ones (statistics computed from outputs that
    differ by rounding)."""
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb), f"[{what} state_dict keys] {sorted(set(sa) ^ set(sb))}"
    for key in sa:
        assert sa[key].dtype == sb[key].dtype and sa[key].device == sb[key].device, f"[{what} {key} dtype/device]"
        if exact or not sa[key].is_floating_point():
            assert torch.equal(sa[key], sb[key]), f"[{what} {key}] values differ"
        else:
            _close(sb[key], sa[key], f"{what} {key}")


def _close(a, b, what):
    torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL, msg=lambda m: f"[{what}] {m}")


def _types(model):
    return [(name, type(m)) for name, m in model.named_modules()]


# --- the CIFAR models ----------------------------------------------------------------------------------------------


def test_mlp_fuses_both_hidden_layers():
    model = models.mlp()
    report = swap_modules(model)
    assert report.model is model
    assert [tuple(f) for f in report.fused] == [("fc1", "relu1", "relu"), ("fc2", "relu2", "relu")]
    assert type(model.fc1) is tnn.Linear and model.fc1.activation == "relu", "[fc1]"
    assert type(model.fc2) is tnn.Linear and model.fc2.activation == "relu", "[fc2]"
    assert type(model.fc3) is tnn.Linear and model.fc3.activation == "none", "[fc3: last layer, nothing to fuse]"
    assert type(model.relu1) is nn.Identity and type(model.relu2) is nn.Identity, "[fused activation slots]"
    c = report.counts
    assert (c["replaced"], c["fused"], c["left_stock"], c["already_torchext"]) == (5, 2, 0, 0), c
    assert c["replaced_by_class"] == {"nn.Linear": 3, "nn.ReLU": 2}


def test_resnet18_cifar_report():
    model = models.resnet18_cifar()
    report = swap_modules(model)
    c = report.counts
    expected = {"nn.ReLU": 17, "nn.Linear": 1, "nn.Conv2d": 20, "nn.BatchNorm2d": 20, "nn.AdaptiveAvgPool2d": 1}
    assert c["replaced_by_class"] == expected, c
    assert c["fused"] == 0, "[the fc layer is not followed by an activation]"
    assert c["graph_fused"] == 17, "[the stem's and each block's BN+ReLU, each block's BN+add+ReLU]"
    assert c["graph_conv_stats"] == 20, "[every convolution gives the BatchNorm after it its statistics]"
    assert c["left_stock_by_class"] == {}, c
    assert all(s.reason == NO_KERNEL for s in report.left_stock)
    assert not any(type(m) in (nn.ReLU, nn.Linear, nn.Conv2d) for m in model.modules()), "a stock layer is left"
    assert ("layer2.0.relu2", "nn.ReLU", "torchext.nn.ReLU") in report.replaced
    assert ("layer3.0.downsample.0", "nn.Conv2d", "torchext.nn.Conv2dStats") in report.replaced
    kept = swap_modules(models.resnet18_cifar(), conv=False)
    assert ("layer3.0.downsample.0", "nn.Conv2d", "conv=False") in kept.left_stock


def test_cnn_cifar_report():
    model = models.cnn_cifar()
    report = swap_modules(model)
    c = report.counts
    conv_relu = [(f"conv{i}", f"relu{i}", "relu") for i in range(1, 5)]
    assert [tuple(f) for f in report.fused] == [*conv_relu, ("fc1", "relu5", "relu")]
    expected = {
        "nn.ReLU": 5,
        "nn.Linear": 2,
        "nn.Conv2d": 4,
        "nn.BatchNorm2d": 2,
        "nn.MaxPool2d": 2,
        "nn.BatchNorm1d": 1,
    }
    assert c["replaced_by_class"] == expected, c
    assert c["left_stock_by_class"] == {"nn.Dropout": 3}, c
    assert type(model.bn3) is tnn.BatchNorm1d
    assert all(type(getattr(model, f"conv{i}")) is tnn.Conv2d for i in range(1, 5))
    assert all(getattr(model, f"conv{i}").activation == "relu" for i in range(1, 5))
    assert type(model.relu5) is nn.Identity and model.fc1.activation == "relu"
    assert type(model.fc2) is tnn.Linear and model.fc2.activation == "none"
    assert all(type(getattr(model, f"relu{i}")) is nn.Identity for i in range(1, 5))
    assert report.channels_last == [] and c["channels_last"] == 0, "channels_last is off by default"
    assert all(getattr(model, f"conv{i}").weight.is_contiguous() for i in range(1, 5))


@pytest.mark.parametrize("name", ["mlp", "cnn_cifar", "resnet18_cifar"])
def test_state_dict_and_parameters_kept(name):
    stock = models.get_model(name).to(F64)
    before = copy.deepcopy(stock.state_dict())
    params = dict(stock.named_parameters())
    swap_modules(stock)
    _assert_same_state(stock, _Holder(before), name)
    after = dict(stock.named_parameters())
    assert list(after) == list(params), f"[{name} parameter names]"
    assert all(after[k] is params[k] for k in params), f"[{name}] in-place swap must keep the Parameter objects"


class _Holder(nn.Module):
    """A module whose state_dict is a given dict (to compare a saved state_dict with _assert_same_state)."""

    def __init__(self, state):
        super().__init__()
        self._state = state

    def state_dict(self, *args, **kwargs):
        return self._state


def test_mlp_forward_backward_match_stock():
    stock, swapped, _ = _stock_and_swapped(models.mlp)
    x = torch.randn(6, 3, 32, 32, dtype=F64)
    y_stock, y_ours = stock(x), swapped(x)
    _close(y_ours, y_stock, "mlp output")
    g = torch.randn_like(y_stock)
    y_stock.backward(g)
    y_ours.backward(g)
    ours = dict(swapped.named_parameters())
    for name, p in stock.named_parameters():
        _close(ours[name].grad, p.grad, f"mlp {name}.grad")


def test_resnet18_cifar_forward_backward_match_stock():
    stock, swapped, _ = _stock_and_swapped(models.resnet18_cifar)
    x = torch.randn(2, 3, 32, 32, dtype=F64, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    y_stock, y_ours = stock(x), swapped(x2)
    _close(y_ours, y_stock, "resnet18_cifar output")
    y_stock.sum().backward()
    y_ours.sum().backward()
    _close(x2.grad, x.grad, "resnet18_cifar input grad")
    ours = dict(swapped.named_parameters())
    for name in ("conv1.weight", "layer1.0.bn1.weight", "layer4.1.conv2.weight", "fc.weight", "fc.bias"):
        _close(ours[name].grad, dict(stock.named_parameters())[name].grad, f"resnet18_cifar {name}.grad")
    # batch-norm running statistics were updated the same way in train mode (from convolutions equal to rounding)
    _assert_same_state(stock, swapped, "resnet18_cifar after a train-mode forward", exact=False)


def test_resnet18_cifar_channels_last_gradients_keep_stocks_layout():
    """Every layer of the swapped channels-last ResNet-18 receives its gradient in the layout stock gives it. (A
    ReLU backward that returned a contiguous gradient where the pooling layer's gradient came in contiguous put the
    whole last stage on cuDNN's and batch norm's NCHW kernels on the GPU.)"""
    stock, swapped, _ = _stock_and_swapped(models.resnet18_cifar)
    x = torch.randn(2, 3, 32, 32, dtype=F64).to(memory_format=torch.channels_last)
    strides = {}
    for tag, model in (("stock", stock), ("torchext", swapped)):
        model.to(memory_format=torch.channels_last)
        seen = strides[tag] = {}
        for name, module in model.named_modules():
            if isinstance(module, (nn.Conv2d, nn.BatchNorm2d)):
                module.register_full_backward_hook(
                    lambda m, gin, gout, name=name, seen=seen: seen.__setitem__(name, gout[0].stride())
                )
        model(x).sum().backward()
    assert len(strides["stock"]) == 40
    assert strides["torchext"] == strides["stock"]


def test_cnn_cifar_forward_matches_stock_with_dropout():
    stock, swapped, _ = _stock_and_swapped(models.cnn_cifar)
    x = torch.randn(4, 3, 32, 32, dtype=F64)
    torch.manual_seed(1)
    y_stock = stock(x)
    torch.manual_seed(1)
    y_ours = swapped(x)  # torchext's ops draw no random numbers: the same dropout masks
    _close(y_ours, y_stock, "cnn_cifar output (train mode)")
    _close(swapped.eval()(x), stock.eval()(x), "cnn_cifar output (eval mode)")


def _op_names(model, x):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        model(x).sum().backward()
    return {e.name for e in prof.events()}


def test_swapped_model_runs_torchext_ops():
    stock, swapped, _ = _stock_and_swapped(models.cnn_cifar, dtype=torch.float32)
    x = torch.randn(2, 3, 32, 32)
    ours, theirs = _op_names(swapped, x), _op_names(stock, x)
    # Every ReLU is fused into the Conv2d or Linear before it (the convolution's relu backward is torchext's too).
    assert {"torchext::conv2d", "torchext::conv2d_backward", "torchext::linear", "torchext::linear_backward"} <= ours
    assert "torchext::relu_backward" in ours
    assert not any(n.startswith("torchext::") for n in theirs), "the stock model must not run torchext ops"
    for op in ("aten::relu", "aten::linear"):
        assert op in theirs and op not in ours, f"[{op}] the swapped model still runs the stock op"


# --- a nested model without torchvision ----------------------------------------------------------------------------


class MyReLU(nn.ReLU):
    """A user subclass: its forward is not nn.ReLU's, so it must stay stock."""

    def forward(self, x):
        return super().forward(x) * 2


class Swish(nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(x)


class MyLinear(nn.Linear):
    pass


class Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(
            OrderedDict(
                [
                    ("fc", nn.Linear(8, 16)),
                    ("act", nn.GELU(approximate="tanh")),
                    ("inner", nn.Sequential(nn.Linear(16, 16), nn.SiLU(), nn.Linear(16, 16), nn.GELU())),
                ]
            )
        )
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(16, 16), nn.Dropout(0.0), nn.ReLU()) for _ in range(2)])
        self.heads = nn.ModuleDict({"a": nn.Linear(16, 16), "b": MyLinear(16, 16)})
        self.leaky = nn.LeakyReLU(0.2)
        self.gelu_tanh = nn.GELU(approximate="tanh")
        self.sig, self.tanh, self.swish, self.mine = nn.Sigmoid(), nn.Tanh(), Swish(), MyReLU()
        self.softmax = nn.Softmax(dim=-1)
        self.norm = nn.LayerNorm(16)
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x):
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        x = self.leaky(self.heads["a"](x)) + self.tanh(self.heads["b"](x))
        x = self.norm(self.swish(self.mine(self.sig(x)) - self.gelu_tanh(x)))
        return self.softmax(x)


def test_nested_model_report():
    model = Nested().to(F64)
    report = swap_modules(model)
    assert [tuple(f) for f in report.fused] == [
        ("stem.fc", "stem.act", "gelu_tanh"),
        ("stem.inner.0", "stem.inner.1", "silu"),
        ("stem.inner.2", "stem.inner.3", "gelu"),
    ]
    assert report.not_fused == [], "Linear, Dropout, ReLU is not a fusable pair"
    for i in range(2):
        assert type(model.blocks[i][0]) is tnn.Linear and model.blocks[i][0].activation == "none", "[blocks.i.0]"
        assert type(model.blocks[i][2]) is tnn.ReLU, "[blocks.i.2: swapped on its own]"
    assert type(model.leaky) is tnn.LeakyReLU and model.leaky.negative_slope == 0.2, "[LeakyReLU slope]"
    assert type(model.gelu_tanh) is tnn.GELU and model.gelu_tanh.approximate == "tanh", "[GELU approximate]"
    assert type(model.softmax) is tnn.Softmax and model.softmax.dim == -1
    assert type(model.sig) is tnn.Sigmoid and type(model.tanh) is tnn.Tanh
    assert type(model.mine) is MyReLU and type(model.heads.b) is MyLinear, "user subclasses must stay stock"
    stock = {s.name: s for s in report.left_stock}
    assert "subclass of nn.ReLU" in stock["mine"].reason, stock["mine"]
    assert "subclass of nn.Linear" in stock["heads.b"].reason, stock["heads.b"]
    assert stock["swish"].reason == NO_KERNEL and stock["swish"].cls.endswith("test_swap.Swish")
    assert stock["norm"] == ("norm", "nn.LayerNorm", NO_KERNEL)
    assert "torchext.nn.CrossEntropyLoss" in stock["loss"].reason
    assert stock["blocks.0.1"].cls == "nn.Dropout"
    assert set(stock) == {"mine", "heads.b", "swish", "norm", "loss", "blocks.0.1", "blocks.1.1"}


def test_nested_model_matches_stock():
    stock, swapped, _ = _stock_and_swapped(Nested)
    x = torch.randn(5, 8, dtype=F64)
    y_stock, y_ours = stock(x), swapped(x)
    _close(y_ours, y_stock, "nested output")
    y_stock.pow(2).sum().backward()
    y_ours.pow(2).sum().backward()
    ours = dict(swapped.named_parameters())
    for name, p in stock.named_parameters():
        _close(ours[name].grad, p.grad, f"nested {name}.grad")


def test_leaky_relu_slope_and_gelu_approximate_compute():
    for module, ref in [
        (nn.LeakyReLU(0.3), lambda x: F.leaky_relu(x, 0.3)),
        (nn.GELU(approximate="tanh"), lambda x: F.gelu(x, approximate="tanh")),
        (nn.GELU(), F.gelu),
    ]:
        swap_modules(module)
        x = torch.randn(7, 3, dtype=F64)
        assert isinstance(module, torchext.nn.__dict__[type(module).__name__])
        _close(module(x), ref(x), f"swapped {module!r}")


# --- fusion rules --------------------------------------------------------------------------------------------------


def _fused_names(report):
    return [(f.linear, f.activation) for f in report.fused]


@pytest.mark.parametrize(
    "act,epilogue", [(nn.ReLU(), "relu"), (nn.GELU(), "gelu"), (nn.GELU("tanh"), "gelu_tanh"), (nn.SiLU(), "silu")]
)
def test_fusion_epilogues_match_stock(act, epilogue):
    stock = nn.Sequential(nn.Linear(9, 7), act).to(F64)
    report = swap_modules(stock, inplace=False)
    fused = report.model
    assert report.fused == [("0", "1", epilogue)]
    assert fused[0].activation == epilogue and type(fused[1]) is nn.Identity
    x = torch.randn(4, 9, dtype=F64)
    _close(fused(x), stock(x), f"Linear+{epilogue}")


def test_conv_relu_fused_in_a_sequential_matches_stock():
    """A Conv2d followed by a ReLU in a Sequential becomes one Conv2d(activation='relu'): forward and both gradients
    as stock's; a Conv2d followed by another activation, or with conv=False, is not fused."""
    stock = nn.Sequential(nn.Conv2d(3, 5, 3, padding=1), nn.ReLU(), nn.Conv2d(5, 4, 1), nn.GELU()).to(F64)
    report = swap_modules(stock, inplace=False)
    fused = report.model
    assert [tuple(f) for f in report.fused] == [("0", "1", "relu")], "Conv2d + GELU has no epilogue: not fused"
    assert type(fused[0]) is tnn.Conv2d and fused[0].activation == "relu" and type(fused[1]) is nn.Identity
    assert fused[2].activation == "none" and type(fused[3]) is tnn.GELU
    assert ("0", "nn.Conv2d", "torchext.nn.Conv2d(activation='relu')") in report.replaced
    x = torch.randn(2, 3, 6, 7, dtype=F64, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    y, y_ref = fused(x), stock(x_ref)
    _close(y, y_ref, "Conv2d+ReLU output")
    g = torch.randn_like(y)
    ours = torch.autograd.grad(y, (x, fused[0].weight, fused[0].bias), g)
    theirs = torch.autograd.grad(y_ref, (x_ref, stock[0].weight, stock[0].bias), g)
    for name, a, b in zip(("input", "weight", "bias"), ours, theirs, strict=True):
        _close(a, b, f"Conv2d+ReLU grad {name}")

    model = nn.Sequential(nn.Conv2d(3, 5, 3), nn.ReLU())
    report = swap_modules(model, conv=False)
    assert report.fused == [] and type(model[0]) is nn.Conv2d and type(model[1]) is tnn.ReLU


def test_channels_last_weights():
    """channels_last=True: every torchext Conv2d's weight (and its gradient) channels-last, listed in the report;
    an NCHW input then gives channels-last activations from the first convolution on (torch's layout rule, which
    torchext's convolutions follow), with the same values and the same state_dict."""
    stock = models.cnn_cifar().to(F64)
    report = swap_modules(stock, inplace=False, channels_last=True)
    ours = report.model
    assert report.channels_last == ["conv1", "conv2", "conv3", "conv4"] and report.counts["channels_last"] == 4
    assert "4 Conv2d weight(s) made channels-last" in str(report).splitlines()[0]
    assert report.as_dict()["channels_last"] == report.channels_last
    for i in range(1, 5):
        w = getattr(ours, f"conv{i}").weight
        assert isinstance(w, nn.Parameter) and w.is_contiguous(memory_format=torch.channels_last)
    _assert_same_state(stock, ours, "channels_last=True")
    ours.eval(), stock.eval()
    x = torch.randn(3, 3, 32, 32, dtype=F64)
    conv1 = ours.conv1(x)
    assert conv1.is_contiguous(memory_format=torch.channels_last) and not conv1.is_contiguous()
    assert conv1.stride() == F.conv2d(x, ours.conv1.weight, ours.conv1.bias, padding=1).stride(), "torch's rule"
    _close(ours(x), stock(x), "channels-last cnn_cifar output")
    # In eval mode: dropout draws its mask in memory order, so a channels-last activation gets a different mask.
    ours(x).sum().backward()
    stock(x).sum().backward()
    for i in range(1, 5):
        ga, gb = getattr(ours, f"conv{i}").weight.grad, getattr(stock, f"conv{i}").weight.grad
        assert ga.is_contiguous(memory_format=torch.channels_last), f"conv{i}: the gradient keeps the weight's layout"
        _close(ga, gb, f"conv{i} weight grad")
    again = swap_modules(ours, channels_last=True)
    assert again.channels_last == [], "weights already channels-last are not listed again"


def test_channels_last_weights_of_1x1_and_depthwise_kernels():
    """A 1x1 or depthwise kernel is contiguous in both formats: it is given channels-last strides all the same (as
    Module.to(memory_format=...) does), so that it suggests channels-last and the output follows; a K x 1 x 1 x 1
    kernel, which no strides make suggest channels-last, is left and not listed."""
    model = nn.Sequential(nn.Conv2d(3, 8, 1), nn.Conv2d(8, 8, 3, groups=8, padding=1), nn.Conv2d(8, 8, 1, groups=8))
    model = model.to(F64)
    ref = copy.deepcopy(model).to(memory_format=torch.channels_last)
    report = swap_modules(model, channels_last=True)
    assert report.channels_last == ["0", "1"]
    for i in (0, 1):
        assert model[i].weight.stride() == ref[i].weight.stride(), f"[{i}] {model[i].weight.stride()}"
    x = torch.randn(2, 3, 6, 6, dtype=F64)
    assert model[0](x).stride() == ref[0](x).stride(), "a 1x1 first layer gives a channels-last output"
    _close(model(x), ref(x), "1x1 and depthwise, channels-last weights")


def test_no_fusion_outside_sequential():
    class TwoAttrs(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.act = nn.ReLU()

        def forward(self, x):
            return self.act(self.fc(x))

    model = TwoAttrs()
    report = swap_modules(model)
    assert report.fused == [] and report.not_fused == []
    assert model.fc.activation == "none" and type(model.act) is tnn.ReLU


def test_no_fusion_when_followed_by_something_else():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 4), nn.Sigmoid())
    report = swap_modules(model)
    assert report.fused == [], "Linear+BatchNorm and Linear+Sigmoid are not fusable"
    assert model[0].activation == "none" and model[3].activation == "none"
    assert type(model[2]) is tnn.ReLU and type(model[4]) is tnn.Sigmoid


def test_no_fusion_when_activation_is_registered_elsewhere():
    shared = nn.ReLU()
    model = nn.Sequential(OrderedDict([("fc", nn.Linear(4, 4)), ("act", shared)]))
    model.extra = shared  # the same ReLU also reachable as model.extra
    report = swap_modules(model)
    assert report.fused == []
    assert [(n.linear, n.activation) for n in report.not_fused] == [("fc", "act")]
    assert "registered more than once" in report.not_fused[0].reason
    assert type(model.act) is tnn.ReLU and model.extra is model.act, "the shared ReLU is swapped once, still shared"
    assert [r.name for r in report.replaced] == ["fc", "act"]


def test_no_fusion_when_linear_is_shared():
    fc = nn.Linear(4, 4)
    model = nn.Sequential(fc, nn.ReLU(), fc)  # the second use of fc must not apply a ReLU
    report = swap_modules(model)
    assert report.fused == [] and len(report.not_fused) == 1
    x = torch.randn(3, 4)
    torch.testing.assert_close(model(x), fc(F.relu(fc(x))))


def test_no_fusion_with_hooks_or_custom_sequential():
    seen = []
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    model[0].register_forward_hook(lambda m, i, o: seen.append(o))
    report = swap_modules(model)
    assert report.fused == [] and "hook" in report.not_fused[0].reason
    model(torch.randn(2, 4))
    assert len(seen) == 1 and (seen[0] < 0).any(), "the hook still sees the Linear's output before the ReLU"

    class Residual(nn.Sequential):
        def forward(self, x):
            return x + super().forward(x)

    model = Residual(nn.Linear(4, 4), nn.ReLU())
    assert swap_modules(model).fused == [] and type(model[1]) is tnn.ReLU


def test_fuse_false_and_flags():
    model = models.mlp()
    report = swap_modules(model, fuse=False)
    assert report.fused == [] and type(model.relu1) is tnn.ReLU and model.fc1.activation == "none"

    model = models.mlp()
    report = swap_modules(model, linear=False)
    assert report.fused == [] and type(model.fc1) is nn.Linear and type(model.relu1) is tnn.ReLU
    assert [s.reason for s in report.left_stock] == ["linear=False"] * 3

    model = models.mlp()
    report = swap_modules(model, activations=False)
    assert report.fused == [] and type(model.fc1) is tnn.Linear and type(model.relu1) is nn.ReLU
    assert [s.reason for s in report.left_stock] == ["activations=False"] * 2


def test_fusion_after_an_unfused_swap():
    model = models.mlp()
    swap_modules(model, fuse=False)
    report = swap_modules(model)
    assert _fused_names(report) == [("fc1", "relu1"), ("fc2", "relu2")]
    assert report.replaced[0] == ("fc1", "torchext.nn.Linear", "torchext.nn.Linear(activation='relu')")


# --- copies, checkpoints, idempotence, training --------------------------------------------------------------------


def test_inplace_false_leaves_the_original_untouched():
    stock = models.cnn_cifar().to(F64)
    stock.fc1.weight.requires_grad_(False)
    types, state = _types(stock), copy.deepcopy(stock.state_dict())
    report = swap_modules(stock, inplace=False)
    swapped = report.model
    assert swapped is not stock and _types(stock) == types, "the original's modules changed"
    _assert_same_state(stock, _Holder(state), "original after swap(inplace=False)")
    _assert_same_state(swapped, stock, "copy")
    ours = dict(swapped.named_parameters())
    for name, p in stock.named_parameters():
        assert ours[name].data_ptr() != p.data_ptr(), f"[{name}] the copy shares storage with the original"
        assert ours[name].requires_grad == p.requires_grad, f"[{name}.requires_grad]"
    assert not swapped.fc1.weight.requires_grad and swapped.fc1.bias.requires_grad


def test_requires_grad_dtype_device_and_training_flag_kept():
    model = Nested().to(F64).eval()
    model.stem.fc.bias.requires_grad_(False)
    swap_modules(model)
    assert model.stem.fc.weight.requires_grad and not model.stem.fc.bias.requires_grad
    assert all(p.dtype == F64 and p.device.type == "cpu" for p in model.parameters())
    assert not any(m.training for m in model.modules()), "eval mode lost"


@pytest.mark.parametrize("name", ["mlp", "cnn_cifar"])
def test_checkpoints_load_both_ways(name):
    stock, swapped, _ = _stock_and_swapped(lambda: models.get_model(name))
    other_stock = models.get_model(name).to(F64)
    other_swapped = swap_modules(models.get_model(name).to(F64)).model

    buf = io.BytesIO()
    torch.save(stock.state_dict(), buf)
    buf.seek(0)
    other_swapped.load_state_dict(torch.load(buf, weights_only=True))  # strict: same keys
    buf = io.BytesIO()
    torch.save(swapped.state_dict(), buf)
    buf.seek(0)
    other_stock.load_state_dict(torch.load(buf, weights_only=True))

    x = torch.randn(3, 3, 32, 32, dtype=F64)
    ref = stock.eval()(x)
    _close(other_swapped.eval()(x), ref, f"{name}: swapped model with the stock checkpoint")
    _close(other_stock.eval()(x), ref, f"{name}: stock model with the swapped checkpoint")


@pytest.mark.parametrize("build", [models.mlp, models.resnet18_cifar, Nested], ids=["mlp", "resnet18_cifar", "nested"])
def test_swapping_twice_is_a_no_op(build):
    model = build()
    first = swap_modules(model)
    types, state = _types(model), copy.deepcopy(model.state_dict())
    second = swap_modules(model)
    assert second.replaced == [] and second.fused == [] and second.not_fused == []
    assert _types(model) == types
    _assert_same_state(model, _Holder(state), "after the second swap")
    n_torchext = sum(1 for r in first.replaced if r.new.startswith("torchext."))
    assert len(second.already_torchext) == n_torchext, (first, second)
    assert second.left_stock == first.left_stock


def test_optimizer_built_before_the_swap_still_trains_the_model():
    model = models.mlp().to(F64)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    swap_modules(model)
    before = model.fc1.weight.detach().clone()
    model(torch.randn(4, 3, 32, 32, dtype=F64)).sum().backward()
    opt.step()
    assert not torch.equal(model.fc1.weight, before), "the optimizer no longer holds the model's parameters"


@pytest.mark.parametrize("build", [models.mlp, Nested], ids=["mlp", "nested"])
def test_training_matches_stock_step_by_step(build):
    stock = build().to(F64)
    ours = swap_modules(stock, inplace=False).model
    in_shape = (8, 3, 32, 32) if build is models.mlp else (8, 8)
    n_out = 10 if build is models.mlp else 16
    gen = torch.Generator().manual_seed(3)
    batches = [(torch.randn(in_shape, generator=gen, dtype=F64), torch.randint(n_out, (8,), generator=gen))
               for _ in range(5)]  # fmt: skip
    losses = {}
    for tag, model, loss_fn in [
        ("stock", stock, nn.CrossEntropyLoss(label_smoothing=0.1)),
        ("torchext", ours, tnn.CrossEntropyLoss(label_smoothing=0.1)),
    ]:
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
        losses[tag] = []
        for x, y in batches:
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            losses[tag].append(loss.item())
    assert len(set(losses["stock"])) == len(batches), "the losses should change from step to step"
    torch.testing.assert_close(losses["torchext"], losses["stock"], rtol=1e-9, atol=0)
    _close(dict(ours.named_parameters())["heads.a.weight" if build is Nested else "fc1.weight"],
           dict(stock.named_parameters())["heads.a.weight" if build is Nested else "fc1.weight"],
           "weights after training")  # fmt: skip


# --- the report ----------------------------------------------------------------------------------------------------


def test_report_text_and_dict():
    report = swap_modules(models.cnn_cifar())
    text = str(report)
    lines = text.splitlines()
    assert lines[0].startswith("swap_modules: 16 replaced, 5 layer+activation pair(s) fused, 3 left stock")
    assert any(line.split() == ["fc1", "nn.Linear", "torchext.nn.Linear(activation='relu')"] for line in lines)
    assert any(line.split() == ["relu5", "nn.ReLU", "nn.Identity"] for line in lines)
    assert any(line.split() == ["conv1", "nn.Conv2d", "torchext.nn.Conv2d(activation='relu')"] for line in lines)
    assert any(line.split() == ["bn1", "nn.BatchNorm2d", "torchext.nn.BatchNorm2d"] for line in lines)
    assert any(line.split() == ["bn3", "nn.BatchNorm1d", "torchext.nn.BatchNorm1d"] for line in lines)
    assert any(line.split()[:2] == ["drop3", "nn.Dropout"] and NO_KERNEL in line for line in lines)
    d = json.loads(json.dumps(report.as_dict()))
    assert d["counts"]["replaced"] == 16 and d["counts"]["left_stock"] == 3
    conv_relu = [{"layer": f"conv{i}", "activation": f"relu{i}", "epilogue": "relu"} for i in range(1, 5)]
    assert d["fused"] == [*conv_relu, {"layer": "fc1", "activation": "relu5", "epilogue": "relu"}]
    assert d["replaced"][0] == {"name": "conv1", "old": "nn.Conv2d", "new": "torchext.nn.Conv2d(activation='relu')"}
    assert "replaced=16" in repr(report)


def test_root_module_and_bad_arguments():
    lin = nn.Linear(3, 2)
    report = swap_modules(lin)
    assert type(lin) is tnn.Linear and report.replaced == [("", "nn.Linear", "torchext.nn.Linear")]
    assert "(model)" in str(report)
    assert isinstance(report, SwapReport)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        swap_modules(lambda x: x)
    with pytest.raises(ValueError, match="torch.compile"):
        swap_modules(torch.compile(models.mlp()))
    assert torchext.swap_modules is swap_modules


# --- pooling -----------------------------------------------------------------------------------------------------


class MyMaxPool(nn.MaxPool2d):
    pass


def test_pooling_swapped_or_left_stock_with_a_reason():
    """MaxPool2d, AvgPool2d and AdaptiveAvgPool2d are swapped (outputs unchanged); one with arguments torchext
    refuses (padding over half the kernel: torch raises at its forward too), a subclass, and pooling=False stay
    stock with their reason."""
    model = nn.Sequential(
        nn.MaxPool2d(3, 2, 1), nn.AvgPool2d(2, ceil_mode=True, count_include_pad=False),
        nn.AdaptiveAvgPool2d((2, None)), nn.AvgPool2d(3, 1, 2), MyMaxPool(2), nn.AvgPool2d(2, divisor_override=0),
    ).to(F64)  # fmt: skip
    stock = copy.deepcopy(model)
    report = swap_modules(model)
    assert [type(m) for m in model[:3]] == [tnn.MaxPool2d, tnn.AvgPool2d, tnn.AdaptiveAvgPool2d], report
    assert [(r.name, r.old) for r in report.replaced] == [("0", "nn.MaxPool2d"), ("1", "nn.AvgPool2d"),
                                                         ("2", "nn.AdaptiveAvgPool2d")]  # fmt: skip
    reasons = {s.name: s.reason for s in report.left_stock}
    assert "padding" in reasons["3"] and "subclass of nn.MaxPool2d" in reasons["4"], reasons
    assert "divisor_override" in reasons["5"], reasons
    x = torch.randn(2, 3, 9, 11, dtype=F64)
    torch.testing.assert_close(model[:3](x), stock[:3](x), msg="[swapped pools: output]")
    kept = swap_modules(nn.Sequential(nn.MaxPool2d(2)), pooling=False)
    assert [s.reason for s in kept.left_stock] == ["pooling=False"], kept
    again = swap_modules(model)
    assert [a.cls for a in again.already_torchext] == [
        "torchext.nn.MaxPool2d", "torchext.nn.AvgPool2d", "torchext.nn.AdaptiveAvgPool2d"
    ], again  # fmt: skip
