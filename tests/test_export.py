"""`tba export`: a LoRA policy comes out merged, loads with plain transformers and generates the same greedy text
as the run's policy; a run without a final policy exports its newest checkpoint; bad input gets a message."""

import copy

import torch
from transformers import AutoModelForCausalLM

from tba.cli import main
from tba.config import LoraConfig
from tba.generation import generate
from tba.models import apply_lora, load_model, save_checkpoint


def greedy(model, tok, prompts):
    ids = [tok(p)["input_ids"] for p in prompts]
    out = generate(model.eval(), ids, num_samples=1, greedy=True, max_new_tokens=12,
                   eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, logprobs=False)
    return [r for r, _ in out]


def test_a_lora_run_exports_a_merged_model_with_the_same_greedy_text(tmp_path, tiny_model, tiny_tokenizer):
    save_checkpoint(tiny_model, tiny_tokenizer, tmp_path / "base")
    policy = apply_lora(load_model(str(tmp_path / "base")), LoraConfig(enabled=True, r=4, alpha=8))
    torch.manual_seed(0)
    with torch.no_grad():  # trained adapters: B ≠ 0, so the merged weights differ from the base
        for name, p in policy.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn_like(p) * 0.3)
    run = tmp_path / "run"
    save_checkpoint(policy, tiny_tokenizer, run / "checkpoint")  # what a LoRA run leaves: the adapter
    assert (run / "checkpoint" / "adapter_config.json").is_file()

    assert main(["export", str(run), str(tmp_path / "out")]) == 0
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert not any("lora" in k for k in exported.state_dict())
    prompts = ["12+34=", "7+8=", "99+1="]
    assert greedy(exported, tiny_tokenizer, prompts) == greedy(policy, tiny_tokenizer, prompts)
    assert greedy(exported, tiny_tokenizer, prompts) != greedy(tiny_model, tiny_tokenizer, prompts)


def test_a_stopped_run_exports_its_newest_checkpoint(tmp_path, tiny_model, tiny_tokenizer, capsys):
    from tba import checkpoint as ckpt

    model = copy.deepcopy(tiny_model)
    optimizer = torch.optim.AdamW(model.parameters())
    run = tmp_path / "run"
    ckpt.save(run, step=3, policy=model, tokenizer=tiny_tokenizer, optimizer=optimizer, state={})
    assert main(["export", str(run), str(tmp_path / "out")]) == 0
    assert "exporting checkpoint step_0000003" in capsys.readouterr().out
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert all(torch.equal(a, b) for a, b in zip(exported.state_dict().values(), model.state_dict().values(),
                                                  strict=True))


def test_nothing_to_export_is_a_message(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["export", str(tmp_path / "empty"), str(tmp_path / "out")]) == 1
    assert "no final policy (checkpoint/) and no full checkpoint" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "missing"), str(tmp_path / "out")]) == 1
    assert "no such run directory" in capsys.readouterr().err
