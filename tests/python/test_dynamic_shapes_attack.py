"""Attacks on ``trace_step(..., dynamic=True)`` (issue 26): a symbolic trace instantiated at a
shape its assumptions do not cover must be refused with the guard and the user's line, never run
nor fail with a bare arithmetic error. What held is listed in the report of helper
review-shapes (session 9); kept here: what found something, and the size branches."""

from __future__ import annotations

import copy

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


class Branchy(nn.Module):
    """Python branches on sizes: ``if S > 8`` and ``min(S, 12)`` (a window)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        scale = 2 if x.shape[1] > 8 else 1
        h = self.lin(x[:, : min(x.shape[1], 12)]) * scale
        return h.pow(2).sum() / x.shape[0]


def test_size_branches_hold_where_traced_and_are_refused_elsewhere():
    """Traced at S=16 (the branch taken, the window 12): S=13 and 20 equal eager (loss and
    SGD-updated weights; SGD keeps a wrong 1/B or x2 visible, Adam would normalise it away);
    S=12 (min picks S) and S=8 (branch not taken) are refused naming the line."""
    torch.manual_seed(0)
    model = Branchy()
    start = copy.deepcopy(model)
    xs = lambda b, s: {"x": torch.randn(b, s, 4, generator=torch.Generator().manual_seed(s))}  # noqa: E731
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = fxdp.trace_step(sgd_step, model, opt, xs(4, 16), dynamic=True)
    for b, s in [(3, 13), (5, 20)]:
        ref = copy.deepcopy(start)
        ref_loss = sgd_step(ref, torch.optim.SGD(ref.parameters(), lr=0.1), xs(b, s))
        state, loss = step.run_local(step.initial_state(), xs(b, s))
        assert float(loss) == pytest.approx(float(ref_loss), rel=1e-6)
        for n, p in ref.named_parameters():
            torch.testing.assert_close(state[n], p.detach(), rtol=1e-5, atol=1e-6, msg=n)
    for s, line in [(12, r"min\(x\.shape\[1\], 12\)"), (8, r"2 if x\.shape\[1\] > 8")]:
        with pytest.raises(
            ShapeError, match=rf"breaks the guard .*test_dynamic_shapes_attack\.py:\d+: .*{line}"
        ):
            step.instantiate(xs(4, s))


def test_a_guard_made_inside_an_installed_package_names_the_users_line(tmp_path, monkeypatch):
    """A size guard made inside a library (transformers' masking_utils.py, here a stand-in
    module in a directory taken for site-packages) quotes the user's line that called into it,
    then the library's; before, only the library's (issue 23)."""
    from fxdp import trace_errors

    site = tmp_path / "site"
    site.mkdir()
    (site / "windowlib.py").write_text("def window(x):\n    return x[:, : min(x.shape[1], 12)]\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(trace_errors, "_INSTALLED_DIRS", (str(site) + "/",), raising=False)
    import windowlib

    class Windowed(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(windowlib.window(x)).pow(2).sum()

    torch.manual_seed(0)
    model = Windowed()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    xs = lambda s: {"x": torch.randn(2, s, 4)}  # noqa: E731
    step = fxdp.trace_step(sgd_step, model, opt, xs(16), dynamic=True)
    with pytest.raises(ShapeError) as err:
        step.instantiate(xs(8))
    msg = str(err.value)
    assert "test_dynamic_shapes_attack.py:" in msg and "self.lin(windowlib.window(x))" in msg, msg
    assert "(in windowlib.py:2: return x[:, : min(x.shape[1], 12)])" in msg, msg
