"""Every traced zoo graph round-trips byte for byte through the C++ decoder/verifier/encoder.

Uses ``fxdp graph roundtrip IN.pb OUT.pb`` from $FXDP_BIN or <repo>/build/bin/fxdp. The test
fails (it does not skip) when the binary is missing: ``make test`` builds it first.
"""

import pathlib
import subprocess

import pytest
from _util import MODELS, OPTIMS, fxdp_binary, traced

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("optim", OPTIMS)
@pytest.mark.parametrize("model", MODELS)
def test_cpp_roundtrip_byte_for_byte(tmp_path, model, optim):
    binary = fxdp_binary("FXDP_BIN", "fxdp")
    src = tmp_path / f"{model}_{optim}.pb"
    dst = tmp_path / f"{model}_{optim}.out.pb"
    traced(model, optim).save(src)
    proc = subprocess.run(
        [binary, "graph", "roundtrip", str(src), str(dst)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, f"fxdp graph roundtrip failed ({proc.returncode}): {proc.stderr}"
    assert dst.read_bytes() == src.read_bytes(), "C++ re-encoding differs from the Python encoding"
