"""Dropless mixture-of-experts dispatch on N ranks (issue 23; analysis/batch_dim/row_order.cc).

transformers' default ``grouped_mm`` experts path flattens the tokens, sorts the (token, expert)
pairs by expert along the token dim, gathers the tokens in that order, runs each expert on its
group of rows (``torch._grouped_mm`` with offsets counted from the sorted keys), and puts the rows
back with the inverse permutation. Each rank sorts its own tokens: not a slice of the one-device
sort, but every step in between is row-wise, so the result is exact. The expanded graph runs on N
Gloo processes (``fxdp.dp_oracle``) and must equal one device; what depends on the tokens' order
across ranks (rows of the sorted order mixed with rows in batch order) is refused at compile time, naming the op, unless it can read the tokens all-gathered: a
capacity count along the tokens (cumsum over every token in batch order) is exact that way.
"""

from __future__ import annotations

import json
import subprocess

import fxdp
import pytest
import torch
import torch.nn.functional as F
from _hf_call import KeywordCall
from test_expand_oracle import FXDP, STEPS, check_against_one_device

E, K, D, H = 4, 2, 8, 16


class _DroplessMoE(torch.nn.Module):
    """The grouped_mm experts path written out (transformers.integrations.moe)."""

    def __init__(self, mix_orders=False, select=False, offsets="counts", argsort=False):
        super().__init__()
        self.argsort = argsort
        self.select = select
        self.offsets = offsets
        self.router = torch.nn.Linear(D, E, bias=False)
        self.w1 = torch.nn.Parameter(torch.randn(E, D, H) * 0.3)
        self.w2 = torch.nn.Parameter(torch.randn(E, H, D) * 0.3)
        self.head = torch.nn.Linear(D, 3)
        self.mix_orders = mix_orders
        if isinstance(select, str) and select.startswith(("gather", "scatter")):
            self.inp = torch.nn.Linear(D, D)  # h needs a gradient: gather's backward runs

    def forward(self, x):
        b, t, _ = x.shape
        h = x.reshape(-1, D)
        if hasattr(self, "inp"):
            h = self.inp(h)
        top_w, top_i = torch.topk(torch.softmax(self.router(h), -1), K, dim=-1)
        top_w = top_w / top_w.sum(-1, keepdim=True)
        ids, weights = top_i.reshape(-1), top_w.reshape(-1)
        keys = ids - 1 if self.offsets == "shifted" else ids  # "shifted": key -1 is no group
        if self.argsort:  # the sorted keys read back through the permutation
            perm = torch.argsort(keys, stable=True)
            ids_g = keys[perm]
        else:
            ids_g, perm = torch.sort(keys, descending=self.offsets == "descending")
        if self.select in ("gather", "scatter_add", "index_add", "scatter_twice"):  # h[perm // K]
            rows = torch.gather(h, 0, (perm // K).unsqueeze(1).expand(-1, D))
        elif self.select == "gather_ids":  # the bug: expert ids used as row numbers
            rows = torch.gather(h, 0, ids.unsqueeze(1).expand(-1, D))
        elif self.select == "gather_rowdim":  # the bug: positions broadcast over the gathered dim
            hh = h.repeat(1, perm.size(0) // D)
            rows = torch.gather(hh, 0, (perm // K).unsqueeze(0).expand(D, -1)).t()
        else:
            rows = torch.index_select(h, 0, perm // K) if self.select else h[perm // K]
        # the bug this refuses: the routing weights in token order against rows in expert order
        w_g = weights if self.mix_orders else weights[perm]
        counts = (ids_g.unsqueeze(1) == torch.arange(E)).sum(0)
        offs = torch.cumsum(
            counts.flip(0) if self.offsets == "flipped" else counts, 0, dtype=torch.int32
        )
        y = torch._grouped_mm(
            F.silu(torch._grouped_mm(rows, self.w1, offs=offs)), self.w2, offs=offs
        )
        y = y * w_g.unsqueeze(-1)
        if self.select in ("scatter_add", "index_add", "scatter_twice"):  # K rows into a token
            tok = (perm // K).view(-1, 1).expand(-1, D)
            back = torch.zeros_like(h)
            if self.select == "index_add":
                back = back.index_add(0, perm // K, y)
            elif self.select == "scatter_add":
                back = back.scatter_add(0, tok, y)
            else:  # the bug: K writes to each token, the last one wins
                back = back.scatter(0, tok, y)
            return self.head((h + back).view(b, t, D).mean(1))
        if isinstance(self.select, str):  # scatter to put the rows back in token order
            back = torch.zeros_like(y).scatter(0, perm.unsqueeze(1).expand(-1, D), y)
            return self.head((h + back.view(b * t, K, D).sum(1)).view(b, t, D).mean(1))
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(perm.size(0))
        y = y[inv].view(b * t, K, D).sum(1)
        return self.head((h + y).view(b, t, D).mean(1))


def _batches(b=6):
    g = torch.Generator().manual_seed(5)
    return [
        (torch.randn(b, 4, D, generator=g), torch.randn(b, 3, generator=g)) for _ in range(STEPS)
    ]


def _trace(model, optim, b=6):
    return fxdp.trace(model, optim, F.mse_loss, _batches(b)[0])


def _analyze(tmp_path, step, world=2):
    graph = str(tmp_path / "g.pb")
    step.save(graph)
    return subprocess.run(
        [FXDP, "analyze", graph, "--world-size", str(world), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "world,optim,b,select",
    [
        (2, "sgd", 6, False),
        (3, "adamw", 7, False),
        (2, "sgd", 6, True),
    ],
    ids=["N2", "N3-uneven", "N2-index_select"],
)
def test_dropless_moe_sorts_within_each_rank_and_trains_like_one_device(
    tmp_path, world, optim, b, select
):
    """sort/index (or index_select)/index_put/_grouped_mm along the token dim: every op has a
    rule, the sort is noted in the report, and B=6 over 2 ranks (3,3) or B=7 over 3 ranks (3,2,2)
    equals one device."""
    torch.manual_seed(0)
    model = _DroplessMoE(select=select)
    opt = (
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        if optim == "sgd"
        else torch.optim.AdamW(model.parameters(), lr=1e-2)
    )
    step = _trace(model, opt, b)
    ops = {n.target.name for n in step.graph.nodes}
    assert {"aten::sort", "aten::_grouped_mm", "aten::index_put"} <= ops
    r = _analyze(tmp_path, step, world)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["warnings"] == []
    assert any("sorts along the batch dim within each rank" in n for n in report["notes"])
    (tmp_path / "run").mkdir()
    report = check_against_one_device(tmp_path / "run", step, _batches(b), world)
    assert [s["size"] for s in report["slices"]] == ([3, 3] if world == 2 else [3, 2, 2])


@pytest.mark.parametrize("world,b", [(2, 6), (3, 7)], ids=["N2", "N3-uneven"])
def test_argsort_dispatch_trains_like_one_device(tmp_path, world, b):
    """perm = keys.argsort(stable=True) and the group counts taken from keys[perm] (not from the
    sort's values output): keys[perm] of the sort's own keys and indices is its values, so the
    offsets group every row by its key. It was refused ('offsets ... not cumsum(histc(keys ...))
    of the values of sort')."""
    torch.manual_seed(0)
    model = _DroplessMoE(argsort=True)
    step = _trace(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), b)
    r = _analyze(tmp_path, step, world)
    assert r.returncode == 0, r.stderr
    (tmp_path / "run").mkdir()
    check_against_one_device(tmp_path / "run", step, _batches(b), world)


GATHER = [(2, "sgd", 6, "gather"), (3, "adamw", 7, "gather"), (2, "adamw", 6, "scatter_add")]
GATHER += [(3, "sgd", 7, "scatter_add"), (2, "sgd", 6, "index_add")]
GATHER += [(3, "adamw", 7, "index_add")]


@pytest.mark.parametrize(
    "world,optim,b,select", GATHER, ids=[f"{s}-N{w}-{o}-B{b}" for w, o, b, s in GATHER]
)
def test_gather_scatter_over_expanded_positions_trains_like_one_device(
    tmp_path, world, optim, b, select
):
    """rows = torch.gather(h, 0, (perm // K).unsqueeze(1).expand(-1, D)) and the rows put back with
    zeros.scatter(0, perm.unsqueeze(1).expand(-1, D), y) (or summed into their tokens with
    scatter_add over perm // K, or index_add(0, perm // K, y)): the expanded index is the sort's
    positions in every column, so gather/scatter are x[p] / x[p] = v; gather's backward
    (scatter_add into new_zeros), scatter's (a gather) and index_add's (index_select) too. B=6
    over 2 ranks and B=7 over 3 (3,2,2) equal one device. It was refused at the unsqueeze ("row
    positions from sort 'sort', as values"); index_add as "not a fresh zero tensor"."""
    torch.manual_seed(0)
    model = _DroplessMoE(select=select)
    if optim == "sgd":
        opt, tol = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), {}
    else:
        opt, tol = torch.optim.AdamW(model.parameters(), lr=1e-2), dict(rtol=1e-4, atol=5e-5)
    step = _trace(model, opt, b)
    put_back = "aten::scatter" if select == "gather" else f"aten::{select}"
    ops = {n.target.name for n in step.graph.nodes}
    assert {"aten::gather", "aten::expand", put_back} <= ops, ops
    r = _analyze(tmp_path, step, world)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["warnings"] == []
    (tmp_path / "run").mkdir()
    report = check_against_one_device(tmp_path / "run", step, _batches(b), world, **tol)
    assert [s["size"] for s in report["slices"]] == ([3, 3] if world == 2 else [3, 2, 2])


@pytest.mark.parametrize(
    "select,needle",
    [
        ("gather_ids", "indexes along dim 0, which holds the batch"),
        ("gather_rowdim", "positions of batch rows on its dim 1"),
        ("scatter_twice", "writes each row 2 times without accumulate"),
    ],
)
def test_gather_over_an_index_that_is_not_rank_local_is_refused(tmp_path, select, needle):
    """torch.gather along the tokens with an index that is not a sort's positions (the expert ids
    used as row numbers), or with the positions broadcast over the dim gathered (column j of the
    result reads feature j of token p[j]: j numbers the rank's rows, not the batch's): refused at
    compile time naming the gather and the user's line; so is a scatter (no accumulate) of each
    token's K rows into it, where which write wins depends on the rows' order."""
    torch.manual_seed(0)
    model = _DroplessMoE(select=select)
    step = _trace(model, torch.optim.SGD(model.parameters(), lr=0.05))
    r = _analyze(tmp_path, step)
    assert r.returncode != 0, f"accepted: {r.stdout[:300]}"
    op, line = ("gather", "rows = torch.gather(h")
    if select == "scatter_twice":
        op, line = ("scatter", "back = back.scatter(")
    assert f"(aten::{op}" in r.stderr and f"in model: {line}" in r.stderr, r.stderr
    assert needle in r.stderr, r.stderr


def test_rows_of_two_orders_are_refused(tmp_path):
    """Routing weights in token order multiplied with rows in expert order: the analysis names
    the mul and the sort whose rank-local order the rows are in."""
    torch.manual_seed(0)
    model = _DroplessMoE(mix_orders=True)
    step = _trace(model, torch.optim.SGD(model.parameters(), lr=0.05))
    r = _analyze(tmp_path, step)
    assert r.returncode != 0
    assert (
        "aten::mul" in r.stderr and "the order sort 'sort' put each rank's rows in" in r.stderr
    ), r.stderr
    assert "whose rows are in batch order" in r.stderr, r.stderr


class _CapacityRouter(torch.nn.Module):
    """Switch-style capacity: each token's position in its expert's queue is a cumsum over the
    tokens, which depends on the tokens of every rank before it."""

    def __init__(self):
        super().__init__()
        self.router = torch.nn.Linear(D, E, bias=False)
        self.head = torch.nn.Linear(D, 3)

    def forward(self, x):
        h = x.reshape(-1, D)
        probs = torch.softmax(self.router(h), -1)
        onehot = (probs.argmax(-1, keepdim=True) == torch.arange(E)).float()
        keep = (torch.cumsum(onehot, 0) * onehot).sum(-1) <= 4.0
        y = h * (probs.max(-1).values * keep).unsqueeze(-1)
        return self.head(y.view(x.shape).mean(1))


def test_capacity_limit_over_the_tokens_trains_like_one_device(tmp_path):
    """A capacity count along the tokens (cumsum of the routing one-hots over the token dim, which
    holds the batch) all-gathers the one-hots and counts over every token in batch order on every
    rank, as one device does: B=7 over 3 ranks (3,2,2) equals one device."""
    torch.manual_seed(0)
    model = _CapacityRouter()
    step = _trace(model, torch.optim.SGD(model.parameters(), lr=0.05), 7)
    r = _analyze(tmp_path, step, 3)
    assert r.returncode == 0, r.stderr
    notes = json.loads(r.stdout)["notes"]
    assert any("cumsum: all-gathers" in n and "works along it whole" in n for n in notes), notes
    (tmp_path / "run").mkdir()
    report = check_against_one_device(tmp_path / "run", step, _batches(7), 3, reductions=1)
    assert [c["purpose"] for c in report["collectives"]][0] == "gather _to_copy for cumsum"


class _SortedCapacity(torch.nn.Module):
    """Tokens sorted by expert, then a capacity limit counted along the sorted rows (each token's
    place in its expert's queue: cumsum), or the top 3 sorted rows kept (topk along the tokens)."""

    def __init__(self, op):
        super().__init__()
        self.op = op
        self.router = torch.nn.Linear(D, E, bias=False)
        self.head = torch.nn.Linear(D, 3)

    def forward(self, x):
        h = x.reshape(-1, D)
        ids, perm = torch.sort(torch.softmax(self.router(h), -1).argmax(-1))
        rows = h[perm]
        onehot = (ids.unsqueeze(1) == torch.arange(E)).float()
        if self.op == "cumsum":
            keep = ((torch.cumsum(onehot, 0) * onehot).sum(-1) <= 4.0).float()
        else:
            keep = torch.zeros(rows.shape[0]).index_fill(0, torch.topk(rows[:, 0], 3).indices, 1.0)
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(perm.size(0))
        return self.head((rows * keep.unsqueeze(-1))[inv].view(x.shape).mean(1))


@pytest.mark.parametrize("op", ["cumsum", "topk"])
def test_capacity_over_rows_in_a_ranks_sorted_order_is_refused(tmp_path, op):
    """Work along the tokens after each rank sorted its own: the sorted rows are not a slice of
    one device's order, so they cannot be all-gathered into it; refused naming the op, the user's
    line and why (in batch order the same count is exact:
    test_capacity_limit_over_the_tokens_trains_like_one_device)."""
    torch.manual_seed(0)
    model = _SortedCapacity(op)
    step = _trace(model, torch.optim.SGD(model.parameters(), lr=0.05))
    r = _analyze(tmp_path, step)
    assert r.returncode != 0, f"accepted: {r.stdout[:300]}"
    assert f"node '{op}' (aten::{op}) [" in r.stderr, r.stderr
    assert "test_moe_dispatch.py:" in r.stderr and "in model: keep = " in r.stderr, r.stderr
    assert "cannot be all-gathered for it: its rows are in a rank-local order" in r.stderr, r.stderr


class _SortedRows(torch.nn.Module):
    """Tokens sorted by a router score, a row-wise layer in that order, put back; `use` picks a
    way to read the sort's positions (or its values) that is not a row permutation."""

    def __init__(self, use):
        super().__init__()
        self.use = use
        self.router = torch.nn.Linear(D, 1, bias=False)
        self.lin = torch.nn.Linear(D, D)
        self.head = torch.nn.Linear(D, 3)
        self.w = torch.nn.Parameter(torch.randn(D, 3) * 0.1)

    def forward(self, x):
        b, t, _ = x.shape
        h = x.reshape(-1, D)
        _, perm = torch.sort(self.router(h)[:, 0])
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(perm.size(0))
        rows = self.lin(h[perm])
        if self.use == "shared":  # the arange of the inverse also scales the tokens
            inv = torch.empty_like(perm)
            pos = torch.arange(perm.size(0))
            inv[perm] = pos
            h = h * (pos.float().unsqueeze(1) * 0.1)
        if self.use == "perm":  # the k-th row of each rank's order scaled by k
            rows = rows * (perm.float().unsqueeze(1) * 0.1)
        y = rows[inv]
        if self.use == "inv":  # each token scaled by its place in the rank's order
            y = y * (inv.float().unsqueeze(1) * 0.1)
        out = self.head((h + y).view(b, t, D).mean(1))
        if self.use == "columns":  # h sorted along the tokens: one permutation per column
            s = torch.sort(h, dim=0).values
            out = out + (s[:, :1] * s).sum(0) @ self.w
        return out


@pytest.mark.parametrize(
    "use,op,needle",
    [
        ("perm", "aten::_to_copy", "row positions from sort 'sort', as values"),
        ("inv", "aten::_to_copy", "row positions from sort 'sort', as values"),
        ("columns", "aten::sort", "each of its 8 columns gets its own permutation"),
        ("shared", "aten::index_put", "each rank's inverse needs its own arange(n_r)"),
    ],
)
def test_reading_a_sort_as_more_than_a_row_permutation_is_refused(tmp_path, use, op, needle):
    """A sort's indices number each rank's own rows 0..n_r-1 (0..B-1 on one device): read as
    values (perm.float(), inv.float()) they differ from one device, as does sorting a 2-D tensor
    along the tokens (each column its own order, then mixed), as does an arange that builds the
    inverse (each rank's arange(n_r)) and also scales the tokens (the batch's positions). All four
    were accepted and trained differently from one device (lin.weight, head.weight, w off by up to
    35% at N=2)."""
    torch.manual_seed(0)
    model = _SortedRows(use)
    step = _trace(model, torch.optim.SGD(model.parameters(), lr=0.05))
    r = _analyze(tmp_path, step)
    assert r.returncode != 0, f"accepted: {r.stdout[:300]}"
    assert op in r.stderr and needle in r.stderr, r.stderr


def test_sorted_rows_put_back_train_like_one_device(tmp_path):
    """The same model using the sort only as a row permutation: accepted and exact at N=2."""
    torch.manual_seed(0)
    model = _SortedRows("none")
    step = _trace(model, torch.optim.SGD(model.parameters(), lr=0.05))
    (tmp_path / "run").mkdir()
    check_against_one_device(tmp_path / "run", step, _batches(), 2)


@pytest.mark.parametrize(
    "offsets,needle",
    [
        (
            "flipped",
            "that are not cumsum(histc(keys, G, 0, G - 1)) or cumsum((keys.unsqueeze(1) == arange(G)).sum(0))",
        ),
        ("descending", "which is descending"),
        ("shifted", "but the keys are not shown to be groups"),
    ],
)
def test_offsets_that_do_not_put_each_row_in_its_keys_group_are_refused(tmp_path, offsets, needle):
    """_grouped_mm's offsets must put every row in its key's group, whatever the rank's other rows:
    counts flipped before the cumsum, a descending sort, or keys outside 0..E-1 (ids - 1: the rows
    of key -1 sort first but are counted nowhere) make a row's group depend on how many rows of
    each key its rank holds. All three were accepted and trained w1 differently from one device."""
    torch.manual_seed(0)
    model = _DroplessMoE(offsets=offsets)
    step = _trace(model, torch.optim.SGD(model.parameters(), lr=0.05))
    r = _analyze(tmp_path, step)
    assert r.returncode != 0, f"accepted: {r.stdout[:300]}"
    assert "aten::_grouped_mm" in r.stderr and needle in r.stderr, r.stderr


transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
V = 64


def _hf_moe(name):
    T = transformers
    common = dict(
        vocab_size=V,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=16,
        num_experts_per_tok=2,
        output_router_logits=True,
        router_aux_loss_coef=0.1,
    )
    if name == "mixtral":
        return T.MixtralForCausalLM(
            T.MixtralConfig(intermediate_size=64, num_local_experts=4, **common)
        )
    return T.Qwen2MoeForCausalLM(
        T.Qwen2MoeConfig(
            intermediate_size=64,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
            num_experts=4,
            **common,
        )
    )


# Each family at N=2 (B=6: 3,3) and N=3 (B=7: 3,2,2) under AdamW (what they are trained with),
# Adam and SGD with momentum.
HF = [
    (name, world, b, optim)
    for name in ("mixtral", "qwen2_moe")
    for world, b in ((2, 6), (3, 7))
    for optim in ("adamw", "adam", "sgd")
]


def _hf_optimizer(model, optim):
    """The optimizer and the tolerances the issue sets for it (SGD rtol 1e-5/atol 1e-6, the Adam
    family rtol 1e-4/atol 5e-5: its normalisation amplifies the per-rank sums' rounding)."""
    if optim == "sgd":
        sgd = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        return sgd, dict(rtol=1e-5, atol=1e-6)
    cls = torch.optim.AdamW if optim == "adamw" else torch.optim.Adam
    return cls(model.parameters(), lr=1e-2), dict(rtol=1e-4, atol=5e-5)


def hf_moe_traced(name, b, make_optimizer):
    """The HF MoE model with its own loss (cross-entropy plus the router's load-balancing loss),
    traced on STEPS batches of b x 8 tokens (labels = inputs); the default experts path (sort,
    grouped_mm, histc) asserted. Returns (step, batches, tolerances of make_optimizer)."""
    model = KeywordCall(_hf_moe(name), ("input_ids", "labels")).train()
    opt, tol = make_optimizer(model)
    g = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(STEPS):
        ids = torch.randint(0, V, (b, 8), generator=g)
        batches.append((ids, ids.clone()))
    step = fxdp.trace(model, opt, None, batches[0])
    assert {"aten::sort", "aten::_grouped_mm", "aten::histc"} <= {
        n.target.name for n in step.graph.nodes
    }
    return step, batches, tol


@pytest.mark.parametrize("name,world,b,optim", HF, ids=[f"{m}-N{n}-{o}" for m, n, _, o in HF])
def test_hugging_face_moe_trains_like_one_device(tmp_path, name, world, b, optim):
    """transformers' Mixtral and Qwen2-MoE, default (grouped_mm) experts, output_router_logits=True
    (the load-balancing loss counts tokens per expert with histc), under AdamW, Adam and SGD with
    momentum: B=6 over 2 ranks and B=7 over 3 (3,2,2) equal one device."""
    torch.manual_seed(0)
    step, batches, tol = hf_moe_traced(name, b, lambda model: _hf_optimizer(model, optim))
    r = _analyze(tmp_path, step, world)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["warnings"] == []
    (tmp_path / "run").mkdir()
    # + the load-balancing loss's two partial sums over the tokens (tokens and router probability
    # per expert), all-reduced before their product
    check_against_one_device(tmp_path / "run", step, batches, world, reductions=2, **tol)
