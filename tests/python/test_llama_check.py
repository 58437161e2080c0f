"""Issue 27's "Done means" at a small size, through bench/llama300m_check.py's own code path
(``--size small``: an 18 M-parameter Llama, its parameters and AdamW state 216 MB): saved sharded
by ``save_pretrained``, traced on ``meta``, 3 steps FULLY_SHARD on 2 real workers of a real
``fxdp-server`` reading that checkpoint, the workers writing theirs. Fetching the final state would
grow the client by the state's size and the server too (it collected the ranks' shards whole): both
grow by less than a quarter of it. The result equals eager PyTorch from the same checkpoint (AdamW's
tolerance), the checkpoint of step 2 resumed on 1 REPLICATE rank equals the uninterrupted run, and
``fxdp export --hf`` gives a checkpoint ``from_pretrained`` loads with the trained weights."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
from _util import fxdp_binary

pytest.importorskip("transformers")

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "bench" / "llama300m_check.py"


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("llama") / "out.json"
    env = dict(os.environ)
    if os.environ.get("FXDP_WORKER"):
        env["FXDP_WORKER"] = fxdp_binary("FXDP_WORKER", "fxdp-worker")
    bindir = os.path.dirname(fxdp_binary("FXDP_BIN", "fxdp"))
    p = subprocess.run(
        [sys.executable, str(SCRIPT), "--size", "small", "--json", str(out), "--bin", bindir],
        capture_output=True,
        text=True,
        env=env,
    )
    assert out.exists(), p.stderr[-4000:]
    return json.loads(out.read_text()), p


def test_every_check_of_the_small_run_holds(result):
    r, p = result
    failed = [what for ok, what in r["checks"] if not ok]
    assert not failed and p.returncode == 0, (failed, p.stderr[-3000:])


def test_neither_the_client_nor_the_server_holds_the_state(result):
    r, _ = result
    state_mb = r["save"]["params"] * 12 / 2**20
    assert state_mb > 200, state_mb  # big enough that fetching it would show
    t = r["train"]
    assert t["checkpoint"].endswith("/ck/step-3"), t
    # The client sent hyper-parameters and rotary inv_freq only: a few hundred bytes.
    assert t["sent_bytes"] < 4096 and t["read_by_workers"] == r["load"]["tensors"], t
    assert t["growth_mb"] < state_mb / 4, (t, state_mb)
    assert t["server_growth_mb"] < state_mb / 4, (t, state_mb)
    assert r["resume"]["growth_mb"] < state_mb / 4 and r["resume"]["sent"] == 0, r["resume"]


def test_equal_to_one_device_resumed_and_exported(result):
    r, _ = result
    ref, cmp_, ld = r["reference"], r["compare"], r["load"]
    # each weight, its exp_avg, exp_avg_sq and step
    assert ref["tensors_compared"] == 4 * r["load"]["tensors"], ref
    assert ref["elements_outside_tolerance"] == 0, ref
    for ours, eager in zip(r["train"]["losses"], ref["losses"]):
        assert abs(ours - eager) < 1e-4, (r["train"]["losses"], ref["losses"])
    assert cmp_["names_equal"] and cmp_["elements_outside_tolerance"] == 0, cmp_
    assert not ld["missing"] and not ld["unexpected"] and not ld["unequal"], ld
    assert not ld["not_in_checkpoint"], ld


def test_rendered_as_bench_area_9(result):
    sys.path.insert(0, str(SCRIPT.parent))
    import results_markdown

    md = "\n".join(results_markdown.md_llama({"raw": result[0], "command": "llama300m_check.py"}))
    assert "## 9. A Llama from a Hugging Face checkpoint" in md and "**FAILED**" not in md, md
