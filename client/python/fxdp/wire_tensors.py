"""torch tensors on the wire: the dtype mapping, a tensor as TensorChunk messages (``chunks``) and a
FetchState stream back as tensors (``assemble``), both under the chunk protocol of
tensor_chunks.py (the server's and the worker's rules)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterable, Iterator

import grpc
import torch

from . import tensor_chunks
from .rpc_errors import ServerError
from .v1 import graph_pb2 as gpb
from .v1 import worker_pb2 as wpb

TO_WIRE = {
    torch.float32: gpb.FLOAT32,
    torch.float64: gpb.FLOAT64,
    torch.float16: gpb.FLOAT16,
    torch.bfloat16: gpb.BFLOAT16,
    torch.int64: gpb.INT64,
    torch.int32: gpb.INT32,
    torch.int16: gpb.INT16,
    torch.int8: gpb.INT8,
    torch.uint8: gpb.UINT8,
    torch.bool: gpb.BOOL,
}
FROM_WIRE = {v: k for k, v in TO_WIRE.items()}

CHUNK_BYTES = 1 << 20  # the largest tensor piece per message train() sends
# Room in a message for all but a chunk's data (name, shape, a step's hyper-parameters), so that
# a message stays within the channel's max_message_mb (Client.__init__).
MESSAGE_HEADROOM = 64 << 10


def chunks(
    name: str, t: torch.Tensor, chunk_bytes: int = CHUNK_BYTES
) -> Iterator["wpb.TensorChunk"]:
    """``t``'s raw bytes as TensorChunk messages of at most ``chunk_bytes`` (one empty chunk for an
    empty tensor: tensor_chunks.chunk_spans); only one chunk's bytes are copied at a time."""
    t = t.detach().to("cpu").contiguous()
    if t.dtype not in TO_WIRE:
        raise TypeError(
            f"tensor '{name}' has dtype {t.dtype}, which the wire format does not carry"
        )
    dtype, shape = TO_WIRE[t.dtype], list(t.shape)
    raw = memoryview(t.reshape(-1).view(torch.uint8).numpy()) if t.numel() else b""
    for off, n in tensor_chunks.chunk_spans(len(raw), chunk_bytes):
        yield wpb.TensorChunk(
            name=name, dtype=dtype, shape=shape, offset=off, data=bytes(raw[off : off + n])
        )


def assemble(state_chunks: Iterable["wpb.StateChunk"]) -> "OrderedDict[str, torch.Tensor]":
    """A FetchState stream's tensors, each checked against the chunk protocol (tensor_chunks.py:
    the server's and the worker's rules); a broken stream is DATA_LOSS naming the tensor."""
    out = OrderedDict()
    tensors = (c.tensor for c in state_chunks if c.HasField("tensor"))
    try:
        for name, dtype, shape, buf in tensor_chunks.assemble(tensors, "the final state"):
            if dtype not in FROM_WIRE:
                raise tensor_chunks.ChunkError(
                    f"the final state: tensor '{name}' is {tensor_chunks.type_text(dtype, shape)}, "
                    "a dtype this client does not convert to torch"
                )
            t = FROM_WIRE[dtype]
            out[name] = (
                torch.frombuffer(buf, dtype=t).reshape(shape).clone()
                if len(buf)
                else torch.empty(shape, dtype=t)
            )
    except tensor_chunks.ChunkError as e:
        raise ServerError(grpc.StatusCode.DATA_LOSS, str(e)) from None
    return out
