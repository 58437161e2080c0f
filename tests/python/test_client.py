"""``fxdp.Client`` against a real ``fxdp-server --local-workers 2``: analyze and expand equal the
local CLI, train() on 2 workers equals single-device training, errors raise ServerError."""

from __future__ import annotations

import json
import subprocess
import time

import grpc
import pytest
import torch

import fxdp
from _util import ATOL, RTOL, fxdp_binary, traced, local_server
from fxdp import zoo
from fxdp.v1 import graph_pb2 as gpb

MODEL, OPTIM = "mlp", "adamw"


@pytest.fixture(scope="module")
def client():
    with local_server() as (address, _), fxdp.Client(address) as c:
        deadline = time.monotonic() + 30
        while sum(w.get("state") == "WORKER_STATE_IDLE" for w in c.workers()) < 2:
            assert time.monotonic() < deadline, c.workers()
            time.sleep(0.1)
        yield c


def test_analyze_and_expand_equal_the_local_cli(client, tmp_path):
    step = traced(MODEL, OPTIM)
    path = tmp_path / "g.pb"
    step.save(path)
    local = json.loads(subprocess.run([fxdp_binary("FXDP_BIN", "fxdp"), "analyze", str(path), "--world-size", "2",
                                       "--json"], capture_output=True, text=True, check=True).stdout)
    assert client.analyze(step, world_size=2) == local
    ex = client.expand(step, world_size=3)
    assert ex.identical and len(ex.graphs) == 1
    assert [s["size"] for s in ex.report["slices"]] == [4, 4, 4]
    assert any(n.target.name == "_c10d_functional::all_reduce" for n in ex.graphs[0].nodes)


def test_train_on_two_workers_equals_one_device(client):
    step = traced(MODEL, OPTIM)
    e = zoo.get(MODEL)
    batches = [e.batch(i) for i in range(3)]
    seen = []
    result = client.train(step, world_size=2, batches=batches, on_step=lambda i, l: seen.append((i, l)))
    ref, losses = step.initial_state(), []
    for b in batches:
        ref, loss = step.run_local(ref, b)
        losses.append(loss.item())
    torch.testing.assert_close(torch.tensor(result.losses), torch.tensor(losses), rtol=RTOL, atol=ATOL)
    assert [i for i, _ in seen] == [1, 2, 3]
    assert set(result.state) == set(ref)
    for name, want in ref.items():
        torch.testing.assert_close(result.state[name], want, rtol=RTOL, atol=ATOL, msg=lambda m: f"{name}: {m}")
    assert client.job(result.job_id).state == 3  # JOB_STATE_SUCCEEDED


def test_errors_raise_server_error(client):
    step = traced(MODEL, OPTIM)
    bad = gpb.GraphDef()
    bad.CopyFrom(step.graph)
    bad.nodes[5].name = bad.nodes[4].name  # a duplicate node name
    with pytest.raises(fxdp.ServerError) as err:
        client.analyze(bad)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and bad.nodes[4].name in str(err.value)
    with pytest.raises(fxdp.ServerError) as err:
        client.train(step, world_size=3, batches=[zoo.get(MODEL).batch(0)])
    assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
