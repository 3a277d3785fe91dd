"""The sharded trainer (trainer.world_size = 2, FSDP2 over gloo on this CPU) against the single-process one: the
same updates from the same batches, the weights it publishes, its optimizer state through a sharded checkpoint."""

from __future__ import annotations

import copy

import pytest
import torch

from tba.algorithm.trainer import Trainer
from tba.algorithm.types import Draw, Sample
from tba.config import load_config
from tba.models import load_model, save_checkpoint
from tba.run.build import build_trainer, trainer_args

K, B = 2, 4


@pytest.fixture(scope="module")
def source(tmp_path_factory, tiny_model, tiny_tokenizer):
    path = tmp_path_factory.mktemp("ranks") / "init"
    save_checkpoint(tiny_model, tiny_tokenizer, path)
    return path


def _batches(n: int, vocab: int) -> list[list[Draw]]:
    """n batches of B groups × K samples with fixed token ids, rewards and reference log-probs."""
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        draws = []
        for p in range(B):
            prompt = torch.randint(3, vocab, (5 + p,), generator=g).tolist()
            samples = []
            for j in range(K):
                response = torch.randint(3, vocab, (4 + j + p % 3,), generator=g).tolist()
                ref = (-torch.rand(len(response), generator=g) * 4).tolist()
                samples.append(Sample(response, ref, reward=float(torch.randint(0, 2, (), generator=g)), version=0,
                                      behaviour_logprobs=ref))
            draws.append(Draw(p, prompt, samples, online=True))
        out.append(draws)
    return out


def _cfg(source, *overrides):
    return load_config(None, [f"model.policy={source}", "trainer.world_size=2", f"trainer.prompts_per_step={B}",
                              f"trainer.samples_per_prompt={K}", "trainer.micro_batch_prompts=1", "trainer.lr=1e-2",
                              "tb.beta_init=0.05", "tb.beta_final=0.05", "search.max_new_tokens=8", *overrides])


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


SPLIT_CHUNKED = ["trainer.micro_batch_samples=1", "trainer.logprob_chunk_tokens=3"]


@pytest.mark.parametrize("objective, extra", [("tb", []), ("tba_prime", []), ("tb", SPLIT_CHUNKED)],
                         ids=["tb", "tba_prime", "tb-split-chunked"])
def test_two_ranks_update_as_one_process(source, tiny_tokenizer, objective, extra):
    """`extra` on both sides: each group split over forwards, the log-probs chunked 3 positions at a time (that these
    equal whole groups and the plain path in one process: tests/algorithm/test_trainer.py)."""
    cfg = _cfg(source, f"objective={objective}", "baselines.reference_reset_steps=2", "trainer.max_grad_norm=1.0",
               *extra)
    single = Trainer(load_model(str(source)), **trainer_args(cfg, load_model(str(source)).eval(),
                                                             tiny_tokenizer.pad_token_id))
    whole = load_model(str(source))
    sharded = build_trainer(cfg, whole, load_model(str(source)).eval(), tiny_tokenizer, str(source))
    try:
        assert sharded.model.lm_head.weight is sharded.model.model.embed_tokens.weight  # still tied once sharded
        for draws in _batches(3, len(tiny_tokenizer)):
            a, b = single.step(copy.deepcopy(draws)), sharded.step(copy.deepcopy(draws))
            for key in ("trainer/loss", "trainer/grad_norm", "trainer/residual_std", "trainer/log_z_mean"):
                assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key
        assert sharded.version == single.version == 3
        published = sharded.weights()
        mine = single.model.state_dict()
        assert published.keys() == mine.keys()
        worst = max(_relative(published[k], mine[k]) for k in mine)
        assert worst <= 1e-5, worst
        master = sharded.state_dict()  # the sharded fp32 master weights, gathered: what was published, exactly
        assert all(torch.equal(published[k], master[k]) for k in published)
        assert all(torch.equal(whole.state_dict()[k], published[k]) for k in published)  # the whole copy
    finally:
        sharded.close()


def test_two_ranks_with_different_response_lengths_run_the_same_forwards(source, tiny_tokenizer):
    """Rank 0's groups are long-tailed (length buckets would split them into two forwards), rank 1's are not: every
    rank must still run the same forwards, since each forward of an FSDP2 model gathers the shards."""
    cfg = _cfg(source)
    single = Trainer(load_model(str(source)), **trainer_args(cfg, load_model(str(source)).eval(),
                                                             tiny_tokenizer.pad_token_id))
    sharded = build_trainer(cfg, load_model(str(source)), load_model(str(source)).eval(), tiny_tokenizer,
                            str(source))
    g = torch.Generator().manual_seed(1)
    draws = []
    for p, lengths in enumerate([(2, 40), (3, 36), (6, 6), (7, 7)]):  # ranks 0 and 1 get two groups each
        samples = [Sample(torch.randint(3, len(tiny_tokenizer), (n,), generator=g).tolist(), [-1.0] * n,
                          reward=float(j), version=0) for j, n in enumerate(lengths)]
        draws.append(Draw(p, torch.randint(3, len(tiny_tokenizer), (5,), generator=g).tolist(), samples, online=True))
    try:
        a, b = single.step(copy.deepcopy(draws)), sharded.step(copy.deepcopy(draws))
        assert b["trainer/loss"] == pytest.approx(a["trainer/loss"], rel=1e-5)
        assert b["trainer/grad_norm"] == pytest.approx(a["trainer/grad_norm"], rel=1e-5)
    finally:
        sharded.close()


def test_two_ranks_train_lora_adapters_as_one_process(source, tiny_tokenizer):
    cfg = _cfg(source, "model.lora.enabled=true", "model.lora.r=4")
    from tba.models import apply_lora

    start = apply_lora(load_model(str(source)), cfg.model.lora)  # A random, B = 0: the same start for both
    single = Trainer(copy.deepcopy(start), **trainer_args(cfg, None, tiny_tokenizer.pad_token_id))
    sharded = build_trainer(cfg, start, None, tiny_tokenizer, str(source))
    try:
        for draws in _batches(3, len(tiny_tokenizer)):
            single.step(copy.deepcopy(draws)), sharded.step(copy.deepcopy(draws))
        published, mine = sharded.weights(), single.weights()
        assert published.keys() == mine.keys() and all("lora" in k for k in mine)
        assert max(_relative(published[k], mine[k]) for k in mine) <= 1e-5
    finally:
        sharded.close()


def test_activation_checkpointing_changes_no_update_and_bf16_compute_stays_close(source, tiny_tokenizer):
    """trainer.activation_checkpointing recomputes each layer in backward: the same update to 1e-5; bf16 gathered
    weights (fsdp.param_dtype) over fp32 master weights: close to the fp32 update, not equal."""
    single = Trainer(load_model(str(source)), **trainer_args(_cfg(source), None, tiny_tokenizer.pad_token_id))
    batches = _batches(2, len(tiny_tokenizer))
    for draws in batches:
        single.step(copy.deepcopy(draws))
    mine = single.model.state_dict()
    for overrides, bound in ((["trainer.activation_checkpointing=true"], 1e-5),
                             (["trainer.fsdp.param_dtype=bfloat16"], 0.2)):
        sharded = build_trainer(_cfg(source, *overrides), load_model(str(source)), None, tiny_tokenizer, str(source))
        try:
            for draws in batches:
                sharded.step(copy.deepcopy(draws))
            published = sharded.weights()
            assert published.keys() == mine.keys() and all(v.dtype == torch.float32 for v in published.values())
            worst = max(_relative(published[k].float(), mine[k]) for k in mine)
            assert worst <= bound, (overrides, worst)
            if bound > 1e-5:
                assert worst > 1e-5  # bf16 forward and backward did change the update
        finally:
            sharded.close()
