"""Seeded, rank-invariant randomness (docs/randomness.md): Hugging Face GPT-2 and BERT with their
default dropout (0.1) train on N = 2 and 3 (uneven) real ``fxdp-worker run`` ranks equal to
``TracedStep.run_local`` on one device with the same seed (SGD at rtol 1e-5 / atol 1e-6, AdamW at
rtol 1e-4 / atol 5e-5); the same seed gives bit-identical runs and another seed other ones; the
drawn masks drop p of the values; run_local's table is the workers' (tests/testdata/random_ops.txt).
"""

from __future__ import annotations

import os
import subprocess

import fxdp
import pytest
import torch
import torch.nn.functional as F
from _util import (
    assert_same_run,
    data_paths_requests,
    fetch,
    fxdp_binary,
    local_server,
    resumed_after_sigkill,
    run_worker_ranks,
)
from fxdp import random_ops
from safetensors.torch import load_file, save_file

transformers = pytest.importorskip("transformers")
T = transformers
T.logging.set_verbosity_error()

STEPS, B, S, V = 3, 8, 8, 64
SEED = 20241127
TESTDATA = os.path.join(os.path.dirname(__file__), "..", "testdata")
TOL = {"sgd": dict(rtol=1e-5, atol=1e-6), "adamw": dict(rtol=1e-4, atol=5e-5)}


def gpt2():
    cfg = T.GPT2Config(vocab_size=V, n_positions=16, n_embd=32, n_layer=1, n_head=2)
    cfg.bos_token_id = cfg.eos_token_id = 0
    return T.GPT2LMHeadModel(cfg)


def bert():
    return T.BertForSequenceClassification(
        T.BertConfig(
            vocab_size=V,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=16,
            num_labels=3,
        )
    )


def lm_loss(out, y):
    return F.cross_entropy(out.logits.flatten(0, 1), y.flatten())


def cls_loss(out, y):
    return F.cross_entropy(out.logits, y)


MODELS = {"gpt2": (gpt2, lm_loss), "bert": (bert, cls_loss)}


def batches(name):
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(STEPS):
        ids = torch.randint(3, V, (B, S), generator=g)
        y = ids.roll(-1, 1) if name == "gpt2" else torch.randint(0, 3, (B,), generator=g)
        out.append((ids, y))
    return out


def traced(name, optim):
    torch.manual_seed(0)
    make, loss = MODELS[name]
    model = make().train()
    assert (
        model.config.to_dict().get("resid_pdrop", model.config.to_dict().get("hidden_dropout_prob"))
        == 0.1
    )
    opt = (
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        if optim == "sgd"
        else torch.optim.AdamW(model.parameters(), lr=1e-3)
    )
    step = fxdp.trace(model, opt, loss, batches(name)[0])
    step.set_seed(SEED)
    return step


def one_device(step, data, seed=None):
    state, losses = step.initial_state(), []
    for i, b in enumerate(data):
        state, loss = step.run_local(state, b, step=i + 1, seed=seed)
        losses.append(float(loss))
    return state, losses


def save(step, data, d):
    step.save(str(d / "g.pb"))
    step.to_safetensors(str(d / "s.safetensors"))
    paths = []
    for i, b in enumerate(data):
        paths.append(str(d / f"b{i}.safetensors"))
        save_file({n: t.contiguous() for n, t in zip(step.input_names(), b)}, paths[-1])
    return paths


MATRIX = [
    ("gpt2", 2, "sgd", "replicate"),
    ("gpt2", 3, "adamw", "replicate"),
    ("bert", 2, "adamw", "replicate"),
    ("bert", 3, "sgd", "replicate"),
    ("gpt2", 3, "sgd", "fully_shard"),
]


@pytest.mark.parametrize(
    "name,world,optim,style", MATRIX, ids=[f"{m}-N{n}-{o}-{s}" for m, n, o, s in MATRIX]
)
def test_dropout_on_n_ranks_equals_one_device(tmp_path, name, world, optim, style):
    step = traced(name, optim)
    assert step.random_nodes(), "the model traced without dropout"
    data = batches(name)
    paths = save(step, data, tmp_path)
    ref_state, ref_losses = one_device(step, data)
    out = tmp_path / "x.pb"
    expand = [fxdp_binary("FXDP_BIN", "fxdp"), "expand", str(tmp_path / "g.pb")]
    expand += ["--world-size", str(world), "--style", style, "-o", str(out)]
    r = subprocess.run(expand, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    graph = str(tmp_path / "x.rank{rank}.pb") if world == 3 else str(out)
    worker = fxdp_binary("FXDP_WORKER", "fxdp-worker")
    state = str(tmp_path / "s.safetensors")
    run = run_worker_ranks(worker, graph, state, paths, world, STEPS, tmp_path, f"{name}-n{world}")
    for r_, f in enumerate(run["finals"][1:], start=1):
        for k, v in run["finals"][0].items():
            assert torch.equal(f[k], v), f"rank {r_} differs from rank 0 on {k}"
    for k, want in ref_state.items():
        got = run["finals"][0][k]
        torch.testing.assert_close(got, want, **TOL[optim], msg=lambda m, k=k: f"{k}: {m}")
    torch.testing.assert_close(
        torch.tensor(run["losses"], dtype=torch.float64),
        torch.tensor(ref_losses, dtype=torch.float64),
        **TOL[optim],
    )


def test_one_seed_is_bit_identical_and_two_seeds_differ(tmp_path):
    """run_local and fxdp-worker run (2 intra-op threads), twice with one seed: bit-identical;
    another seed differs. (Reruns with >1 thread once differed, about one in 100: MKL's vector-math
    detection race, now closed before any step; test_reruns.py forces it.)"""
    step = traced("gpt2", "sgd")
    data = batches("gpt2")
    a, la = one_device(step, data)
    b, lb = one_device(step, data)
    assert la == lb and all(torch.equal(a[k], b[k]) for k in a)
    _, lc = one_device(step, data, seed=SEED + 1)
    assert lc != la
    # The workers, twice with --seed, and with another seed.
    paths = save(step, data, tmp_path)
    worker = fxdp_binary("FXDP_WORKER", "fxdp-worker")

    def run(seed, out):
        args = [
            worker,
            "run",
            "--graph",
            str(tmp_path / "g.pb"),
            "--state",
            str(tmp_path / "s.safetensors"),
            "--steps",
            str(STEPS),
            "--out",
            str(out),
            "--seed",
            str(seed),
            "--threads",
            "2",
        ]
        for p in paths:
            args += ["--data", p]
        r = subprocess.run(args, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return load_file(str(out))

    w1, w2, w3 = (
        run(SEED, tmp_path / "1.st"),
        run(SEED, tmp_path / "2.st"),
        run(7, tmp_path / "3.st"),
    )
    assert all(torch.equal(w1[k], w2[k]) for k in w1)
    assert not all(torch.equal(w1[k], w3[k]) for k in w1)
    for k in a:  # the worker with the graph's seed is one device
        torch.testing.assert_close(w1[k], a[k], rtol=1e-5, atol=1e-6)


def test_compiled_step_is_seeded_from_torch():
    """@fxdp.compile draws its seed from torch's default generator when it traces."""

    def run(seed):
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(4, 16), torch.nn.Dropout(0.5), torch.nn.Linear(16, 1)
        )
        opt = torch.optim.SGD(model.parameters(), lr=0.05)

        @fxdp.compile()
        def train_step(model, opt, batch):
            loss = F.mse_loss(model(batch[0]), batch[1])
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        torch.manual_seed(seed)
        g = torch.Generator().manual_seed(1)
        data = [(torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)) for _ in range(3)]
        return [float(train_step(model, opt, b)) for b in data]

    first = run(1)
    assert run(1) == first
    assert run(2) != first


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_dropout_rate_of_the_drawn_masks(p):
    n = 1 << 22
    x = torch.ones(n)
    out, mask = random_ops.draw(
        torch.ops.aten.native_dropout.default,
        (x, p, True),
        {},
        "dropout",
        (n,),
        torch.float32,
        5,
        1,
    )
    rate = 1.0 - mask.double().mean().item()
    assert abs(rate - p) < 0.01 * p, rate
    assert torch.equal(out, x.mul(mask).mul_(1.0 / (1.0 - p)))


def test_run_local_table_is_the_workers():
    with open(os.path.join(TESTDATA, "random_ops.txt")) as f:
        assert random_ops.table_text() == f.read()


def test_client_train_with_a_seed_equals_run_local():
    """Through the server: Client.train(seed=S) on 2 workers equals run_local with S on one device
    (dropout on), the same seed twice gives bit-identical results, another seed differs."""
    step = traced("gpt2", "sgd")
    data = batches("gpt2")
    want, want_losses = one_device(step, data, seed=SEED + 5)
    with local_server(workers=2) as (address, log), fxdp.Client(address) as c:
        a = c.train(step, world_size=2, batches=data, seed=SEED + 5)
        b = c.train(step, world_size=2, batches=data, seed=SEED + 5)
        other = c.train(step, world_size=2, batches=data, seed=SEED + 6)
    assert step.seed() == SEED  # the caller's step keeps its seed
    assert a.losses == b.losses and all(torch.equal(a.state[k], b.state[k]) for k in a.state)
    assert other.losses != a.losses
    for k, v in want.items():
        torch.testing.assert_close(a.state[k], v, **TOL["sgd"], msg=lambda m, k=k: f"{k}: {m}")
    torch.testing.assert_close(
        torch.tensor(a.losses, dtype=torch.float64),
        torch.tensor(want_losses, dtype=torch.float64),
        **TOL["sgd"],
    )


class DropMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.drop, self.fc2 = (
            torch.nn.Linear(6, 16),
            torch.nn.Dropout(0.3),
            torch.nn.Linear(16, 2),
        )

    def forward(self, x):
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


def test_a_resumed_job_continues_the_same_random_stream(tmp_path):
    """A job with dropout killed mid-run (server SIGKILL, --checkpoint-every 5) and resumed ends
    bit for bit as an uninterrupted run: the step number in the key continues, masks do not
    repeat. 200 steps of ~5 ms, as test_durable_jobs (the kill must land mid-run under load)."""
    torch.manual_seed(0)
    model = DropMLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(3)
    data = [(torch.randn(8, 6, generator=g), torch.randn(8, 2, generator=g)) for _ in range(3)]
    step = fxdp.trace(model, opt, F.mse_loss, data[0], input_names=("x", "y"))
    assert step.random_nodes()
    files = []
    for i, (x, y) in enumerate(data):
        files.append(tmp_path / f"b{i}.safetensors")
        save_file({"x": x, "y": y}, str(files[-1]))
    requests = data_paths_requests(step, files, 200)
    with resumed_after_sigkill(tmp_path / "state", requests, 13, "--checkpoint-every", "5") as (
        server,
        job,
        info,
        _,
    ):
        assert any("resumed from the checkpoint of step" in line for line in server.log)
        final = fetch(server.jobs, job)
        with fxdp.Client(server.address) as client:
            plain = client.train(step, world_size=2, data_path=files, steps=200)
    assert_same_run(info.losses, final, plain)


def test_value_trace_names_each_nodes_outputs(tmp_path):
    """FXDP_VALUE_TRACE=FILE: every node's outputs per run (layout and a hash of the values), the
    tool for finding the first node where two runs that should be bit-identical part (the known
    >1-thread rerun bug, docs/randomness.md: it showed run 1's in-place GELU 'tanh' parting, MKL's
    vector-math detection race). Two runs of the GPT-2 at --threads 2 trace alike; empty_like's
    memory is marked, not hashed; steps that wrote into their input say so."""
    step = traced("gpt2", "sgd")
    paths = save(step, batches("gpt2"), tmp_path)
    worker = fxdp_binary("FXDP_WORKER", "fxdp-worker")
    traces = []
    for i in range(2):
        trace = tmp_path / f"t{i}.txt"
        args = [worker, "run", "--graph", str(tmp_path / "g.pb"), "--state"]
        args += [str(tmp_path / "s.safetensors"), "--steps", "2", "--threads", "2"]
        for p in paths[:2]:
            args += ["--data", p]
        env = {**os.environ, "FXDP_VALUE_TRACE": str(trace)}
        r = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env)
        assert r.returncode == 0, r.stderr
        traces.append(trace.read_text().splitlines())
    lines = traces[0]
    assert lines[0].startswith("run 1 node 'view' (aten::view) ["), lines[0]
    assert {ln.split(" ")[1] for ln in lines} == {"1", "2"}
    empties = [ln for ln in lines if "(aten::empty_like)" in ln]
    assert empties and all(ln.endswith("uninitialised") for ln in empties)
    assert any(" inplace out 0 " in ln for ln in lines)
    assert all(" fnv " in ln for ln in lines if "aten::empty" not in ln and "Float" in ln)
    first = next((a for a, b in zip(lines, traces[1]) if a != b), None)
    assert first is None and len(lines) == len(traces[1]), f"the runs part at: {first}"


def test_twenty_step_loss_curve_is_statistically_eagers(tmp_path):
    """GPT-2 (dropout 0.1, SGD) for 20 steps over 4 batches on 2 real ranks against eager PyTorch:
    other draws (fxdp's generator is not torch's), so the curves agree statistically, not value
    for value: both start within 2% and fall by more than 5% (measured: 4.15 -> 3.63, eager
    4.16 -> 3.61), and the mean loss of the last 5 steps is within 5% of eager's (0.2%)."""
    steps, step = 20, traced("gpt2", "sgd")
    g = torch.Generator().manual_seed(3)
    ids = [torch.randint(3, V, (B, S), generator=g) for _ in range(4)]
    data = [(i, i.roll(-1, 1)) for i in ids] * (steps // 4)
    paths = save(step, data, tmp_path)
    torch.manual_seed(0)
    model = gpt2().train()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    eager = []
    for x, y in data:
        loss = lm_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        eager.append(float(loss))
    out = tmp_path / "x.pb"
    expand = [fxdp_binary("FXDP_BIN", "fxdp"), "expand", str(tmp_path / "g.pb")]
    r = subprocess.run(
        expand + ["--world-size", "2", "-o", str(out)], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    worker = fxdp_binary("FXDP_WORKER", "fxdp-worker")
    state = str(tmp_path / "s.safetensors")
    got = run_worker_ranks(worker, str(out), state, paths, 2, steps, tmp_path, "curve")["losses"]
    assert len(got) == steps
    assert abs(got[0] - eager[0]) < 0.02 * eager[0], (got[0], eager[0])
    assert got[-1] < 0.95 * got[0] and eager[-1] < 0.95 * eager[0], (got, eager)
    tail, eager_tail = sum(got[-5:]) / 5, sum(eager[-5:]) / 5
    assert abs(tail - eager_tail) < 0.05 * eager_tail, (got, eager)
