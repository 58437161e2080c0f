"""Dataset directories (docs/datasets.md): a DataLoader's batches written as safetensors shards
plus ``index.json``, for the workers to read themselves (``fxdp-worker run --data DIR``,
``Client.train(data_path=DIR)``), each rank only its rows of each step, when the step runs."""

from __future__ import annotations

import json
import os
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Union

import torch

INDEX = "index.json"
VERSION = 1

Batch = Union[Sequence[torch.Tensor], Mapping[str, torch.Tensor]]


def _named(batch: Batch, names: Optional[Sequence[str]], i: int) -> Dict[str, torch.Tensor]:
    if isinstance(batch, Mapping):
        out = dict(batch)
    else:
        if names is None:
            raise ValueError(
                f"write_dataset: batch {i} is a sequence; pass step= (a TracedStep) or names= "
                "to name its tensors (the step's input state names)"
            )
        if len(batch) != len(names):
            raise ValueError(
                f"write_dataset: batch {i} has {len(batch)} tensors, the inputs are "
                f"{len(names)}: {list(names)}"
            )
        out = dict(zip(names, batch))
    rows = set()
    for name, t in out.items():
        if not isinstance(t, torch.Tensor) or t.dim() == 0:
            raise ValueError(
                f"write_dataset: batch {i}'s '{name}' is not a tensor with a batch dim (rows "
                "along dim 0)"
            )
        rows.add(t.shape[0])
    if len(rows) != 1:
        sizes = {n: t.shape[0] for n, t in out.items()}
        raise ValueError(
            f"write_dataset: batch {i}'s tensors disagree on the number of rows (dim 0): {sizes}"
        )
    return out


def _layout(batch: Dict[str, torch.Tensor]):
    return {n: (t.dtype, tuple(t.shape[1:])) for n, t in sorted(batch.items())}


class _Shards:
    """Batches gathered into one shard until it holds ``shard_bytes`` (or a batch's layout
    differs), then written; what the index says about each step."""

    def __init__(self, directory: str, shard_bytes: int):
        self.directory, self.shard_bytes = directory, shard_bytes
        self.pending: List[Dict[str, torch.Tensor]] = []
        self.pending_bytes = 0
        self.rows = 0
        self.steps: List[dict] = []
        self.files = 0

    def add(self, batch: Dict[str, torch.Tensor]) -> None:
        if self.pending and _layout(batch) != _layout(self.pending[0]):
            self.flush()
        n = next(iter(batch.values())).shape[0]
        name = f"shard-{self.files:05d}.safetensors"
        shape = {k: list(t.shape) for k, t in sorted(batch.items())}
        self.steps.append({"file": name, "rows": [self.rows, self.rows + n], "shape": shape})
        self.pending.append(batch)
        self.rows += n
        self.pending_bytes += sum(t.numel() * t.element_size() for t in batch.values())
        if self.pending_bytes >= self.shard_bytes:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        from safetensors.torch import save_file

        names = sorted(self.pending[0])
        tensors = {
            n: torch.cat([b[n].detach().cpu() for b in self.pending]).contiguous() for n in names
        }
        path = os.path.join(self.directory, f"shard-{self.files:05d}.safetensors")
        save_file(tensors, path + ".tmp")
        os.replace(path + ".tmp", path)
        self.files += 1
        self.pending, self.pending_bytes, self.rows = [], 0, 0


def write_dataset(
    directory: Union[str, os.PathLike],
    batches: Iterable[Batch],
    step=None,
    names: Optional[Sequence[str]] = None,
    shard_mb: float = 256.0,
) -> int:
    """Writes ``batches`` (one global batch per step, e.g. a DataLoader's: mappings from the
    step's input state names to tensors, or sequences in the order of ``step.input_names()`` /
    ``names``) as a dataset directory: safetensors shards of about ``shard_mb`` MiB each, every
    tensor's rows (dim 0) of consecutive steps concatenated, and ``index.json`` listing each
    step's shard, row range and shape (every tensor's dims; written last, so a directory with an
    index is complete).
    Batches are consumed one at a time: at most one shard is held. Returns the number of steps.

    A batch's tensors must agree on their rows (dim 0); batches of another dtype or trailing
    shape start a new shard (so batches padded to different lengths can be written; the graph
    must then accept each step's shape)."""
    directory = os.fspath(directory)
    if names is None and step is not None:
        names = step.input_names()
    os.makedirs(directory, exist_ok=True)
    if os.path.exists(os.path.join(directory, INDEX)):
        raise FileExistsError(
            f"write_dataset: {directory} already holds a dataset ({INDEX}); use a new directory"
        )
    shards = _Shards(directory, max(1, int(shard_mb * (1 << 20))))
    for i, batch in enumerate(batches):
        shards.add(_named(batch, names, i))
    shards.flush()
    if not shards.steps:
        raise ValueError("write_dataset: no batches")
    tmp = os.path.join(directory, INDEX + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"fxdp_dataset": VERSION, "steps": shards.steps}, f, separators=(",", ":"))
    os.replace(tmp, os.path.join(directory, INDEX))
    return len(shards.steps)
