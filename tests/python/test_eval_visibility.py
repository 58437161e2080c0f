"""A job's evaluations (JobInfo.evals, docs/evaluation.md) where a user looks for them: ``fxdp job
ID`` prints the last ones in a line (``--json``: every one), ``fxdp jobs`` the last one's step and
loss; a job resumed from a cancelled one starts with the evaluations it made up to its checkpoint
(as its losses do); an evaluation of a finished job's kept state runs for as many batches as a
generator yields (no step count given). 2 real workers."""

from __future__ import annotations

import json
import subprocess
import threading

import fxdp
import grpc
import pytest
from _util import fxdp_binary, local_server
from fxdp.v1 import jobs_pb2 as jpb
from safetensors.torch import save_file
from test_eval_jobs import _batches, _one_device, _steps


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("evalvis")
    files = []
    for i, (x, y) in enumerate(_batches(2, 7)):
        files.append(str(root / f"eval{i}.safetensors"))
        save_file({"x": x, "y": y}, files[-1])
    args = ["--data-root", str(root), "--state-dir", str(root / "state")]
    with local_server(extra_args=args) as (address, _), fxdp.Client(address) as client:
        yield client, files, address


def _fxdp(address, *args):
    r = subprocess.run(
        [fxdp_binary("FXDP_BIN", "fxdp"), *args, "--server", address],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_fxdp_job_and_jobs_show_the_evaluations(server):
    client, files, address = server
    train, ev = _steps()
    r = client.train(
        train, world_size=2, batches=_batches(4, 3), eval=ev, eval_data=files, eval_every=1
    )
    assert [e.step for e in r.evals] == [1, 2, 3, 4]
    last = r.evals[-1].metrics
    text = _fxdp(address, "job", r.job_id)
    line = next(x for x in text.splitlines() if x.startswith("evaluations"))
    want = "; ".join(
        f"step {e.step}: loss={e.metrics['loss']:.6g} correct={e.metrics['correct']:.6g} "
        f"accuracy={e.metrics['accuracy']:.6g}"
        for e in r.evals[1:]
    )
    assert line == f"evaluations 4, the last 3: {want}", text
    info = json.loads(_fxdp(address, "job", r.job_id, "--json"))
    assert [e["step"] for e in info["evals"]] == [1, 2, 3, 4]
    assert info["evals"][-1]["metrics"] == pytest.approx(last)
    assert info["evals"][-1]["batches"] == 2
    row = next(x for x in _fxdp(address, "jobs").splitlines() if x.startswith(r.job_id))
    assert f"step 4: loss={last['loss']:.6g}" in row, row


def test_a_resumed_job_starts_with_the_evaluations_up_to_its_checkpoint(server):
    client, files, _ = server
    train, ev = _steps()
    batches = _batches(4, 3)
    cancelled, ids = threading.Event(), []

    def two_then_wait():
        yield from batches[:2]
        cancelled.wait(60)  # the job waits for step 3's batch while it is cancelled
        yield from batches[2:]

    def on_event(e):
        ids.append(e.job_id)
        if e.HasField("eval") and e.eval.step == 2 and not cancelled.is_set():
            client.cancel(e.job_id)
            cancelled.set()

    kw = dict(eval=ev, eval_data=files, eval_every=1)
    with pytest.raises(fxdp.ServerError) as e:
        client.train(train, world_size=2, batches=two_then_wait(), steps=4, on_event=on_event, **kw)
    assert e.value.code == grpc.StatusCode.CANCELLED, e.value
    old = client.job(ids[0])
    assert (old.state, old.steps_done, [m.step for m in old.evals]) == (
        jpb.JOB_STATE_CANCELLED,
        2,
        [1, 2],
    ), old
    resumed = client.train(train, world_size=2, batches=batches, steps=4, resume=ids[0], **kw)
    assert [m.step for m in resumed.evals] == [3, 4]  # the ones this job made
    info = client.job(resumed.job_id)
    assert [m.step for m in info.evals] == [1, 2, 3, 4]
    assert list(info.evals[:2]) == list(old.evals)
    _, want = _one_device(train, ev, batches, _batches(2, 7), at={3, 4})
    for m in info.evals[2:]:
        got = {v.name: v.value for v in m.metrics}
        assert got == pytest.approx(want[m.step], rel=1e-5, abs=1e-6)


def test_a_kept_state_is_evaluated_over_a_generator_without_a_step_count(server):
    client, _, _ = server
    train, ev = _steps()
    trained = client.train(train, world_size=2, batches=_batches(2, 3))
    evals = _batches(3, 7)
    got = client.evaluate(ev, trained.job_id, world_size=2, batches=(b for b in evals))
    state, _ = _one_device(train, ev, _batches(2, 3), evals, at=set())
    want = [float(ev.run_local(state, e, outputs=True)[1]) for e in evals]
    assert got.losses == pytest.approx(want, rel=1e-5, abs=1e-6)
    assert client.job(got.job_id).steps == 3
