"""Every torchext op inside a captured CUDA graph: forward and backward captured once, replayed on new input values
written into the static inputs, and compared with eager calls on the same values. A capture fails if an op
synchronizes the host, allocates outside the graph's pool or touches a stream it must not; a replay gives stale or
wrong results if an op baked a host-side value of its inputs into the graph. And a small model's whole training
step (forward, backward, optimizer step) captured once and replayed, against the same steps run eagerly, by hand
and through torchext.graphs.GraphedTrainStep."""

import pytest
import torch
from conftest import gpu
from torch import nn

import torchext
import torchext.functional as TF
from torchext.graphs import GraphedTrainStep


def capture(fn, static_inputs, warmup=3):
    """Warms fn up on a side stream (as torch.cuda.graphs' docs ask), then captures one call. Returns the graph and
    the static outputs of the captured call."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn(*static_inputs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = fn(*static_inputs)
    return graph, outputs


def fwd_bwd(op):
    """(inputs that need gradients, other inputs) -> outputs and the gradients of a weighted sum of them."""

    def run(x, *rest):
        x = x.detach().requires_grad_(True)
        out = op(x, *rest)
        weights = torch.linspace(-1.0, 1.0, out.numel(), device=out.device, dtype=out.dtype).view_as(out)
        (grad,) = torch.autograd.grad((out * weights).sum(), x)
        return out.detach(), grad

    return run


def _targets(n, classes, device):
    return torch.randint(0, classes, (n,), device=device)


# name -> (op on (x, *rest), shape of x, make the other inputs from x)
OPS = {
    "relu": (TF.relu, (33, 65), lambda x: ()),
    "leaky_relu": (lambda x: TF.leaky_relu(x, 0.1), (33, 65), lambda x: ()),
    "sigmoid": (TF.sigmoid, (33, 65), lambda x: ()),
    "tanh": (TF.tanh, (33, 65), lambda x: ()),
    "gelu": (TF.gelu, (33, 65), lambda x: ()),
    "gelu_tanh": (lambda x: TF.gelu(x, approximate="tanh"), (33, 65), lambda x: ()),
    "silu": (TF.silu, (33, 65), lambda x: ()),
    "add": (TF.add, (33, 65), lambda x: (torch.randn_like(x),)),
    "softmax": (lambda x: TF.softmax(x, dim=-1), (33, 65), lambda x: ()),
    "log_softmax": (lambda x: TF.log_softmax(x, dim=1), (33, 65), lambda x: ()),
    "cross_entropy": (lambda x, t: TF.cross_entropy(x, t), (64, 10), lambda x: (_targets(64, 10, x.device),)),
    "cross_entropy_smoothing_weight": (
        lambda x, t, w: TF.cross_entropy(x, t, weight=w, label_smoothing=0.1, ignore_index=3),
        (64, 10),
        lambda x: (_targets(64, 10, x.device), torch.rand(10, device=x.device) + 0.5),
    ),
    "mse_loss": (lambda x, y: TF.mse_loss(x, y), (33, 65), lambda x: (torch.randn_like(x),)),
    "bce_with_logits": (
        lambda x, y: TF.binary_cross_entropy_with_logits(x, y),
        (33, 65),
        lambda x: (torch.rand_like(x),),
    ),
    "multi_margin_loss": (lambda x, t: TF.multi_margin_loss(x, t), (64, 10), lambda x: (_targets(64, 10, x.device),)),
    "matmul": (lambda x, b: torchext.matmul(x, b), (129, 96), lambda x: (torch.randn(96, 80, device=x.device),)),
    "linear_relu": (
        lambda x, w, b: TF.linear(x, w, b, "relu"),
        (129, 96),
        lambda x: (torch.randn(80, 96, device=x.device) * 0.1, torch.randn(80, device=x.device)),
    ),
    # Training mode: the statistics pass, its device-side finalize (which also updates the running buffers) and the
    # normalize pass; the backward's reduction and elementwise passes.
    "batch_norm_relu": (
        lambda x, w, b, rm, rv: TF.batch_norm_relu(
            x.contiguous(memory_format=torch.channels_last), rm, rv, w, b, training=True
        ),
        (8, 16, 5, 7),
        lambda x: (
            torch.rand(16, device=x.device) + 0.5,
            torch.randn(16, device=x.device),
            torch.zeros(16, device=x.device),
            torch.ones(16, device=x.device),
        ),
    ),
    "batch_norm_add_relu_nchw": (
        lambda x, r, w, b: TF.batch_norm_add_relu(x, r, None, None, w, b, training=True),
        (8, 3, 5, 7),
        lambda x: (torch.randn_like(x), torch.rand(3, device=x.device) + 0.5, torch.randn(3, device=x.device)),
    ),
    # pooling: NCHW and channels-last (the vectorized path), overlapping windows in the backward
    "max_pool2d": (lambda x: TF.max_pool2d(x, 3, 2, 1), (4, 16, 17, 19), lambda x: ()),
    "max_pool2d_channels_last": (
        lambda x: TF.max_pool2d(x.contiguous(memory_format=torch.channels_last), 3, 2, 1, ceil_mode=True),
        (4, 16, 17, 19),
        lambda x: (),
    ),
    "avg_pool2d": (lambda x: TF.avg_pool2d(x, 3, 2, 1, count_include_pad=False), (4, 16, 17, 19), lambda x: ()),
    "global_avg_pool_channels_last": (
        lambda x: TF.adaptive_avg_pool2d(x.contiguous(memory_format=torch.channels_last), 1),
        (8, 64, 7, 7),
        lambda x: (),
    ),
    "adaptive_avg_pool2d": (lambda x: TF.adaptive_avg_pool2d(x, (5, 3)), (4, 16, 17, 19), lambda x: ()),
}


def _refill(tensors):
    """New values in place (static inputs keep their storage): floating ones random, integer ones (targets) random
    classes."""
    for t in tensors:
        if t.is_floating_point():
            t.copy_(torch.randn_like(t) if t.min() < 0 else torch.rand_like(t) + 0.1)
        else:
            t.copy_(torch.randint_like(t, 0, 10))


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", OPS)
def test_op_replays_in_a_cuda_graph(name, dtype):
    op, shape, make_rest = OPS[name]
    x = torch.randn(shape, device="cuda", dtype=dtype)
    rest = tuple(t.to(dtype) if t.is_floating_point() else t for t in make_rest(x))
    run = fwd_bwd(op)
    graph, (out, grad) = capture(run, (x, *rest))
    for _ in range(2):
        _refill((x, *rest))
        graph.replay()
        out_eager, grad_eager = run(x, *rest)
        torch.testing.assert_close(out, out_eager, msg=lambda m: f"[{name} output after replay] {m}")
        torch.testing.assert_close(grad, grad_eager, msg=lambda m: f"[{name} gradient after replay] {m}")


@gpu
def test_bad_target_inside_a_graph_gives_nan_and_no_error():
    """Inside a capture the deferred target check is off (a copy to the host cannot be captured): the documented
    behaviour is NaN for the offending rows and no error, at capture and at replay."""
    x = torch.randn(8, 5, device="cuda")
    t = torch.randint(0, 5, (8,), device="cuda")
    graph, loss = capture(lambda x, t: TF.cross_entropy(x, t, reduction="none"), (x, t))
    t[3] = 7
    graph.replay()
    torch.cuda.synchronize()
    assert torch.isnan(loss[3]) and torch.isfinite(loss[torch.arange(8, device="cuda") != 3]).all()
    torchext.ops.check_targets()  # nothing was queued by the captured calls: does not raise


def _small_cnn():
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(8 * 8 * 8, 32),
        nn.ReLU(),
        nn.Linear(32, 10),
    )


@gpu
def test_whole_training_step_replays_like_eager_steps():
    """A swapped model's whole step (forward, backward, SGD step with momentum) captured once and replayed over new
    batches ends with the same weights as the same steps run eagerly. Warm-up steps run eagerly in both (capture
    itself runs nothing)."""
    torch.manual_seed(0)
    stock = _small_cnn().cuda()
    models = [torchext.swap_modules(stock, inplace=False).model for _ in range(2)]
    criterion = torchext.nn.CrossEntropyLoss()
    batches = [(torch.randn(16, 3, 8, 8, device="cuda"), torch.randint(0, 10, (16,), device="cuda")) for _ in range(6)]
    warmup = 3

    def make_step(model, opt):
        def step(x, y):
            opt.zero_grad(set_to_none=False)
            loss = criterion(model(x), y)
            loss.backward()
            opt.step()
            return loss.detach()

        return step

    eager, graphed = models
    opt_eager = torch.optim.SGD(eager.parameters(), lr=0.05, momentum=0.9)
    step_eager = make_step(eager, opt_eager)
    losses_eager = [step_eager(*batches[0]) for _ in range(warmup)]
    losses_eager += [step_eager(*b) for b in batches[1:]]

    opt = torch.optim.SGD(graphed.parameters(), lr=0.05, momentum=0.9)
    static_x, static_y = batches[0][0].clone(), batches[0][1].clone()
    graph, static_loss = capture(make_step(graphed, opt), (static_x, static_y), warmup=warmup)
    losses = []
    for xb, yb in batches[1:]:
        static_x.copy_(xb)
        static_y.copy_(yb)
        graph.replay()
        losses.append(static_loss.clone())
    torch.testing.assert_close(torch.stack(losses), torch.stack(losses_eager[warmup:]), msg=lambda m: f"[losses] {m}")
    for (name, p), p_eager in zip(graphed.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p, p_eager, msg=lambda m, name=name: f"[{name} after the replayed steps] {m}")


class _ResidualBlock(nn.Module):
    """conv -> bn -> relu -> conv -> bn (+ input) -> relu -> pool -> linear: swapped, two Conv2dStats handing their
    BatchNorms the sums, a BatchNormReLU2d, a BatchNormAddReLU2d and a fork."""

    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)
        self.conv2, self.bn2 = nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)
        self.relu1, self.relu2 = nn.ReLU(), nn.ReLU()
        self.pool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(16, 10)

    def forward(self, x):
        y = self.relu1(self.bn1(self.conv1(x)))
        y = self.relu2(self.bn2(self.conv2(y)) + y)
        return self.fc(torch.flatten(self.pool(y), 1))


@gpu
@pytest.mark.parametrize("model", ["cnn", "residual_block"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("autocast_dtype", [None, torch.bfloat16], ids=str)
def test_graphed_train_step_matches_eager_training(model, optimizer, autocast_dtype):
    """GraphedTrainStep's replays, with a OneCycle schedule changing a tensor lr between them, train the model to
    the same weights and losses as plain eager steps from the same start: its warm-up steps leave no trace. The
    residual block runs the convolutions' epilogue sums, the fused BatchNorms and a fork inside the graph."""
    torch.manual_seed(0)
    stock = (_small_cnn() if model == "cnn" else _ResidualBlock()).cuda()
    eager, graphed = (torchext.swap_modules(stock, inplace=False).model for _ in range(2))
    if model == "residual_block":
        assert sum(type(m) is torchext.nn.Conv2dStats for m in graphed.modules()) == 2
    criterion = torchext.nn.CrossEntropyLoss(label_smoothing=0.1)
    batches = [(torch.randn(16, 3, 8, 8, device="cuda"), torch.randint(0, 10, (16,), device="cuda")) for _ in range(6)]

    def make_optimizer(model):
        lr = torch.tensor(0.05, device="cuda")
        if optimizer == "sgd":
            opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=5e-4, fused=True)
        else:
            opt = torch.optim.Adam(model.parameters(), lr=lr, capturable=True)
        return opt, torch.optim.lr_scheduler.OneCycleLR(
            opt, max_lr=0.05, total_steps=len(batches), cycle_momentum=False
        )

    opt_eager, sched_eager = make_optimizer(eager)
    losses_eager = []
    for xb, yb in batches:
        opt_eager.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
            loss = criterion(eager(xb), yb)
        loss.backward()
        opt_eager.step()
        sched_eager.step()
        losses_eager.append(loss.detach().float())

    opt, sched = make_optimizer(graphed)
    step = GraphedTrainStep(graphed, criterion, opt, *batches[0], autocast_dtype=autocast_dtype)
    losses = []
    for xb, yb in batches:
        losses.append(step(xb, yb).clone().float())
        sched.step()
    tol = {} if autocast_dtype is None else {"rtol": 2e-2, "atol": 2e-2}
    torch.testing.assert_close(torch.stack(losses), torch.stack(losses_eager), **tol, msg=lambda m: f"[losses] {m}")
    for (name, p), p_eager in zip(graphed.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p, p_eager, **tol, msg=lambda m, name=name: f"[{name} after training] {m}")


@gpu
def test_graphed_train_step_rejects_another_batch_shape():
    model = _small_cnn().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, fused=True)
    step = GraphedTrainStep(
        model,
        nn.CrossEntropyLoss(),
        opt,
        torch.randn(4, 3, 8, 8, device="cuda"),
        torch.randint(0, 10, (4,), device="cuda"),
    )
    with pytest.raises(ValueError, match=r"`input` must match the captured one \(\(4, 3, 8, 8\)"):
        step(torch.randn(5, 3, 8, 8, device="cuda"), torch.randint(0, 10, (5,), device="cuda"))


def test_graphed_train_step_argument_errors():
    model = _small_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,))
    with pytest.raises(ValueError, match="`example_input` must be a CUDA tensor"):
        GraphedTrainStep(model, nn.CrossEntropyLoss(), opt, x, y)
    with pytest.raises(TypeError, match="`example_target` must be a tensor, got list"):
        GraphedTrainStep(model, nn.CrossEntropyLoss(), opt, x, [1, 2])
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="float16 autocast needs a GradScaler"):
            GraphedTrainStep(model, nn.CrossEntropyLoss(), opt, x.cuda(), y.cuda(), autocast_dtype=torch.float16)
