"""The steps test_trace_step.py and test_trace_step_workers.py trace and run eagerly: the
schedule, a step with micro-batches and clipping, the traced and eager loops, the small MLP."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
from _util import ATOL, RTOL
from fxdp import schedule as S

O = torch.optim
STEPS = 3


def warmup_decay(opt):
    """Linear warmup then cosine decay: lr changes every step."""
    return O.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 2) * 0.5 * (1 + math.cos(math.pi * s / 8))
    )


def accumulating_step(loss_fn, k, max_norm, batch_dim=0):
    """A typical step: k micro-batches, clip_grad_norm_, step, zero_grad."""

    def train_step(model, opt, batch):
        x, y = batch
        total = 0.0
        for xm, ym in zip(x.chunk(k, dim=batch_dim), y.chunk(k, dim=batch_dim)):
            loss = loss_fn(model(xm), ym) / k
            loss.backward()
            total = total + loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        opt.step()
        opt.zero_grad()
        return total

    return train_step


def run_traced(step, batches, sched, steps=STEPS):
    values = S.schedule_values(sched, steps, step)
    state = step.initial_state()
    losses = []
    for i in range(steps):
        state, loss = step.run_local(state, batches[i], hyperparameters=values[i])
        losses.append(loss)
    return state, losses, values


def run_eager(train_step, model, opt, sched, batches, steps=STEPS):
    losses = []
    for i in range(steps):
        losses.append(train_step(model, opt, batches[i]).detach())
        sched.step()
    return losses


def run_local_outputs(step, batches, values, steps=STEPS):
    """run_local over `steps` batches with the schedule's values: the final state and the last
    step's extra outputs."""
    state = step.initial_state()
    for i in range(steps):
        state, _, outs = step.run_local(state, batches[i], hyperparameters=values[i], outputs=True)
    return state, outs


def run_eager_last(train_step, make, batches, steps=STEPS):
    """The step run eagerly on a fresh make() (model, optimizer, scheduler), the scheduler stepped
    after each step: the model and the last step's return value."""
    model, opt, sched = make()
    for i in range(steps):
        out = train_step(model, opt, batches[i])
        sched.step()
    return model, out


def assert_params(state, model, rtol=RTOL, atol=ATOL):
    for n, p in model.named_parameters():
        torch.testing.assert_close(
            state[n], p.detach(), rtol=rtol, atol=atol, msg=lambda m: f"{n}: {m}"
        )
    for n, b in model.named_buffers():
        torch.testing.assert_close(state[n], b, rtol=rtol, atol=atol, msg=lambda m: f"{n}: {m}")


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))


def _mlp_batches(n=STEPS, b=6):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(b, 4, generator=g), torch.randn(b, 3, generator=g)) for _ in range(n)]


def _mse(out, y):
    return torch.nn.functional.mse_loss(out, y)
