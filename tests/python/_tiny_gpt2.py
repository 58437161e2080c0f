"""The tiny Hugging Face GPT-2 (config built in code, dropout off) that test_load_into,
test_meta_models and test_user_training_loop train: its config, a train step over
``{"input_ids"}`` batches (the ids are their own labels) and the batches; and issue 26's
newcomer (test_shape_jobs, test_dataset_shapes, test_micro_batch_rows): a padding collator,
a step with clipping, and a DataLoader epoch of mixed lengths with a partial last batch."""

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


PAD = 0


def pad_collate(samples):
    """Dynamic padding: each batch padded to its longest sequence (right), labels -100 there."""
    n = max(len(s) for s in samples)
    ids = torch.full((len(samples), n), PAD, dtype=torch.long)
    mask = torch.zeros(len(samples), n, dtype=torch.long)
    labels = torch.full((len(samples), n), -100, dtype=torch.long)
    for i, s in enumerate(samples):
        ids[i, : len(s)], mask[i, : len(s)], labels[i, : len(s)] = s, 1, s
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def gpt2_step(model, opt, batch):
    loss = model(**batch).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad()
    return loss


def padded_epoch(seed: int):
    """15 samples of 5-29 tokens in batches of 4 (the last one partial), dynamically padded."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(5, 30, (15,), generator=g).tolist()
    data = [torch.randint(1, V, (n,), generator=g) for n in lengths]
    return torch.utils.data.DataLoader(data, batch_size=4, collate_fn=pad_collate, drop_last=False)
