"""Every traced zoo graph round-trips byte for byte through the C++ decoder/verifier/encoder.

Uses ``fxdp graph roundtrip IN.pb OUT.pb`` from $FXDP_BIN or <repo>/build/bin/fxdp. The test
fails (it does not skip) when the binary is missing: ``make test`` builds it first.
"""

import os
import pathlib
import subprocess

import pytest
from _util import MODELS, OPTIMS, traced

REPO = pathlib.Path(__file__).resolve().parents[2]


def fxdp_bin() -> str:
    path = os.environ.get("FXDP_BIN") or str(REPO / "build" / "bin" / "fxdp")
    assert os.path.isfile(path) and os.access(
        path, os.X_OK
    ), f"C++ CLI not found at {path}: build it first (make test builds it) or set FXDP_BIN"
    return path


@pytest.mark.parametrize("optim", OPTIMS)
@pytest.mark.parametrize("model", MODELS)
def test_cpp_roundtrip_byte_for_byte(tmp_path, model, optim):
    binary = fxdp_bin()
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
