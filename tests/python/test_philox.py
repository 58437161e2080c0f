"""fxdp.philox (run_local's generator) against tests/testdata/philox_vectors.txt: Random123's known
answers for Philox4x32-10 and the stream words util/philox.h (the workers' generator) gives."""

from __future__ import annotations

import os

import pytest
import torch
from fxdp import philox

VECTORS = os.path.join(os.path.dirname(__file__), "..", "testdata", "philox_vectors.txt")


def lines(kind):
    with open(VECTORS) as f:
        return [ln.split() for ln in f if ln.split() and ln.split()[0] == kind]


def test_random123_known_answers():
    rows = lines("philox4x32")
    assert len(rows) == 3
    for f in rows:
        v = [int(x, 16) for x in f[2:]]
        out = philox.philox4x32(tuple(torch.tensor([x]) for x in v[:4]), v[4], v[5], int(f[1]))
        assert [int(o) for o in out] == v[6:], f


def test_node_ids():
    for f in lines("node"):
        assert philox.node_id("" if f[1] == "-" else f[1]) == int(f[2], 16), f


def test_stream_words():
    for f in lines("stream"):
        want = [int(x, 16) for x in f[5:]]
        got = philox.words(int(f[1]), int(f[2]), int(f[3], 16), int(f[4]), len(want))
        assert got.tolist() == want, f


def test_windows_agree_with_the_whole():
    whole = philox.words(99, 5, 1234, 0, 40)
    for first in range(12):
        for n in range(15):
            assert torch.equal(philox.words(99, 5, 1234, first, n), whole[first : first + n])


def test_key_out_of_range_is_refused():
    with pytest.raises(ValueError, match=r"step 4294967296 is not in \[0, 2\*\*32\)"):
        philox.words(0, 2**32, 0, 0, 4)
    with pytest.raises(ValueError, match="seed -1"):
        philox.words(-1, 1, 0, 0, 4)
