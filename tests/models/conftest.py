"""Fixtures of the decoding and scoring tests: prompts of different lengths, and a tiny model of each family."""

import pytest
from families import FAMILIES, family

TEXTS = ["1+2=", "57+68=", "99+1=", "40+33="]  # different lengths: left padding is exercised


@pytest.fixture(scope="module")
def prompts(tiny_tokenizer):
    return [tiny_tokenizer(t)["input_ids"] for t in TEXTS]


@pytest.fixture(scope="module", params=FAMILIES)
def family_model(request, tiny_tokenizer):
    return family(request.param, tiny_tokenizer)
