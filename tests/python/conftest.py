# pytest configuration for the fxdp Python tests. Nothing magic: the fxdp package is installed
# (editable) in the project's .venv; shared helpers live in _util.py next to the tests.
import torch

torch.manual_seed(0)
