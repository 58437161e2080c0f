"""The Python client's tensor-chunk protocol (fxdp/tensor_chunks.py) against the cases the C++
checker passes too (tests/testdata/tensor_chunks.json; tests/analysis/tensor_chunks_test.cc)."""

import json
import pathlib

import pytest
import torch
from fxdp import ServerError, tensor_chunks, wire_tensors
from fxdp.v1 import graph_pb2 as gpb
from fxdp.v1 import worker_pb2 as wpb

VECTORS = json.loads(
    (pathlib.Path(__file__).resolve().parents[1] / "testdata" / "tensor_chunks.json").read_text()
)


def _pattern(start: int, n: int) -> bytes:
    return bytes((start + j) % 251 for j in range(n))


def _chunk(c) -> "wpb.TensorChunk":
    dtype = c["dtype"] if isinstance(c["dtype"], int) else gpb.DType.Value(c["dtype"])
    return wpb.TensorChunk(
        name=c["name"],
        dtype=dtype,
        shape=c["shape"],
        offset=c["offset"],
        data=_pattern(c["offset"], c["size"]),
    )


def test_dtype_table_is_the_vectors():
    want = {gpb.DType.Value(w): (name, size) for w, name, size in VECTORS["dtypes"]}
    assert tensor_chunks.DTYPES == want


@pytest.mark.parametrize("stream", VECTORS["streams"], ids=lambda s: s["case"])
def test_streams_are_checked_as_the_vectors_say(stream):
    check = tensor_chunks.ChunkChecker(stream["what"])
    complete, data = [], bytearray()
    for c in stream["chunks"]:
        chunk = _chunk(c)
        if "error" in c:
            with pytest.raises(tensor_chunks.ChunkError) as e:
                check.add(chunk)
            assert str(e.value) == c["error"]
            continue
        starts, completes = check.add(chunk)
        if starts:
            data = bytearray(check.current[3])
        data[chunk.offset : chunk.offset + len(chunk.data)] = chunk.data
        if completes:
            assert bytes(data) == _pattern(0, len(data)), check.current[0]
            complete.append(check.current[0])
    assert complete == stream["complete"]
    assert check.complete == len(complete)
    assert (check.current[0] if check.pending else "") == stream["pending"]


@pytest.mark.parametrize("s", VECTORS["spans"], ids=lambda s: f"{s['bytes']}by{s['chunk_bytes']}")
def test_spans_are_the_vectors(s):
    assert [list(p) for p in tensor_chunks.chunk_spans(s["bytes"], s["chunk_bytes"])] == s["spans"]


def test_client_chunks_and_assembles_through_the_protocol():
    tensors = {
        "w": torch.arange(10, dtype=torch.float32),
        "e": torch.empty(0, 3),
        "b": torch.tensor([True, False]),
    }
    chunks = [
        c for name, t in tensors.items() for c in wire_tensors.chunks(name, t, chunk_bytes=16)
    ]
    assert [c.offset for c in chunks if c.name == "w"] == [0, 16, 32]
    got = wire_tensors.assemble(wpb.StateChunk(tensor=c) for c in chunks)
    assert list(got) == list(tensors)
    for name, t in tensors.items():
        assert got[name].dtype == t.dtype and torch.equal(got[name], t)
    with pytest.raises(ServerError, match="tensor 'w': chunk at offset 32, expected 16"):
        wire_tensors.assemble(wpb.StateChunk(tensor=c) for c in [chunks[0], chunks[2]])
    with pytest.raises(ServerError, match="tensor 'w' is incomplete"):
        wire_tensors.assemble(wpb.StateChunk(tensor=c) for c in chunks[:2])
