"""A whole training step captured into one CUDA graph and replayed: forward, loss, backward and optimizer step.

A small model's training step is host-bound: its time goes to Python, the dispatcher, autograd and kernel launches,
not to the GPU. Captured once into a CUDA graph, the step is one launch per replay. ``GraphedTrainStep`` does that
for any model, stock or torchext (every torchext op is capture-safe: tests/test_cuda_graphs.py)::

    optimizer = torch.optim.SGD(model.parameters(), lr=torch.tensor(0.1, device="cuda"), momentum=0.9, fused=True)
    step = torchext.graphs.GraphedTrainStep(model, criterion, optimizer, x0, y0, autocast_dtype=torch.bfloat16)
    for x, y in loader:          # every batch of x0's and y0's shape, dtype and device
        loss = step(x, y)        # copies x, y into the graph's inputs and replays; loss is the graph's output
        scheduler.step()         # fine: the graph reads the lr tensor

What the caller must know:
- The optimizer must not synchronize the host in ``step()``: ``torch.optim.SGD(..., fused=True)`` or
  ``torch.optim.Adam(..., capturable=True)``. A learning rate that changes (a scheduler) must be a CUDA tensor, which
  the graph reads at every replay; a float is baked into the graph at capture, and so are the other
  hyper-parameters (momentum, betas, weight decay: a scheduler must not cycle them, e.g. OneCycleLR's
  ``cycle_momentum=False``).
- Capture needs a few eager warm-up steps (``warmup``). They run on the example batch and are then undone: the
  parameters and buffers are restored and the optimizer's state tensors are zeroed, which equals a fresh state for
  SGD (momentum, dampening 0) and Adam (the step counters are zeroed too), so the first replay is the model's first
  real step.
- Gradients live in the graph's memory pool (set to None before capture, written by every replay): read them
  after a replay, not across replays.
- fp16 with a GradScaler is not supported (its inf checks read values on the host); bfloat16 needs no scaler.
- torchext's deferred target checks (cross_entropy, multi_margin_loss) do not run inside a graph: an out-of-range
  target gives a NaN loss and no error.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor, nn

__all__ = ["GraphedTrainStep"]


class GraphedTrainStep:
    """``step(x, y) -> loss``: ``criterion(model(x), y)``, its backward and ``optimizer.step()``, replayed from one
    CUDA graph. See the module's docstring for what the optimizer must be."""

    def __init__(
        self,
        model: nn.Module,
        criterion: Callable[[Tensor, Tensor], Tensor],
        optimizer: torch.optim.Optimizer,
        example_input: Tensor,
        example_target: Tensor,
        *,
        autocast_dtype: torch.dtype | None = None,
        warmup: int = 3,
    ):
        examples = (("example_input", example_input), ("example_target", example_target))
        for name, t in examples:
            if not isinstance(t, Tensor):
                raise TypeError(f"GraphedTrainStep: `{name}` must be a tensor, got {type(t).__name__}")
        for name, t in examples:
            if t.device.type != "cuda":
                raise ValueError(f"GraphedTrainStep: `{name}` must be a CUDA tensor, got one on {t.device}")
        if autocast_dtype == torch.float16:
            raise ValueError(
                "GraphedTrainStep: float16 autocast needs a GradScaler, whose inf checks cannot be captured; use "
                "torch.bfloat16 or no autocast"
            )
        if warmup < 1:
            raise ValueError(f"GraphedTrainStep: `warmup` must be at least 1 (capture needs it), got {warmup}")
        self.model, self.criterion, self.optimizer = model, criterion, optimizer
        self.autocast_dtype = autocast_dtype
        self.static_input = example_input.detach().clone()
        self.static_target = example_target.detach().clone()

        saved = [t.detach().clone() for t in self._model_state()]
        optimizer.zero_grad(set_to_none=True)
        side = torch.cuda.Stream(device=example_input.device)
        side.wait_stream(torch.cuda.current_stream(example_input.device))
        with torch.cuda.stream(side):
            for _ in range(warmup):
                optimizer.zero_grad(set_to_none=True)
                self._forward_backward().detach()
                optimizer.step()
        torch.cuda.current_stream(example_input.device).wait_stream(side)
        self._restore(saved)

        optimizer.zero_grad(set_to_none=True)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.static_loss = self._forward_backward().detach()
            optimizer.step()

    def _model_state(self):
        return [*self.model.parameters(), *self.model.buffers()]

    def _forward_backward(self) -> Tensor:
        device_type = self.static_input.device.type
        with torch.autocast(
            device_type,
            dtype=self.autocast_dtype or torch.float32,
            enabled=self.autocast_dtype is not None,
            cache_enabled=False,
        ):
            loss = self.criterion(self.model(self.static_input), self.static_target)
        loss.backward()
        return loss

    @torch.no_grad()
    def _restore(self, saved) -> None:
        """Undoes the warm-up steps in place (the graph will read these very tensors)."""
        for t, value in zip(self._model_state(), saved):
            t.copy_(value)
        for state in self.optimizer.state.values():
            for value in state.values():
                if isinstance(value, Tensor):
                    value.zero_()

    def __call__(self, input: Tensor, target: Tensor) -> Tensor:
        for name, t, static in (("input", input, self.static_input), ("target", target, self.static_target)):
            if t.shape != static.shape or t.dtype != static.dtype or t.device != static.device:
                raise ValueError(
                    f"GraphedTrainStep: `{name}` must match the captured one ({tuple(static.shape)}, {static.dtype}, "
                    f"{static.device}), got ({tuple(t.shape)}, {t.dtype}, {t.device})"
                )
        self.static_input.copy_(input)
        self.static_target.copy_(target)
        self.graph.replay()
        return self.static_loss
