"""Tracing without running the model is the default (issue 27): ``tracing_mode="auto"`` traces on
FakeTensors and checks the layouts FakeTensors may get wrong (fxdp.layouts). For every zoo model and
every Hugging Face model of test_real_models (_real_models.CASES), its graph is the one
``tracing_mode="real"`` gives (which runs the step twice and the graph once more), byte for byte but
for the strides of size-1 dims (they address nothing; Falcon's attention views differ there), and so
are the initial states' constants. Where the fake layout is not the kernel's (zoo ``seqfirst``:
``mse_loss_backward`` of a non-contiguous input; Swin: ``native_layer_norm_backward``), auto finds
it and traces again on real tensors; ``tracing_mode="fake"`` does not, and gives another graph. A
model on ``meta`` whose fake layouts are not the kernel's is refused, naming the node, the op, the
line and both layouts.
"""

from __future__ import annotations

import re

import fxdp
import pytest
import torch
from fxdp import zoo
from fxdp.zoo import models as zoo_models

transformers = pytest.importorskip("transformers")
import _real_models as hf  # noqa: E402


def normalized(step: fxdp.TracedStep) -> bytes:
    g = type(step.graph)()
    g.CopyFrom(step.graph)
    for n in g.nodes:
        for o in n.outputs:
            t = o.tensor
            for i, d in enumerate(t.shape):
                if d <= 1 and i < len(t.stride):
                    t.stride[i] = 0
    return g.SerializeToString(deterministic=True)


def zoo_trace(name: str, mode: str, device=None) -> fxdp.TracedStep:
    e = zoo.get(name)
    with torch.device(device or "cpu"):
        m = e.model(0)
    batch = e.batch(0)
    return fxdp.trace(
        m,
        zoo.make_optimizer("adam", m),
        e.loss_fn,
        batch,
        batch_dim=e.batch_dim,
        input_names=e.input_names,
        loss_reduction=e.loss_reduction,
        tracing_mode=mode,
    )


def hf_trace(name: str, mode: str) -> fxdp.TracedStep:
    m = hf.make(name)
    return fxdp.trace(
        m, hf.optimizer(m), hf.CASES[name].loss, hf.batches(name)[0], tracing_mode=mode
    )


def assert_same(auto: fxdp.TracedStep, real: fxdp.TracedStep) -> None:
    assert normalized(auto) == normalized(real)
    a, r = auto.initial_state(), real.initial_state()
    assert list(a) == list(r)
    for k in a:
        if k.startswith("const."):
            assert torch.equal(a[k], r[k]), k


@pytest.mark.parametrize("name", list(zoo_models.MODELS))
def test_zoo_auto_equals_real(name):
    assert_same(zoo_trace(name, "auto"), zoo_trace(name, "real"))


@pytest.mark.parametrize("name", list(hf.CASES))
def test_hugging_face_auto_equals_real(name):
    assert_same(hf_trace(name, "auto"), hf_trace(name, "real"))


def test_fake_alone_misses_what_auto_checks_and_a_meta_model_is_refused_there():
    real = zoo_trace("seqfirst", "real")
    assert normalized(zoo_trace("seqfirst", "fake")) != normalized(real)
    with pytest.raises(fxdp.TraceError) as e:
        zoo_trace("seqfirst", "auto", device="meta")
    msg = str(e.value)
    assert "node 'mse_loss_backward' (aten::mse_loss_backward) at backward of " in msg
    assert (
        "lays out its output as shape [5, 12, 4] strides [48, 4, 1] on cpu, FakeTensor says "
        "shape [5, 12, 4] strides [4, 20, 1]: the graph traced on fake tensors would not be exact"
    ) in msg
    assert "tracing_mode='fake'" in msg


def test_a_progress_line_says_what_is_traced(monkeypatch, capsys):
    monkeypatch.setenv("FXDP_PROGRESS", "1")
    zoo_trace("mlp", "auto")
    err = capsys.readouterr().err
    assert re.fullmatch(
        r"fxdp: tracing MLP \([\d,]+ parameters\) on fake tensors \.\.\. \d+ nodes in [\d.]+ s\n",
        err,
    ), err
    monkeypatch.setenv("FXDP_PROGRESS", "0")
    zoo_trace("mlp", "auto")
    assert capsys.readouterr().err == ""


def test_where_fake_tensors_cannot_trace_auto_traces_on_real_ones():
    """_grouped_mm's meta kernel refuses float32 (the CPU kernel takes it): fake mode fails, auto
    gives real mode's graph (test_moe_dispatch trains it)."""
    from test_moe_dispatch import _batches, _DroplessMoE

    def trace(mode):
        torch.manual_seed(0)
        m = _DroplessMoE()
        opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
        return fxdp.trace(m, opt, torch.nn.functional.mse_loss, _batches(6)[0], tracing_mode=mode)

    with pytest.raises(fxdp.TraceError, match="Expected inputs of BF16 type"):
        trace("fake")
    assert_same(trace("auto"), trace("real"))
