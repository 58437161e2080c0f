"""Real models: Hugging Face ``transformers`` architectures trained data-parallel on real workers.

Each model is built from a small config in code (no weights downloaded, dropout off), traced with
``fxdp.trace`` (forward, loss, backward and the optimizer), analysed with ``fxdp analyze`` (zero
fallback warnings: every op has a batch-dim rule), expanded with ``fxdp expand`` and trained for 3
steps on 3 different global batches of 8 samples by real ``fxdp-worker run`` processes over Gloo:
N=2 (4+4) for every model, N=3 (3+3+2, uneven) for one model of each family; SGD with momentum
(why not Adam: ``optimizer``). Checked:

* all ranks hold bit-identical state;
* rank 0's parameters, buffers and optimizer state and the per-step global losses equal one
  device (``TracedStep.run_local`` on the full batches) at rtol 1e-5 / atol 1e-6;
* BatchNorm models (ResNet) normalise with each rank's local batch statistics, as DDP does, so
  they equal that semantics instead (``_eager_dp.rank_local_eager``: every rank's replica on its
  slice, gradients and running statistics combined with weights B_r/B), at the same tolerance.

DeBERTa-v2 is traced with the ``attention_mask`` a real input pipeline has: without it,
transformers checks the ids for padding (a data-dependent ``if``), which tracing refuses
(client/python/README.md, "Hugging Face models"). GPT-2 and Llama are also trained as causal LMs
the way users do (``*_padded``): a tokenizer's 2-D ``attention_mask`` with right and left padding,
labels -100 at the padding, the model's own loss; the padding sits in one rank's rows, then in the
other's, then nowhere (fxdp.hf_masks makes transformers build the mask that is right for all
three). BART gets prebuilt 4-D boolean masks, the other way to pass one.

Run alone: ``pytest -m real_models tests/python``. Workers are $FXDP_WORKER (default
build/bin/fxdp-worker), ``fxdp`` $FXDP_BIN (build/bin/fxdp).
"""

from __future__ import annotations

import json
import subprocess

import fxdp
import pytest
import torch
from _eager_dp import rank_local_eager
from _real_models import (
    CASES,
    MATRIX,
    STEPS,
    bart_config,
    batches,
    cls_loss,
    make,
    masked_cls_batch,
    optimizer,
    padded_lm_batch,
)
from _util import ATOL, RTOL, fxdp_binary, run_worker_ranks
from safetensors.torch import save_file

transformers = pytest.importorskip("transformers")
T = transformers
T.logging.set_verbosity_error()

pytestmark = pytest.mark.real_models


class Lab:
    """Module-wide cache: one trace (and one-device reference) per model and optimizer."""

    def __init__(self, root):
        self.root = root
        self.fxdp = fxdp_binary("FXDP_BIN", "fxdp")
        self.worker = fxdp_binary("FXDP_WORKER", "fxdp-worker")
        self._prepared = {}

    def prepared(self, name: str) -> dict:
        if name in self._prepared:
            return self._prepared[name]
        case, data = CASES[name], batches(name)
        d = self.root / name
        d.mkdir()
        model = make(name)
        step = fxdp.trace(model, optimizer(model), case.loss, data[0])
        p = {
            "dir": d,
            "step": step,
            "graph": str(d / "g.pb"),
            "state": str(d / "s.safetensors"),
            "batches": data,
            "data": [],
        }
        step.save(p["graph"])
        step.to_safetensors(p["state"])
        names = step.input_names()
        for i, b in enumerate(data):
            path = str(d / f"b{i}.safetensors")
            save_file({n: t.contiguous() for n, t in zip(names, b)}, path)
            p["data"].append(path)
        state, losses = step.initial_state(), []
        for b in data:
            state, loss = step.run_local(state, b)
            losses.append(float(loss))
        p["ref_state"], p["ref_losses"] = state, losses
        self._prepared[name] = p
        return p

    def cli(self, *args) -> subprocess.CompletedProcess:
        return subprocess.run([self.fxdp, *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    return Lab(tmp_path_factory.mktemp("real"))


def compare(got, want, what: str) -> None:
    missing = sorted(set(want) - set(got))
    assert not missing, f"{what}: the workers' state lacks {missing}"
    for k in sorted(want):
        g, w = got[k], want[k]
        assert (
            g.dtype == w.dtype and g.shape == w.shape
        ), f"{what}: {k}: {g.dtype}{list(g.shape)} vs {w.dtype}{list(w.shape)}"
        torch.testing.assert_close(g, w, rtol=RTOL, atol=ATOL, msg=lambda m: f"{what}: {k}: {m}")


@pytest.mark.parametrize("name,world", MATRIX, ids=[f"{m}-N{n}" for m, n in MATRIX])
def test_trains_like_one_device_on_real_workers(lab, name, world):
    p = lab.prepared(name)
    # fxdp analyze: every op has a rule (no size matching), nothing sliced from a global value.
    r = lab.cli("analyze", p["graph"], "--world-size", str(world), "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["warnings"] == [], report["warnings"]
    out = p["dir"] / f"x{world}.pb"
    r = lab.cli("expand", p["graph"], "--world-size", str(world), "-o", str(out), "--json")
    assert r.returncode == 0, r.stderr
    sizes = [s["size"] for s in json.loads(r.stdout)["slices"]]
    assert sizes == ([4, 4] if world == 2 else [3, 3, 2])
    template = str(p["dir"] / f"x{world}.rank{{rank}}.pb") if len(set(sizes)) > 1 else str(out)
    d = p["dir"] / f"run{world}"
    d.mkdir()
    run = run_worker_ranks(
        lab.worker, template, p["state"], p["data"], world, STEPS, d, f"{name}-n{world}"
    )
    finals = run["finals"]
    for r_, f in enumerate(finals[1:], start=1):
        for k, v in finals[0].items():
            assert torch.equal(f[k], v), f"rank {r_} differs from rank 0 on {k}"
    if CASES[name].batchnorm:
        # Rank-local BatchNorm statistics, as DDP: fxdp's semantics emulated eagerly.
        model = make(name)
        case = CASES[name]
        want = rank_local_eager(
            model,
            optimizer(model),
            lambda m, b: case.loss(m(*b[:-1]), b[-1]),
            p["batches"],
            [0] * len(p["batches"][0]),
            world,
        )
        compare(finals[0], want, f"{name} N={world} vs eager rank-local BatchNorm")
        return
    compare(finals[0], p["ref_state"], f"{name} N={world} vs one device")
    assert set(finals[0]) == set(p["ref_state"])
    torch.testing.assert_close(
        torch.tensor(run["losses"], dtype=torch.float64),
        torch.tensor(p["ref_losses"], dtype=torch.float64),
        rtol=RTOL,
        atol=ATOL,
    )


def test_deberta_without_attention_mask_is_refused_naming_the_check(lab):
    """Without a mask, transformers looks for padding in the ids (a data-dependent ``if``): a
    trace that runs the model (tracing_mode="real") refuses it with the module and the source
    line. The default trace (FakeTensors) does not meet it: transformers skips that check, which
    only warns, when it is traced (``is_tracing``), so the step traces; with the mask it traces
    either way (above)."""
    torch.manual_seed(0)
    model = CASES["deberta_v2"].make().model.train()
    ids, _, labels = masked_cls_batch(torch.Generator().manual_seed(1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(
        fxdp.TraceError, match=r"data-dependent control flow in module 'deberta'.*pad_token_id"
    ):
        fxdp.trace(model, opt, cls_loss, (ids, labels), tracing_mode="real")
    assert fxdp.trace(model, opt, cls_loss, (ids, labels)).graph.nodes


@pytest.mark.parametrize("name", ["gpt2_padded", "llama_padded"])
def test_padded_lm_traced_equals_eager_hugging_face(lab, name):
    """The traced step on one device (the reference the workers match above) equals eager
    transformers training on the same padded batches: the losses HF computes and the parameters
    after 3 SGD steps; the batch without padding included."""
    p = lab.prepared(name)
    assert not p["batches"][2][1].eq(0).any() and p["batches"][0][1].eq(0).any()
    model = make(name)
    opt = optimizer(model)
    losses = []
    for b in p["batches"]:
        opt.zero_grad()
        loss = model(*b)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    torch.testing.assert_close(
        torch.tensor(p["ref_losses"], dtype=torch.float64),
        torch.tensor(losses, dtype=torch.float64),
        rtol=RTOL,
        atol=ATOL,
    )
    compare(
        p["ref_state"],
        {k: v.detach() for k, v in model.named_parameters()},
        f"{name}: traced vs eager HF",
    )


def test_bart_with_2d_masks_traces_and_matches_eager():
    """BART's encoder (bidirectional) and decoder (causal) masks from 2-D masks with padding trace
    too; the traced loss is transformers' eager loss on the same batch."""
    torch.manual_seed(0)
    model = T.BartForConditionalGeneration(bart_config()).train()

    class Bart2D(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, ids, mask, labels, dec_mask):
            return self.model(
                input_ids=ids, attention_mask=mask, labels=labels, decoder_attention_mask=dec_mask
            ).loss

    ids, mask, labels = padded_lm_batch(torch.Generator().manual_seed(1), 0)
    batch = (ids, mask, labels, mask)
    wrapped = Bart2D()
    with torch.no_grad():
        want = wrapped(*batch)
    step = fxdp.trace(wrapped, torch.optim.SGD(wrapped.parameters(), lr=0.1), None, batch)
    _, got = step.run_local(step.initial_state(), batch)
    torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)


def test_mask_builders_are_restored_after_tracing():
    """fxdp's explicit-mask builders are transformers' local registry entries only while it traces:
    afterwards the library's builders, or the user's own local entry, are back."""
    from transformers import masking_utils as mu

    registry = mu.ALL_MASK_ATTENTION_FUNCTIONS
    model = make("gpt2_padded")
    batch = batches("gpt2_padded")[0]

    def mine(**kwargs):
        return mu.sdpa_mask(**kwargs)

    fxdp.trace(model, optimizer(model), None, batch)
    assert registry["sdpa"] is mu.sdpa_mask and registry["eager"] is mu.eager_mask
    registry["sdpa"] = mine
    try:
        fxdp.trace(model, optimizer(model), None, batch)
        assert registry["sdpa"] is mine and registry["eager"] is mu.eager_mask
    finally:
        del registry["sdpa"]
