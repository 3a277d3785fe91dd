"""`tba export`: a LoRA policy comes out merged, loads with plain transformers and generates the same greedy text
as the run's policy; a run without a final policy exports its newest checkpoint; bad input gets a message."""

import copy
import importlib.util

import pytest
import torch
from transformers import AutoModelForCausalLM

from tba.cli import main
from tba.config.schema import LoraConfig
from tba.models import apply_lora, load_model, save_checkpoint
from tba.models.generation import generate


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
    from tba.run import checkpoint as ckpt

    model = copy.deepcopy(tiny_model)
    optimizer = torch.optim.AdamW(model.parameters())
    run = tmp_path / "run"
    ckpt.save(run, step=3, policy=model, tokenizer=tiny_tokenizer, optimizer=optimizer, state={})
    assert main(["export", str(run), str(tmp_path / "out")]) == 0
    assert "exporting checkpoint step_0000003" in capsys.readouterr().err  # the log, on stderr
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert all(torch.equal(a, b) for a, b in zip(exported.state_dict().values(), model.state_dict().values(),
                                                  strict=True))


def test_nothing_to_export_is_a_message(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["export", str(tmp_path / "empty"), str(tmp_path / "out")]) == 1
    assert "no final policy (checkpoint/) and no full checkpoint" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "missing"), str(tmp_path / "out")]) == 1
    assert "no such run directory" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_an_exported_lora_model_serves_with_vllm_and_decodes_as_the_policy(tmp_path, arith_task):
    """The export is what a user serves: vllm.LLM loads it (tokenizer included) and its greedy tokens are the
    run policy's. A model vLLM's CPU attention accepts (head size 32)."""
    from vllm import LLM, SamplingParams

    from tba.config.schema import TinyModelConfig
    from tba.models.builtin import build_tiny_model, train_tokenizer

    tok = train_tokenizer(arith_task.corpus(), 128)
    save_checkpoint(build_tiny_model(tok, TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2,
                                                          intermediate_size=128), seed=0), tok, tmp_path / "base")
    policy = apply_lora(load_model(str(tmp_path / "base")), LoraConfig(enabled=True, r=4, alpha=8))
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn_like(p) * 0.3)
    save_checkpoint(policy, tok, tmp_path / "run" / "checkpoint")
    assert main(["export", str(tmp_path / "run"), str(tmp_path / "out")]) == 0

    prompts = ["12+34=", "7+8=", "99+1="]
    llm = LLM(str(tmp_path / "out"), dtype="float32", enforce_eager=True, max_model_len=64,
              kv_cache_memory_bytes=1 << 27, seed=0)
    try:
        outs = llm.generate([{"prompt_token_ids": tok(p)["input_ids"]} for p in prompts],
                            SamplingParams(temperature=0.0, max_tokens=12), use_tqdm=False)
    finally:  # as tba.rollout.samplers.vllm closes its engines: later engines (and process checks) find a clean slate
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        llm.llm_engine.engine_core.shutdown()
        del llm
        cleanup_dist_env_and_memory()
    served = [list(o.outputs[0].token_ids) for o in outs]
    expected = greedy(policy, tok, prompts)

    def upto_eos(ids):
        return ids[: ids.index(tok.eos_token_id) + 1] if tok.eos_token_id in ids else ids

    assert [upto_eos(s) for s in served] == [upto_eos(e) for e in expected]
    import time

    from runs import child_processes

    deadline = time.monotonic() + 120  # the engine-core process exits after shutdown(); slowly under load
    while child_processes() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not child_processes()
