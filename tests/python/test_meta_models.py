"""Models built on the ``meta`` device (issue 27): no memory behind their weights, traced with
``tracing_mode="fake"`` as if on the CPU (the graph is byte for byte the one a CPU model gives:
SDPA's CPU flash attention, not the math path meta would pick; factory ops on cpu), and run on CPU
workers from a state that comes from elsewhere (``fxdp.state_of`` of the model built with weights),
equal to one device. The workers' side (every device argument is the worker's device) is
InterpreterTest.DeviceArgumentsNameTheWorkersDevice."""

from __future__ import annotations

import fxdp
import pytest
import torch
from _tiny_gpt2 import CONFIG, batches, train_step
from _util import local_server

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

from test_user_training_loop import assert_state_equals  # noqa: E402

# AdamW's tolerances (issue 23/24's standard: rtol 1e-4, atol 5e-5): AdamW divides each gradient by
# its own running norm, so a rounding difference in a near-zero gradient moves a weight by ~1e-6,
# above SGD's atol (1 of 3,072 elements, 1.39e-6, since session 10's reordered float operations).
RTOL, ATOL = 1e-4, 5e-5

WORLD = 2


def make(device=None):
    torch.manual_seed(0)
    with torch.device(device or "cpu"):
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**CONFIG)).train()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)


def test_a_meta_gpt2_traces_as_on_the_cpu_and_trains_on_cpu_workers_from_a_state_given():
    meta_model, meta_opt = make("meta")
    step = fxdp.trace_step(train_step, meta_model, meta_opt, batches(1)[0], tracing_mode="fake")
    assert step.metadata()["device"] == "cpu"
    model, opt = make()
    cpu_step = fxdp.trace_step(train_step, model, opt, batches(1)[0])
    assert step.serialize() == cpu_step.serialize()

    init = step.initial_state()
    assert init["transformer.wte.weight"].is_meta  # no values; hyper-parameters have theirs
    assert float(init["optim.group0.lr"]) == 1e-3  # float64, exactly the group's value
    state = fxdp.state_of(step, model, opt)
    data = batches(2)
    with local_server(workers=WORLD) as (address, _), fxdp.Client(address) as c:
        with pytest.raises(ValueError, match=r"state tensors are on the meta device .*state_of"):
            c.train(step, WORLD, batches=data)
        r = c.train(step, WORLD, batches=data, state=state)
    for b in data:
        train_step(model, opt, b)
    assert_state_equals(r.state, model, opt, RTOL, ATOL, "one device")


def test_meta_models_trace_only_fake_and_state_of_names_what_differs():
    meta_model, meta_opt = make("meta")
    with pytest.raises(fxdp.TraceError, match="meta device .* tracing_mode='auto' .* or 'fake'"):
        fxdp.trace_step(train_step, meta_model, meta_opt, batches(1)[0], tracing_mode="real")
    model, opt = make()
    with pytest.raises(fxdp.TraceError, match="device='cuda' is for a model on the meta device"):
        fxdp.trace_step(train_step, model, opt, batches(1)[0], device="cuda")
    step = fxdp.trace_step(train_step, meta_model, meta_opt, batches(1)[0], tracing_mode="fake")
    other = transformers.GPT2LMHeadModel(transformers.GPT2Config(**{**CONFIG, "n_layer": 1}))
    with pytest.raises(
        ValueError, match=r"state_of: .* 48 missing \(transformer\.h\.1\.ln_1\.weight"
    ):
        fxdp.state_of(step, other, torch.optim.AdamW(other.parameters()))
