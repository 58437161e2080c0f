"""Op rules of issue 23 on models that use them: histc, affine_grid/grid_sample, cdist,
embedding_bag and index_put with batch-sharded indices. Each model, traced and expanded for
N = 2 and 3 ranks (B=7: 4,3 and 3,2,2, uneven), runs on real Gloo processes (fxdp.dp_oracle)
and equals one device after 3 steps (SGD rtol 1e-5/atol 1e-6, AdamW rtol 1e-4/atol 5e-5); the
cases that cannot be exact are refused by `fxdp expand`, naming the op and what to change.
"""

from __future__ import annotations

import json
import subprocess

import fxdp
import pytest
import torch
import torch.nn.functional as F
from _hf_call import KeywordCall
from _util import fxdp_binary, run_worker_ranks
from safetensors.torch import save_file
from test_expand_oracle import FXDP, STEPS, check_against_one_device
from torch import nn

B = 7
ADAMW_TOL = dict(rtol=1e-4, atol=5e-5)


def batches_of(*makers, seed=5):
    g = torch.Generator().manual_seed(seed)
    return [tuple(m(g) for m in makers) for _ in range(STEPS)]


def randn(*shape):
    return lambda g: torch.randn(*shape, generator=g)


def randint(high, *shape):
    return lambda g: torch.randint(0, high, shape, generator=g)


def optimizer(model, kind):
    if kind == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), {}
    return torch.optim.AdamW(model.parameters(), lr=0.01), ADAMW_TOL


def refused(tmp_path, step, *needles):
    """`fxdp expand` refuses the graph at compile time; its message holds every needle."""
    graph = str(tmp_path / "g.pb")
    step.save(graph)
    r = subprocess.run(
        [FXDP, "expand", graph, "--world-size", "2", "-o", str(tmp_path / "x.pb")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0, r.stdout
    for needle in needles:
        assert needle in r.stderr, r.stderr
    return r.stderr


def ops_of(step):
    return {n.target.name for n in step.graph.nodes}


def one_device(tmp_path, step, batches, world, **kw):
    """No op of `step` falls back to size matching (`fxdp analyze` warns of none), and expanded
    for `world` ranks it equals one device (test_expand_oracle.check_against_one_device)."""
    graph = str(tmp_path / "analyzed.pb")
    step.save(graph)
    r = subprocess.run(
        [FXDP, "analyze", graph, "--world-size", str(world), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["warnings"] == []
    return check_against_one_device(tmp_path, step, batches, world, **kw)


def on_workers(tmp_path, step, batches, world, rtol=1e-5, atol=1e-6, skip=None):
    """The step expanded for `world` ranks on real `fxdp-worker run` processes (LibTorch) equals
    one device: the cases whose workers used to fail on a graph that compiled. `skip`: {parameter:
    index} of elements left out, in it and its optimizer state (a gradient that is zero but for
    rounding, which Adam scales up to lr-sized steps of either sign: test_unseen_models)."""
    graph, state = str(tmp_path / "g.pb"), str(tmp_path / "s.safetensors")
    step.save(graph)
    step.to_safetensors(state)
    data = []
    for i, b in enumerate(batches):
        data.append(str(tmp_path / f"b{i}.safetensors"))
        save_file({n: t.contiguous().clone() for n, t in zip(step.input_names(), b)}, data[-1])
    r = subprocess.run(
        [FXDP, "expand", graph, "--world-size", str(world), "-o", str(tmp_path / "x.pb"), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    files = json.loads(r.stdout)["files"]
    template = files[0]["path"] if len(files) == 1 else str(tmp_path / "x.rank{rank}.pb")
    (tmp_path / "run").mkdir()
    run = run_worker_ranks(
        fxdp_binary("FXDP_WORKER", "fxdp-worker"),
        template,
        state,
        data,
        world,
        STEPS,
        tmp_path / "run",
        "oprules",
    )
    want, losses = step.initial_state(), []
    for i, b in enumerate(batches):  # step i + 1: the key of its random draws, as the workers'
        want, loss = step.run_local(want, b, step=i + 1)
        losses.append(float(loss))
    for k, w in want.items():
        got = run["finals"][0][k]
        for p, index in (skip or {}).items():
            if k == p or k.startswith(f"optim.{p}.") and got.shape == want[p].shape:
                got, w = got.clone(), w.clone()
                got[index] = w[index]
        torch.testing.assert_close(got, w, rtol=rtol, atol=atol, msg=lambda m: f"{k}: {m}")
    torch.testing.assert_close(
        torch.tensor(run["losses"]), torch.tensor(losses), rtol=rtol, atol=atol
    )


# ---- histc: per-rank counts, summed ----------------------------------------------------------


class _Router(nn.Module):
    """A Switch-style load-balancing loss: tokens per expert counted with histc (Mixtral's
    load_balancing_loss_func) times the mean router probability."""

    def __init__(self, count="histc", experts=4):
        super().__init__()
        self.gate, self.out, self.count, self.experts = (
            nn.Linear(8, experts),
            nn.Linear(8, 3),
            count,
            experts,
        )

    def forward(self, x):
        probs = self.gate(x).softmax(-1)
        _, top = torch.topk(probs, 2, dim=-1)
        flat = top.reshape(-1)
        if self.count == "histc":
            counts = torch.histc(flat.float(), bins=self.experts, min=0, max=self.experts)
        else:  # the bins span the data's own range
            counts = torch.histc(flat.float(), bins=self.experts)
        aux = (counts / flat.shape[0] * probs.mean(0)).sum() * self.experts
        return self.out(x), aux


def _router_loss(out, y):
    pred, aux = out
    return F.mse_loss(pred, y) + 0.5 * aux


@pytest.mark.parametrize("world", [2, 3])
def test_histogram_counts_are_summed_over_ranks(tmp_path, world):
    """Each rank counts its own tokens; the counts are all-reduced before the product with the
    mean probability (a product of two partial sums), so the aux loss is the global one, not
    about 1/N of it (the old size-matching guess made histc replicated)."""
    torch.manual_seed(0)
    model = _Router()
    opt, _ = optimizer(model, "sgd")
    batches = batches_of(randn(B, 8), randn(B, 3))
    step = fxdp.trace(model, opt, _router_loss, batches[0])
    assert "aten::histc" in ops_of(step)
    # + the counts' and the mean probability's all-reduces
    report = one_device(tmp_path, step, batches, world, reductions=2)
    assert [s["size"] for s in report["slices"]] == ([4, 3] if world == 2 else [3, 2, 2])


def test_histogram_with_bins_from_the_data_is_refused(tmp_path):
    """histc without min/max bins over the data's range, which differs between ranks: refused.
    (bincount's output size is the data's largest value + 1: tracing refuses it already.)"""
    torch.manual_seed(0)
    model = _Router("histc_no_range")
    opt, _ = optimizer(model, "sgd")
    g = torch.Generator().manual_seed(1)
    x = torch.randn(B, 8, generator=g)
    step = fxdp.trace(model, opt, _router_loss, (x, torch.randn(B, 3, generator=g)))
    refused(tmp_path, step, "aten::histc", "pass the range")


# ---- affine_grid / grid_sample: the spatial-transformer tutorial ----------------------------


class _SpatialTransformer(nn.Module):
    """pytorch/tutorials' spatial transformer, small: a conv localization net regresses theta,
    affine_grid(theta, x.size()) and grid_sample warp the input, a classifier follows."""

    def __init__(self):
        super().__init__()
        self.localization = nn.Sequential(nn.Conv2d(1, 4, 3), nn.MaxPool2d(2), nn.ReLU())
        self.fc_loc = nn.Sequential(nn.Linear(4 * 3 * 3, 8), nn.ReLU(), nn.Linear(8, 6))
        self.fc_loc[2].weight.data.mul_(0.1)
        self.fc_loc[2].bias.data.copy_(torch.tensor([1, 0, 0, 0, 1, 0], dtype=torch.float))
        self.classifier = nn.Sequential(
            nn.Conv2d(1, 3, 3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 6 * 6, 5)
        )

    def forward(self, x):
        theta = self.fc_loc(self.localization(x).flatten(1)).view(-1, 2, 3)
        grid = F.affine_grid(theta, x.size(), align_corners=False)
        return self.classifier(F.grid_sample(x, grid, align_corners=False))


@pytest.mark.parametrize("world,optim", [(2, "sgd"), (3, "sgd"), (2, "adamw"), (3, "adamw")])
def test_spatial_transformer(tmp_path, world, optim):
    """affine_grid_generator's size argument [B, C, H, W] is made local (a worker failed with
    "Expected [64, 3] but got [32, 3]"); grid_sampler_2d and its backward are per sample."""
    torch.manual_seed(0)
    model = _SpatialTransformer()
    opt, tol = optimizer(model, optim)
    batches = batches_of(randn(B, 1, 8, 8), randint(5, B))
    step = fxdp.trace(model, opt, F.cross_entropy, batches[0])
    assert {
        "aten::affine_grid_generator",
        "aten::grid_sampler_2d",
        "aten::grid_sampler_2d_backward",
    } <= ops_of(step)
    one_device(tmp_path, step, batches, world, **tol)


class _VolumeTransformer(nn.Module):
    """The spatial transformer on volumes: a 3x4 theta, affine_grid over [B, C, D, H, W] and
    grid_sampler_3d."""

    def __init__(self):
        super().__init__()
        self.fc_loc = nn.Linear(4 * 4 * 4, 12)
        self.fc_loc.weight.data.mul_(0.1)
        self.fc_loc.bias.data.copy_(
            torch.tensor([1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0], dtype=torch.float)
        )
        self.classifier = nn.Linear(4 * 4 * 4, 5)

    def forward(self, x):
        theta = self.fc_loc(x.flatten(1)).view(-1, 3, 4)
        grid = F.affine_grid(theta, x.size(), align_corners=False)
        return self.classifier(F.grid_sample(x, grid, align_corners=False).flatten(1))


def test_volume_transformer(tmp_path):
    torch.manual_seed(0)
    model = _VolumeTransformer()
    opt, _ = optimizer(model, "sgd")
    batches = batches_of(randn(B, 1, 4, 4, 4), randint(5, B))
    step = fxdp.trace(model, opt, F.cross_entropy, batches[0])
    assert {"aten::grid_sampler_3d", "aten::grid_sampler_3d_backward"} <= ops_of(step)
    one_device(tmp_path, step, batches, 3)


# ---- cdist: samples against replicated prototypes --------------------------------------------


class _Prototypes(nn.Module):
    """Logits are negative distances to learned prototypes, cdist(features, prototypes) and,
    the other way round, cdist(prototypes, features).T: one operand batch-sharded."""

    def __init__(self, coupled=False):
        super().__init__()
        self.features = nn.Linear(8, 5)
        self.prototypes = nn.Parameter(torch.randn(3, 5))
        self.coupled = coupled

    def forward(self, x):
        f = self.features(x)
        if self.coupled:  # in-batch: every sample against every other
            # "shifted": no zero distances, which the product form (_euclidean_dist) computes as
            # rounding noise whose gradient depends on the matmul's shape
            return -torch.cdist(f, f + 1 if self.coupled == "shifted" else f)[:, :3]
        return -(torch.cdist(f, self.prototypes) + torch.cdist(self.prototypes, f).t()) / 2


@pytest.mark.parametrize("world,optim", [(2, "sgd"), (3, "sgd"), (3, "adamw")])
def test_cdist_to_replicated_prototypes(tmp_path, world, optim):
    torch.manual_seed(0)
    model = _Prototypes()
    opt, tol = optimizer(model, optim)
    batches = batches_of(randn(B, 8), randint(3, B))
    step = fxdp.trace(model, opt, F.cross_entropy, batches[0])
    assert {"aten::_cdist_forward", "aten::_cdist_backward"} <= ops_of(step)
    one_device(tmp_path, step, batches, world, **tol)


def test_cdist_of_many_rows_to_prototypes(tmp_path):
    """More than 25 rows: torch computes the euclidean cdist as a product (_euclidean_dist),
    B=29 over 3 ranks (10,10,9)."""
    torch.manual_seed(0)
    model = _Prototypes()
    opt, _ = optimizer(model, "sgd")
    batches = batches_of(randn(29, 8), randint(3, 29))
    step = fxdp.trace(model, opt, F.cross_entropy, batches[0])
    assert "aten::_euclidean_dist" in ops_of(step)
    one_device(tmp_path, step, batches, 3)


@pytest.mark.parametrize(
    "world,b", [(2, B), (3, B), (3, 29)], ids=["N2", "N3-uneven", "N3-euclidean"]
)
def test_in_batch_cdist_trains_like_one_device(tmp_path, world, b):
    """In-batch distances, cdist(f, f) (a worker failed with "Target 4 is out of bounds" when
    size matching placed them): the forward all-gathers x2; _cdist_backward for x1 gathers x2 too,
    and the one for x2, _cdist_backward(grad.T, x2, x1, p, cdist.T), gathers its x2 (fewer bytes
    than grad.T, x1 and cdist.T) and sums over the rank's x1 rows: a partial, all-reduced and
    sliced to each rank's rows. B=29: torch's product form (_euclidean_dist, above 25 rows), of f
    and f + 1."""
    torch.manual_seed(0)
    model = _Prototypes(coupled="shifted" if b > 25 else True)
    opt, _ = optimizer(model, "sgd")
    batches = batches_of(randn(b, 8), randint(3, b))
    step = fxdp.trace(model, opt, F.cross_entropy, batches[0])
    euclidean = "aten::_euclidean_dist" in ops_of(step)
    assert euclidean == (b > 25)
    # + one gather of f, read by the forward and by each backward (3 gathers of the same value
    # before), and x2's partial gradient; _euclidean_dist: one gather (read by the forward and
    # the gradient's mm, 2 before) and 2 partials (an mm and a sum over x1 rows)
    report = one_device(tmp_path, step, batches, world, reductions=3 if euclidean else 2)
    gathers = [c for c in report["collectives"] if c["purpose"].startswith("gather ")]
    assert len(gathers) == 1 and gathers[0]["bytes"] == world * -(-b // world) * 5 * 4, gathers


# ---- embedding_bag: bags are samples ----------------------------------------------------------


class _Bags(nn.Module):
    def __init__(self, mode):
        super().__init__()
        self.mode = mode
        self.bag = nn.EmbeddingBag(20, 6, mode=mode, padding_idx=0 if mode == "mean" else None)
        self.fc = nn.Linear(6, 3)

    def forward(self, tokens, weights=None):
        return self.fc(self.bag(tokens, per_sample_weights=weights))

    def makers(self):
        weights = [lambda g: torch.rand(B, 4, generator=g)] if self.mode == "sum" else []
        return (randint(20, B, 4), *weights, randint(3, B))


@pytest.mark.parametrize(
    "mode,world,optim",
    [("mean", 2, "sgd"), ("mean", 3, "adamw"), ("sum", 3, "sgd"), ("max", 2, "sgd")],
)
def test_embedding_bag_2d(tmp_path, mode, world, optim):
    """A 2-D input [B, L] (F.embedding_bag flattens it, offsets arange(0, B*L, L)): each rank
    builds its own offsets arange(0, B_r*L, L)."""
    torch.manual_seed(0)
    model = _Bags(mode)
    opt, tol = optimizer(model, optim)
    batches = batches_of(*model.makers())
    step = fxdp.trace(model, opt, F.cross_entropy, batches[0])
    assert {"aten::_embedding_bag", "aten::_embedding_bag_backward"} <= ops_of(step)
    one_device(tmp_path, step, batches, world, **tol)


class _FreqScaled(nn.Module):
    def __init__(self, bag: bool):
        super().__init__()
        self.bag = bag
        self.emb = (
            nn.EmbeddingBag(20, 6, scale_grad_by_freq=True)
            if bag
            else nn.Embedding(20, 6, scale_grad_by_freq=True)
        )
        self.fc = nn.Linear(6, 3)

    def forward(self, tokens):
        h = self.emb(tokens)
        return self.fc(h if self.bag else h.mean(1))


@pytest.mark.parametrize("bag", [False, True], ids=["embedding", "embedding_bag"])
def test_scale_grad_by_freq_is_refused(tmp_path, bag):
    """scale_grad_by_freq divides by each index's count in the whole batch; each rank would count
    only its own rows (it was accepted with a note and trained differently from one device)."""
    torch.manual_seed(0)
    model = _FreqScaled(bag)
    opt, _ = optimizer(model, "sgd")
    step = fxdp.trace(model, opt, F.cross_entropy, batches_of(randint(20, B, 4), randint(3, B))[0])
    refused(tmp_path, step, "backward", "scale_grad_by_freq=True", "use scale_grad_by_freq=False")


# ---- index_put: a parameter indexed by batch ids ------------------------------------------------


class _Table(nn.Module):
    """self.table[ids] with ids batch data: the backward adds each sample's gradient rows into
    zeros at its ids (index_put, accumulate=True), a partial sum over ranks."""

    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(10, 6))
        self.fc = nn.Linear(6, 3)

    def forward(self, ids):
        return self.fc(self.table[ids].mean(1))


@pytest.mark.parametrize("world,optim", [(2, "sgd"), (3, "sgd"), (2, "adamw"), (3, "adamw")])
def test_parameter_indexed_by_batch_ids(tmp_path, world, optim):
    torch.manual_seed(0)
    model = _Table()
    opt, tol = optimizer(model, optim)
    batches = batches_of(randint(10, B, 4), randint(3, B))
    step = fxdp.trace(model, opt, F.cross_entropy, batches[0])
    assert "aten::index_put" in ops_of(step)
    one_device(tmp_path, step, batches, world, **tol)


class _Overwrite(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 3)

    def forward(self, ids, feats):
        slots = feats.new_zeros(10, 6).index_put((ids,), self.fc.weight.sum() * feats)
        return self.fc(slots).sum(0, keepdim=True).expand(ids.shape[0], 3)


def test_index_put_without_accumulate_at_batch_indices_is_refused(tmp_path):
    torch.manual_seed(0)
    model = _Overwrite()
    opt, _ = optimizer(model, "sgd")
    step = fxdp.trace(
        model, opt, F.mse_loss, (torch.randperm(10)[:B], torch.randn(B, 6), torch.randn(B, 3))
    )
    refused(tmp_path, step, "aten::index_put", "without accumulate")


# ---- the formerly crashing graphs on real workers ----------------------------------------------


def test_on_real_workers(tmp_path):
    """The spatial transformer, 2-D embedding bags and cdist to prototypes on 3 real
    fxdp-worker processes (B=7: 3,2,2) equal one device."""
    torch.manual_seed(0)
    cases = [
        (_SpatialTransformer(), (randn(B, 1, 8, 8), randint(5, B))),
        (_Bags("mean"), _Bags("mean").makers()),
        (_Prototypes(), (randn(B, 8), randint(3, B))),
        (_Table(), (randint(10, B, 4), randint(3, B))),
    ]
    for i, (model, makers) in enumerate(cases):
        opt, _ = optimizer(model, "sgd")
        batches = batches_of(*makers)
        step = fxdp.trace(model, opt, F.cross_entropy, batches[0])
        (tmp_path / str(i)).mkdir()
        on_workers(tmp_path / str(i), step, batches, 3)


# ---- Hugging Face models (tiny configs built in code) ----------------------------------------


@pytest.mark.real_models
@pytest.mark.parametrize("world", [2, 3])
def test_mixtral_router_aux_loss(tmp_path, world):
    """transformers' Mixtral with output_router_logits=True: load_balancing_loss_func counts
    tokens per expert with histc (summed over ranks now: the aux loss was ~1/N of one device's);
    the batched_mm experts index the expert weights by the tokens' expert ids, whose backward is
    index_put(accumulate=True) with the batch in the indices. (The default grouped_mm experts
    sort the tokens, which is helper work of its own.)"""
    T = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = T.MixtralConfig(
        vocab_size=40,
        hidden_size=16,
        intermediate_size=24,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=16,
        output_router_logits=True,
        router_aux_loss_coef=0.5,
    )
    cfg._experts_implementation = "batched_mm"
    model = KeywordCall(T.MixtralForCausalLM(cfg), ("input_ids", "labels"))
    opt, _ = optimizer(model, "sgd")
    batches = batches_of(randint(40, 5, 6), randint(40, 5, 6))
    step = fxdp.trace(model, opt, None, batches[0])
    assert {"aten::histc", "aten::index_put"} <= ops_of(step)
    one_device(
        tmp_path, step, batches, world, reductions=2
    )  # histc's counts, the router probabilities


def tiny_whisper():
    """transformers' Whisper, a tiny config built here, called with (input_features, labels)
    and returning its own loss; the batch makers for `b` samples."""
    T = pytest.importorskip("transformers")
    cfg = T.WhisperConfig(
        vocab_size=40,
        num_mel_bins=8,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        d_model=16,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_source_positions=8,
        max_target_positions=16,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
        dropout=0.0,
    )
    model = KeywordCall(T.WhisperForConditionalGeneration(cfg), ("input_features", "labels"))
    return model, lambda b: (
        randn(b, 8, 16),
        lambda g: torch.randint(3, 40, (b, 5), generator=g),
    )


@pytest.mark.real_models
@pytest.mark.parametrize("world,b", [(2, 4), (3, 7)], ids=["N2", "N3-uneven"])
def test_whisper(tmp_path, world, b):
    """transformers' Whisper (tiny config, labels): the decoder's positions are repeated per
    sample, so the backward of embed_positions.weight[positions] adds every sample's rows
    (index_put, accumulate=True) with the batch in the values and indices. N=2 (B=4) and N=3
    (B=7: 3,2,2)."""
    torch.manual_seed(0)
    model, makers = tiny_whisper()
    opt, _ = optimizer(model, "sgd")
    batches = batches_of(*makers(b))
    step = fxdp.trace(model, opt, None, batches[0])
    assert "aten::index_put" in ops_of(step)
    one_device(tmp_path, step, batches, world)
