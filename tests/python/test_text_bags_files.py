"""The text classifier of test_text_bags.py as a job whose batches are safetensors files on the
workers (Client.train(data_path=..., eval_data=...)): each worker reads the global batch file and
cuts it itself (ShardBatch: its bags' tokens, its rows of the offsets rebased to them; issue 23),
for the training step (170 tokens, split by bags) and for the evaluation while it trains (17
tokens, split too: an evaluation has no table gradient). Equal to one device.
"""

from __future__ import annotations

import fxdp
import pytest
import torch
import torch.nn.functional as F
from _util import ATOL, RTOL, local_server
from safetensors.torch import save_file
from test_op_rule_models import B
from test_text_bags import _TextClassifier, batches_of_total
from test_text_bags_jobs import classifier_step, one_device, ragged_pairs


def _save(step_or_names, batches, root, prefix):
    """One safetensors file per global batch, its tensors named as the step's inputs."""
    paths = []
    for i, b in enumerate(batches):
        paths.append(str(root / f"{prefix}{i}.safetensors"))
        save_file({n: t.contiguous() for n, t in zip(step_or_names, b)}, paths[-1])
    return paths


@pytest.mark.parametrize("world", [2, 3], ids=["N2", "N3-uneven"])
def test_data_path_files_are_cut_by_bags_on_the_workers(tmp_path, world):
    """3 training files of 7 bags (170 tokens) and 2 evaluation files (17 tokens), cut by each
    worker: the losses, the final state and the evaluation after the last step equal one
    device's."""
    step, batches = classifier_step()
    eval_step = fxdp.trace_eval(
        lambda m, b: F.cross_entropy(m(b[0], b[1]), b[2]),
        _TextClassifier().eval(),
        batches_of_total(17, B)[0],
        batch_dim=[-1, 0, 0],
    )
    evals = batches_of_total(17, B, seed=9)[:2]
    files = _save(step.input_names(), batches, tmp_path, "b")
    eval_files = _save(eval_step.input_names(), evals, tmp_path, "e")
    state, losses = one_device(step, batches)
    want = sum(float(eval_step.run_local(state, b)[1]) for b in evals)
    extra = ["--data-root", str(tmp_path)]
    with local_server(workers=3, extra_args=extra) as (address, _), fxdp.Client(address) as c:
        assert ragged_pairs(c.expand(step, world)), "no fxdp.ragged in the training graphs"
        assert ragged_pairs(c.expand(eval_step, world)), "no fxdp.ragged in the evaluation graphs"
        r = c.train(
            step,
            world,
            data_path=files,
            steps=len(files),
            eval=eval_step,
            eval_data=eval_files,
            eval_every=0,
        )
    assert r.losses == pytest.approx(losses, rel=RTOL, abs=ATOL)
    for n, t in state.items():
        torch.testing.assert_close(r.state[n], t, rtol=RTOL, atol=ATOL, msg=lambda m: f"{n}: {m}")
    assert [(e.step, e.batches) for e in r.evals] == [(len(files), 2)]
    assert r.evals[0].metrics["loss"] == pytest.approx(want, rel=RTOL, abs=ATOL)
