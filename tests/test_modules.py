"""torchext.nn and torchext.functional as drop-in replacements for torch.nn and torch.nn.functional."""

import inspect

import pytest
import torch
import torch.nn.functional as F
from conftest import device_params, make_tensor
from torch import nn

import torchext
import torchext.functional as TF
import torchext.nn as tnn

ACTIVATION_MODULES = [
    ("ReLU", {}),
    ("LeakyReLU", {"negative_slope": 0.2}),
    ("Sigmoid", {}),
    ("Tanh", {}),
    ("GELU", {"approximate": "tanh"}),
    ("GELU", {}),
    ("SiLU", {}),
    ("Softmax", {"dim": 1}),
    ("LogSoftmax", {"dim": -1}),
]


@pytest.mark.parametrize("name,kwargs", ACTIVATION_MODULES)
@pytest.mark.parametrize("device", device_params())
def test_activation_module_matches_torch(name, kwargs, device):
    ours, theirs = getattr(tnn, name)(**kwargs), getattr(nn, name)(**kwargs)
    assert isinstance(ours, getattr(nn, name)) and repr(ours) == repr(theirs)
    x = make_tensor((4, 6, 5), torch.float64, device, requires_grad=True)
    y_ours, y_theirs = ours(x), theirs(x)
    torch.testing.assert_close(y_ours, y_theirs, msg=f"[{name} output]")
    g = torch.randn_like(y_ours)
    torch.testing.assert_close(
        torch.autograd.grad(y_ours, x, g)[0], torch.autograd.grad(y_theirs, x, g)[0], msg=f"[{name} x.grad]"
    )


def _class_targets(n, c, device):
    return torch.randint(0, c, (n,), device=device)


LOSS_MODULES = [
    ("CrossEntropyLoss", {"label_smoothing": 0.1}, _class_targets),
    ("CrossEntropyLoss", {"weight": "per-class", "reduction": "sum", "ignore_index": 2}, _class_targets),
    ("MSELoss", {"reduction": "sum"}, lambda n, c, d: torch.randn(n, c, dtype=torch.float64, device=d)),
    ("BCEWithLogitsLoss", {"pos_weight": "per-class"}, lambda n, c, d: torch.rand(n, c, dtype=torch.float64, device=d)),
    ("MultiMarginLoss", {"p": 2, "margin": 0.5, "weight": "per-class"}, _class_targets),
]


@pytest.mark.parametrize("name,kwargs,make_target", LOSS_MODULES)
@pytest.mark.parametrize("device", device_params())
def test_loss_module_matches_torch_and_shares_state_dict(name, kwargs, make_target, device):
    n, c = 9, 5
    kwargs = {
        k: (torch.rand(c, dtype=torch.float64, device=device) + 0.5 if v == "per-class" else v)
        for k, v in kwargs.items()
    }
    ours, theirs = getattr(tnn, name)(**kwargs), getattr(nn, name)(**kwargs)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    theirs.load_state_dict(ours.state_dict())
    ours.load_state_dict(theirs.state_dict())
    x = make_tensor((n, c), torch.float64, device, requires_grad=True)
    t = make_target(n, c, device)
    l_ours, l_theirs = ours(x, t), theirs(x, t)
    torch.testing.assert_close(l_ours, l_theirs, msg=f"[{name} loss]")
    torch.testing.assert_close(torch.autograd.grad(l_ours, x)[0], torch.autograd.grad(l_theirs, x)[0])


# torch.nn.functional names whose Python signature is a dispatcher's (*args, **kwargs): the function they dispatch to.
_SIGNATURE_OF = {"max_pool2d": "max_pool2d_with_indices"}


@pytest.mark.parametrize("name", torchext.functional.__all__)
def test_functional_signature_matches_torch(name):
    """torch's parameters, in torch's order with torch's defaults (torch.nn.functional's, or torch's for matmul);
    torchext's own options (linear's `activation`, matmul's `kernel`) may follow them, with defaults."""
    ours = inspect.signature(getattr(TF, name))
    if getattr(F, name, None) is None and getattr(torch, name, None) is None:
        pytest.skip(f"{name} is torchext's own fusion (batch_norm_relu, ...): torch has no function to match")
    try:
        theirs = inspect.signature(getattr(F, _SIGNATURE_OF.get(name, name), None) or getattr(torch, name))
    except ValueError:
        pytest.skip(f"torch's {name} is a builtin without a Python signature")
    theirs_names = list(theirs.parameters)
    assert list(ours.parameters)[: len(theirs_names)] == theirs_names, f"torchext.functional.{name} parameters differ"
    for p in theirs.parameters.values():
        assert ours.parameters[p.name].default == p.default, f"{name}({p.name}=...) default differs"
    for extra in list(ours.parameters)[len(theirs_names) :]:
        assert ours.parameters[extra].default is not inspect.Parameter.empty, f"{name}({extra}) needs a default"


def test_functional_softmax_other_dim_and_dtype():
    x = torch.randn(3, 4, 5)
    torch.testing.assert_close(TF.softmax(x, dim=1), F.softmax(x, dim=1))
    torch.testing.assert_close(TF.log_softmax(x, dim=0, dtype=torch.float64), F.log_softmax(x, dim=0, dtype=torch.float64))


class _AllModules(nn.Module):
    """A small model that uses every torchext module, for torch.compile."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(12, 16), nn.Linear(16, 5)
        self.acts = nn.Sequential(tnn.ReLU(), tnn.LeakyReLU(0.1), tnn.GELU("tanh"), tnn.SiLU(), tnn.GELU(), tnn.Tanh())
        self.sigmoid, self.softmax, self.log_softmax = tnn.Sigmoid(), tnn.Softmax(-1), tnn.LogSoftmax(-1)
        self.ce, self.mse = tnn.CrossEntropyLoss(label_smoothing=0.1), tnn.MSELoss()
        self.bce, self.margin = tnn.BCEWithLogitsLoss(), tnn.MultiMarginLoss()

    def forward(self, x, t):
        logits = self.fc2(self.acts(self.fc1(x)))
        p = self.softmax(logits)
        return (
            self.ce(logits, t)
            + self.mse(p, self.sigmoid(logits))
            + self.bce(logits, p.detach())
            + self.margin(logits, t)
            - self.log_softmax(logits).mean()
        )


@pytest.mark.slow
def test_compile_fullgraph_no_graph_breaks():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _AllModules()
    x, t = torch.randn(8, 12), torch.randint(0, 5, (8,))
    eager = model(x, t)
    (g_eager,) = torch.autograd.grad(eager, model.fc1.weight)
    compiled = torch.compile(model, fullgraph=True)
    out = compiled(x, t)
    (g_compiled,) = torch.autograd.grad(out, model.fc1.weight)
    torch.testing.assert_close(out, eager, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g_compiled, g_eager, rtol=1e-4, atol=1e-6)


def test_activations_keep_float32_under_cpu_autocast_and_losses_go_float32():
    x = torch.randn(4, 5, dtype=torch.bfloat16)
    t = torch.randint(0, 5, (4,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torchext.ops.gelu(x).dtype == torch.float32  # the CPU kernels are float32/float64
        assert torchext.ops.cross_entropy(x, t).dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_autocast_rules(dtype):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    x = torch.randn(4, 5, device="cuda", dtype=dtype)
    t = torch.randint(0, 5, (4,), device="cuda")
    with torch.autocast("cuda", dtype=dtype):
        assert torchext.ops.relu(x).dtype == dtype, "activations run in the dtype they are given on CUDA"
        assert torchext.ops.softmax(x).dtype == torch.float32
        assert torchext.ops.cross_entropy(x, t).dtype == torch.float32
        assert torchext.ops.mse_loss(x, x.float()).dtype == torch.float32
