"""Evaluation while a job trains (JobSpec.eval, docs/evaluation.md): after every K-th step and
after the last, the workers run an evaluation graph (fxdp.trace_eval) over their rows of every
evaluation batch on their filesystem against their current state, untouched; the job reports
each evaluation (JobEvent.eval, JobInfo.evals, TrainResult.evals). On 2 real workers with 7-row
batches (4 + 3 rows), REPLICATE and FULLY_SHARD, the evaluations after steps 2 and 4 equal
run_local of the evaluation graph on one device's state after 2 and 4 steps, summed over the
evaluation batches, and the final state equals 4 training steps of one device. A graph that is
not an evaluation graph of the job's state is refused, INVALID_ARGUMENT naming what differs."""

from __future__ import annotations

import re
import subprocess

import fxdp
import grpc
import pytest
import torch
from _util import fxdp_binary, local_server
from fxdp.v1 import jobs_pb2 as jpb
from safetensors.torch import save_file

ROWS = 7


def _model(hidden=8):
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(6, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 3)
    )


def _batches(n, seed):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(ROWS, 6, generator=g), torch.randint(0, 3, (ROWS,), generator=g))
        for _ in range(n)
    ]


def _eval_step(model, batch):
    x, y = batch
    out = model(x)
    hit = out.argmax(-1) == y
    return torch.nn.functional.cross_entropy(out, y), {
        "correct": hit.sum(),
        "accuracy": hit.float().mean(),
    }


def _train_step(model, opt, batch):
    x, y = batch
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def _steps(hidden=8):
    model = _model(hidden)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    train = fxdp.trace_step(_train_step, model, opt, _batches(1, 1)[0], input_names=["x", "y"])
    ev = fxdp.trace_eval(_eval_step, model.eval(), _batches(1, 1)[0], input_names=["x", "y"])
    return train, ev


def _one_device(train, ev, batches, evals, at):
    """The state after each step of `at` and the evaluation of it, summed over `evals`."""
    state, want = train.initial_state(), {}
    for i, b in enumerate(batches, 1):
        state, _ = train.run_local(state, b)
        if i in at:
            sums = {}
            for e in evals:
                _, loss, extra = ev.run_local(state, e, outputs=True)
                for k, v in {"loss": loss, **extra}.items():
                    sums[k] = sums.get(k, 0.0) + float(v)
            want[i] = sums
    return state, want


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("evaldata")
    files = []
    for i, (x, y) in enumerate(_batches(3, 7)):
        files.append(str(root / f"eval{i}.safetensors"))
        save_file({"x": x, "y": y}, files[-1])
    fxdp.write_dataset(root / "evalset", _batches(3, 7), names=["x", "y"])
    with local_server(extra_args=["--data-root", str(root)]) as (address, _):
        with fxdp.Client(address) as client:
            yield client, files, str(root / "evalset"), address


@pytest.mark.parametrize("style,data", [("replicate", "files"), ("fully_shard", "dataset")])
def test_evaluations_while_training_equal_one_device(server, style, data):
    client, files, dataset, _ = server
    train, ev = _steps()
    batches = _batches(4, 3)
    state, want = _one_device(train, ev, batches, _batches(3, 7), at={2, 4})
    seen = []
    result = client.train(
        train,
        world_size=2,
        batches=batches,
        style=style,
        eval=ev,
        eval_data=files if data == "files" else dataset,
        eval_every=2,
        on_event=seen.append,
    )
    assert [e.step for e in result.evals] == [2, 4]
    for e in result.evals:
        assert e.batches == 3
        assert list(e.metrics) == ["loss", "correct", "accuracy"]
        assert e.metrics == pytest.approx(want[e.step], rel=1e-5, abs=1e-6)
    # each evaluation comes after the event of the step it evaluated
    running = [e for e in seen if e.state == jpb.JOB_STATE_RUNNING and e.step > 0]
    order = [("eval" if e.HasField("eval") else "step", e.step) for e in running]
    assert order == [("step", 1), ("step", 2), ("eval", 2), ("step", 3), ("step", 4), ("eval", 4)]
    assert [m.step for m in client.job(result.job_id).evals] == [2, 4]
    assert len(result.losses) == 4
    for k, v in state.items():
        torch.testing.assert_close(result.state[k], v, rtol=1e-5, atol=1e-6)


def _refused(client, files, ev, match, **kw):
    train, _ = _steps()
    with pytest.raises(fxdp.ServerError, match=match) as e:
        client.train(
            train,
            world_size=2,
            batches=_batches(2, 3),
            eval=ev,
            eval_data=files,
            eval_every=1,
            **kw,
        )
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT, e.value


def test_a_graph_that_is_not_an_evaluation_of_the_state_is_refused(server):
    client, files, _, _ = server
    _, wider = _steps(hidden=9)
    _refused(
        client,
        files,
        wider,
        r"JobSpec\.eval\.graph's state '0\.weight' is f32\[9, 6\], the training graph's is "
        r"f32\[8, 6\]",
    )
    train, _ = _steps()
    _refused(client, files, train, r"JobSpec\.eval\.graph updates state '0\.weight'")
    _, ev = _steps()
    with pytest.raises(ValueError, match="eval_data"):
        client.train(train, world_size=2, batches=_batches(2, 3), eval=ev)


def test_a_finished_jobs_kept_state_is_evaluated_on_the_workers(server):
    """Client.evaluate: a job whose JobSpec.resume_job names a SUCCEEDED job and whose graph is
    an evaluation graph starts from the state that job kept (never sent by the client): its
    metrics per batch equal run_local on one device's state after the same 3 steps, and its
    state is the evaluation graph's, unchanged. A graph reading another shape, or an unknown
    job, is refused."""
    client, _, _, _ = server
    train, ev = _steps()
    batches, evals = _batches(3, 3), _batches(3, 7)
    state, _ = _one_device(train, ev, batches, evals, at=set())
    trained = client.train(train, world_size=2, batches=batches)
    got = client.evaluate(ev, trained.job_id, world_size=2, batches=evals)
    want = [ev.run_local(state, e, outputs=True) for e in evals]
    assert got.losses == pytest.approx([float(w[1]) for w in want], rel=1e-5, abs=1e-6)
    for o, w in zip(got.outputs, want):
        assert o == pytest.approx({k: float(v) for k, v in w[2].items()}, rel=1e-5, abs=1e-6)
    assert sorted(got.state) == sorted(ev.initial_state())
    for k, v in got.state.items():
        assert torch.equal(v, trained.state[k]), k
    _, wider = _steps(hidden=9)
    with pytest.raises(
        fxdp.ServerError,
        match=r"kept: tensor '0\.bias' is f32\[8\], the graph's \S+ 'p_0_bias' declares f32\[9\]",
    ) as e:
        client.evaluate(wider, trained.job_id, world_size=2, batches=evals)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(fxdp.ServerError) as e:
        client.evaluate(ev, "no-such-job", world_size=2, batches=evals)
    assert e.value.code == grpc.StatusCode.NOT_FOUND


def test_fxdp_run_prints_the_evaluations(server, tmp_path):
    """fxdp run --eval G --eval-data F ... --eval-every 1: a line per evaluation, its metrics
    run_local's on one device's state after that step, summed over the evaluation batches."""
    _, files, _, address = server
    train, ev = _steps()
    batches = _batches(2, 3)
    _, want = _one_device(train, ev, batches, _batches(3, 7), at={1, 2})
    train.save(str(tmp_path / "t.pb"))
    ev.save(str(tmp_path / "e.pb"))
    train.to_safetensors(str(tmp_path / "s.safetensors"))
    data = []
    for i, (x, y) in enumerate(batches):
        data += ["--data", str(tmp_path / f"b{i}.safetensors")]
        save_file({"x": x, "y": y}, data[-1])
    r = subprocess.run(
        [fxdp_binary("FXDP_BIN", "fxdp"), "run", str(tmp_path / "t.pb"), "--server", address,
         "--world-size", "2", "--state", str(tmp_path / "s.safetensors"), *data,
         "--eval", str(tmp_path / "e.pb"), *[a for f in files for a in ("--eval-data", f)],
         "--eval-every", "1"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    lines = [x for x in r.stdout.splitlines() if x.startswith("evaluation after step")]
    assert len(lines) == 2, r.stdout
    for k, line in zip((1, 2), lines):
        m = re.fullmatch(
            rf"evaluation after step {k}: (.*) \(summed over 3 batches, [\d.]+ ms\)", line
        )
        assert m, line
        got = {a: float(b) for a, b in (kv.split("=") for kv in m.group(1).split())}
        assert got == pytest.approx(want[k], rel=1e-5, abs=1e-5)
