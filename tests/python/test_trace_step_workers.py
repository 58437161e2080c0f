"""fxdp.trace_step data parallel, with DDP's semantics: `fxdp analyze` all-reduces exactly the
grad_of values (sum over micro-batches) before clipping reads them, with no fallback warning; the
expansion has one all_reduce per bucket; real `fxdp-worker run` processes at N=2, 3 and 4
(micro-batches: even batches; uneven batches without micro-batches; the small MLP with AdamW, bf16
autocast, and the seq-first and transformer zoo models with SGD), with a per-step `--schedule FILE`,
equal one device. Tracing itself: test_trace_step.py.
"""

from __future__ import annotations

import json
import os
import subprocess

import fxdp
import pytest
import torch
from _trace_steps import (
    STEPS,
    O,
    _mlp,
    _mlp_batches,
    _mse,
    accumulating_step,
    run_traced,
    warmup_decay,
)
from _util import ATOL, RTOL, expand_json, free_port, fxdp_binary
from fxdp import schedule as S
from fxdp import zoo
from safetensors.torch import load_file, save_file

# --------------------------------------------------------------------------- data parallel


def _cli(*args, timeout=60):
    r = subprocess.run(
        [fxdp_binary("FXDP_BIN", "fxdp"), *args], capture_output=True, text=True, timeout=timeout
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_analysis_all_reduces_grad_of_before_clipping_once_per_step(tmp_path):
    e = zoo.get("transformer")
    m = e.model(0)
    step = fxdp.trace_step(
        accumulating_step(e.loss_fn, 3, 0.05),
        m,
        O.AdamW(m.parameters(), lr=1e-2),
        e.batch(0),
        input_names=e.input_names,
    )
    path = tmp_path / "t.pb"
    step.save(path)
    a = json.loads(_cli("analyze", str(path), "--world-size", "2", "--json"))
    assert a["warnings"] == []
    grad_nodes = {n.name: n.grad_of for n in step.graph.nodes if n.grad_of}
    assert sorted(grad_nodes.values()) == sorted(n for n, _ in m.named_parameters())
    grads = [r for r in a["reductions"] if r["grad_of"]]
    # exactly the grad_of values: one all-reduce per gradient per step
    assert sorted(r["value"].split(":")[0] for r in grads) == sorted(grad_nodes)
    # and cross-entropy's total weight (the count of targets that count: the mean is over the whole
    # batch's), one scalar sum per micro-batch
    counts = [r for r in a["reductions"] if not r["grad_of"]]
    assert len(counts) == 3 and all(r["op"] == "sum" for r in counts), counts
    x = json.loads(
        _cli("expand", str(path), "--world-size", "2", "-o", str(tmp_path / "x.pb"), "--json")
    )
    g = fxdp.load(tmp_path / "x.pb").graph
    reduces = [n for n in g.nodes if n.target.name == "_c10d_functional::all_reduce"]
    # one per bucket, plus the loss (all-reduced once, not per micro-batch), plus the 3 total weights
    assert len(reduces) == len(x["buckets"]) + 1 + 3


def _worker_run(graph_template, state, data, out_template, world, extra=()):
    args = [
        fxdp_binary("FXDP_WORKER", "fxdp-worker"),
        "run",
        "--graph",
        graph_template,
        "--state",
        state,
        "--steps",
        str(STEPS),
        "--out",
        out_template,
        "--timeout",
        "60",
        *extra,
    ]
    for d in data:
        args += ["--data", d]
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")
    }
    port = free_port()
    procs = [
        subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={
                **env,
                "RANK": str(r),
                "WORLD_SIZE": str(world),
                "LOCAL_RANK": str(r),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
            },
        )
        for r in range(world)
    ]
    for r, p in enumerate(procs):
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, f"rank {r}: {err}"


WORKER_CASES = [  # (model, world, batch, micro-batches, autocast): the small MLP with AdamW, zoo models with SGD
    ("mlp8", 2, 12, 2, False),
    ("mlp8", 3, 12, 2, False),
    ("mlp8", 2, 7, 1, False),  # uneven: 4, 3
    ("mlp8", 3, 8, 1, False),  # uneven: 3, 3, 2
    ("mlp8", 2, 12, 2, True),  # bf16 autocast
    ("seqfirst", 3, 12, 2, False),  # batch dim 1, micro-batches along it
    ("transformer", 4, 6, 1, False),  # uneven: 2, 2, 1, 1
]


def _worker_case(name, b):
    """(model, optimizer, loss_fn, batches, batch_dim, input_names) for a worker case."""
    if name == "mlp8":
        m = _mlp()
        return (
            m,
            O.AdamW(m.parameters(), lr=1e-2, weight_decay=0.01),
            _mse,
            _mlp_batches(b=b),
            0,
            ("input.0", "input.1"),
        )
    e = zoo.get(name)
    m = e.model(0)
    batches = [e.batch(i) for i in range(STEPS)]
    assert batches[0][0].shape[e.batch_dim] == b
    return (
        m,
        O.SGD(m.parameters(), lr=0.05, momentum=0.9, nesterov=True),
        e.loss_fn,
        batches,
        e.batch_dim,
        e.input_names or ("input.0", "input.1"),
    )


@pytest.mark.parametrize(
    "name,world,b,k,bf16",
    WORKER_CASES,
    ids=[f"{m}-n{w}-b{b}-k{k}{'-bf16' if a else ''}" for m, w, b, k, a in WORKER_CASES],
)
def test_workers_equal_one_device_with_a_schedule(tmp_path, name, world, b, k, bf16):
    m, opt, loss_fn, batches, bdim, names = _worker_case(name, b)
    inner = accumulating_step(loss_fn, k, 0.05, bdim)

    def train_step(model, opt, batch):
        if not bf16:
            return inner(model, opt, batch)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return inner(model, opt, batch)

    sched = warmup_decay(opt)
    step = fxdp.trace_step(train_step, m, opt, batches[0], batch_dim=bdim, input_names=names)
    want, _, values = run_traced(step, batches, sched)
    step.save(tmp_path / "g.pb")
    step.to_safetensors(tmp_path / "s.safetensors")
    S.save_schedule(tmp_path / "sched.json", values)
    data = []
    for i, (x, y) in enumerate(batches):
        save_file({names[0]: x, names[1]: y}, str(tmp_path / f"d{i}.safetensors"))
        data.append(str(tmp_path / f"d{i}.safetensors"))
    x = json.loads(
        _cli(
            "expand",
            str(tmp_path / "g.pb"),
            "--world-size",
            str(world),
            "-o",
            str(tmp_path / "x.pb"),
            "--json",
        )
    )
    uneven = len({s["size"] for s in x["slices"]}) > 1
    assert uneven == (b % world != 0)
    tmpl = str(tmp_path / ("x.rank{rank}.pb" if uneven else "x.pb"))
    _worker_run(
        tmpl,
        str(tmp_path / "s.safetensors"),
        data,
        str(tmp_path / "f{rank}.safetensors"),
        world,
        ["--schedule", str(tmp_path / "sched.json")],
    )
    finals = [load_file(str(tmp_path / f"f{r}.safetensors")) for r in range(world)]
    tol = dict(rtol=2e-2, atol=1e-3) if bf16 else dict(rtol=RTOL, atol=ATOL)
    for r, f in enumerate(finals):
        for n, _ in m.named_parameters():
            assert torch.equal(f[n], finals[0][n]), f"rank {r} differs from rank 0 on {n}"
            torch.testing.assert_close(f[n], want[n], **tol, msg=lambda msg: f"rank {r} {n}: {msg}")


def test_micro_batches_the_world_size_does_not_divide_split_per_micro_batch(tmp_path):
    """2 micro-batches of 3 rows on 2 ranks: each rank holds its share of each (rows 0-1 and 3-4
    on rank 0, 2 and 5 on rank 1; analysis/ir/batch_split.h RankRows). Refused before ("make the
    batch a multiple of 4"): each rank split its own contiguous rows. Training on such splits is
    checked against one device in test_micro_batch_rows.py."""
    m = _mlp()
    step = fxdp.trace_step(
        accumulating_step(_mse, 2, 0.05), m, O.SGD(m.parameters(), lr=0.1), _mlp_batches(b=6)[0]
    )
    step.save(tmp_path / "g.pb")
    report, _ = expand_json(
        fxdp_binary("FXDP_BIN", "fxdp"), str(tmp_path / "g.pb"), 2, tmp_path / "x.pb"
    )
    assert report["micro_batches"] == 2
    assert report["rank_rows"] == [
        [{"start": 0, "size": 2}, {"start": 3, "size": 2}],
        [{"start": 2, "size": 1}, {"start": 5, "size": 1}],
    ]
