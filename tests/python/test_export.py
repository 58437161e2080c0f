"""``fxdp export`` (issue 27, docs/checkpoints.md): a checkpoint the tiny GPT-2's 2 FULLY_SHARD
workers wrote, consolidated into ``model.safetensors``, loads with ``from_pretrained`` (no missing
or unexpected names, the tied ``lm_head.weight`` once) with the job's weights bit for bit; by
directory and by job id; a job without such a checkpoint is refused."""

from __future__ import annotations

import subprocess

import fxdp
import pytest
import torch
from _tiny_gpt2 import CONFIG, batches, train_step
from _util import fxdp_binary, local_server

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()


def fxdp_cli(*args):
    return subprocess.run(
        [fxdp_binary("FXDP_BIN", "fxdp"), *args], capture_output=True, text=True, timeout=60
    )


def test_export_gives_a_checkpoint_from_pretrained_loads_with_equal_weights(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**CONFIG)).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = fxdp.trace_step(train_step, model, opt, batches(1)[0])
    model.config.save_pretrained(tmp_path)
    with local_server(workers=2, extra_args=["--data-root", str(root)]) as (address, _):
        with fxdp.Client(address) as c:
            r = c.train(
                step, 2, batches=batches(2), style="fully_shard", checkpoints={"dir": str(root)}
            )
            plain = c.train(step, 1, batches=batches(1))
        for given, out in [(str(root / "step-2"), tmp_path / "hf"), (r.job_id, tmp_path / "hf2")]:
            p = fxdp_cli(
                "export",
                given,
                "--hf",
                str(out),
                "--config",
                str(tmp_path / "config.json"),
                "--server",
                address,
            )
            assert p.returncode == 0, p.stderr
            assert "of the checkpoint of step 2 (2 ranks, fully_shard)" in p.stdout, p.stdout
        p = fxdp_cli("export", plain.job_id, "--hf", str(tmp_path / "no"), "--server", address)
        assert (
            p.returncode == 1 and "has no checkpoint written by its workers" in p.stderr
        ), p.stderr
    loaded, info = transformers.GPT2LMHeadModel.from_pretrained(
        tmp_path / "hf", output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert loaded.lm_head.weight.data_ptr() == loaded.transformer.wte.weight.data_ptr()  # tied
    sd = loaded.state_dict()
    for n, t in sd.items():
        want = r.state["transformer.wte.weight" if n == "lm_head.weight" else n]
        assert torch.equal(t, want), n
    assert (tmp_path / "hf2" / "model.safetensors").read_bytes() == (
        tmp_path / "hf" / "model.safetensors"
    ).read_bytes()
