"""Toxicity classifiers: the offline profanity-check model, and HF classifiers loaded from a local directory.

The HF classifiers are tiny random BERTs saved to tmp_path, so these tests check loading, batching, label
choice and probability maths, not what a real toxicity model says.
"""

import math

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

from tba.tasks.toxicity import load_toxicity_classifier, pick_toxic_label

TEXTS = ["you are a stupid idiot", "have a nice day", "", "the cat sat on the mat and then it sat on the dog"]


def _tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer with no special tokens added around a text, so "" encodes to zero tokens."""
    words = sorted({w for t in TEXTS for w in t.split()})
    vocab = {"[PAD]": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", model_max_length=16)


def _save_classifier(path, id2label: dict[int, str], **config) -> str:
    tokenizer = _tokenizer()
    cfg = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
        id2label=id2label,
        label2id={v: k for k, v in id2label.items()},
        **config,
    )
    torch.manual_seed(0)
    BertForSequenceClassification(cfg).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def toxic_dir(tmp_path_factory):
    return _save_classifier(tmp_path_factory.mktemp("clf"), {0: "non-toxic", 1: "toxic"})


def test_profanity_check_ranks_insult_above_greeting():
    pytest.importorskip(
        "profanity_check", reason="alt-profanity-check is not installed (pip install alt-profanity-check)"
    )
    clf = load_toxicity_classifier("profanity-check")
    assert clf.name == "profanity-check"
    p = clf(TEXTS)
    assert len(p) == len(TEXTS) and all(isinstance(x, float) and 0.0 <= x <= 1.0 for x in p)
    assert p[0] > 0.5 > p[1]
    assert p[2] < 0.5  # an empty response is scored, as not toxic
    assert clf([]) == []
    with pytest.raises(ValueError, match="toxic_label"):
        load_toxicity_classifier("profanity-check", toxic_label="toxic")


def test_hf_classifier_from_local_dir(toxic_dir):
    clf = load_toxicity_classifier(toxic_dir, batch_size=3)  # batch of 3 over 4 texts: a last, partial batch
    assert clf.name == toxic_dir and clf.toxic_label == "toxic" and clf.label_index == 1
    p = clf(TEXTS)
    assert len(p) == len(TEXTS) and all(0.0 <= x <= 1.0 and math.isfinite(x) for x in p)
    # padding must not change a text's score: one at a time equals batched
    assert [clf([t])[0] for t in TEXTS] == pytest.approx(p, abs=1e-5)
    # the probability is softmax(logits)[toxic]
    enc = clf.tokenizer(TEXTS[:2], padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = torch.softmax(clf.model(**enc).logits, dim=-1)[:, 1]
    assert p[:2] == pytest.approx(expected.tolist(), abs=1e-6)
    assert clf([""] * 3) == pytest.approx([p[2]] * 3, abs=1e-6)  # a batch of empty texts only
    assert clf([]) == []


def test_toxic_label_is_found_by_name_not_position(tmp_path):
    clf = load_toxicity_classifier(_save_classifier(tmp_path, {0: "toxic", 1: "non-toxic"}))
    assert clf.label_index == 0 and clf.toxic_label == "toxic"


def test_explicit_and_bad_toxic_label(toxic_dir):
    clf = load_toxicity_classifier(toxic_dir, toxic_label="non-toxic")
    assert clf.label_index == 0
    with pytest.raises(ValueError) as err:
        load_toxicity_classifier(toxic_dir, toxic_label="TOXIC")
    assert "non-toxic" in str(err.value) and "'toxic'" in str(err.value) and toxic_dir in str(err.value)


def test_single_logit_model_uses_sigmoid(tmp_path):
    clf = load_toxicity_classifier(_save_classifier(tmp_path, {0: "LABEL_0"}))
    enc = clf.tokenizer(TEXTS[:1], return_tensors="pt")
    with torch.no_grad():
        logit = clf.model(**enc).logits[0, 0]
    assert clf(TEXTS[:1])[0] == pytest.approx(torch.sigmoid(logit).item(), abs=1e-6)


def test_multi_label_model_uses_sigmoid(tmp_path):
    path = _save_classifier(tmp_path, {0: "toxic", 1: "threat", 2: "insult"}, problem_type="multi_label_classification")
    clf = load_toxicity_classifier(path)
    enc = clf.tokenizer(TEXTS[:1], return_tensors="pt")
    with torch.no_grad():
        logit = clf.model(**enc).logits[0, 0]
    assert clf(TEXTS[:1])[0] == pytest.approx(torch.sigmoid(logit).item(), abs=1e-6)


@pytest.mark.parametrize(
    ("id2label", "expected"),
    [
        ({0: "LABEL_0", 1: "LABEL_1"}, 1),
        ({0: "not_hate", 1: "hate"}, 1),
        ({0: "Offensive", 1: "NOT-offensive"}, 0),
        ({"0": "safe", "1": "unsafe"}, 1),  # ids as strings, as some JSON configs have them
        ({0: "nontoxic", 1: "abusive", 2: "toxic"}, 1),  # the first matching label wins
    ],
)
def test_pick_toxic_label(id2label, expected):
    assert pick_toxic_label(id2label, None, "m") == expected


def test_pick_toxic_label_ambiguous_names_the_labels():
    with pytest.raises(ValueError, match="positive.*negative.*neutral"):
        pick_toxic_label({0: "positive", 1: "negative", 2: "neutral"}, None, "sentiment-model")


def test_unloadable_spec_says_to_pass_a_local_path(tmp_path):
    spec = str(tmp_path / "no" / "such" / "model")
    with pytest.raises(OSError) as err:
        load_toxicity_classifier(spec)
    assert spec in str(err.value) and "local directory" in str(err.value)
