"""Shared tiny fixtures: a 2-digit arith task, a tokenizer trained on its corpus, and a ~20k-param model.

Session-scoped because building them costs ~1 s; tests that mutate a model must deep-copy it first.
"""

import pytest

from tba.config.schema import TinyModelConfig
from tba.models.builtin import build_tiny_model, train_tokenizer


@pytest.fixture(scope="session")
def arith_task():
    from tba.tasks.arith import ArithTask  # here, not at the top: a GPU image without reasoning-gym runs `-m gpu`

    return ArithTask(digits=2, train_size=200, test_size=20)


@pytest.fixture(scope="session")
def tiny_tokenizer(arith_task):
    return train_tokenizer(arith_task.corpus(), 128)


@pytest.fixture(scope="session")
def tiny_model(tiny_tokenizer):
    cfg = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    return build_tiny_model(tiny_tokenizer, cfg, seed=0).eval()


@pytest.fixture
def offline_hub(monkeypatch):
    """The Hub switched off for this test. The env vars are read when huggingface_hub/datasets are imported,
    so the module-level flags are flipped too; otherwise a load spends ~20 s in HTTP retries before failing."""
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
