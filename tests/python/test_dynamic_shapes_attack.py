"""Attacks on ``trace_step(..., dynamic=True)`` (issue 26): a symbolic trace instantiated at a
shape its assumptions do not cover must be refused with the guard and the user's line, never run
nor fail with a bare arithmetic error. What held is listed in the report of helper
review-shapes (session 9); the cases kept here are the ones that found something."""

from __future__ import annotations

import fxdp
import pytest
import torch
import torch.nn as nn
from fxdp.errors import ShapeError


class Chunked(nn.Module):
    """Three micro-batches by ``x.chunk(3)``: traced at B=6 (three chunks of 2)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        total = 0
        for c in x.chunk(3):
            total = total + self.lin(c).pow(2).mean()
        return total


def sgd_step(model, opt, batch):
    loss = model(**batch)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def x_of(b: int):
    return {"x": torch.randn(b, 8, 4, generator=torch.Generator().manual_seed(b))}


@pytest.fixture(scope="module")
def chunked():
    torch.manual_seed(0)
    model = Chunked()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return fxdp.trace_step(sgd_step, model, opt, x_of(6), dynamic=True)


@pytest.mark.parametrize("b", [2, 4])
def test_a_batch_whose_chunks_differ_names_the_guard_not_a_zero_divisor(chunked, b):
    """chunk(3) of 4 rows is 2 chunks (2 + 2), of 2 rows 2 chunks (1 + 1): the trace's third
    chunk does not exist. An expression the trace wrote for the chunks divides by zero there;
    the guards (checked first) refuse the batch and name the chunk's line. Before the fix: a
    ValueError 'size expression 26 divides by zero', naming neither."""
    with pytest.raises(
        ShapeError,
        match=r"breaks the guard .*x\.shape\[0\].*test_dynamic_shapes_attack\.py:\d+: for c in x\.chunk\(3\)",
    ):
        chunked.instantiate(x_of(b))
