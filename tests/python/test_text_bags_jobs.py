"""The text classifier of test_text_bags.py as a job (fxdp.Client.train on a real fxdp-server and
real fxdp-worker processes), its flat text SPLIT BY BAGS (issue 23): the rank graphs list the text
as ragged (graph metadata fxdp.ragged, "INPUT OFFSETS"), the server sends each rank only its bags'
tokens and its rows of the offsets rebased to them (server/jobs/ragged_batch.h), and the job
equals one device (run_local).
"""

from __future__ import annotations

import fxdp
import grpc
import pytest
import torch
import torch.nn.functional as F
from _util import ATOL, RTOL, local_server, one_device
from test_op_rule_models import B, optimizer
from test_text_bags import (
    TOKENS,
    _TextClassifier,
    _TokensToo,
    batches_of_total,
    trace,
    weighted_bags,
)

RAGGED_KEY = "fxdp.ragged"


def ragged_pairs(expanded) -> list:
    """Each rank graph's fxdp.ragged pairs [(INPUT, OFFSETS)], checked equal on every rank."""
    per_rank = []
    for g in expanded.graphs:
        value = "".join(m.value for m in g.metadata if m.key == RAGGED_KEY)
        per_rank.append([tuple(line.split(" ")) for line in value.splitlines() if line])
    assert all(p == per_rank[0] for p in per_rank), per_rank
    return per_rank[0]


def assert_equal(r, state, losses):
    """A TrainResult's losses and final state against one device's (rtol 1e-5, atol 1e-6)."""
    assert r.losses == pytest.approx(losses, rel=RTOL, abs=ATOL)
    for n, t in state.items():
        torch.testing.assert_close(r.state[n], t, rtol=RTOL, atol=ATOL, msg=lambda m: f"{n}: {m}")


def assert_trains_like_one_device(c, step, batches, world):
    """The job on `world` workers: its rank graphs list a ragged input; losses and final state
    equal run_local's (rtol 1e-5, atol 1e-6)."""
    pairs = ragged_pairs(c.expand(step, world))
    assert pairs, "the rank graphs list no ragged input (fxdp.ragged)"
    state, losses = one_device(step, batches)
    assert_equal(c.train(step, world, batches), state, losses)
    return pairs


def classifier_step():
    torch.manual_seed(0)
    model = _TextClassifier()
    opt, _ = optimizer(model, "sgd")
    batches = batches_of_total(TOKENS, B)
    return trace(model, opt, batches[0]), batches


def test_text_split_by_bags_trains_like_one_device_on_2_and_3_workers():
    """B=7 bags of 170 tokens (more bytes than the table's gradient: split by bags): 4+3 bags on
    2 workers, 3+2+2 on 3 (uneven); SGD, 3 steps."""
    step, batches = classifier_step()
    with local_server(workers=3) as (address, _), fxdp.Client(address) as c:
        for world in (2, 3):
            pairs = assert_trains_like_one_device(c, step, batches, world)
            assert len(pairs) == 1, pairs


def test_per_sample_weights_are_cut_with_the_text():
    """per_sample_weights (one per token, batch_dim=-1 like the text) shares the text's offsets:
    both ragged, cut by the same bags; 3 workers equal one device."""
    step, batches = weighted_bags()
    with local_server(workers=3) as (address, _), fxdp.Client(address) as c:
        pairs = assert_trains_like_one_device(c, step, batches, 3)
    assert len(pairs) == 2 and pairs[0][1] == pairs[1][1], pairs


def test_int32_offsets_train_like_one_device():
    """int32 offsets (EmbeddingBag takes them with int32 text): rebased and sent as int32. Twice
    the tokens: int32 text moves half the bytes, so 170 tokens would be read whole."""
    torch.manual_seed(0)
    model = _TextClassifier()
    opt, _ = optimizer(model, "sgd")
    batches = [(t.int(), o.int(), y) for t, o, y in batches_of_total(2 * TOKENS, B)]
    step = trace(model, opt, batches[0])
    with local_server(workers=3) as (address, _), fxdp.Client(address) as c:
        assert_trains_like_one_device(c, step, batches, 3)


def test_offsets_that_decrease_fail_the_job_naming_the_element():
    """A batch whose offsets decrease (bag 3 starts before bag 2): the job fails INVALID_ARGUMENT
    naming the step, the inputs and the element, before any rank gets the step (with the whole
    text, the workers' EmbeddingBag took such offsets without a word)."""
    step, batches = classifier_step()
    text, offsets, labels = batches[0]
    bad = offsets.clone()
    bad[3] = bad[2] - 1
    with local_server(workers=2) as (address, _), fxdp.Client(address) as c:
        with pytest.raises(fxdp.ServerError) as e:
            c.train(step, 2, [(text, bad, labels)])
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT, e.value
    assert (
        "step 1's batch: input 'input.1' (the offsets of the bags of input 'input.0' "
        f"i64[{TOKENS}]): "
        f"offsets[3] is {int(bad[3])}, outside [{int(offsets[2])}, {TOKENS}]"
    ) in str(e.value), e.value


def test_a_text_read_besides_the_bags_stays_whole():
    """The text also read outside the bags (test_text_bags.py's _TokensToo): no fxdp.ragged, the
    server sends it whole and each rank its rows of the offsets; 3 workers equal one device."""
    torch.manual_seed(0)
    model = _TokensToo()
    opt, _ = optimizer(model, "sgd")
    batches = batches_of_total(TOKENS, B)
    step = trace(model, opt, batches[0])
    with local_server(workers=3) as (address, _), fxdp.Client(address) as c:
        assert ragged_pairs(c.expand(step, 3)) == []
        state, losses = one_device(step, batches)
        assert_equal(c.train(step, 3, batches), state, losses)


def test_one_symbolic_job_runs_every_total_length():
    """dynamic=True: one job of batches of 170 tokens in 7 bags and 230 tokens in 6 bags (each
    shape its own rank graphs, each listing the text as ragged) on 3 workers equals one device."""
    torch.manual_seed(0)
    model = _TextClassifier()
    opt, _ = optimizer(model, "sgd")
    step = trace(model, opt, batches_of_total(TOKENS, B)[0], dynamic=True)
    batches = batches_of_total(TOKENS, B)[:2] + batches_of_total(230, 6, seed=230)[:2]
    state, losses = one_device(step, batches)
    with local_server(workers=3) as (address, _), fxdp.Client(address) as c:
        for b in (batches[0], batches[2]):
            assert ragged_pairs(c.expand(step.instantiate(b), 3)), "no fxdp.ragged"
        r = c.train(step, 3, batches)
        assert_equal(r, state, losses)
        assert len(c.job(r.job_id).shapes) == 2


def test_evaluating_the_kept_state_splits_the_bags():
    """Client.evaluate of the state a 3-worker job kept (fxdp.trace_eval: no table gradient, so
    even 17 tokens are split by bags), 2 streamed batches on 3 workers: each batch's loss equals
    one device's evaluation of that state."""
    step, batches = classifier_step()
    model = _TextClassifier().eval()
    eval_step = fxdp.trace_eval(
        lambda m, b: F.cross_entropy(m(b[0], b[1]), b[2]),
        model,
        batches_of_total(17, B)[0],
        batch_dim=[-1, 0, 0],
    )
    evals = batches_of_total(17, B, seed=9)[:2]
    with local_server(workers=3) as (address, _), fxdp.Client(address) as c:
        assert ragged_pairs(c.expand(eval_step, 3)), "no fxdp.ragged"
        trained = c.train(step, 3, batches)
        r = c.evaluate(eval_step, trained.job_id, 3, evals)
    state = {n: trained.state[n] for n in eval_step.initial_state()}
    want = [float(eval_step.run_local(state, b)[1]) for b in evals]
    assert r.losses == pytest.approx(want, rel=RTOL, abs=ATOL)
