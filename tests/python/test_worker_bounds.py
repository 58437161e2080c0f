"""Issue 17: a worker checks every state and batch tensor a server streams against its rank
graph's placeholders (name, dtype, shape) when the tensor's first chunk arrives, before it
allocates anything, so a hostile or buggy server cannot make it allocate a tensor its graph does
not declare. The job fails INVALID_ARGUMENT naming the tensor, what came and what the graph
declares; the worker stays attached and takes the next job.

The server is the fake one of test_worker_attach.py (a Python WorkerService), the worker a real
``fxdp-worker attach``.
"""

from __future__ import annotations

from fxdp import zoo
from fxdp.v1 import graph_pb2 as gpb
from fxdp.v1 import worker_pb2 as wpb
from test_worker_attach import assign, idle, lab, send_batch  # noqa: F401  (lab: the fixture)

GIB8 = 1 << 31  # f32 elements: 8 GiB, which Linux lets at::empty reserve without touching it


def _chunk(name: str, shape, data: bytes = b"\0\0\0\0") -> "wpb.TensorChunk":
    return wpb.TensorChunk(name=name, dtype=gpb.FLOAT32, shape=list(shape), offset=0, data=data)


def test_declared_shapes_are_checked_against_the_graph_before_allocating(lab):  # noqa: F811
    step, single, _ = lab.graphs("mlp", "sgd", 2)
    state = step.initial_state()
    first = next(iter(state))
    server = lab.server()
    proc = lab.start_worker(server.port, "h0")
    conn = server.accept(1)["h0"]

    def expect_invalid(job_id, *words):
        f = conn.recv("job_failed")
        assert f.job_id == job_id and f.code == 3, f  # INVALID_ARGUMENT
        for w in words:
            assert w in f.error, f"{w!r} not in {f.error!r}"
        conn.wait_heartbeat(idle)

    # A state tensor of the graph declared 8 GiB: one chunk of 4 bytes, never the rest.
    conn.send(
        assign_job=wpb.AssignJob(
            job_id="huge",
            rank=0,
            world_size=1,
            device="cpu",
            steps=1,
            graph=single,
            num_state_tensors=len(state),
        )
    )
    conn.send(state_chunk=wpb.StateChunk(job_id="huge", tensor=_chunk(first, [GIB8])))
    want = ", ".join(str(d) for d in state[first].shape)
    expect_invalid(
        "huge",
        "initial state",
        f"tensor '{first}' is f32[{GIB8}]",
        "the graph's placeholder",
        f"declares f32[{want}]",
    )

    # A name the graph does not have.
    conn.send(
        assign_job=wpb.AssignJob(
            job_id="stranger",
            rank=0,
            world_size=1,
            device="cpu",
            steps=1,
            graph=single,
            num_state_tensors=len(state),
        )
    )
    conn.send(
        state_chunk=wpb.StateChunk(job_id="stranger", tensor=_chunk("not.in.the.graph", [GIB8]))
    )
    expect_invalid(
        "stranger", "initial state", "tensor 'not.in.the.graph' is not a state tensor of the graph"
    )

    # A batch tensor declared 32 GiB, after a good state.
    assign(conn, "bigbatch", single, state, steps=1)
    conn.recv("job_started")
    batch = dict(zoo.get("mlp").named_batch(0))
    name, t = next(iter(batch.items()))
    conn.send(
        batch=wpb.Batch(
            job_id="bigbatch", step=1, tensors=[_chunk(name, [GIB8] + list(t.shape[1:]))], more=True
        )
    )
    want = ", ".join(str(d) for d in t.shape)
    expect_invalid(
        "bigbatch", "batch for step 1", f"tensor '{name}' is f32[{GIB8}", f"declares f32[{want}]"
    )

    # The worker is still there and trains the next job.
    assert proc.poll() is None
    assign(conn, "good", single, state, steps=1)
    conn.recv("job_started")
    send_batch(conn, "good", 1, batch)
    assert conn.recv("step_result").step == 1
    conn.send(shutdown=wpb.Shutdown(reason="test over"))
    assert proc.wait(timeout=10) == 0


def test_the_same_data_path_many_times_cannot_exhaust_a_worker(lab, tmp_path):  # noqa: F811
    """A worker keeps every data_paths file (its shard) for the whole job: --max-data-mb bounds
    them together, so a path listed many times cannot hold as many copies (RESOURCE_EXHAUSTED
    naming the flag; before, 8 entries of a 400 KB file held 3.2 MB against a 1 MiB limit). Only
    the tensors the graph's inputs name are read and counted (issue 25.10): the file's 400 KB
    'padding' is not, its 720-byte batch is, so 1,456 entries fit in 1 MiB and 2,048 do not."""
    import subprocess

    import torch
    from safetensors.torch import save_file

    step, single, _ = lab.graphs("mlp", "sgd", 2)
    state = step.initial_state()
    data = tmp_path / "data"
    data.mkdir()
    batch = {k: v.contiguous() for k, v in dict(zoo.get("mlp").named_batch(0)).items()}
    save_file({**batch, "padding": torch.zeros(100_000)}, str(data / "b.safetensors"))  # ~400 KB
    server = lab.server()
    err = open(tmp_path / "d0.err", "w")
    proc = subprocess.Popen(
        [
            lab.worker,
            "attach",
            "--server",
            f"127.0.0.1:{server.port}",
            "--worker-id",
            "d0",
            "--threads",
            "1",
            "--heartbeat-ms",
            "5000",
            "--data-root",
            str(data),
            "--max-data-mb",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=err,
    )
    err.close()
    lab.procs.append(proc)
    conn = server.accept(1)["d0"]
    conn.send(
        assign_job=wpb.AssignJob(
            job_id="many",
            rank=0,
            world_size=1,
            device="cpu",
            steps=1,
            graph=single,
            num_state_tensors=len(state),
            data_paths=[str(data / "b.safetensors")] * 2048,
        )
    )
    f = conn.recv("job_failed")
    assert f.job_id == "many" and f.code == 8, f  # RESOURCE_EXHAUSTED
    assert (
        "--max-data-mb 1 MiB" in f.error
        and "1456 of its 2048 entries hold 1048320 bytes" in f.error
    ), f.error
    assert proc.poll() is None
    conn.wait_heartbeat(idle)
