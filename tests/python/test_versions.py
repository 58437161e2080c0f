"""The torch versions the frontend accepts (fxdp/versions.py): 2.13.x, what fxdp-worker runs."""

from __future__ import annotations

import re

import fxdp
import pytest
import torch
from fxdp import versions, zoo


@pytest.mark.parametrize("v", ["2.13.0", "2.13.0+cpu", "2.13.1+cu130"])
def test_2_13_is_accepted(v):
    versions.check_torch(v)


@pytest.mark.parametrize("v", ["2.4.0", "2.12.1+cpu", "2.14.0", "3.0.0", "nightly"])
def test_other_versions_are_refused_naming_them(v, monkeypatch):
    monkeypatch.delenv(versions.ALLOW_ENV, raising=False)
    with pytest.raises(
        fxdp.TraceError,
        match=rf"torch {re.escape(v)} is not supported: fxdp traces with torch 2\.13\.x",
    ):
        versions.check_torch(v)
    monkeypatch.setenv(versions.ALLOW_ENV, "1")
    versions.check_torch(v)


def test_trace_checks_the_installed_torch(monkeypatch):
    monkeypatch.delenv(versions.ALLOW_ENV, raising=False)
    monkeypatch.setattr(torch, "__version__", "2.4.1")
    e = zoo.get("mlp")
    model = e.model(0)
    with pytest.raises(fxdp.TraceError, match="torch 2.4.1 is not supported"):
        fxdp.trace(model, torch.optim.SGD(model.parameters(), lr=0.1), e.loss_fn, e.batch(0))
