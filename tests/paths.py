"""Where the tests find the repository's files, whatever folder a test file sits in."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
RECIPES = REPO / "src" / "tba" / "recipes"
TINY = str(TESTS / "tiny.yaml")
"""The tiny recipe the end-to-end tests train."""
FIXTURES = TESTS / "fixtures"
SHARED = REPO.parent / "shared"
"""The project's shared folder, where a machine has it (the full GSM8K data)."""
