"""The one wrapper the tests give a ``transformers`` model (_real_models, test_moe_dispatch,
test_op_rule_models): the batch's tensors, in order, as the model's keyword arguments."""

from __future__ import annotations

from typing import Sequence

import torch


class KeywordCall(torch.nn.Module):
    """``model(**{names[i]: inputs[i]})``, its ``out``: the model's own ``loss`` (given labels),
    or its ``logits``. The model stays the attribute ``model`` (its state names start with
    ``model.``)."""

    def __init__(self, model: torch.nn.Module, names: Sequence[str], out: str = "loss"):
        super().__init__()
        self.model, self.names, self.out = model, tuple(names), out

    def forward(self, *inputs):
        return getattr(self.model(**dict(zip(self.names, inputs))), self.out)
