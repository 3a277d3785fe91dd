"""The published shapes (tba.models.published) instantiated on the meta device give the parameter counts the models'
own cards state (total and non-embedding, in billions: an independent check of every width, depth, head count,
vocabulary and tie in the table), and `model_shape` finds them offline when no cache has them."""

import pytest

from tba.config.schema import TinyModelConfig
from tba.models.builtin import tiny_config
from tba.models.published import PUBLISHED, published_config
from tba.models.shape import model_shape, shape_of, source_config
from tba.models.sources import ModelLoadError

CARDS = {
    # model card: "Number of Parameters" and "Number of Parameters (Non-Embedding)", billions
    "Qwen/Qwen2.5-0.5B-Instruct": (0.49, 0.36),
    "Qwen/Qwen2.5-1.5B-Instruct": (1.54, 1.31),
    "Qwen/Qwen2.5-3B-Instruct": (3.09, 2.77),
    "Qwen/Qwen2.5-7B-Instruct": (7.61, 6.53),
    "Qwen/Qwen3-0.6B": (0.6, 0.44),
    "Qwen/Qwen3-1.7B": (1.7, 1.4),
    "Qwen/Qwen3-4B": (4.0, 3.6),
    "Qwen/Qwen3-8B": (8.2, 6.95),
    "meta-llama/Llama-3.2-1B-Instruct": (1.23, None),
    "meta-llama/Llama-3.2-3B-Instruct": (3.21, None),
    "meta-llama/Llama-3.1-8B-Instruct": (8.03, None),
}


@pytest.mark.parametrize("name", sorted(CARDS))
def test_each_published_shape_has_its_model_cards_parameter_counts(name):
    config = published_config(name)
    shape = shape_of(config)
    total, non_embedding = CARDS[name]
    digits = len(str(total).split(".")[1])
    assert shape.params / 1e9 == pytest.approx(total, abs=10**-digits)
    if non_embedding is not None:  # the cards leave out the input embeddings and an untied head
        embeddings = shape.vocab * shape.hidden * (1 if config.tie_word_embeddings else 2)
        assert (shape.params - embeddings) / 1e9 == pytest.approx(non_embedding, abs=10**-digits)


def test_every_entry_builds_its_architecture_and_base_and_instruct_share_a_shape():
    shapes = {name: shape_of(published_config(name)) for name in PUBLISHED}
    assert shapes["Qwen/Qwen2.5-7B"].params == shapes["Qwen/Qwen2.5-7B-Instruct"].params == 7615616512
    assert shapes["meta-llama/Llama-3.1-8B"].params == shapes["meta-llama/Meta-Llama-3-8B"].params == 8030261248
    assert (shapes["Qwen/Qwen3-8B"].head_dim, shapes["meta-llama/Llama-3.2-1B"].head_dim) == (128, 64)
    assert type(published_config("Qwen/Qwen3-0.6B")).__name__ == "Qwen3Config"
    assert published_config("qwen/qwen2.5-7b-instruct") is not None  # the hub's names are not case-sensitive


def test_a_hub_name_no_cache_has_plans_offline_from_the_table_and_an_unknown_one_says_what_is_known(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert model_shape("Qwen/Qwen2.5-1.5B-Instruct", TinyModelConfig()).layers == 28
    with pytest.raises(ModelLoadError, match="not among the published shapes tba knows: Qwen/Qwen2.5-0.5B"):
        source_config("nobody/no-such-model-7B")


def test_a_bare_config_json_is_a_shape(tmp_path):
    tiny_config(TinyModelConfig(16, 2, 2, 32, 20), 20, bos=1, eos=2, pad=0).save_pretrained(tmp_path)
    shape = model_shape(str(tmp_path / "config.json"), TinyModelConfig())
    assert (shape.hidden, shape.layers, shape.vocab) == (16, 2, 20)
