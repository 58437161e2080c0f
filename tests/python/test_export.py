"""``fxdp export`` (issue 27, docs/checkpoints.md): a checkpoint the tiny GPT-2's 2 FULLY_SHARD
workers wrote, consolidated into ``model.safetensors``, loads with ``from_pretrained`` (no missing
or unexpected names, the tied ``lm_head.weight`` once) with the job's weights bit for bit; by
directory and by job id; a job without such a checkpoint is refused. A Llama's non-persistent
rotary buffers (recorded by the tracer, marked in the workers' index) are left out: the export holds
exactly ``model.state_dict()``'s names, and ``load_into`` takes it; an index without the mark (an
older checkpoint) exports every buffer, as before; ``initial_checkpoint`` sends those buffers
without being given the model."""

from __future__ import annotations

import json
import subprocess

import fxdp
import pytest
import torch
from _real_models import CASES
from _tiny_gpt2 import CONFIG, batches, train_step
from _util import fxdp_binary, local_server
from safetensors.torch import load_file

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
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert loaded.lm_head.weight.data_ptr() == loaded.transformer.wte.weight.data_ptr()  # tied
    sd = loaded.state_dict()
    for n, t in sd.items():
        want = r.state["transformer.wte.weight" if n == "lm_head.weight" else n]
        assert torch.equal(t, want), n
    assert (tmp_path / "hf2" / "model.safetensors").read_bytes() == (
        tmp_path / "hf" / "model.safetensors"
    ).read_bytes()


ROTARY = ["model.rotary_emb.inv_freq", "model.rotary_emb.original_inv_freq"]


def test_a_llamas_non_persistent_buffers_are_left_out_and_from_pretrained_loads_it(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    torch.manual_seed(0)
    model = CASES["llama"].make().train()  # 1 layer of 32, vocabulary 64
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = fxdp.trace_step(train_step, model, opt, batches(1)[0])
    assert step.non_persistent_buffers() == ROTARY
    assert not set(ROTARY) & set(model.state_dict()) and set(ROTARY) <= set(step.state_names())
    # A plan from a Hugging Face checkpoint this machine cannot read, without the model: the step
    # says which buffers no checkpoint holds, and those are sent.
    plan = fxdp.initial_checkpoint(step, str(tmp_path / "elsewhere"))
    assert set(ROTARY) <= set(plan.sent) and not set(ROTARY) & set(plan.tensors)
    model.config.save_pretrained(tmp_path)
    with local_server(workers=2, extra_args=["--data-root", str(root)]) as (address, _):
        with fxdp.Client(address) as c:
            r = c.train(step, 2, batches=batches(2), checkpoints={"dir": str(root)})
        out, config = str(tmp_path / "hf"), str(tmp_path / "config.json")
        p = fxdp_cli("export", r.job_id, "--hf", out, "--config", config, "--server", address)
    assert p.returncode == 0, p.stderr
    assert "exported 12 tensors of the checkpoint of step 2 (2 ranks, replicate)" in p.stdout
    assert p.stdout.endswith("model.safetensors (2 non-persistent buffers left out)\n"), p.stdout
    index = json.loads((root / "step-2" / "fxdp-checkpoint.json").read_text())
    marked = sorted(n for n, e in index["tensors"].items() if "persistent" in e)
    assert marked == ROTARY and all(index["tensors"][n]["persistent"] is False for n in marked)
    exported = load_file(tmp_path / "hf" / "model.safetensors")
    assert sorted(exported) == sorted(model.state_dict())  # what save_pretrained writes
    loaded, info = transformers.LlamaForCausalLM.from_pretrained(
        tmp_path / "hf", output_loading_info=True
    )
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    for n, t in loaded.state_dict().items():
        assert torch.equal(t, r.state[n]), n
    # load_into: the job's state restores the rotary buffers, the export (without them) leaves
    # the model's own; neither is missing or unexpected.
    fresh = CASES["llama"].make()
    fxdp.load_into(fresh, torch.optim.AdamW(fresh.parameters(), lr=1e-3), r.state)
    fxdp.load_into(fresh, None, exported)
    for n, t in fresh.state_dict().items():
        assert torch.equal(t, r.state[n]), n
    # An index without the mark (written before the tracer recorded it) exports every buffer.
    for e in index["tensors"].values():
        e.pop("persistent", None)
    (root / "step-2" / "fxdp-checkpoint.json").write_text(json.dumps(index))
    p = fxdp_cli("export", str(root / "step-2"), "--hf", str(tmp_path / "old"))
    assert p.returncode == 0 and "left out" not in p.stdout, (p.stdout, p.stderr)
    assert sorted(load_file(tmp_path / "old" / "model.safetensors")) == sorted([*exported, *ROTARY])
