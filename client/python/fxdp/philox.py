"""fxdp's random stream in torch ops: Philox4x32-10 keyed by (seed, step, node), vectorised.

The same stream as util/philox.h (the workers' generator; docs/randomness.md): word ``w`` of node
``node`` in step ``step`` of a job seeded ``seed`` is word ``w % 4`` of
``Philox4x32_10(counter=(b lo, b hi, node, step), key=(seed lo, seed hi))``, ``b = w // 4``.
``TracedStep.run_local`` draws its random ops from it, so one device draws exactly what N ranks
draw together. tests/testdata/philox_vectors.txt holds both implementations to Random123's known
answers and to each other.

Words are held in int64 tensors (0 <= w < 2**32): a 32x32-bit product fits 64 bits, and torch's
int64 multiply wraps, so its high half is ``(p >> 32) & 0xFFFFFFFF`` even when the product's top
bit is set.
"""

from __future__ import annotations

from typing import Tuple

import torch

MASK32 = 0xFFFFFFFF
MUL = (0xD2511F53, 0xCD9E8D57)
WEYL = (0x9E3779B9, 0xBB67AE85)


def philox4x32(c: Tuple[torch.Tensor, ...], k0: int, k1: int, rounds: int = 10):
    """Philox4x32 on counters ``c`` (four int64 tensors of words) with key (k0, k1)."""
    c0, c1, c2, c3 = c
    for r in range(rounds):
        if r > 0:
            k0 = (k0 + WEYL[0]) & MASK32
            k1 = (k1 + WEYL[1]) & MASK32
        p0 = c0 * MUL[0]
        p1 = c2 * MUL[1]
        c0, c1, c2, c3 = (
            ((p1 >> 32) & MASK32) ^ c1 ^ k0,
            p1 & MASK32,
            ((p0 >> 32) & MASK32) ^ c3 ^ k1,
            p0 & MASK32,
        )
    return c0, c1, c2, c3


def node_id(name: str) -> int:
    """A random node's id: FNV-1a (32 bits) of its name (util/philox.h NodeId)."""
    h = 2166136261
    for byte in name.encode():
        h = ((h ^ byte) * 16777619) & MASK32
    return h


def check_key(seed: int, step: int) -> None:
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed {seed} is not in [0, 2**64)")
    if not 0 <= step < 2**32:
        raise ValueError(f"step {step} is not in [0, 2**32)")


def words(seed: int, step: int, node: int, first: int, n: int, device="cpu") -> torch.Tensor:
    """Words ``first .. first+n-1`` of the stream, as an int64 tensor of n values in [0, 2**32)."""
    check_key(seed, step)
    b0, b1 = first // 4, (first + n + 3) // 4
    b = torch.arange(b0, b1, dtype=torch.int64, device=device)
    full = lambda v: torch.full_like(b, v)  # noqa: E731
    out = philox4x32(
        (b & MASK32, (b >> 32) & MASK32, full(node), full(step)), seed & MASK32, seed >> 32
    )
    w = torch.stack(out, dim=1).reshape(-1)
    return w[first - 4 * b0 : first - 4 * b0 + n]
