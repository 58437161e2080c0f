"""``@fxdp.compile`` with the batches a data loader yields: each shape is traced once and kept (the
last ``max_shapes`` of them), so a shape seen before runs its graph without a new trace, and every
call still trains the live model like eager (issue 26)."""

from __future__ import annotations

import fxdp
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from _util import ATOL, RTOL


def make():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))
    return m, torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)


def step(model, opt, batch):
    x, y = batch
    loss = F.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def batch(i: int, rows: int):
    g = torch.Generator().manual_seed(i)
    return torch.randn(rows, 5, generator=g), torch.randn(rows, 3, generator=g)


# a padded loader's last batch, then shapes seen before
ROWS = [4, 6, 4, 2, 6, 4]


@pytest.mark.parametrize("max_shapes,traces", [(8, 3), (1, 6)])
def test_a_shape_seen_before_is_not_traced_again(max_shapes, traces):
    compiled = fxdp.compile(max_shapes=max_shapes)(step)
    m, o = make()
    m2, o2 = make()
    for i, rows in enumerate(ROWS):
        b = batch(i, rows)
        loss = compiled(m, o, b)
        want = step(m2, o2, b)
        torch.testing.assert_close(loss, want.detach(), rtol=RTOL, atol=ATOL)
    assert compiled.traces == traces
    for p, p2 in zip(m.parameters(), m2.parameters()):
        torch.testing.assert_close(p, p2, rtol=RTOL, atol=ATOL)


def test_another_model_is_traced_again():
    compiled = fxdp.compile()(step)
    m, o = make()
    compiled(m, o, batch(0, 4))
    m2, o2 = make()
    compiled(m2, o2, batch(0, 4))
    compiled(m, o, batch(1, 4))
    assert compiled.traces == 2


def test_max_shapes_must_be_positive():
    with pytest.raises(ValueError, match="max_shapes must be at least 1, got 0"):
        fxdp.compile(max_shapes=0)(step)
