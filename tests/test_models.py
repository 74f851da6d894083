"""torchext.models: the CIFAR-10 models of the stock-vs-torchext comparison: sizes, shapes, initialisation, every
activation a module of its own (so a module swap reaches all of them), the registry, torchvision's ResNet-18."""

import math
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchext.nn as tnn
from torchext import models

# (name, parameters with 10 classes, ReLU modules: resnet18_cifar has 1 in the stem and 2 in each of its 8 blocks)
SIZES = [
    ("resnet18_cifar", 11_173_962, 17),
    ("cnn_cifar", 1_252_074, 5),
    ("mlp", 1_707_274, 2),
]


def n_params(model):
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name,params,relus", SIZES)
def test_parameter_count(name, params, relus):
    assert n_params(models.get_model(name)) == params, f"[{name} parameters]"


@pytest.mark.parametrize("name", list(models.MODELS))
def test_output_shape(name):
    if name == "resnet18_torchvision":
        pytest.importorskip("torchvision")
    model = models.get_model(name, num_classes=7)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 7), f"[{name} output]"


class _CountingReLU(nn.Module):
    """A ReLU that does not go through torch's relu, and counts its calls."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x.clamp_min(0)


def _replace_relus(module):
    replaced = []
    for name, child in module.named_children():
        if isinstance(child, nn.ReLU):
            new = _CountingReLU()
            setattr(module, name, new)
            replaced.append(new)
        else:
            replaced += _replace_relus(child)
    return replaced


def _forbid(*args, **kwargs):
    raise AssertionError("a functional relu ran in forward: every activation must be a module")


@pytest.mark.parametrize("name,params,relus", SIZES)
def test_every_activation_is_its_own_module(name, params, relus, monkeypatch):
    model = models.get_model(name)
    found = [m for m in model.modules() if isinstance(m, nn.ReLU)]
    assert len(found) == relus, f"[{name} nn.ReLU modules]"
    assert len({id(m) for m in found}) == relus
    counters = _replace_relus(model)
    for owner, attr in [(F, "relu"), (F, "relu_"), (torch, "relu"), (torch, "relu_"), (torch.Tensor, "relu"),
                        (torch.Tensor, "relu_")]:  # fmt: skip
        monkeypatch.setattr(owner, attr, _forbid)
    model.eval()(torch.randn(2, 3, 32, 32))
    # Each ReLU instance serves exactly one place: a module used twice would count 2, one left unused 0.
    assert [c.calls for c in counters] == [1] * relus, f"[{name} calls per ReLU module]"


def _swap_relus(module):
    for name, child in module.named_children():
        if type(child) is nn.ReLU:
            setattr(module, name, tnn.ReLU())
        else:
            _swap_relus(child)


@pytest.mark.parametrize("name", ["resnet18_cifar", "cnn_cifar", "mlp"])
def test_swapped_relus_give_the_same_output(name):
    model = models.get_model(name).eval()
    x = torch.randn(2, 3, 32, 32)
    expected = model(x)
    _swap_relus(model)
    assert sum(isinstance(m, tnn.ReLU) for m in model.modules()) == sum(isinstance(m, nn.ReLU) for m in model.modules())
    torch.testing.assert_close(model(x), expected, msg=f"[{name} output with torchext ReLUs]")


def test_resnet18_cifar_architecture():
    model = models.resnet18_cifar()
    assert model.conv1.kernel_size == (3, 3) and model.conv1.stride == (1, 1) and model.conv1.bias is None
    assert not any(isinstance(m, nn.MaxPool2d) for m in model.modules()), "no max-pool in the CIFAR stem"
    shapes = []
    x = model.relu(model.bn1(model.conv1(torch.randn(1, 3, 32, 32))))
    for i in range(1, 5):
        stage = getattr(model, f"layer{i}")
        assert len(stage) == 2 and all(isinstance(b, models.BasicBlock) for b in stage)
        assert (stage[0].downsample is None) == (i == 1), f"[layer{i} shortcut]"
        if i > 1:
            conv, bn = stage[0].downsample
            assert conv.kernel_size == (1, 1) and conv.stride == (2, 2) and isinstance(bn, nn.BatchNorm2d)
        x = stage(x)
        shapes.append(tuple(x.shape[1:]))
    assert shapes == [(64, 32, 32), (128, 16, 16), (256, 8, 8), (512, 4, 4)]
    assert model.fc.in_features == 512


def test_resnet18_cifar_state_dict_keys_are_torchvisions():
    torchvision = pytest.importorskip("torchvision")
    ours = models.resnet18_cifar().state_dict()
    theirs = torchvision.models.resnet18(num_classes=10).state_dict()
    assert list(ours) == list(theirs)
    differ = [k for k in ours if ours[k].shape != theirs[k].shape]
    assert differ == ["conv1.weight"], differ


def test_resnet18_cifar_init_is_torchvisions():
    model = models.resnet18_cifar()
    for name, m in model.named_modules():
        if isinstance(m, nn.Conv2d):
            fan_out = m.out_channels * m.kernel_size[0] * m.kernel_size[1]
            expected = math.sqrt(2.0 / fan_out)
            std = m.weight.std().item()
            rel = 0.25 if m.weight.numel() < 4096 else 0.05
            assert abs(std - expected) < rel * expected, f"[{name}.weight std] {std:.4g} vs kaiming {expected:.4g}"
        elif isinstance(m, nn.BatchNorm2d):
            assert torch.all(m.weight == 1) and torch.all(m.bias == 0), f"[{name}]"
    zero = models.resnet18_cifar(zero_init_residual=True)
    assert all(torch.all(b.bn2.weight == 0) for b in zero.modules() if isinstance(b, models.BasicBlock))


def test_cnn_cifar_layout():
    model = models.cnn_cifar()
    kinds = [type(m).__name__ for m in model]
    assert kinds == [
        "Conv2d", "ReLU", "BatchNorm2d", "Conv2d", "ReLU", "MaxPool2d", "Dropout",
        "Conv2d", "ReLU", "BatchNorm2d", "Conv2d", "ReLU", "MaxPool2d", "Dropout",
        "Flatten", "Linear", "ReLU", "BatchNorm1d", "Dropout", "Linear",
    ]  # fmt: skip
    convs = [m for m in model if isinstance(m, nn.Conv2d)]
    assert [c.out_channels for c in convs] == [32, 32, 64, 64]
    assert all(c.kernel_size == (3, 3) for c in convs)
    assert [c.padding for c in convs] == [(1, 1), (0, 0), (1, 1), (0, 0)], "the Keras layout: second conv unpadded"
    assert [m.p for m in model if isinstance(m, nn.Dropout)] == [0.25, 0.25, 0.5]
    assert model.fc1.in_features == 64 * 6 * 6 and model.fc1.out_features == 512


def test_mlp_layout():
    linears = [m for m in models.mlp() if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(3072, 512), (512, 256), (256, 10)]


def test_get_model_unknown_name_lists_the_models():
    with pytest.raises(
        ValueError, match="unknown model 'resnet50'.*resnet18_cifar, resnet18_torchvision, cnn_cifar, mlp"
    ):
        models.get_model("resnet50")


def test_resnet18_torchvision_loads_a_local_state_dict(tmp_path):
    pytest.importorskip("torchvision")
    source = models.resnet18_torchvision(num_classes=10)
    path = tmp_path / "r18.pt"
    torch.save(source.state_dict(), path)
    loaded = models.resnet18_torchvision(num_classes=10, weights=str(path))
    for (k, a), b in zip(source.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), f"[{k}]"
    wrapped = tmp_path / "ckpt.pt"
    torch.save({"state_dict": source.state_dict(), "epoch": 3}, wrapped)
    assert torch.equal(models.resnet18_torchvision(weights=wrapped).fc.weight, source.fc.weight)
    assert n_params(loaded) == 11_181_642


def test_resnet18_torchvision_weight_errors(tmp_path):
    pytest.importorskip("torchvision")
    missing = tmp_path / "nope.pt"
    with pytest.raises(FileNotFoundError, match="nope.pt.*does not exist"):
        models.resnet18_torchvision(weights=str(missing))
    path = tmp_path / "ten.pt"
    torch.save(models.resnet18_torchvision(num_classes=10).state_dict(), path)
    with pytest.raises(
        ValueError, match=r"ten\.pt.*shape mismatches.*fc\.weight: file \(10, 512\) vs model \(100, 512\)"
    ):
        models.resnet18_torchvision(num_classes=100, weights=str(path))
    other = tmp_path / "cifar.pt"
    torch.save(models.resnet18_cifar().state_dict(), other)
    with pytest.raises(ValueError, match=r"conv1\.weight: file \(64, 3, 3, 3\) vs model \(64, 3, 7, 7\)"):
        models.resnet18_torchvision(weights=str(other))
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="junk.pt"):
        models.resnet18_torchvision(weights=str(junk))


def test_resnet18_torchvision_without_torchvision(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchvision", None)
    with pytest.raises(ImportError, match="needs torchvision"):
        models.resnet18_torchvision()
