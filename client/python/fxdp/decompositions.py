"""The tracer's default decomposition table (``fxdp.DEFAULT_DECOMPOSITIONS``), applied while
``make_fx`` records the step. Two jobs, each documented in client/python/README.md
("Decomposition table"):

* ``native_batch_norm`` -> ``_native_batch_norm_legit`` (PyTorch's own decomposition): its schema
  declares the running-stat mutation, so functionalization sees it.
* ``nll_loss_forward``/``nll_loss2d_forward`` with the mean reduction -> the sum reduction divided
  by the total weight (the op's own second output), and their backward ops -> the sum reduction of
  ``grad_output / total_weight``: the arithmetic ATen's mean kernels do, with the divisor an
  explicit value. A mean over the targets that count (``ignore_index``, class weights) is not a
  mean over the batch rows: a tokenizer's padding labelled -100 leaves each rank a different
  number of tokens. With the division in the graph the batch-dim analysis sees the total weight
  as a per-rank partial sum divided into the loss, all-reduces it, and every rank divides by the
  whole batch's count, so N ranks equal one device.

Every other op stays as autograd and the CompositeImplicitAutograd kernels produce it.
"""

from __future__ import annotations

from typing import Any, Callable, Dict

import torch

aten = torch.ops.aten

_MEAN, _SUM = 1, 2  # at::Reduction


def _loss_forward(op):
    def forward(self, target, weight, reduction, ignore_index):
        if reduction != _MEAN:
            return NotImplemented  # traced as it is
        total, total_weight = op(self, target, weight, _SUM, ignore_index)
        return total / total_weight, total_weight

    return forward


def _loss_backward(op):
    def backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
        if reduction != _MEAN:
            return NotImplemented
        return op(
            grad_output / total_weight, self, target, weight, _SUM, ignore_index, total_weight
        )

    return backward


def default_decompositions() -> Dict[Any, Callable]:
    from torch._decomp.decompositions import native_batch_norm_decomposition

    return {
        aten.native_batch_norm.default: native_batch_norm_decomposition,
        aten.nll_loss_forward.default: _loss_forward(aten.nll_loss_forward.default),
        aten.nll_loss2d_forward.default: _loss_forward(aten.nll_loss2d_forward.default),
        aten.nll_loss_backward.default: _loss_backward(aten.nll_loss_backward.default),
        aten.nll_loss2d_backward.default: _loss_backward(aten.nll_loss2d_backward.default),
    }


# The "decompositions" metadata entry of every traced step.
NAME = "fxdp-default-v2:native_batch_norm,nll_loss_mean"
