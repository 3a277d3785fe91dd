"""A tiny model of every family the recipes use — Llama (also grouped-query, as SmolLM2), GPT-2 (red-teaming),
GPT-NeoX (TL;DR / Pythia), Qwen2 with tied embeddings (the GPU recipes) and a PEFT LoRA wrapper with non-zero
adapters — for the decoding and scoring tests (tests/models)."""

import torch


def family(name: str, tok):
    from transformers import AutoModelForCausalLM, GPT2Config, GPTNeoXConfig, LlamaConfig, Qwen2Config

    ids = dict(vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
               pad_token_id=tok.pad_token_id)
    small = dict(hidden_size=32, num_hidden_layers=2, intermediate_size=64, max_position_embeddings=128,
                 initializer_range=0.3)  # sharp enough that greedy never meets a near-tie
    config = {
        "llama-gqa": lambda: LlamaConfig(**ids, **small, num_attention_heads=4, num_key_value_heads=2),
        "gpt2": lambda: GPT2Config(**ids, n_embd=32, n_layer=2, n_head=2, n_positions=128, initializer_range=0.3),
        "gpt-neox": lambda: GPTNeoXConfig(**ids, **small, num_attention_heads=2),
        "qwen2-tied": lambda: Qwen2Config(**ids, **small, num_attention_heads=4, num_key_value_heads=2,
                                          tie_word_embeddings=True),
    }
    torch.manual_seed(0)
    if name == "lora":
        from peft import LoraConfig, get_peft_model

        base = AutoModelForCausalLM.from_config(config["llama-gqa"]())
        lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)
        return get_peft_model(base, lora).eval()
    return AutoModelForCausalLM.from_config(config[name]()).eval()


FAMILIES = ["llama-gqa", "gpt2", "gpt-neox", "lora"]
