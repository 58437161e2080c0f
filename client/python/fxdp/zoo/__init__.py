"""A small model zoo used by tests across fxdp (Python and C++).

Every entry has a model constructor, a loss function, a seeded example batch and the batch dim
of each input. Batch sizes differ from every other dim of the model (12 or 6), so batch-dim
analysis cannot be fooled by a coincidence.

    from fxdp import zoo
    e = zoo.get("mlp")
    model = e.make_model(); opt = zoo.make_optimizer("adam", model)
    step = fxdp.trace(model, opt, e.loss_fn, e.batch(0), batch_dim=e.batch_dim)

``python -m fxdp.zoo.export OUTDIR`` writes ``<model>_<optim>.pb`` and ``.safetensors``.
"""

from .models import MODELS, OPTIMIZERS, ZooEntry, get, make_optimizer, trace_entry

__all__ = ["MODELS", "OPTIMIZERS", "ZooEntry", "get", "make_optimizer", "trace_entry"]
