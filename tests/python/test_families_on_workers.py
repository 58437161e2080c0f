"""Issue 23's Done-means on real workers: each model family it names (HF Mixtral and Qwen2-MoE on
the default grouped_mm experts with output_router_logits=True, Whisper, CLIP with
return_loss=True, an LSTM classifier, the spatial-transformer and EmbeddingBag tutorial models, an
in-batch cdist contrastive loss), traced, expanded by `fxdp expand` and run for 3 steps on N real
`fxdp-worker run` processes (LibTorch over Gloo), equals one device (`run_local`): N=2 with an
even split (B=6, SGD with momentum) and N=2 and N=3 uneven (B=7: 4,3 and 3,2,2) under SGD
(rtol 1e-5/atol 1e-6) and AdamW (rtol 1e-4/atol 5e-5). The other tests of these families run
the expanded graphs on PyTorch (fxdp.dp_oracle); these check that no worker fails on a graph
that compiled and that the C++ executor computes what one device does. Tiny configs built in
code; the families' models are the other tests' (one copy each).
"""

from __future__ import annotations

import fxdp
import pytest
import torch
import torch.nn.functional as F
from test_coupled_batch import _clip_step, _InfoNCE, _tiny_clip, _train
from test_expand_oracle import STEPS, _RnnClassifier
from test_op_rule_models import (
    _SpatialTransformer,
    batches_of,
    on_workers,
    optimizer,
    randint,
    randn,
    tiny_whisper,
)
from test_text_bags import TOKENS, _TextClassifier, batches_of_total
from test_text_bags import trace as trace_bags


def _moe(name):
    from test_moe_dispatch import hf_moe_traced

    def make(b, optim):
        return hf_moe_traced(name, b, lambda model: optimizer(model, optim))

    return make


def _whisper(b, optim):
    model, makers = tiny_whisper()
    opt, tol = optimizer(model, optim)
    batches = batches_of(*makers(b))
    step = fxdp.trace(model, opt, None, batches[0])
    assert "aten::index_put" in _ops(step)
    return step, batches, tol


def _clip(b, optim):
    """Each text ends with its eos token (49), where CLIP pools it, as a tokenizer writes it (the
    other tests' texts have none: pooled at token 0, which attends only to itself, so q_proj and
    k_proj got gradients of rounding noise, ~1e-9, that AdamW scales up to lr-sized steps of
    whichever sign the order of the sums gives)."""
    model = _tiny_clip(eos_token_id=49, bos_token_id=48, pad_token_id=0)
    opt, tol = optimizer(model, optim)
    g = torch.Generator().manual_seed(3)
    batches = []
    for _ in range(STEPS):
        text = torch.randint(1, 48, (b, 5), generator=g)
        text[:, -1] = 49
        batches.append((text, torch.randn(b, 3, 8, 8, generator=g)))
    return fxdp.trace_step(_clip_step, model, opt, batches[0]), batches, tol


# Under AdamW, left out of the comparison (test_op_rule_models.on_workers' skip): the key biases,
# whose gradient is zero but for rounding (a softmax does not see a number added to each row of
# scores: test_clip_key_bias_gradients_are_noise).
ADAMW_SKIP = {
    "clip": {
        f"{tower}_model.encoder.layers.0.self_attn.k_proj.bias": slice(None)
        for tower in ("text", "vision")
    }
}


def _lstm(b, optim):
    model = _RnnClassifier(torch.nn.LSTM)
    opt, tol = optimizer(model, optim)
    batches = batches_of(randint(20, b, 5), randint(3, b))
    return fxdp.trace(model, opt, F.cross_entropy, batches[0]), batches, tol


def _spatial(b, optim):
    model = _SpatialTransformer()
    opt, tol = optimizer(model, optim)
    batches = batches_of(randn(b, 1, 8, 8), randint(5, b))
    step = fxdp.trace(model, opt, F.cross_entropy, batches[0])
    assert {"aten::affine_grid_generator", "aten::grid_sampler_2d_backward"} <= _ops(step)
    return step, batches, tol


def _text_bags(b, optim):
    model = _TextClassifier()
    opt, tol = optimizer(model, optim)
    batches = batches_of_total(TOKENS, b)
    return trace_bags(model, opt, batches[0]), batches, tol


class _CdistInfoNCE(_InfoNCE):
    """An in-batch contrastive loss over distances: each sample's positive is its own pair, the
    negatives the rest of the batch, logits -cdist(a, b) of normalized features. (Unnormalized,
    cdist(f, f) does not change with f's bias: its gradient is rounding noise, which AdamW scales
    up to lr-sized steps of whichever sign the summation order gives.)"""

    def forward(self, xa, xb):
        a = F.normalize(self.fa(xa), dim=-1)
        b = F.normalize(self.fb(xb), dim=-1)
        return F.cross_entropy(-torch.cdist(a, b) / 0.1, torch.arange(xa.shape[0]))


def _cdist(b, optim):
    model = _CdistInfoNCE()
    opt, tol = optimizer(model, optim)
    batches = batches_of(randn(b, 8), randn(b, 8))
    step = fxdp.trace_step(_train, model, opt, batches[0])
    assert {"aten::_cdist_forward", "aten::_cdist_backward"} <= _ops(step)
    return step, batches, tol


def _ops(step):
    return {n.target.name for n in step.graph.nodes}


FAMILIES = {
    "mixtral": _moe("mixtral"),
    "qwen2_moe": _moe("qwen2_moe"),
    "whisper": _whisper,
    "clip": _clip,
    "lstm": _lstm,
    "spatial_transformer": _spatial,
    "embedding_bag_text": _text_bags,
    "cdist_contrastive": _cdist,
}
# (world, B, optimizer): even N=2, then uneven N=2 and N=3 under both optimizers
RUNS = [(2, 6, "sgd"), (2, 7, "adamw"), (3, 7, "sgd"), (3, 7, "adamw")]
HF = {"mixtral", "qwen2_moe", "whisper", "clip"}  # marker real_models: transformers' models
CASES = [
    pytest.param(
        f, *r, id=f"{f}-N{r[0]}-B{r[1]}-{r[2]}", marks=[pytest.mark.real_models] if f in HF else []
    )
    for f in FAMILIES
    for r in RUNS
]


@pytest.mark.parametrize("family,world,b,optim", CASES)
def test_family_trains_like_one_device_on_real_workers(tmp_path, family, world, b, optim):
    torch.manual_seed(0)
    step, batches, tol = FAMILIES[family](b, optim)
    skip = ADAMW_SKIP.get(family) if optim == "adamw" else None
    on_workers(tmp_path, step, batches, world, skip=skip, **tol)


@pytest.mark.real_models
def test_clip_key_bias_gradients_are_noise():
    """What ADAMW_SKIP leaves out: on one device (eager) CLIP's key biases get gradients below
    1e-6 of the model's largest gradient, every other parameter more."""
    torch.manual_seed(0)
    model = _tiny_clip(eos_token_id=49, bos_token_id=48, pad_token_id=0)
    g = torch.Generator().manual_seed(3)
    text = torch.randint(1, 48, (7, 5), generator=g)
    text[:, -1] = 49
    model(
        input_ids=text, pixel_values=torch.randn(7, 3, 8, 8, generator=g), return_loss=True
    ).loss.backward()
    grads = {n: p.grad.abs().max() for n, p in model.named_parameters()}
    top = max(grads.values())
    assert all((g < 1e-6 * top) == (n in ADAMW_SKIP["clip"]) for n, g in grads.items()), grads
