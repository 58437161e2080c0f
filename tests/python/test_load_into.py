"""fxdp.load_into (issue 27, "Back into PyTorch"): a job's final state goes back into the user's
model and torch.optim optimizer, tied weights and AdamW's state and hyper-parameters included, so
that the next eager step equals the next fxdp step; a state that does not fit is refused, naming
every missing and unexpected entry, and nothing is changed.

The model is a tiny Hugging Face GPT-2 built from a config (its ``lm_head.weight`` is
``transformer.wte.weight``, which a state holds once), trained by a real ``fxdp-server
--local-workers 2``.
"""

from __future__ import annotations

import fxdp
import pytest
import torch
from _tiny_gpt2 import CONFIG, batches, train_step
from _util import ATOL, RTOL, local_server

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

from test_user_training_loop import assert_state_equals  # noqa: E402

WORLD = 2


def make(seed: int, lr: float = 1e-3, weight_decay: float = 0.1):
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**CONFIG)).train()
    return model, torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)


def test_gpt2_with_adamw_state_round_trips_and_the_next_eager_step_equals_fxdps():
    model, opt = make(0)
    step = fxdp.trace_step(train_step, model, opt, batches(1)[0])
    data = batches(3)
    with local_server(workers=WORLD) as (address, _), fxdp.Client(address) as c:
        trained = c.train(step, WORLD, batches=data[:2]).state
        assert any(k.startswith("const.") for k in trained) and "lm_head.weight" not in trained
        nxt = c.train(step, WORLD, batches=data[2:], state=trained).state

    # another seed, learning rate and weight decay: everything must come from the state
    model2, opt2 = make(1, lr=5.0, weight_decay=0.0)
    fxdp.load_into(model2, opt2, trained)
    assert model2.lm_head.weight is model2.transformer.wte.weight  # the tie survives
    g = opt2.param_groups[0]
    assert (g["lr"], g["weight_decay"]) == (
        float(trained["optim.group0.lr"]),
        float(trained["optim.group0.weight_decay"]),
    )
    assert_state_equals(trained, model2, opt2, 0, 0, "loaded")
    assert all(st["step"].item() == 2 for st in opt2.state.values())

    train_step(model2, opt2, data[2])  # the next step, eagerly
    assert_state_equals(nxt, model2, opt2, RTOL, ATOL, "next step")

    model3, opt3 = make(0)  # the user's own values survive where the state holds them (float32)
    fxdp.load_into(model3, opt3, trained)
    assert opt3.param_groups[0]["lr"] == 1e-3 and opt3.param_groups[0]["betas"] == (0.9, 0.999)


def test_a_state_that_does_not_fit_is_refused_naming_every_entry_and_nothing_changes():
    model, opt = make(0)
    state = fxdp.trace_step(train_step, model, opt, batches(1)[0]).initial_state()
    model2, opt2 = make(1)
    before = {n: p.detach().clone() for n, p in model2.named_parameters()}

    bad = dict(state)
    del bad["transformer.h.0.ln_1.weight"], bad["optim.transformer.h.1.mlp.c_fc.bias.exp_avg_sq"]
    bad["lm_head.weight"] = state["transformer.wte.weight"]
    bad["transformer.h.9.attn.bias"] = torch.zeros(3)
    with pytest.raises(ValueError) as e:
        fxdp.load_into(model2, opt2, bad)
    assert str(e.value) == (
        "load_into: the state does not match the model and optimizer: 2 missing from the state: "
        "transformer.h.0.ln_1.weight, optim.transformer.h.1.mlp.c_fc.bias.exp_avg_sq; 2 unexpected "
        "(not of this model and optimizer): lm_head.weight (tied to 'transformer.wte.weight', which "
        "the state holds once), transformer.h.9.attn.bias"
    )

    bad = dict(state)
    bad["transformer.wpe.weight"] = torch.zeros(8, 32)
    with pytest.raises(
        ValueError, match=r"'transformer.wpe.weight' has shape \[8, 32\], the model's \[16, 32\]"
    ):
        fxdp.load_into(model2, opt2, bad)

    with pytest.raises(ValueError, match=r"unexpected .*: optim\.transformer\.wte\.weight\.step"):
        fxdp.load_into(model2, None, state)  # the model alone: optimizer entries are not its
    for n, p in model2.named_parameters():
        assert torch.equal(p, before[n]), n
    assert not opt2.state and opt2.param_groups[0]["lr"] == 1e-3
