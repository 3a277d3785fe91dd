"""The built-in model, so that `tba train` runs with no network: a Llama-style config (the fastest architecture on
CPU at this size) and a byte-level BPE tokenizer trained locally with `tokenizers`, digits split one per token so
that arithmetic is learnable by a 1M-parameter model.
"""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

from tba.config.schema import TinyModelConfig

SPECIALS = ["<pad>", "<bos>", "<eos>"]


def train_tokenizer(corpus: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE with single-digit tokens; `<bos>` is prepended by the post-processor."""
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer)
    bos = tok.token_to_id("<bos>")
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", bos)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", padding_side="left"
    )


def tiny_config(cfg: TinyModelConfig, vocab_size: int, *, bos: int, eos: int, pad: int) -> LlamaConfig:
    """The builtin model's config for a tokenizer of `vocab_size` tokens (tba.models.shape plans with it too)."""
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=pad,
    )


def build_tiny_model(tokenizer: PreTrainedTokenizerFast, cfg: TinyModelConfig, seed: int):
    config = tiny_config(cfg, len(tokenizer), bos=tokenizer.bos_token_id, eos=tokenizer.eos_token_id,
                         pad=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config)
