"""RewardModel: the TL;DR reward read at the EOS position, with tiny GPT-NeoX classifiers built from configs.

The models are random, so these tests check *where* the score is read and what is fed in (EOS re-appended,
padding, truncation, penalties), against an unbatched forward pass computed independently here.
"""

import huggingface_hub
import pytest
import torch
from transformers import GPTNeoXConfig, GPTNeoXForSequenceClassification

from tba.models import ModelLoadError
from tba.models.builtin import train_tokenizer
from tba.tasks.reward_model import RewardModel

CORPUS = [f"SUBREDDIT: r/test\n\nTITLE: post {i}\n\nPOST: my cat ate {i} socks today and then slept\n\nTL;DR:"
          f" cat ate {i} socks" for i in range(40)]
QUERIES = ["POST: my cat ate socks\n\nTL;DR:", "TITLE: dog\n\nPOST: the dog slept all day long\n\nTL;DR:", "TL;DR:"]
RESPONSES = [" cat ate socks", " dog slept", ""]


def save_rm(path, tokenizer, *, seed=0, max_positions=128) -> str:
    """A 2-layer GPT-NeoX scalar classifier + `tokenizer`, saved as a reward model would be."""
    cfg = GPTNeoXConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=max_positions, num_labels=1,
                        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(seed)
    GPTNeoXForSequenceClassification(cfg).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(CORPUS, 200)


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory, tokenizer):
    return save_rm(tmp_path_factory.mktemp("rm"), tokenizer)


@pytest.fixture(scope="module")
def rm(rm_dir):
    return RewardModel(rm_dir, batch_size=2)


def manual_score(rm: RewardModel, ids: list[int]) -> float:
    """The classifier's head on the backbone's last hidden state of one unpadded sequence."""
    with torch.no_grad():
        hidden = rm.model.gpt_neox(input_ids=torch.tensor([ids])).last_hidden_state
        return rm.model.score(hidden[0, -1]).item()


def test_unfinished_responses_get_the_penalty_and_are_not_scored(rm, rm_dir):
    values = rm.score(QUERIES, RESPONSES, [False, True, False])
    assert values[0] == -1.0 and values[2] == -1.0 and values[1] != -1.0
    assert RewardModel(rm_dir, non_eos_penalty=-3.0).score(QUERIES[:1], RESPONSES[:1], [False]) == [-3.0]
    assert rm.score([], [], []) == []


def test_score_is_the_head_at_the_re_appended_eos(rm, tokenizer):
    values = rm.score(QUERIES, RESPONSES, [True] * 3)
    for q, r, value in zip(QUERIES, RESPONSES, values, strict=True):
        ids = tokenizer(q)["input_ids"] + tokenizer(r, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        assert value == pytest.approx(manual_score(rm, ids), abs=1e-5)
        # pad != eos here, so transformers' own pooling (last non-pad token) agrees on an unpadded sequence
        with torch.no_grad():
            assert value == pytest.approx(rm.model(input_ids=torch.tensor([ids])).logits[0, 0].item(), abs=1e-5)
    # without the EOS the RM reads another position and gives another number
    assert rm.score_texts(QUERIES[:1], RESPONSES[:1], append_eos=False) != pytest.approx(values[:1], abs=1e-6)


def test_score_does_not_depend_on_batch_composition_or_padding(rm_dir):
    queries = QUERIES * 3 + ["POST: " + "long words here " * 10 + "\n\nTL;DR:"]
    responses = RESPONSES * 3 + [" long"]
    alone = RewardModel(rm_dir, batch_size=1).score_texts(queries, responses)
    batched = RewardModel(rm_dir, batch_size=4).score_texts(queries, responses)
    order = list(reversed(range(len(queries))))
    shuffled = RewardModel(rm_dir, batch_size=5).score_texts([queries[i] for i in order],
                                                            [responses[i] for i in order])
    assert batched == pytest.approx(alone, abs=1e-5)
    assert [shuffled[order.index(i)] for i in range(len(queries))] == pytest.approx(alone, abs=1e-5)


def test_pad_equal_to_eos_is_scored_at_the_eos(tmp_path, tokenizer):
    """Pythia's tokenizers use pad == EOS: pooling by "first pad token" would land before the EOS."""
    import copy

    tok = copy.deepcopy(tokenizer)
    tok.pad_token = tok.eos_token
    rm = RewardModel(save_rm(tmp_path, tok, seed=1), batch_size=3)
    assert rm.pad_id == rm.eos_id
    values = rm.score(QUERIES, RESPONSES, [True] * 3)
    for q, r, value in zip(QUERIES, RESPONSES, values, strict=True):
        ids = tok(q)["input_ids"] + tok(r, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        assert value == pytest.approx(manual_score(rm, ids), abs=1e-5)


def test_long_queries_lose_their_start_and_keep_the_response(tmp_path, tokenizer):
    rm = RewardModel(save_rm(tmp_path, tokenizer, max_positions=24))
    query, response = "POST: " + "my cat ate socks " * 20 + "\n\nTL;DR:", " cat ate socks"
    ids = rm.encode(query, response, append_eos=True)
    r = tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert len(ids) == 24 and ids[-len(r):] == r
    assert ids[:-len(r)] == tokenizer(query)["input_ids"][-(24 - len(r)):]
    assert rm.score([query], [response], [True]) == pytest.approx([manual_score(rm, ids)], abs=1e-5)


def test_unreachable_hub_name_names_the_model_and_asks_for_a_local_directory(monkeypatch, rm_dir):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelLoadError, match="no-such-org/no-such-rm") as e:
        RewardModel("no-such-org/no-such-rm", tokenizer=rm_dir)
    assert "local directory" in str(e.value)
    with pytest.raises(ModelLoadError, match="no-such-org/tokenizer"):
        RewardModel(rm_dir, tokenizer="no-such-org/tokenizer")
