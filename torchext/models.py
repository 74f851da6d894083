"""CIFAR-10 models for the stock-vs-torchext comparison (issue 5).

Every activation is its own ``nn.ReLU`` module (a new instance at each use, never ``F.relu`` in a forward), so a
module swap can replace each one with ``torchext.nn.ReLU`` and nothing is left running the stock op. The ReLUs are
not ``inplace``: torchext's ReLU always returns a new tensor, so the stock model does the same work the swapped one
does.

=========================  ===========  =============================================================
name                       parameters   what it is (10 classes)
=========================  ===========  =============================================================
``resnet18_cifar``         11,173,962   ResNet-18 for 32x32: 3x3 stride-1 stem, no max-pool
``resnet18_torchvision``   11,181,642   torchvision's ResNet-18 as is (7x7 stride-2 stem, max-pool)
``cnn_cifar``              1,252,074    two conv pairs and a dense layer, with batch norm and dropout
``mlp``                    1,707,274    3072-512-256-10
=========================  ===========  =============================================================
"""

import os
from collections import OrderedDict
from typing import Callable, Optional

import torch
from torch import Tensor, nn

__all__ = [
    "BasicBlock",
    "ResNetCIFAR",
    "resnet18_cifar",
    "resnet18_torchvision",
    "cnn_cifar",
    "mlp",
    "MODELS",
    "get_model",
]


class BasicBlock(nn.Module):
    """Two 3x3 conv + batch-norm layers and a residual connection: relu2(bn2(conv2(relu1(bn1(conv1(x))))) + s(x)),
    where s is the identity, or a strided 1x1 conv + batch norm when the shape changes. Parameter names are
    torchvision's (``conv1``, ``bn1``, ``conv2``, ``bn2``, ``downsample.0``, ``downsample.1``)."""

    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu2 = nn.ReLU()
        self.downsample: Optional[nn.Module] = None
        if stride != 1 or in_planes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_planes, planes, kernel_size=1, stride=stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu2(out + identity)


class ResNetCIFAR(nn.Module):
    """ResNet with BasicBlocks for 32x32 inputs: a 3x3 stride-1 stem (64 channels, no bias) + BN + ReLU and no
    max-pool, four stages of ``layers[i]`` blocks (64, 128, 256, 512 channels; stages 2-4 start with stride 2),
    adaptive average pool, flatten, ``fc``. Feature maps: 32x32, 16x16, 8x8, 4x4.

    Initialisation is torchvision's: Kaiming-normal (fan_out, relu) convolutions, batch norms at weight 1 and bias
    0, the Linear layer at PyTorch's default; ``zero_init_residual`` zeroes each block's last BN weight as
    torchvision's option does. State-dict keys are torchvision's ResNet's (only ``conv1.weight``'s shape differs).
    """

    def __init__(self, layers=(2, 2, 2, 2), num_classes: int = 10, zero_init_residual: bool = False) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU()
        in_planes = 64
        for i, (planes, blocks) in enumerate(zip((64, 128, 256, 512), layers)):
            stage = []
            for j in range(blocks):
                stride = 2 if i > 0 and j == 0 else 1
                stage.append(BasicBlock(in_planes, planes, stride))
                in_planes = planes
            setattr(self, f"layer{i + 1}", nn.Sequential(*stage))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.flatten = nn.Flatten(1)
        self.fc = nn.Linear(512 * BasicBlock.expansion, num_classes)

        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)
        if zero_init_residual:
            for m in self.modules():
                if isinstance(m, BasicBlock):
                    nn.init.constant_(m.bn2.weight, 0)

    def forward(self, x: Tensor) -> Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.flatten(self.avgpool(x)))


def resnet18_cifar(num_classes: int = 10, zero_init_residual: bool = False) -> ResNetCIFAR:
    """ResNet-18 for 32x32 images (2 BasicBlocks per stage); 11,173,962 parameters with 10 classes."""
    return ResNetCIFAR((2, 2, 2, 2), num_classes=num_classes, zero_init_residual=zero_init_residual)


def resnet18_torchvision(num_classes: int = 10, weights: Optional[str] = None) -> nn.Module:
    """torchvision's ResNet-18 unchanged (7x7 stride-2 stem and max-pool, built for 224x224 ImageNet images; on
    32x32 inputs its last stage sees 1x1 maps) with a ``num_classes`` head; 11,181,642 parameters with 10 classes.
    Its blocks call one ReLU module twice, so it is the stock reference rather than a model to swap.

    ``weights``: optional path of a local ``state_dict`` file (``torch.save(model.state_dict(), path)``; a
    checkpoint dict holding it under ``"state_dict"`` or ``"model"`` also works). Nothing is ever downloaded. An
    ImageNet checkpoint has a 1000-class head, so it loads only with ``num_classes=1000``.
    """
    try:
        import torchvision
    except ImportError as e:
        raise ImportError(
            "resnet18_torchvision needs torchvision, which is not installed (pip install torchvision, the release "
            f"that matches torch {torch.__version__}); resnet18_cifar needs nothing beyond torch"
        ) from e
    model = torchvision.models.resnet18(weights=None, num_classes=num_classes)
    if weights is None:
        return model
    path = os.fspath(weights)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"resnet18_torchvision: weights file {path!r} does not exist (expected a local "
            "state_dict saved with torch.save; nothing is downloaded)"
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ValueError(f"resnet18_torchvision: cannot read {path!r} as a torch.save'd state_dict: {e}") from e
    if isinstance(state, dict):
        for key in ("state_dict", "model"):
            if isinstance(state.get(key), dict):
                state = state[key]
                break
    if not isinstance(state, dict):
        raise ValueError(f"resnet18_torchvision: {path!r} holds a {type(state).__name__}, not a state_dict")
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    mismatched = [
        f"{k}: file {tuple(v.shape)} vs model {tuple(own[k].shape)}"
        for k, v in state.items()
        if k in own and isinstance(v, Tensor) and v.shape != own[k].shape
    ]
    if missing or unexpected or mismatched:
        problems = []
        if missing:
            problems.append(f"missing keys {missing[:5]}{' ...' if len(missing) > 5 else ''}")
        if unexpected:
            problems.append(f"unexpected keys {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}")
        if mismatched:
            problems.append(f"shape mismatches {mismatched[:5]}{' ...' if len(mismatched) > 5 else ''}")
        raise ValueError(
            f"resnet18_torchvision(num_classes={num_classes}): {path!r} does not match torchvision's ResNet-18: "
            + "; ".join(problems)
        )
    model.load_state_dict(state)
    return model


def cnn_cifar(num_classes: int = 10) -> nn.Sequential:
    """A small CNN, the classic Keras CIFAR-10 example's layout with batch norm: 1,252,074 parameters with 10
    classes, 1,180,160 of them in the first dense layer::

        conv 3->32 (padded), ReLU, BN, conv 32->32 (unpadded), ReLU, max-pool 2, dropout 0.25   32x32 -> 15x15
        conv 32->64 (padded), ReLU, BN, conv 64->64 (unpadded), ReLU, max-pool 2, dropout 0.25  15x15 -> 6x6
        flatten, dense 2304->512, ReLU, BN, dropout 0.5, dense 512->num_classes

    All convs are 3x3; the first of each pair keeps the size (padding 1), the second does not, as in the Keras
    example (that is what makes it the "about 1.2M parameters" model). Each conv and the hidden dense layer is
    followed by its own ReLU module.
    """
    layers = OrderedDict(
        [
            ("conv1", nn.Conv2d(3, 32, 3, padding=1)),
            ("relu1", nn.ReLU()),
            ("bn1", nn.BatchNorm2d(32)),
            ("conv2", nn.Conv2d(32, 32, 3)),
            ("relu2", nn.ReLU()),
            ("pool1", nn.MaxPool2d(2)),
            ("drop1", nn.Dropout(0.25)),
            ("conv3", nn.Conv2d(32, 64, 3, padding=1)),
            ("relu3", nn.ReLU()),
            ("bn2", nn.BatchNorm2d(64)),
            ("conv4", nn.Conv2d(64, 64, 3)),
            ("relu4", nn.ReLU()),
            ("pool2", nn.MaxPool2d(2)),
            ("drop2", nn.Dropout(0.25)),
            ("flatten", nn.Flatten(1)),
            ("fc1", nn.Linear(64 * 6 * 6, 512)),
            ("relu5", nn.ReLU()),
            ("bn3", nn.BatchNorm1d(512)),
            ("drop3", nn.Dropout(0.5)),
            ("fc2", nn.Linear(512, num_classes)),
        ]
    )
    return nn.Sequential(layers)


def mlp(num_classes: int = 10) -> nn.Sequential:
    """Flatten, 3072->512, ReLU, 512->256, ReLU, 256->num_classes; 1,707,274 parameters with 10 classes."""
    layers = OrderedDict(
        [
            ("flatten", nn.Flatten(1)),
            ("fc1", nn.Linear(3 * 32 * 32, 512)),
            ("relu1", nn.ReLU()),
            ("fc2", nn.Linear(512, 256)),
            ("relu2", nn.ReLU()),
            ("fc3", nn.Linear(256, num_classes)),
        ]
    )
    return nn.Sequential(layers)


MODELS: "dict[str, Callable[..., nn.Module]]" = {
    "resnet18_cifar": resnet18_cifar,
    "resnet18_torchvision": resnet18_torchvision,
    "cnn_cifar": cnn_cifar,
    "mlp": mlp,
}


def get_model(name: str, **kwargs) -> nn.Module:
    """``MODELS[name](**kwargs)``, e.g. ``get_model("resnet18_cifar", num_classes=100)``."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; the models are: {', '.join(MODELS)}")
    return MODELS[name](**kwargs)
