"""``@fxdp.compile`` with the batches a data loader yields (issue 26, docs/shapes.md step 7): one
symbolic trace serves every shape, a batch breaking its guards is traced again as a second variant,
and with ``dynamic=False`` each shape is traced once and kept (the last ``max_shapes`` of them);
every call still trains the live model like eager."""

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


def run_like_eager(compiled, fn, rows):
    m, o = make()
    m2, o2 = make()
    for i, r in enumerate(rows):
        b = batch(i, r)
        loss = compiled(m, o, b)
        want = fn(m2, o2, b)
        torch.testing.assert_close(loss, want.detach(), rtol=RTOL, atol=ATOL)
    for p, p2 in zip(m.parameters(), m2.parameters()):
        torch.testing.assert_close(p, p2, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    "dynamic,max_shapes,traces", [(True, 8, 1), (True, 1, 1), (False, 8, 3), (False, 1, 6)]
)
def test_a_shape_seen_before_is_not_traced_again(dynamic, max_shapes, traces):
    compiled = fxdp.compile(max_shapes=max_shapes, dynamic=dynamic)(step)
    run_like_eager(compiled, step, ROWS)
    assert compiled.traces == traces
    assert compiled.traced.is_symbolic() is False  # each call runs a static instance


def guarded(model, opt, batch):
    x, y = batch
    if x.shape[0] < 6:  # the trace at 4 rows holds for 2..5
        loss = F.mse_loss(model(x), y)
    else:
        loss = F.l1_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def test_a_batch_breaking_the_guards_is_traced_again_as_a_variant():
    compiled = fxdp.compile()(guarded)
    run_like_eager(compiled, guarded, ROWS + [8, 3])
    assert compiled.traces == 2  # 4 rows (2..5), then 6 rows (6 or more)


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
