"""``fxdp.Client`` against a real ``fxdp-server --local-workers 2``: analyze and expand equal the
local CLI; train() on 2 workers equals single-device training, from a list, from a generator it
consumes lazily while the job runs (open-ended: as many steps as it yields), and from a safetensors
file on the workers (``data_path``); a 64 MiB state passes a server and client limited to 8 MiB
messages (it goes in chunks); errors raise ServerError (a missing or bad data file names the path,
tensor and rank)."""

from __future__ import annotations

import json
import subprocess
import threading

import fxdp
import grpc
import pytest
import torch
from _util import ATOL, RTOL, fxdp_binary, idle_client, local_server, traced
from fxdp import zoo
from fxdp.v1 import graph_pb2 as gpb
from fxdp.v1 import jobs_pb2 as jpb
from safetensors.torch import save_file

MODEL, OPTIM = "mlp", "adamw"


@pytest.fixture(scope="module")
def client():
    with idle_client() as c:
        yield c


def test_analyze_and_expand_equal_the_local_cli(client, tmp_path):
    step = traced(MODEL, OPTIM)
    path = tmp_path / "g.pb"
    step.save(path)
    local = json.loads(
        subprocess.run(
            [fxdp_binary("FXDP_BIN", "fxdp"), "analyze", str(path), "--world-size", "2", "--json"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
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
    result = client.train(
        step, world_size=2, batches=batches, on_step=lambda i, l: seen.append((i, l))
    )
    ref, losses = step.initial_state(), []
    for b in batches:
        ref, loss = step.run_local(ref, b)
        losses.append(loss.item())
    torch.testing.assert_close(
        torch.tensor(result.losses), torch.tensor(losses), rtol=RTOL, atol=ATOL
    )
    assert [i for i, _ in seen] == [1, 2, 3]
    assert set(result.state) == set(ref)
    for name, want in ref.items():
        torch.testing.assert_close(
            result.state[name], want, rtol=RTOL, atol=ATOL, msg=lambda m: f"{name}: {m}"
        )
    assert client.job(result.job_id).state == 3  # JOB_STATE_SUCCEEDED


def reference(step, batches):
    ref, losses = step.initial_state(), []
    for b in batches:
        ref, loss = step.run_local(ref, b)
        losses.append(loss.item())
    return ref, losses


def test_train_streams_a_generator_lazily(client):
    step = traced(MODEL, OPTIM)
    e = zoo.get(MODEL)
    steps, done = 6, []
    progressed = threading.Condition()

    def on_step(i, loss):
        with progressed:
            done.append(i)
            progressed.notify_all()

    def batches():
        for k in range(steps):
            # The batch of step k+1 is made only once step k's loss has arrived: a client that
            # read the whole generator first, or a server that held step k's result back until
            # it had the next batch, would stall here (and the test would fail).
            with progressed:
                assert progressed.wait_for(lambda: len(done) >= k, timeout=30), (k, done)
            yield e.batch(k)

    events = []
    result = client.train(
        step, world_size=2, batches=batches(), on_step=on_step, on_event=events.append
    )
    ref, losses = reference(step, [e.batch(k) for k in range(steps)])
    torch.testing.assert_close(
        torch.tensor(result.losses), torch.tensor(losses), rtol=RTOL, atol=ATOL
    )
    assert events[0].state == jpb.JOB_STATE_QUEUED and events[-1].state == jpb.JOB_STATE_SUCCEEDED
    assert client.job(result.job_id).steps == steps  # open-ended: the steps the generator yielded
    for name, want in ref.items():
        torch.testing.assert_close(
            result.state[name], want, rtol=RTOL, atol=ATOL, msg=lambda m: f"{name}: {m}"
        )


def test_train_from_a_file_on_the_workers(client, tmp_path):
    step = traced(MODEL, OPTIM)
    e = zoo.get(MODEL)
    path = tmp_path / "batch.safetensors"
    save_file(e.named_batch(3), str(path))
    result = client.train(step, world_size=2, data_path=path, steps=3)
    ref, losses = reference(step, [e.batch(3)] * 3)
    torch.testing.assert_close(
        torch.tensor(result.losses), torch.tensor(losses), rtol=RTOL, atol=ATOL
    )
    for name, want in ref.items():
        torch.testing.assert_close(
            result.state[name], want, rtol=RTOL, atol=ATOL, msg=lambda m: f"{name}: {m}"
        )
    assert list(client.job(result.job_id).data_paths) == [str(path)]

    missing = tmp_path / "nope.safetensors"
    with pytest.raises(fxdp.ServerError) as err:
        client.train(step, world_size=2, data_path=missing, steps=1)
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION, err.value
    assert str(missing) in str(err.value) and "rank" in str(err.value), err.value
    partial = tmp_path / "x_only.safetensors"
    save_file({"x": e.named_batch(0)["x"]}, str(partial))
    with pytest.raises(fxdp.ServerError) as err:
        client.train(step, world_size=2, data_path=[partial], steps=1)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT, err.value
    assert (
        str(partial) in str(err.value) and "'target'" in str(err.value) and "rank" in str(err.value)
    )


def test_errors_raise_server_error(client):
    step = traced(MODEL, OPTIM)
    bad = gpb.GraphDef()
    bad.CopyFrom(step.graph)
    bad.nodes[5].name = bad.nodes[4].name  # a duplicate node name
    with pytest.raises(fxdp.ServerError) as err:
        client.analyze(bad)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and bad.nodes[4].name in str(
        err.value
    )
    x, target = zoo.get(MODEL).batch(0)
    with pytest.raises(fxdp.ServerError) as err:
        client.train(step, world_size=2, batches=[(x[:, :9], target)])
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and "input 'x' is f32[12, 9]" in str(
        err.value
    )

    def failing():
        yield (x, target)
        raise RuntimeError("the data loader broke")

    with pytest.raises(RuntimeError, match="the data loader broke"):
        client.train(step, world_size=2, batches=failing())
    with pytest.raises(KeyError, match="lacks inputs"):
        client.train(step, world_size=2, batches=[{"x": x}])
    with pytest.raises(ValueError):
        client.train(step, world_size=2)


def test_unreachable_server_names_the_address_and_how_to_start_one():
    """gRPC alone says "failed to connect to all addresses"; the client says which address it tried."""
    with pytest.raises(fxdp.ServerError) as err:
        fxdp.Client("127.0.0.1:1", timeout=10).jobs()
    msg = str(err.value)
    assert err.value.code == grpc.StatusCode.UNAVAILABLE, msg
    assert (
        "cannot reach fxdp-server at 127.0.0.1:1" in msg and "fxdp-server --local-workers" in msg
    ), msg


@pytest.mark.parametrize(
    "args",
    [
        ["workers"],
        ["jobs"],
        ["job", "job-1"],
        ["cancel", "job-1"],
        ["analyze", "G"],
        ["expand", "G", "--world-size", "2", "-o", "OUT"],
    ],
)
def test_cli_unreachable_server_names_the_address_and_how_to_start_one(tmp_path, args):
    """Every `fxdp` command that talks to a server says, like the Python client, which address it
    tried and how to start a server there (exit 3)."""
    graph = tmp_path / "g.pb"
    graph.write_bytes(b"")
    names = {"G": str(graph), "OUT": str(tmp_path / "x.pb")}
    cmd = [names.get(a, a) for a in args]
    p = subprocess.run(
        [fxdp_binary("FXDP_BIN", "fxdp"), *cmd, "--server", "127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 3, (p.returncode, p.stderr)
    assert f"fxdp {args[0]}: server 127.0.0.1:1" in p.stderr, p.stderr
    assert "start one there (`fxdp-server --local-workers 2`" in p.stderr, p.stderr
    assert "--server HOST:PORT or FXDP_SERVER=HOST:PORT" in p.stderr, p.stderr


@pytest.mark.parametrize(
    "env,name,want",
    [
        ("FXDP_BIN", "fxdp", "fxdp 0.1.0"),
        ("FXDP_SERVER_BIN", "fxdp-server", "fxdp-server 0.1.0"),
        ("FXDP_WORKER", "fxdp-worker", "fxdp-worker 0.1.0 (LibTorch 2.13"),
    ],
)
def test_every_binary_has_version(env, name, want):
    p = subprocess.run(
        [fxdp_binary(env, name), "--version"], capture_output=True, text=True, timeout=30
    )
    assert p.returncode == 0 and p.stdout.startswith(want), (p.returncode, p.stdout, p.stderr)


def test_large_state_goes_in_chunks():
    """A 64 MiB state through a server and client that accept no message over 8 MiB."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4096, 4096)
    x, y = torch.randn(8, 4096), torch.randn(8, 4096)
    step = fxdp.trace(
        model, torch.optim.SGD(model.parameters(), lr=0.01), torch.nn.MSELoss(), (x, y)
    )
    with (
        local_server(extra_args=("--max-message-mb", "8")) as (address, _),
        fxdp.Client(address, max_message_mb=8) as c,
    ):
        result = c.train(step, world_size=2, batches=[(x, y)] * 2)
    ref, losses = reference(step, [(x, y)] * 2)
    torch.testing.assert_close(
        torch.tensor(result.losses), torch.tensor(losses), rtol=RTOL, atol=ATOL
    )
    for name, want in ref.items():
        torch.testing.assert_close(
            result.state[name], want, rtol=RTOL, atol=ATOL, msg=lambda m: f"{name}: {m}"
        )
