# pytest configuration for the fxdp Python tests. Nothing magic: the fxdp package is installed
# (editable) in the project's .venv; shared helpers live in _util.py next to the tests.
import torch
from fxdp.traced import init_kernel_libraries

torch.manual_seed(0)
# The eager references the tests compute in this process run torch's VML ops (tanh, exp...) on
# 2 threads: make MKL's first VML call on one thread, as the workers and run_local do (MKL caches
# the CPU type it detects without a lock; docs/randomness.md "Hunting the rerun difference").
init_kernel_libraries()


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "real_models: Hugging Face transformers models trained on real workers "
        "(test_real_models.py); run alone with `pytest -m real_models tests/python`",
    )
    config.addinivalue_line(
        "markers",
        "install: builds the package's sdist and wheel and uses it from a fresh venv "
        "(~30 s; deselect with -m 'not install')",
    )
