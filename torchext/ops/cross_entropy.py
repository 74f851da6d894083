"""cross_entropy: fused log-softmax + negative log-likelihood over class indices.

One read of the logits forward; backward recomputes softmax from the saved per-row log-sum-exp instead of storing
an (N, C) softmax. Same semantics as torch.nn.functional.cross_entropy with class-index targets: class weights,
ignore_index, label_smoothing, reductions 'none' | 'mean' | 'sum'; input (C,), (N, C) or (N, C, d1, ...).
Probability ("soft") targets are not supported: a floating-point target raises a TypeError.
Layout rule (docs/compile.md): the op's results (loss, lse, total_weight) and its backward are contiguous.

Autocast rule (csrc/autograd.cpp, csrc/autocast.cpp): under torch.autocast (CUDA or CPU) the logits and weight are
cast to float32 and the loss is float32, as PyTorch does for cross_entropy.

Bad targets raise an IndexError naming `target`. On CUDA the check runs on the device and, by default, is read back
without stopping the GPU: the error comes from a later cross_entropy or multi_margin_loss call, or from
``check_targets()``, and the offending call's loss holds NaN for those rows. ``TORCHEXT_CHECK_TARGETS=sync`` makes
the call itself raise (one 4-byte read and a stream synchronization per call), ``=off`` skips the check
(csrc/target_checks.h). A check still pending when the interpreter exits prints its error to stderr.
"""

import atexit
import sys
from typing import Optional

import torch
from torch import Tensor

from ._common import not_a_tensor

__all__ = ["cross_entropy", "check_targets"]

_ops = torch.ops.torchext


def cross_entropy(
    input: Tensor,
    target: Tensor,
    weight: Optional[Tensor] = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> Tensor:
    """Cross entropy between logits `input` and class indices `target`.

    input: (C,), (N, C) or (N, C, d1, ..., dk) logits; target: (), (N,) or (N, d1, ..., dk) int64.
    Returns a 0-dim loss for 'mean'/'sum' and target's shape for 'none'.
    """
    if not isinstance(input, Tensor):
        raise not_a_tensor("cross_entropy", "input", input)
    if not isinstance(target, Tensor):
        raise not_a_tensor("cross_entropy", "target", target)
    if weight is not None and not isinstance(weight, Tensor):
        raise not_a_tensor("cross_entropy", "weight", weight, optional=True)
    if input.dim() == 0:
        raise ValueError("torchext.ops.cross_entropy: `input` must have at least one dimension (the classes)")
    if input.dim() == 1:
        if target.dim() != 0:
            raise ValueError(
                f"torchext.ops.cross_entropy: for 1-D `input` (C,), `target` must be 0-dim, got shape {tuple(target.shape)}"
            )
        loss = _ops.cross_entropy.default(
            input.unsqueeze(0), target.reshape(1), weight, reduction, ignore_index, label_smoothing
        )[0]
        return loss.reshape(()) if reduction == "none" else loss
    if input.dim() == 2:
        return _ops.cross_entropy.default(input, target, weight, reduction, ignore_index, label_smoothing)[0]
    expected = input.shape[:1] + input.shape[2:]
    if target.shape != expected:
        raise ValueError(
            f"torchext.ops.cross_entropy: `target` must have shape {tuple(expected)} for `input` of shape "
            f"{tuple(input.shape)}, got {tuple(target.shape)}"
        )
    classes = input.shape[1]
    flat = input.movedim(1, -1).reshape(-1, classes)
    loss = _ops.cross_entropy.default(flat, target.reshape(-1), weight, reduction, ignore_index, label_smoothing)[0]
    return loss.reshape(target.shape) if reduction == "none" else loss


def check_targets() -> None:
    """Waits for the target checks that cross_entropy and multi_margin_loss calls on CUDA have left pending and
    raises the IndexError of the oldest that found an out-of-range target (each is reported once). Call it where a
    bad target must surface before going on, such as at the end of an epoch or of a script. A no-op on the CPU
    (whose checks raise at the call) and under TORCHEXT_CHECK_TARGETS=sync or off."""
    torch.classes.torchext.TargetChecks.flush()


@atexit.register
def _report_pending_target_errors() -> None:
    """At interpreter exit, a deferred check not yet reported would be lost (a script whose last loss call got a
    bad target): wait for the pending checks and print their error to stderr."""
    try:
        check_targets()
    except IndexError as e:
        print(f"torchext: {e}", file=sys.stderr)
    except Exception:  # noqa: BLE001 - exiting; CUDA may already be unusable
        pass


def _acc_dtype(t: Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


@torch.library.register_fake("torchext::cross_entropy")
def _(self, target, weight=None, reduction="mean", ignore_index=-100, label_smoothing=0.0):
    rows = self.shape[0]
    loss = self.new_empty((rows,)) if reduction == "none" else self.new_empty(())
    return loss, self.new_empty((rows,), dtype=_acc_dtype(self)), self.new_empty((), dtype=_acc_dtype(self))


@torch.library.register_fake("torchext::cross_entropy_backward")
def _(grad_output, self, target, weight, reduction, ignore_index, label_smoothing, lse, total_weight):
    return self.new_empty(self.shape)


# Autograd and the autocast rules are C++ (csrc/autograd.cpp, csrc/autocast.cpp).
