"""analysis/op_schemas.inc (the op schemas the server and CLI check graphs against) is what
scripts/gen_op_schemas.py generates from the installed torch (2.13.0, pinned by scripts/setup.sh),
and the checked-in table refuses what the workers could not run, naming node and op."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import torch
from _util import fxdp_binary

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_checked_in_table_equals_the_generator_output():
    assert torch.__version__.split("+")[0] == "2.13.0", "the table is generated from torch 2.13.0"
    p = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen_op_schemas.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    text = (REPO / "analysis" / "op_schemas.inc").read_text()
    assert '#define FXDP_OP_SCHEMAS_TORCH_VERSION "2.13.0"' in text
    # Every op the frontend traces in the zoo and the expansion inserts is in it.
    for row in (
        '{"aten::addmm", "", ',
        '{"aten::_foreach_add", "List", ',
        '{"_c10d_functional::all_reduce", "", ',
        '{"_c10d_functional::wait_tensor", "", ',
    ):
        assert row in text, row


def test_graph_check_and_analyze_refuse_an_unknown_op(tmp_path):
    from _util import traced
    from fxdp.v1 import graph_pb2 as pb

    g = pb.GraphDef()
    g.CopyFrom(traced("mlp", "sgd").graph)
    node = next(n for n in g.nodes if n.target.name == "aten::relu")
    node.target.name = "aten::no_such_op"
    path = tmp_path / "bad.pb"
    path.write_bytes(g.SerializeToString())
    fxdp = fxdp_binary("FXDP_BIN", "fxdp")
    for cmd in (
        ["graph", "check"],
        ["analyze"],
        ["expand", "--world-size", "2", "-o", str(tmp_path / "x.pb")],
    ):
        p = subprocess.run([fxdp, *cmd, str(path)], capture_output=True, text=True, timeout=60)
        assert p.returncode == 1, (cmd, p.stdout, p.stderr)
        assert (
            f"node '{node.name}'" in p.stderr and "unknown op aten::no_such_op" in p.stderr
        ), p.stderr
        assert "traced with torch " + torch.__version__ in p.stderr, p.stderr
    assert not os.path.exists(tmp_path / "x.pb")
