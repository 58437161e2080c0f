"""Hugging Face ``transformers`` attention masks from a 2-D ``attention_mask``, made traceable.

Given a tokenizer's ``attention_mask`` (batch, seq) of 0/1, transformers' ``masking_utils`` builds
the 4-D mask the attention layers use, but first asks whether it may skip it: with no padding in
the batch, SDPA's ``is_causal=True`` (decoders) or no mask at all (encoders) does the same job
faster. That question reads the mask's values (``padding_mask.all()``), so the answer would be
baked into the graph: true for the example batch, wrong for the next one that has padding. While
fxdp traces, :func:`explicit_attention_masks` makes transformers build the explicit mask whenever
a mask is given (the path that is correct for every batch, padded or not), through transformers'
own registry of mask builders (``AttentionMaskInterface``): a local entry on the shared
``ALL_MASK_ATTENTION_FUNCTIONS`` for the "sdpa" and "eager" attention implementations calls the
builder with ``allow_is_causal_skip=False, allow_is_bidirectional_skip=False`` and no padding
mask, then applies the padding by broadcasting it over the rows, ``mask & padding[:, None, None,
:]`` (transformers' own ``padding_mask[batch_idx, kv_idx]`` indexes the batch dim with
``arange(B)`` reshaped to 4-D, which the batch-dim analysis cannot split). The entries the user
had are put back afterwards. Without a mask the skip reads no tensor value and is left as it is
(``is_causal=True``). GPT-2, Llama and BART trained this way equal eager transformers and, on N
ranks, one device (tests/python/test_real_models.py).

Nothing is imported: when ``transformers.masking_utils`` has not been loaded (no transformers
model in the process), this does nothing.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from typing import Callable, Iterator

import torch

# The attention implementations whose mask builders take the skip flags (flash and flex
# attention have their own builders, for devices fxdp does not target).
_IMPLEMENTATIONS = ("sdpa", "eager")


def _explicit(build: Callable) -> Callable:
    """``build`` (transformers' sdpa_mask or eager_mask) with the skips off and the 2-D padding mask
    applied by broadcasting it over the batch rows (``padding[:, None, None, kv]``) instead of
    transformers' ``padding_mask[batch_idx, kv_idx]``, so no op indexes the batch dim."""

    @functools.wraps(build)
    def explicit(*args, **kwargs):
        mask = kwargs.get("attention_mask")
        if mask is None or args:  # no padding to apply (or a caller fxdp does not know: as it is)
            return build(*args, **kwargs)
        kv_length, kv_offset = kwargs["kv_length"], kwargs.get("kv_offset", 0)
        pattern = build(
            **{
                **kwargs,
                "attention_mask": None,
                "allow_is_causal_skip": False,
                "allow_is_bidirectional_skip": False,
            }
        )
        if pattern is None:  # a builder of the user's that skips anyway: transformers' own path
            return build(
                **{**kwargs, "allow_is_causal_skip": False, "allow_is_bidirectional_skip": False}
            )
        keep = _padding(mask, kv_length, kv_offset)[:, None, None, :]
        if pattern.dtype == torch.bool:
            return pattern & keep
        return pattern.masked_fill(~keep, torch.finfo(pattern.dtype).min)

    return explicit


def _padding(mask: torch.Tensor, kv_length: int, kv_offset: int) -> torch.Tensor:
    """Columns ``kv_offset .. kv_offset + kv_length`` of the 2-D mask as booleans, zero-padded on
    the right as transformers' prepare_padding_mask pads it."""
    mask = mask.bool()
    if (short := kv_offset + kv_length - mask.shape[-1]) > 0:
        mask = torch.nn.functional.pad(mask, (0, short))
    return mask[:, kv_offset : kv_offset + kv_length]


@contextlib.contextmanager
def explicit_attention_masks() -> Iterator[None]:
    """While active, transformers builds an explicit attention mask from every 2-D mask it is given
    (see the module docstring)."""
    masking = sys.modules.get("transformers.masking_utils")
    registry = getattr(masking, "ALL_MASK_ATTENTION_FUNCTIONS", None)
    if registry is None:
        yield
        return
    library = type(registry)()  # a fresh interface has no local entries: transformers' own builders
    previous = {k: registry[k] for k in _IMPLEMENTATIONS if k in registry}
    try:
        for k, build in previous.items():
            registry[k] = _explicit(build)  # a local entry, on the instance every model reads
        yield
    finally:
        for k, build in previous.items():
            if build is library.get(k):
                del registry[k]
            else:
                registry[k] = build  # the user's own local entry
