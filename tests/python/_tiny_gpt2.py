"""The tiny Hugging Face GPT-2 (config built in code, dropout off) that test_load_into,
test_meta_models and test_user_training_loop train: its config, a train step over
``{"input_ids"}`` batches (the ids are their own labels) and the batches."""

from __future__ import annotations

import torch

V, B, S = 64, 8, 8

CONFIG = dict(
    vocab_size=V,
    n_positions=16,
    n_embd=32,
    n_layer=2,
    n_head=2,
    resid_pdrop=0.0,
    embd_pdrop=0.0,
    attn_pdrop=0.0,
)


def train_step(model, opt, batch):
    loss = model(input_ids=batch["input_ids"], labels=batch["input_ids"]).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def batches(n: int):
    g = torch.Generator().manual_seed(1)
    return [{"input_ids": torch.randint(0, V, (B, S), generator=g)} for _ in range(n)]
