"""pytorch/tutorials' text classification (text_sentiment_ngrams_tutorial) on N ranks: an
EmbeddingBag over a flat 1-D text with one offset per sample (the tutorial's collate_batch
concatenates the samples' tokens and takes offsets = cumsum([0] + lengths[:-1])), a batch of
variable total length. The batch is the offsets' (and labels') dim 0; the text has none
(batch_dim=-1). The text is split by bags (a ragged input, issue 23): each rank reads only its
bags' tokens and its offsets rebased to them (the rank graphs' "fxdp.ragged"; every splitter cuts
it: fxdp.dp_oracle here, the workers and the server), computes its own bags, and the table's
gradient is all-reduced like any other. Where something else reads the text or the offsets, the
text stays whole on every rank and the offsets are all-gathered (exact too). Before, the worker
failed ("offsets[0] has to be 0"), then the compile step refused the graph.
"""

from __future__ import annotations

import json
import subprocess

import fxdp
import pytest
import torch
import torch.nn.functional as F
from test_expand_oracle import FXDP, STEPS, check_against_one_device
from test_op_rule_models import B, on_workers, optimizer, refused
from torch import nn

V = 20
# Tokens per step: 170 in 7 bags move more bytes than the 20x6 table's gradient, so the text is
# split by bags; 17 move fewer, so it is read whole (the analysis picks the cheaper, exact both).
TOKENS = 170


class _TextClassifier(nn.Module):
    """The tutorial's TextClassificationModel, small."""

    def __init__(self, mode="mean"):
        super().__init__()
        self.embedding = nn.EmbeddingBag(V, 6, mode=mode)
        self.fc = nn.Linear(6, 3)

    def forward(self, text, offsets):
        return self.fc(self.embedding(text, offsets))


def collate(lengths, g):
    """The tutorial's collate_batch for samples of these token counts: (text, offsets, labels)."""
    text = torch.randint(0, V, (sum(lengths),), generator=g)
    offsets = torch.tensor([0] + lengths[:-1]).cumsum(0)
    return text, offsets, torch.randint(0, 3, (len(lengths),), generator=g)


def batches_of_total(total, b, seed=5):
    """STEPS batches of b samples whose lengths (1..) differ per step but add up to `total`."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(STEPS):
        cuts = torch.randperm(total - 1, generator=g)[: b - 1].add(1).sort().values.tolist()
        lengths = [e - s for s, e in zip([0, *cuts], [*cuts, total])]
        out.append(collate(lengths, g))
    return out


def trace(model, opt, batch, **kw):
    return fxdp.trace(model, opt, F.cross_entropy, batch, batch_dim=[-1, 0, 0], **kw)


@pytest.mark.parametrize(
    "mode,world,optim",
    [
        ("mean", 2, "sgd"),
        ("mean", 3, "sgd"),
        ("mean", 3, "adamw"),
        ("sum", 2, "sgd"),
        ("max", 2, "sgd"),
    ],
)
def test_text_classifier_trains_like_one_device(tmp_path, mode, world, optim):
    """B=7 bags of 170 tokens in all (4,3 and 3,2,2 bags per rank): split by bags, nothing
    gathered, the table's gradient in a bucket with the others; equal to one device."""
    torch.manual_seed(0)
    model = _TextClassifier(mode)
    opt, tol = optimizer(model, optim)
    batches = batches_of_total(TOKENS, B)
    step = trace(model, opt, batches[0])
    assert {"aten::_embedding_bag", "aten::_embedding_bag_backward"} <= {
        n.target.name for n in step.graph.nodes
    }
    report = check_against_one_device(tmp_path, step, batches, world, **tol)
    assert [c for c in report["collectives"] if c["op"] == "all_gather_into_tensor"] == []
    notes = " ".join(report["notes"])
    assert "x_input_0 split by the bags of x_input_1 (metadata fxdp.ragged)" in notes, notes
    assert any("embedding.weight" in b["gradients"] for b in report["buckets"]), report
    rank1 = fxdp.load(report["files"][-1]["path"]).metadata()
    assert rank1["fxdp.ragged"] == "input.0 input.1\n"


def test_a_short_text_is_read_whole(tmp_path):
    """17 tokens: each rank reading every bag's tokens and all-gathering the offsets and the bags'
    gradient rows moves fewer bytes than all-reducing the 20x6 table's gradient (N=2: 180 bytes
    per rank against 480), so the text is read whole; the note gives both; equal to one device."""
    torch.manual_seed(0)
    model = _TextClassifier()
    opt, tol = optimizer(model, "sgd")
    batches = batches_of_total(17, B)
    report = check_against_one_device(
        tmp_path, trace(model, opt, batches[0]), batches, 2, reductions=2, **tol
    )
    notes = " ".join(report["notes"])
    assert "x_input_0 read whole by every rank" in notes, notes
    assert "(180 bytes per rank per step) rather than splitting by bags" in notes, notes
    assert "all-reducing the table's gradient (480 bytes)" in notes, notes
    assert all("embedding.weight" not in b["gradients"] for b in report["buckets"]), report


class _TwoTables(nn.Module):
    """Two bags' ops over one text and offsets (a mean and a max table, concatenated)."""

    def __init__(self):
        super().__init__()
        self.mean = nn.EmbeddingBag(V, 6)
        self.max = nn.EmbeddingBag(V, 6, mode="max")
        self.fc = nn.Linear(12, 3)

    def forward(self, text, offsets):
        return self.fc(torch.cat([self.mean(text, offsets), self.max(text, offsets)], 1))


@pytest.mark.parametrize("tokens,split", [(400, True), (170, False)])
def test_two_tables_over_one_text_make_one_choice(tmp_path, tokens, split):
    """N=3: the choice is the text's, for both tables: splitting all-reduces both tables'
    gradients (2 x 480 bytes x 4/3), so 400 tokens are split and 170 read whole (which one table
    alone would split); either way equal to one device, and both ops' notes say the same."""
    torch.manual_seed(0)
    model = _TwoTables()
    opt, tol = optimizer(model, "sgd")
    batches = batches_of_total(tokens, B)
    step = trace(model, opt, batches[0])
    report = check_against_one_device(
        tmp_path, step, batches, 3, reductions=0 if split else 3, **tol
    )
    choice = "split by the bags of x_input_1" if split else "read whole by every rank"
    notes = [n for n in report["notes"] if "x_input_0" in n and "rather than" in n]
    assert len(notes) == 2 and all(choice in n for n in notes), notes
    assert ("fxdp.ragged" in fxdp.load(report["files"][-1]["path"]).metadata()) == split


class _TokensToo(nn.Module):
    """The text read besides the bags (a mean of its tokens' embeddings added to every bag):
    each rank needs all of it, so it is not split."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.EmbeddingBag(V, 6)
        self.tokens = nn.Embedding(V, 6)
        self.fc = nn.Linear(6, 3)

    def forward(self, text, offsets):
        return self.fc(self.embedding(text, offsets) + self.tokens(text).mean(0))


def test_a_text_read_besides_the_bags_stays_whole(tmp_path):
    """N=3: the offsets all-gathered, every rank computes every bag (and the token mean over the
    whole text), no fxdp.ragged; equal to one device."""
    torch.manual_seed(0)
    model = _TokensToo()
    opt, tol = optimizer(model, "sgd")
    batches = batches_of_total(TOKENS, B)
    step = trace(model, opt, batches[0])
    report = check_against_one_device(tmp_path, step, batches, 3, reductions=2, **tol)
    gathers = [c["purpose"] for c in report["collectives"] if c["op"] == "all_gather_into_tensor"]
    assert gathers == [
        "gather x_input_1 for _embedding_bag",
        "gather mm for _embedding_bag_backward",
    ]
    assert "fxdp.ragged" not in fxdp.load(report["files"][-1]["path"]).metadata()


def test_the_tutorials_step_with_clipping(tmp_path):
    """The tutorial's own train step: CrossEntropyLoss, backward, clip_grad_norm_(0.1), SGD lr=5
    (the clipping norm reads the table's whole gradient and fc's all-reduced ones); N=3."""
    torch.manual_seed(0)
    model = _TextClassifier()
    opt = torch.optim.SGD(model.parameters(), lr=5.0)
    criterion = nn.CrossEntropyLoss()

    def train_step(m, o, batch):
        text, offsets, label = batch
        loss = criterion(m(text, offsets), label)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 0.1)
        o.step()
        o.zero_grad()
        return loss

    batches = batches_of_total(TOKENS, B)
    step = fxdp.trace_step(train_step, model, opt, batches[0], batch_dim=[-1, 0, 0])
    check_against_one_device(tmp_path, step, batches, 3)


class _WeightedBags(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.EmbeddingBag(V, 6, mode="sum")
        self.fc = nn.Linear(6, 3)

    def forward(self, text, offsets, weights):
        return self.fc(self.embedding(text, offsets, per_sample_weights=weights))


def weighted_bags():
    """_WeightedBags under SGD traced over TOKENS-token batches with one weight per token
    (per_sample_weights batch_dim=-1 like the text): (step, batches)."""
    torch.manual_seed(0)
    model = _WeightedBags()
    opt, _ = optimizer(model, "sgd")
    g = torch.Generator().manual_seed(4)
    batches = [
        (t, o, torch.rand(t.shape[0], generator=g), y) for t, o, y in batches_of_total(TOKENS, B)
    ]
    return fxdp.trace(model, opt, F.cross_entropy, batches[0], batch_dim=[-1, 0, -1, 0]), batches


def test_per_sample_weights_are_split_with_the_text(tmp_path):
    """per_sample_weights, one per token, batch_dim=-1 like the text: split by the same bags;
    N=3 equals one device."""
    step, batches = weighted_bags()
    report = check_against_one_device(tmp_path, step, batches, 3)
    notes = " ".join(report["notes"])
    assert "x_input_0 and x_input_2 split by the bags of x_input_1" in notes, notes


def test_one_symbolic_trace_for_every_total_length(tmp_path):
    """dynamic=True: one trace for batches of any total length and size; instantiated at 170
    tokens in 7 bags and 230 tokens in 6 bags, each equals one device on 2 ranks."""
    torch.manual_seed(0)
    model = _TextClassifier()
    opt, _ = optimizer(model, "sgd")
    step = trace(model, opt, batches_of_total(TOKENS, B)[0], dynamic=True)
    assert step.is_symbolic()
    for total, b in ((TOKENS, B), (230, 6)):
        batches = batches_of_total(total, b, seed=total)
        (tmp_path / str(total)).mkdir()
        check_against_one_device(tmp_path / str(total), step.instantiate(batches[0]), batches, 2)


def test_on_real_workers(tmp_path):
    """3 real fxdp-worker processes (LibTorch), B=7 (3,2,2), each slicing the global batch files
    itself (ShardBatch): a rank reads only its bags' tokens, its offsets rebased to them; equal
    to one device."""
    torch.manual_seed(0)
    model = _TextClassifier()
    opt, _ = optimizer(model, "sgd")
    batches = batches_of_total(TOKENS, B)
    on_workers(tmp_path, trace(model, opt, batches[0]), batches, 3)


def test_a_flat_input_that_holds_the_batch_is_refused(tmp_path):
    """The flat input given batch_dim 0 (it happens to have as many tokens as samples): a rank's
    share of it would depend on the offsets; refused naming the op, the user's line and both ways
    out (batch_dim=-1 for the flat input, or a 2-D input)."""
    torch.manual_seed(0)
    model = _TextClassifier()
    opt, _ = optimizer(model, "sgd")
    g = torch.Generator().manual_seed(1)
    text, offsets, labels = collate([1, 2, 1, 1, 1, 0, 1], g)
    step = fxdp.trace(model, opt, F.cross_entropy, (text, offsets, labels))
    refused(
        tmp_path,
        step,
        "node '_embedding_bag' (aten::_embedding_bag) [",
        "in model.embedding: return self.fc(self.embedding(text, offsets))]",
        "a rank's share of the input depends on the data",
        "give the flat input batch_dim=-1",
        "pass a 2-D input",
    )


def test_analyze_places_every_node(tmp_path):
    """No op falls back to size matching (`fxdp analyze` warns of none)."""
    torch.manual_seed(0)
    model = _TextClassifier()
    opt, _ = optimizer(model, "sgd")
    step = trace(model, opt, batches_of_total(TOKENS, B)[0])
    step.save(str(tmp_path / "g.pb"))
    r = subprocess.run(
        [FXDP, "analyze", str(tmp_path / "g.pb"), "--world-size", "2", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["warnings"] == []


def test_an_evaluation_step_is_split_by_bags(tmp_path):
    """fxdp.trace_eval of the classifier: no table gradient, so splitting moves nothing and the
    text is split even at 17 tokens; the note says no all-reduce."""
    torch.manual_seed(0)
    model = _TextClassifier().eval()
    batch = batches_of_total(17, B)[0]
    step = fxdp.trace_eval(
        lambda m, b: F.cross_entropy(m(b[0], b[1]), b[2]), model, batch, batch_dim=[-1, 0, 0]
    )
    step.save(str(tmp_path / "e.pb"))
    r = subprocess.run(
        [FXDP, "expand", str(tmp_path / "e.pb"), "--world-size", "2", "-o", str(tmp_path / "x.pb")]
        + ["--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    notes = " ".join(report["notes"])
    assert "computes its own bags (0 bytes per rank per step) rather than reading" in notes, notes
    assert fxdp.load(report["files"][-1]["path"]).metadata()["fxdp.ragged"] == "input.0 input.1\n"
