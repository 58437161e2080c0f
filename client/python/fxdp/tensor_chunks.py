"""The tensor-chunk protocol (proto/fxdp/v1/worker.proto, TensorChunk) on the client's side.

A tensor travels as dtype + shape + raw row-major little-endian bytes, split into chunks by byte
offset. The rules and messages are those of the C++ checker (analysis/ir/tensor_chunks.h, used by
the server and the worker); tests/testdata/tensor_chunks.json holds the cases both must agree on
(tests/python/test_tensor_chunks.py, tests/analysis/tensor_chunks_test.cc)."""

from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from .v1 import graph_pb2 as gpb

# Wire dtype -> (short name, bytes per element): analysis/ir/types.cc's table.
DTYPES: Dict[int, Tuple[str, int]] = {
    gpb.FLOAT32: ("f32", 4),
    gpb.FLOAT64: ("f64", 8),
    gpb.FLOAT16: ("f16", 2),
    gpb.BFLOAT16: ("bf16", 2),
    gpb.INT64: ("i64", 8),
    gpb.INT32: ("i32", 4),
    gpb.INT16: ("i16", 2),
    gpb.INT8: ("i8", 1),
    gpb.UINT8: ("u8", 1),
    gpb.BOOL: ("b8", 1),
    gpb.COMPLEX64: ("c64", 8),
    gpb.COMPLEX128: ("c128", 16),
    gpb.COMPLEX32: ("c32", 4),
    gpb.FLOAT8_E4M3FN: ("f8e4m3fn", 1),
    gpb.FLOAT8_E5M2: ("f8e5m2", 1),
    gpb.UINT16: ("u16", 2),
    gpb.UINT32: ("u32", 4),
    gpb.UINT64: ("u64", 8),
}

_MAX_BYTES = (1 << 63) - 1


class ChunkError(ValueError):
    """A chunk that breaks the protocol; the message is the C++ checker's."""


def type_text(dtype: int, shape: Sequence[int]) -> str:
    """``f32[2, 3]``; an unknown wire dtype as ``dtype99[2, 3]``."""
    name = DTYPES[dtype][0] if dtype in DTYPES else f"dtype{dtype}"
    return f"{name}[{', '.join(str(d) for d in shape)}]"


def chunk_spans(nbytes: int, chunk_bytes: int) -> List[Tuple[int, int]]:
    """(offset, size) of the chunks a tensor of ``nbytes`` is sent in: at most ``chunk_bytes``
    each, one empty chunk for 0 bytes."""
    chunk_bytes = max(chunk_bytes, 1)
    if nbytes == 0:
        return [(0, 0)]
    return [(off, min(chunk_bytes, nbytes - off)) for off in range(0, nbytes, chunk_bytes)]


class ChunkChecker:
    """Checks a stream of TensorChunks against the protocol; ``add`` raises ChunkError (the
    chunk changes nothing) or returns (starts, completes) for an accepted chunk, whose bytes go at
    its offset of the tensor ``current`` names."""

    def __init__(self, what: str = ""):
        self.what = what
        self._names: set = set()
        self.current: Optional[Tuple[str, int, Tuple[int, ...], int]] = (
            None  # name, dtype, shape, bytes
        )
        self.pending = False
        self._next = 0
        self.complete = 0

    def _error(self, msg: str) -> ChunkError:
        return ChunkError(f"{self.what}: {msg}" if self.what else msg)

    def _first(self, c) -> Tuple[str, int, Tuple[int, ...], int]:
        name, shape = c.name, tuple(c.shape)
        if not name:
            raise self._error("a tensor chunk without a name")
        if name in self._names:
            raise self._error(f"tensor '{name}': sent twice")
        if c.dtype not in DTYPES:
            raise self._error(f"tensor '{name}': unknown dtype {c.dtype}")
        nbytes = DTYPES[c.dtype][1]
        text = f"[{', '.join(str(d) for d in shape)}]"
        for d in shape:
            if d < 0:
                raise self._error(f"tensor '{name}': negative dim in shape {text}")
            if d > 0 and nbytes > _MAX_BYTES // d:
                raise self._error(f"tensor '{name}': shape {text} is too large")
            nbytes *= d
        return name, c.dtype, shape, nbytes

    def add(self, c) -> Tuple[bool, bool]:
        starts = not self.pending
        if self.pending:
            name, dtype, shape, nbytes = self.current
            if c.name != name:
                raise self._error(
                    f"tensor '{c.name}' started before tensor '{name}' was complete "
                    f"({self._next} of {nbytes} bytes)"
                )
            if c.dtype != dtype or tuple(c.shape) != shape:
                raise self._error(
                    f"tensor '{name}': a chunk says {type_text(c.dtype, c.shape)}, "
                    f"the first said {type_text(dtype, shape)}"
                )
            expected, tensor = self._next, self.current
        else:
            tensor, expected = self._first(c), 0
        name, dtype, shape, nbytes = tensor
        if c.offset != expected:
            raise self._error(f"tensor '{name}': chunk at offset {c.offset}, expected {expected}")
        n = len(c.data)
        if n > nbytes - expected:
            raise self._error(
                f"tensor '{name}': chunk of {n} bytes at offset {c.offset} runs past "
                f"the tensor's {nbytes} bytes ({type_text(dtype, shape)})"
            )
        if starts:
            self.current = tensor
            self._names.add(name)
            self.pending = True
        self._next = expected + n
        completes = self._next == nbytes
        if completes:
            self.pending = False
            self.complete += 1
        return starts, completes


def assemble(chunks, what: str = "") -> Iterator[Tuple[str, int, Tuple[int, ...], bytearray]]:
    """Whole tensors (name, wire dtype, shape, bytes) from TensorChunk messages, each checked
    (ChunkError); a tensor left incomplete at the end is an error too."""
    check = ChunkChecker(what)
    buf = bytearray()
    for c in chunks:
        starts, completes = check.add(c)
        if starts:
            buf = bytearray(check.current[3])
        buf[c.offset : c.offset + len(c.data)] = c.data
        if completes:
            name, dtype, shape, _ = check.current
            yield name, dtype, shape, buf
    if check.pending:
        raise check._error(f"tensor '{check.current[0]}' is incomplete: the stream ended")
