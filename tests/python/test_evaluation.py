"""fxdp.trace_eval (docs/evaluation.md): an evaluation step (forward and metrics, no optimizer)
traces into a graph with no UPDATED_* output, run_local equals eager evaluation, and on 2 and 3
ranks with uneven splits (7 rows: 4 + 3, 3 + 2 + 2) its reported metric equals one device's, a
mean exactly weighted by each rank's rows, a sum summed; the state is left as it was."""

from __future__ import annotations

import fxdp
import pytest
import torch
from _util import expand_json, fxdp_binary, local_server, run_worker_ranks
from fxdp.v1 import graph_pb2 as gpb
from safetensors.torch import save_file

ROWS = 7


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _eval_ce(model, batch):
    x, y = batch
    out = model(x)
    return torch.nn.functional.cross_entropy(out, y), {"correct": (out.argmax(-1) == y).sum()}


def _eval_accuracy(model, batch):
    x, y = batch
    return (model(x).argmax(-1) == y).float().mean()


def _eval_correct(model, batch):
    x, y = batch
    return (model(x).argmax(-1) == y).float().sum()


def _batches(n=3):
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randn(ROWS, 6, generator=g), torch.randint(0, 3, (ROWS,), generator=g))
        for _ in range(n)
    ]


CASES = {
    "ce": (_eval_ce, "mean"),
    "accuracy": (_eval_accuracy, "mean"),
    "correct": (_eval_correct, "sum"),
}


def _traced(name):
    fn, reduction = CASES[name]
    return fxdp.trace_eval(
        fn, _model(), _batches()[0], input_names=["x", "y"], loss_reduction=reduction
    )


def test_an_evaluation_graph_updates_nothing_and_equals_eager():
    step = _traced("ce")
    out = step.graph.nodes[len(step.graph.nodes) - 1]
    assert [s.role for s in out.output_specs] == [gpb.LOSS, gpb.OTHER]
    assert list(step.initial_state()) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    model = _model().eval()
    for b in _batches():
        state, loss, extra = step.run_local(step.initial_state(), b, outputs=True)
        with torch.no_grad():
            want, metrics = _eval_ce(model, b)
        assert float(loss) == pytest.approx(float(want), rel=1e-6)
        assert int(extra["correct"]) == int(metrics["correct"])
        for k, v in step.initial_state().items():
            assert torch.equal(state[k], v), k


def test_a_module_in_training_mode_is_refused():
    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.BatchNorm1d(4))

    def ev(model, batch):
        return model(batch).mean()

    with pytest.raises(
        fxdp.TraceError, match=r"changes the state \(1\.running_mean.*model\.eval\(\)"
    ):
        fxdp.trace_eval(ev, model, torch.randn(5, 6))


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("world", [2, 3])
def test_evaluation_on_ranks_equals_one_device(case, world, tmp_path):
    """fxdp-worker run on the expanded evaluation graph: the loss it reports per step equals
    run_local's (a mean over uneven ranks weighted exactly, a sum summed); --out is the state."""
    from safetensors.torch import load_file

    step, d = _traced(case), tmp_path
    step.save(str(d / "g.pb"))
    step.to_safetensors(str(d / "s.safetensors"))
    files = []
    for i, (x, y) in enumerate(_batches()):
        files.append(str(d / f"b{i}.safetensors"))
        save_file({"x": x, "y": y}, files[-1])
    _, graph = expand_json(fxdp_binary("FXDP_BIN", "fxdp"), str(d / "g.pb"), world, d / "x.pb")
    run = run_worker_ranks(
        fxdp_binary("FXDP_WORKER", "fxdp-worker"),
        graph,
        str(d / "s.safetensors"),
        files,
        world,
        3,
        d,
        "eval",
    )
    want = [float(step.run_local(step.initial_state(), b)[1]) for b in _batches()]
    assert run["losses"] == pytest.approx(want, rel=1e-6, abs=1e-7)
    state = load_file(str(d / "s.safetensors"))
    for k, v in state.items():
        assert torch.equal(run["finals"][0][k], v), k


def test_evaluation_job_against_a_trained_state():
    """Client.train with an evaluation step and a trained state (a training step's model
    entries): the per-step losses are the evaluation's on one device, and the state
    comes back unchanged."""
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=0.05)

    def train(model, opt, batch):
        loss, _ = _eval_ce(model, batch)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    tstep = fxdp.trace_step(train, model, opt, _batches()[0], input_names=["x", "y"])
    trained = tstep.initial_state()
    for b in _batches():
        trained, _ = tstep.run_local(trained, b)
    estep = _traced("accuracy")
    want = [float(estep.run_local(trained, b)[1]) for b in _batches()]
    with local_server(workers=2) as (address, _), fxdp.Client(address) as client:
        # A job's state is exactly the graph's (JobSpec.num_state_tensors): the model's entries.
        state = {k: trained[k] for k in estep.initial_state()}
        result = client.train(estep, world_size=2, batches=_batches(), state=state)
    assert result.losses == pytest.approx(want, rel=1e-6, abs=1e-7)
    assert list(result.state) == list(state)
    for k, v in state.items():
        assert torch.equal(result.state[k], v), k
