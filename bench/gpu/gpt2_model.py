"""The Hugging Face model of the GPU check (docs/gpu.md): transformers' GPT2LMHeadModel from a
config in code (no weights, dropout off) with AdamW. The same code traces it here (bench/gpu/pack.py)
and runs it eagerly and under torch.compile on the device (bench/gpu/eager.py). Imports only torch
and transformers (the device has no fxdp package installed).

``attn``: "eager" (matmul + softmax: the traced graph runs on any device) or "sdpa" (transformers'
default: traced on a CPU it calls aten::_scaled_dot_product_flash_attention_for_cpu, a CPU-only
kernel, which the GPU check expects to fail on cuda:0, naming the op)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# name -> size; "batch" is the global batch (sequences of seq tokens)
SIZES = {
    "gpt2_tiny": dict(layers=2, hidden=64, heads=4, seq=32, vocab=256, batch=4, attn="eager"),
    "gpt2_tiny_sdpa": dict(layers=2, hidden=64, heads=4, seq=32, vocab=256, batch=4, attn="sdpa"),
    # dropout 0.1 (transformers' default): fxdp's Philox draws on the host, the same on any device
    "gpt2_tiny_dropout": dict(
        layers=2, hidden=64, heads=4, seq=32, vocab=256, batch=4, attn="eager", dropout=0.1
    ),
    # the step timed on the GPU: 6 x 512, 8 heads, vocabulary 8192, 8 x 256 tokens (~23M params)
    "gpt2_step": dict(layers=6, hidden=512, heads=8, seq=256, vocab=8192, batch=8, attn="eager"),
}
LR = 1e-3


class GPT2(nn.Module):
    def __init__(self, layers: int, hidden: int, heads: int, seq: int, vocab: int, attn: str, **kw):
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(
            vocab_size=vocab,
            n_positions=seq,
            n_embd=hidden,
            n_layer=layers,
            n_head=heads,
            resid_pdrop=kw.get("dropout", 0.0),
            embd_pdrop=kw.get("dropout", 0.0),
            attn_pdrop=kw.get("dropout", 0.0),
            bos_token_id=0,
            eos_token_id=0,
        )
        cfg._attn_implementation = attn
        self.lm = GPT2LMHeadModel(cfg)

    def forward(self, tokens):
        return self.lm(input_ids=tokens).logits


def lm_loss(logits, targets):
    """fxdp.zoo.models.lm_loss (mean cross-entropy over every token)."""
    v = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, v), targets.reshape(-1))


def make(name: str, seed: int = 0):
    """The model (seeded) and its AdamW."""
    torch.manual_seed(seed)
    model = GPT2(**SIZES[name])
    return model, torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)


def batch(name: str, seed: int = 1234):
    """(tokens, target), each (batch, seq) int64."""
    s = SIZES[name]
    g = torch.Generator().manual_seed(seed)
    toks = torch.randint(0, s["vocab"], (s["batch"], s["seq"] + 1), generator=g)
    return toks[:, :-1].contiguous(), toks[:, 1:].contiguous()
