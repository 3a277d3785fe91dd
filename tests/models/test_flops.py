"""An update's model FLOPs (trainer/mfu's numerator): by hand for a known shape, and the matmuls against torch's own
FLOP counter over a real trainer update."""

import copy
import dataclasses

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from tba.algorithm.objectives import OBJECTIVES
from tba.algorithm.objectives.tb import beta_schedule
from tba.algorithm.trainer import Trainer
from tba.algorithm.types import Draw, Sample
from tba.config.schema import BaselineConfig, TBConfig, TinyModelConfig, TrainerConfig
from tba.models.flops import ModelFlops
from tba.models.shape import builtin_shape, shape_of

# the builtin architecture at hidden 32, 2 layers, 2 heads, MLP 64, 128 tokens, by hand: per layer q, k, v, o
# 4·32·32 = 4,096 and gate, up, down 3·32·64 = 6,144 → N = 2 × 10,240 = 20,480; the head 128·32 = 4,096;
# attention 12·L·H = 12·2·32 = 768 per token and token of context
TINY = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, vocab_size=128)
GROUP = [(5, [3, 4])]  # one prompt of 5 tokens, responses of 3 and 4


def test_the_shape_gives_the_hand_counted_weights():
    assert ModelFlops.of(builtin_shape(TINY)) == ModelFlops(body=20480, head=4096, layers=2, attention_width=32)


def test_one_update_by_hand():
    flops = ModelFlops.of(builtin_shape(TINY))
    # each sample alone: 8 + 9 tokens through the layers, 7 through the head, T² = 64 + 81
    assert flops.update(GROUP, shared_prompts=False) == 6 * 20480 * 17 + 6 * 4096 * 7 + 768 * (64 + 81)
    # the prompt once (T = 5), then each response but its last token (T = 8 and 9)
    assert flops.update(GROUP, shared_prompts=True) == 6 * 20480 * 10 + 6 * 4096 * 7 + 768 * (25 + 2 * 8 + 3 * 9)
    lora = ModelFlops.of(builtin_shape(TINY), lora=True)  # frozen weights: no weight gradients, 4 per weight
    assert lora.update(GROUP, shared_prompts=True) == 4 * 20480 * 10 + 4 * 4096 * 7 + 768 * 68
    assert flops.update(GROUP * 3, shared_prompts=True) == 3 * flops.update(GROUP, shared_prompts=True)


@pytest.mark.parametrize("shared", [False, True])
def test_the_weights_matmuls_are_what_torch_counts_in_a_trainer_update(tiny_model, tiny_tokenizer, shared):
    """torch's FlopCounterMode counts every matmul with weights (its CPU attention kernel it does not count: the
    attention term is the hand count's alone)."""
    prompt, response, k = 12, 24, 4
    g = torch.Generator().manual_seed(0)
    ids = lambda n: torch.randint(3, tiny_model.config.vocab_size, (n,), generator=g).tolist()  # noqa: E731
    draws = [Draw(i, ids(prompt), [Sample(ids(response), [0.0] * response, float(j % 2), 0) for j in range(k)],
                  online=True) for i in range(2)]
    cfg = TrainerConfig(prompts_per_step=2, samples_per_prompt=k, micro_batch_prompts=2, shared_prompts=shared)
    trainer = Trainer(copy.deepcopy(tiny_model), OBJECTIVES["tb"].bind(TBConfig(), BaselineConfig(), max_tokens=24),
                      cfg, beta=beta_schedule(TBConfig()), temperature=0.7, pad_id=tiny_tokenizer.pad_token_id)
    with FlopCounterMode(display=False) as counted:
        trainer.step(draws)
    matmuls = dataclasses.replace(ModelFlops.of(shape_of(tiny_model.config)), attention_width=0)
    expected = matmuls.update([(prompt, [response] * k)] * 2, shared_prompts=shared)
    assert counted.get_total_flops() == pytest.approx(expected, rel=0.01)
