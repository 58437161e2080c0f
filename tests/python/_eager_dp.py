"""fxdp's data parallelism emulated in one process with eager PyTorch (test_real_models,
test_worker_dist): what a run on N ranks must equal where one device's run is not the reference
(rank-local BatchNorm statistics)."""

from __future__ import annotations

import copy
from typing import Dict

import torch
from fxdp.dp_oracle import balanced_slices


def rank_local_eager(model, opt, loss_of, batches, bdims, world: int) -> Dict[str, torch.Tensor]:
    """fxdp's data parallelism emulated in one process with eager PyTorch: every rank's replica
    runs ``loss_of(replica, shard).backward()`` on its slice (BatchNorm normalising with the
    slice's statistics); the gradients and the BatchNorm running statistics are combined with
    weights B_r/B (the expansion's scaled all-reduces); one optimizer step per batch. Returns the
    state under fxdp's names (parameters, buffers, ``optim.<param>.<key>``)."""
    for full in batches:
        b = full[0].shape[bdims[0]]
        grads = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
        bufs = {n: torch.zeros_like(v) for n, v in model.named_buffers()}
        for start, size in balanced_slices(b, world):
            replica = copy.deepcopy(model)
            shard = [x.narrow(d, start, size) if d >= 0 else x for x, d in zip(full, bdims)]
            loss_of(replica, shard).backward()
            w = size / b
            for n, p in replica.named_parameters():
                if p.grad is not None:
                    grads[n] += p.grad * w
            for n, v in replica.named_buffers():
                if v.is_floating_point():
                    bufs[n] += v * w
                else:
                    bufs[n] = v.clone()  # num_batches_tracked: the same on every rank
        for n, p in model.named_parameters():
            p.grad = grads[n]
        opt.step()
        with torch.no_grad():
            for n, v in model.named_buffers():
                v.copy_(bufs[n])
    pname = {id(p): n for n, p in model.named_parameters()}
    state = {n: p.detach().clone() for n, p in model.named_parameters()}
    state.update({n: v.clone() for n, v in model.named_buffers()})
    for p, st in opt.state.items():
        for k, v in st.items():
            if v is not None:
                state[f"optim.{pname[id(p)]}.{k}"] = torch.as_tensor(v).clone()
    return state
