"""One job, every batch shape (issue 26, docs/shapes.md build plan steps 5-6): a step traced once
with ``dynamic=True`` goes to the server as it is; the server compiles each new batch shape once
(JobInfo.shapes), sends each worker that shape's program once (LoadGraph) and names it in each
step's Batch; a real ``fxdp-server`` with 2 real ``fxdp-worker`` processes:

* a symbolic MLP job over 3 shapes (8, 5 and 3 rows: uneven splits) equals ``run_local`` per step,
  each step's ``JobEvent.shape`` says its shape, and a shape seen again is not compiled again;
* a batch that breaks a guard fails the job naming the input, the range the trace holds for and
  what to do, and the job keeps its last completed step's state;
* the newcomer's script (issue 26's Done-means): a tiny HF GPT-2 (config in code) with AdamW,
  clipping and a DataLoader with a padding collator (dynamic padding, ``drop_last=False``) trains
  one epoch in one job on 2 workers, equal to eager per step.
"""

from __future__ import annotations

import copy

import fxdp
import grpc
import pytest
import torch
from _util import ATOL, RTOL, ServerProcess
from fxdp.rpc_errors import ServerError
from test_dynamic_shapes import guarded_step

torch.set_num_threads(1)


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(6, 16), torch.nn.Linear(16, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def mlp_step(model, opt, batch):
    loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def rows(b: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(b, 6, generator=g), "y": torch.randn(b, 3, generator=g)}


def mlp_traced():
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    return fxdp.trace_step(mlp_step, model, opt, rows(8, 0), dynamic=True)


def local(step, batches, n=None):
    """``run_local`` of the first ``n`` batches: (the state after them, the losses)."""
    state, losses = step.initial_state(), []
    for i, b in enumerate(batches[:n], 1):
        state, loss = step.run_local(state, b, step=i)
        losses.append(float(loss))
    return state, losses


def assert_state_close(got, want):
    for name, t in want.items():
        torch.testing.assert_close(got[name], t, rtol=RTOL, atol=ATOL, msg=lambda m: f"{name}: {m}")


@pytest.fixture(scope="module")
def server():
    with ServerProcess() as s, fxdp.Client(s.address, timeout=120) as c:
        yield s, c


def test_a_symbolic_job_runs_every_shape_like_one_device(server):
    proc, client = server
    step = mlp_traced()
    assert step.is_symbolic()
    batches = [rows(b, seed) for seed, b in enumerate([8, 5, 3, 8, 5], 1)]
    shapes = []
    r = client.train(
        step, 2, batches, on_event=lambda e: e.step and e.shape and shapes.append(e.shape)
    )
    want_state, want = local(step, batches)
    assert r.losses == pytest.approx(want, rel=RTOL, abs=ATOL)
    assert_state_close(r.state, want_state)
    assert shapes == [f"x={b}x6 y={b}x3" for b in (8, 5, 3, 8, 5)]
    info = client.job(r.job_id)
    # First seen first; 8 rows is the traced example's (graph 0), 5 and 3 compiled once each.
    assert [(c.shape, c.steps, c.evicted) for c in info.shapes] == [
        ("x=8x6 y=8x3", 2, False),
        ("x=5x6 y=5x3", 2, False),
        ("x=3x6 y=3x3", 1, False),
    ]
    assert all(c.compile_ms > 0 for c in info.shapes)
    compiled = [
        line for line in proc.log if f"{r.job_id}: step" in line and "compiled shape" in line
    ]
    assert len(compiled) == 2, compiled


def test_a_batch_breaking_a_guard_fails_naming_it_and_keeps_the_state(server):
    _, client = server
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    example = {"x": torch.randn(4, 8)}
    step = fxdp.trace_step(guarded_step, model, opt, example, dynamic={"x": [0]})
    batches = [
        {"x": torch.randn(b, 8, generator=torch.Generator().manual_seed(b))} for b in (4, 5, 6)
    ]
    seen = {}
    with pytest.raises(ServerError) as e:
        client.train(step, 2, batches, on_event=lambda ev: seen.setdefault("id", ev.job_id))
    err = e.value
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT, err
    msg = str(err)
    # `if x.shape[0] < 6` held for the 4-row example: the trace holds for 2..5 rows.
    assert "step 3's batch: at x=6x8: input 'x' is [6, 8]: its dim 0" in msg, msg
    assert "is 6, but the trace holds for" in msg and "in [2, 5] (traced at 4)" in msg, msg
    assert "re-trace with this batch as the example" in msg, msg  # what to do
    assert f"its state after step 2 is kept (fxdp fetch {seen['id']}" in msg, msg
    info = client.job(seen["id"])
    assert (info.steps_done, info.has_state) == (2, True), info
    assert_state_close(client.fetch_state(seen["id"]), local(step, batches, 2)[0])


# ------------------------------------------------------------ the newcomer's script (Done-means)


def test_a_dataloader_epoch_with_dynamic_padding_trains_in_one_job(server):
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    from _tiny_gpt2 import CONFIG, gpt2_step, padded_epoch

    loader = padded_epoch(3)
    batches = list(loader)
    assert [b["input_ids"].shape[0] for b in batches] == [4, 4, 4, 3]  # the last one partial
    torch.manual_seed(0)
    config = transformers.GPT2Config(**{**CONFIG, "n_positions": 64})
    model = transformers.GPT2LMHeadModel(config)
    eager_model = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    step = fxdp.trace_step(gpt2_step, model, opt, batches[0], dynamic=True)

    r = server[1].train(step, 2, loader)  # the loader itself: one epoch, lazily

    eager_opt = torch.optim.AdamW(eager_model.parameters(), lr=1e-3, weight_decay=0.01)
    eager = [float(gpt2_step(eager_model, eager_opt, copy.deepcopy(b))) for b in batches]
    assert r.losses == pytest.approx(eager, rel=1e-5), (r.losses, eager)
    for name, p in eager_model.named_parameters():
        # AdamW moves an element by lr * m / (sqrt(v) + eps): where the gradient is near eps the
        # summation order shows, so parameters are compared to 1% of a step (lr 1e-3).
        torch.testing.assert_close(r.state[name], p.detach(), rtol=RTOL, atol=1e-5)
    info = server[1].job(r.job_id)
    assert info.steps_done == 4 and len(info.shapes) == len(
        {tuple(b["input_ids"].shape) for b in batches}
    )


def test_samples_per_second_count_each_steps_own_rows(server, capfd, tmp_path):
    """Steps of 8, 5, 3 and 5 rows: ``Client.train(progress=True)`` and ``fxdp run --json`` count
    each step's own rows (its ``JobEvent.shape``), so after step 4 the samples/s are the rows of
    steps 2-4 (13) over the time of those 3 steps: 13/3 of the steps/s."""
    import json
    import re
    import subprocess

    from _util import fxdp_binary
    from safetensors.torch import save_file

    proc, client = server
    step = mlp_traced()
    batches = [rows(b, seed) for seed, b in enumerate([8, 5, 3, 5], 1)]
    client.train(step, 2, batches, progress=True)
    lines = [x for x in capfd.readouterr().err.splitlines() if x.startswith("step 4/")]
    m = re.fullmatch(r"step 4/4 .*  (\S+) steps/s  (\S+) samples/s", lines[-1])
    assert m, lines
    assert float(m.group(2)) / float(m.group(1)) == pytest.approx(13 / 3, rel=0.01), lines[-1]

    graph, state, data = tmp_path / "g.pb", tmp_path / "s.safetensors", []
    step.save(str(graph))
    step.to_safetensors(str(state))
    for i, b in enumerate(batches):
        data += ["--data", str(tmp_path / f"b{i}.safetensors")]
        save_file(b, data[-1])
    out = subprocess.run(
        [fxdp_binary("FXDP_BIN", "fxdp"), "run", str(graph), "--world-size", "2", "--state"]
        + [str(state), *data, "--steps", "4", "--json", "--server", proc.address],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    events = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
    last = [e for e in events if e.get("step") == 4 and "steps_per_s" in e]
    assert last and last[0]["samples_per_s"] == pytest.approx(13 / 3 * last[0]["steps_per_s"])
