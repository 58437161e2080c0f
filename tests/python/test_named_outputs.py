"""Named metrics (docs/evaluation.md): the 0-d extra outputs a step returns beside the loss
(``(loss, {"correct": ...})``) come back per step from real workers, reduced on the ranks as one
device computes them: ``StepResult.outputs`` -> ``JobEvent.outputs`` -> ``TrainResult.outputs``,
and ``fxdp-worker run`` prints them after the loss. 7 rows split unevenly (4 + 3, 3 + 2 + 2): a
mean weighted by each rank's rows, a sum summed."""

from __future__ import annotations

import fxdp
import pytest
import torch
from _util import expand_json, fxdp_binary, local_server, run_worker_ranks
from fxdp.v1 import jobs_pb2 as jpb
from safetensors.torch import save_file

ROWS = 7


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _batches(n=3):
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randn(ROWS, 6, generator=g), torch.randint(0, 3, (ROWS,), generator=g))
        for _ in range(n)
    ]


def _metrics(out, y):
    hit = out.argmax(-1) == y
    return {"correct": hit.sum(), "accuracy": hit.float().mean()}


def _eval_step(model, batch):
    x, y = batch
    out = model(x)
    return torch.nn.functional.cross_entropy(out, y), _metrics(out, y)


def _train_step(model, opt, batch):
    x, y = batch
    out = model(x)
    loss = torch.nn.functional.cross_entropy(out, y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss, _metrics(out.detach(), y)


def _traced_train():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return fxdp.trace_step(_train_step, model, opt, _batches()[0], input_names=["x", "y"])


def _traced_eval():
    return fxdp.trace_eval(_eval_step, _model().eval(), _batches()[0], input_names=["x", "y"])


def _one_device(step, state=None):
    """run_local over the batches: the named outputs of each step, as floats."""
    state, want = state or step.initial_state(), []
    for b in _batches():
        state, _, extra = step.run_local(state, b, outputs=True)
        want.append({k: float(v) for k, v in extra.items()})
    return want


def _assert_outputs(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert list(g) == list(w)
        assert g == pytest.approx(w, rel=1e-6, abs=1e-7)


@pytest.mark.parametrize("world", [2, 3])
def test_training_and_evaluation_jobs_return_the_named_outputs(world):
    """Client.train on real workers: a training step's and an evaluation graph's metrics per
    step equal run_local's, in the order the step returned them."""
    train, ev = _traced_train(), _traced_eval()
    assert train.output_names() == ["correct", "accuracy"]
    seen = []
    with local_server(workers=world) as (address, _), fxdp.Client(address) as client:
        trained = client.train(train, world_size=world, batches=_batches(), on_event=seen.append)
        state = {k: trained.state[k] for k in ev.initial_state()}
        evaluated = client.train(ev, world_size=world, batches=_batches(), state=state)
    _assert_outputs(trained.outputs, _one_device(train))
    _assert_outputs(evaluated.outputs, _one_device(ev, trained.state))
    steps = [e for e in seen if e.step > 0 and e.state == jpb.JOB_STATE_RUNNING]
    assert [[v.name for v in e.outputs] for e in steps] == [["correct", "accuracy"]] * 3


def test_worker_run_prints_the_named_outputs(tmp_path):
    """fxdp-worker run on 3 ranks (3 + 2 + 2 rows): each step line ends with name=value."""
    ev, d = _traced_eval(), tmp_path
    ev.save(str(d / "g.pb"))
    ev.to_safetensors(str(d / "s.safetensors"))
    files = []
    for i, (x, y) in enumerate(_batches()):
        files.append(str(d / f"b{i}.safetensors"))
        save_file({"x": x, "y": y}, files[-1])
    _, graph = expand_json(fxdp_binary("FXDP_BIN", "fxdp"), str(d / "g.pb"), 3, d / "x.pb")
    worker = fxdp_binary("FXDP_WORKER", "fxdp-worker")
    run = run_worker_ranks(worker, graph, str(d / "s.safetensors"), files, 3, 3, d, "named")
    _assert_outputs(run["outputs"], _one_device(ev))


def test_a_bad_extra_outputs_metadata_is_refused(tmp_path):
    """The names come from the client's graph: metadata naming more outputs than the graph has
    fails the rank before it meets its peers, INVALID_ARGUMENT naming the counts."""
    import subprocess

    ev, d = _traced_eval(), tmp_path
    for kv in ev.graph.metadata:
        if kv.key == "extra_outputs":
            kv.value = '["correct", "accuracy", "third"]'
    ev.save(str(d / "g.pb"))
    ev.to_safetensors(str(d / "s.safetensors"))
    x, y = _batches()[0]
    save_file({"x": x, "y": y}, str(d / "b.safetensors"))
    r = subprocess.run(
        [fxdp_binary("FXDP_WORKER", "fxdp-worker"), "run", "--graph", str(d / "g.pb"), "--state",
         str(d / "s.safetensors"), "--data", str(d / "b.safetensors"), "--steps", "1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode != 0
    assert "graph metadata 'extra_outputs' names 3 outputs; the graph has 2 OTHER outputs" in (
        r.stderr
    ), r.stderr
