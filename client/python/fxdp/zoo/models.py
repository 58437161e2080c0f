"""Zoo models, losses, batches and optimizers."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

# --------------------------------------------------------------------------- models


class MLP(nn.Module):
    def __init__(self, d_in: int = 10, hidden: int = 16, d_out: int = 5):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(hidden, d_out)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class CNN(nn.Module):
    """Conv2d -> BatchNorm2d -> ReLU -> MaxPool2d -> flatten -> Linear."""

    def __init__(self, channels: int = 3, width: int = 8, hw: int = 10, classes: int = 7):
        super().__init__()
        # no conv bias: BatchNorm cancels it, its gradient would be pure rounding noise (which Adam
        # amplifies into O(lr) updates, making exact comparisons meaningless)
        self.conv = nn.Conv2d(channels, width, kernel_size=3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(width)
        self.act = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(width * (hw // 2) * (hw // 2), classes)

    def forward(self, x):
        x = self.pool(self.act(self.bn(self.conv(x))))
        return self.fc(torch.flatten(x, 1))


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention written with view/transpose/permute (no SDPA)."""

    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.heads = heads
        # no qkv bias: the key bias has an exactly-zero gradient (softmax is shift invariant), so
        # its computed gradient is rounding noise; see CNN.
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x):  # (B, S, D)
        b, s, d = x.shape
        h = self.heads
        qkv = self.qkv(x).view(b, s, 3, h, d // h).permute(2, 0, 3, 1, 4)  # (3, B, H, S, Dh)
        q, k, v = qkv[0], qkv[1], qkv[2]
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // h))  # (B, H, S, S)
        mask = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, s, d)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int, ff: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, ff)
        self.fc2 = nn.Linear(ff, d_model)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TransformerLM(nn.Module):
    """Decoder-only LM: token + positional embedding, blocks, final LayerNorm, vocab head."""

    def __init__(
        self,
        vocab: int = 23,
        d_model: int = 16,
        heads: int = 2,
        ff: int = 32,
        layers: int = 2,
        max_seq: int = 9,
    ):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(max_seq, d_model)
        self.blocks = nn.ModuleList([Block(d_model, heads, ff) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, idx):  # (B, S) int64
        s = idx.shape[1]
        pos = torch.arange(s, device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))  # (B, S, V)


def lm_loss(logits, targets):
    v = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, v), targets.reshape(-1))


class SeqFirstAttention(nn.Module):
    """Sequence-first model: input (S, B, F) with the batch on dim 1; per-position MLP plus a
    single-head self-attention over the sequence, written with transpose/permute/bmm."""

    def __init__(self, d_in: int = 10, d_model: int = 16, d_out: int = 4):
        super().__init__()
        self.inp = nn.Linear(d_in, d_model)
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model, bias=False)  # key bias has a zero gradient
        self.v = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, d_out)

    def forward(self, x):  # (S, B, F)
        h = torch.tanh(self.inp(x))  # (S, B, D)
        hb = h.transpose(0, 1)  # (B, S, D)
        q, k, v = self.q(hb), self.k(hb), self.v(hb)
        att = torch.softmax(q @ k.permute(0, 2, 1) / math.sqrt(q.shape[-1]), dim=-1)  # (B, S, S)
        y = (att @ v) + hb
        return self.out(y).permute(1, 0, 2)  # (S, B, out)


# --------------------------------------------------------------------------- entries


@dataclass
class ZooEntry:
    name: str
    make_model: Callable[[], nn.Module]
    loss_fn: Callable
    make_batch: Callable[[torch.Generator], Tuple[torch.Tensor, ...]]
    batch_dim: Union[int, Sequence[int]] = 0
    loss_reduction: str = "mean"
    input_names: Tuple[str, ...] = ("x", "target")

    def model(self, seed: int = 0) -> nn.Module:
        torch.manual_seed(seed)
        return self.make_model()

    def batch(self, step: int = 0, seed: int = 1234) -> Tuple[torch.Tensor, ...]:
        """A deterministic batch; different ``step`` values give different batches."""
        g = torch.Generator().manual_seed(seed + 7919 * step)
        return self.make_batch(g)

    def named_batch(self, step: int = 0, seed: int = 1234) -> Dict[str, torch.Tensor]:
        return dict(zip(self.input_names, self.batch(step, seed)))


def _mlp_batch(g):
    return torch.randn(12, 10, generator=g), torch.randn(12, 5, generator=g)


def _cnn_batch(g):
    return torch.randn(6, 3, 10, 10, generator=g), torch.randint(0, 7, (6,), generator=g)


def _lm_batch(g):
    toks = torch.randint(0, 23, (6, 8), generator=g)
    return toks[:, :-1].contiguous(), toks[:, 1:].contiguous()  # (6, 7) each


def _seqfirst_batch(g):
    return torch.randn(5, 12, 10, generator=g), torch.randn(5, 12, 4, generator=g)


MODELS: Dict[str, ZooEntry] = {
    "mlp": ZooEntry("mlp", MLP, nn.MSELoss(), _mlp_batch),
    "cnn": ZooEntry("cnn", CNN, nn.CrossEntropyLoss(), _cnn_batch),
    "transformer": ZooEntry(
        "transformer", TransformerLM, lm_loss, _lm_batch, input_names=("tokens", "target")
    ),
    "seqfirst": ZooEntry("seqfirst", SeqFirstAttention, nn.MSELoss(), _seqfirst_batch, batch_dim=1),
}

OPTIMIZERS: Dict[str, Callable[[nn.Module], torch.optim.Optimizer]] = {
    "sgd": lambda m, **kw: torch.optim.SGD(m.parameters(), **{"lr": 0.05, "momentum": 0.9, **kw}),
    "adam": lambda m, **kw: torch.optim.Adam(m.parameters(), **{"lr": 1e-2, **kw}),
    "adamw": lambda m, **kw: torch.optim.AdamW(
        m.parameters(), **{"lr": 1e-2, "weight_decay": 0.01, **kw}
    ),
}


def get(name: str) -> ZooEntry:
    return MODELS[name]


def make_optimizer(name: str, model: nn.Module, **overrides) -> torch.optim.Optimizer:
    return OPTIMIZERS[name](model, **overrides)


def trace_entry(name: str, optim: str = "adam", seed: int = 0, **optim_overrides):
    """Build the zoo model (seeded) and optimizer and trace it: returns (step, model, optimizer)."""
    import fxdp

    e = get(name)
    model = e.model(seed)
    opt = make_optimizer(optim, model, **optim_overrides)
    step = fxdp.trace(
        model,
        opt,
        e.loss_fn,
        e.batch(0),
        batch_dim=e.batch_dim,
        input_names=e.input_names,
        loss_reduction=e.loss_reduction,
    )
    return step, model, opt
