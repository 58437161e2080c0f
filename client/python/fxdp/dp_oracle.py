"""One rank of a data-parallel run of an expanded fxdp graph, with PyTorch as the executor.

The reference executor for ``fxdp expand`` output (used by tests/python/test_expand_oracle.py
and ``make demo``): the expanded GraphDef is loaded back into torch.fx
(fxdp.convert.graphdef_to_fx) and run under a real Gloo process group, where
``_c10d_functional`` collectives resolve the default group ("0") by name.

usage: python -m fxdp.dp_oracle RANK WORLD PORT GRAPH STATE.safetensors DATA.pt OUT.pt [MODEL OPTIM]
DATA.pt holds a list of full global batches (tuples of tensors, one per step); each rank
takes its rows along every input's batch dim (rank_rows: its contiguous slice, or with
micro-batches its slice of each), as the expansion's report says.
With MODEL and OPTIM (a zoo entry), the rank then trains the same model eagerly under
PyTorch's DistributedDataParallel on the same shards and saves its parameters too.

A FULLY_SHARD graph (metadata "fxdp.style" = "fully_shard") holds the state its
"fxdp.sharded_state" lists as flat shards (analysis/ir/flat_shard.h: s = ceil(n / N), rank r holds
elements [r*s, (r+1)*s) of the flattened tensor padded with zeros): each rank slices them from
the whole state file and all-gathers them back at the end, so OUT.pt holds whole tensors.
"""

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from safetensors.torch import load_file

import fxdp
from fxdp.v1 import graph_pb2 as pb


def balanced_slices(b: int, world: int):
    """(start, size) of every rank's contiguous slice of b samples: the first b % world ranks get
    one more. The same split as analysis/ir/batch_split.h (fxdp expand, the server, the workers),
    restated here on purpose: this module is the tests' independent oracle for the C++ side, so it
    must not call into it."""
    sizes = [b // world + (r < b % world) for r in range(world)]
    return [(sum(sizes[:r]), sizes[r]) for r in range(world)]


def rank_rows(b: int, micro: int, world: int, rank: int):
    """[(start, size)] of the global rows (of b) rank `rank` holds, in its graph's order: its
    balanced slice, or with micro-batches of `micro` rows (the rank graph's "fxdp.micro_batch";
    x.chunk(k)'s pieces: rows [j*micro, min((j+1)*micro, b))) its balanced slice of each, so that
    micro-batch j over the ranks is one device's. The same rows as analysis/ir/batch_split.h's
    RankRows, restated here for the same reason as balanced_slices."""
    if micro <= 0 or micro >= b:
        return [balanced_slices(b, world)[rank]]
    out = []
    for first in range(0, b, micro):
        start, size = balanced_slices(min(micro, b - first), world)[rank]
        out.append((first + start, size))
    return out


def ragged_cut(offsets, length: int, rows):
    """A rank's part of a ragged input (a flat 1-D input of bags: sample i is
    [offsets[i], offsets[i + 1]), the last up to `length`; the rank graph's "fxdp.ragged"):
    ([(begin, end)] spans of the input it reads, concatenated in order, and its offsets into
    them). The same cut as analysis/ir/batch_split.h's CutRagged, restated as rank_rows is."""
    offsets = [int(o) for o in offsets]
    spans, out = [], []
    for start, size in rows:
        if size == 0:
            continue
        begin = offsets[start]
        end = offsets[start + size] if start + size < len(offsets) else length
        base = sum(e - b for b, e in spans)
        out += [o - begin + base for o in offsets[start : start + size]]
        spans.append((begin, end))
    return spans, out


def shard_batch(step, full, world: int, rank: int):
    """Rank `rank`'s part of one global batch (a tuple of INPUT tensors in graph order): its rows
    along each input's batch dim (rank_rows), and of each ragged input ("fxdp.ragged") its bags'
    spans, with its offsets rebased to them."""
    meta = step.metadata()
    micro = int(meta.get("fxdp.micro_batch", "0"))
    ragged = dict(line.split(" ") for line in meta.get("fxdp.ragged", "").splitlines())
    inputs = [p.placeholder for p in step.placeholders if p.placeholder.role == pb.INPUT]
    by_name = dict(zip((p.state_name for p in inputs), full))
    shard = []
    for ph, x in zip(inputs, full):
        d = ph.batch_dim
        if ph.state_name in ragged:
            offsets = by_name[ragged[ph.state_name]]
            rows = rank_rows(offsets.shape[0], micro, world, rank)
            spans, _ = ragged_cut(offsets, x.shape[0], rows)
            x = torch.cat([x[b:e] for b, e in spans])
        elif d >= 0:
            rows = rank_rows(x.shape[d], micro, world, rank)
            if ph.state_name in ragged.values():
                length = by_name[next(k for k, v in ragged.items() if v == ph.state_name)].shape[0]
                x = torch.tensor(ragged_cut(x, length, rows)[1], dtype=x.dtype)
            else:
                x = torch.cat([x.narrow(d, start, size) for start, size in rows], d)
        shard.append(x)
    return shard


def ddp_params(model_name: str, optim: str, shards) -> dict:
    """Eager DDP (Gloo) training of the zoo entry on this rank's shards: final parameters."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from fxdp import zoo

    e = zoo.get(model_name)
    model = e.model(0)
    ddp = DDP(model)
    opt = zoo.make_optimizer(optim, model)
    with torch.enable_grad():
        for b in shards:
            opt.zero_grad()
            e.loss_fn(ddp(*b[:-1]), b[-1]).backward()
            opt.step()
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    del ddp  # its reducer must go before the process group does
    return params


def flat_shard(x: torch.Tensor, world: int, rank: int) -> torch.Tensor:
    s = -(-x.numel() // world)
    flat = torch.zeros(world * s, dtype=x.dtype)
    flat[: x.numel()] = x.reshape(-1)
    return flat[rank * s : (rank + 1) * s].clone()


def unshard(x: torch.Tensor, shape, world: int) -> torch.Tensor:
    out = torch.empty(world * x.numel(), dtype=x.dtype)
    dist.all_gather_into_tensor(out, x.contiguous())
    return out[: torch.Size(shape).numel()].reshape(shape).clone()


def main() -> None:
    rank, world, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    graph, state_path, data_path, out_path = sys.argv[4:8]
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=60),
    )
    assert dist.group.WORLD.group_name == "0", dist.group.WORLD.group_name
    step = fxdp.load(graph)
    state = load_file(state_path)
    meta = step.metadata()
    sharded = (
        meta.get("fxdp.sharded_state", "").split("\n")
        if meta.get("fxdp.style") == "fully_shard"
        else []
    )
    full_shapes = {k: state[k].shape for k in sharded}
    for k in sharded:
        state[k] = flat_shard(state[k], world, rank)
    batches = torch.load(data_path)
    losses, local_losses, shards = [], [], []
    for full in batches:
        shard = shard_batch(step, full, world, rank)
        shards.append(list(shard))
        outs = step.graph_module()(
            *[
                shard.pop(0) if p.placeholder.role == pb.INPUT else state[p.placeholder.state_name]
                for p in step.placeholders
            ]
        )
        for spec, v in zip(step.output_node.output_specs, outs):
            if spec.role in (pb.UPDATED_PARAMETER, pb.UPDATED_BUFFER, pb.UPDATED_OPTIMIZER_STATE):
                state[spec.state_name] = v
            elif spec.role == pb.LOSS:
                losses.append(v.detach().clone())
            elif spec.state_name == "local_loss":
                local_losses.append(v.detach().clone())
    for k in sharded:
        state[k] = unshard(state[k], full_shapes[k], world)
    result = {"state": dict(state), "losses": losses, "local_losses": local_losses}
    if len(sys.argv) > 9:
        result["ddp"] = ddp_params(sys.argv[8], sys.argv[9], shards)
    torch.save(result, out_path)
    # Every rank finishes its collectives, then leaves without tearing c10d down: Gloo's and
    # DDP's background threads can abort a process at interpreter exit ("terminate called
    # without an active exception", seen in fresh-clone CI runs), and the result is saved.
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    with torch.no_grad():
        main()
