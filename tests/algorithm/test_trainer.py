"""The trainer: LR schedules by hand, one TB update, skipping non-finite steps, gradient accumulation, prompt groups
split over forwards, the chunked LM head and activation checkpointing against the plain update."""

import copy
import dataclasses
import functools
import math

import pytest
import torch

from tba.algorithm.objectives import OBJECTIVES
from tba.algorithm.objectives.tb import beta_schedule, vargrad_tb_loss
from tba.algorithm.objectives.tba_prime import ResettingReference
from tba.algorithm.trainer import Trainer, lr_factor
from tba.algorithm.types import Draw
from tba.config.schema import BaselineConfig, SearchConfig, TBConfig, TrainerConfig
from tba.models.logprobs import response_logprobs
from tba.models.recompute import decoder_layers
from tba.rollout.samplers.hf import HFSampler
from tba.rollout.searcher import Searcher

K = 4


@pytest.mark.parametrize("step, expected", [(1, 0.5), (2, 1.0), (5, 1.0), (6, 0.5 * (1 + math.cos(math.pi / 4))),
                                            (7, 0.5), (9, 0.0)])
def test_wsd_hand_values(step, expected):
    cfg = TrainerConfig(steps=9, lr_schedule="wsd", warmup_steps=2, stable_steps=3, decay_steps=4)
    assert lr_factor(step, cfg) == pytest.approx(expected, abs=1e-12)


def test_wsd_stops_mid_decay_when_steps_end_first():
    # the paper's Fig. 1 run: 50 warmup / 350 stable / 600 decay over 700 steps ends at 50 % of peak
    cfg = TrainerConfig(steps=700, lr_schedule="wsd", warmup_steps=50, stable_steps=350, decay_steps=600)
    assert lr_factor(400, cfg) == 1.0 and lr_factor(700, cfg) == pytest.approx(0.5)
    # stable_steps=None: the decay ends exactly at the last step
    cfg = TrainerConfig(steps=10, lr_schedule="wsd", warmup_steps=2, stable_steps=None, decay_steps=4)
    assert [lr_factor(s, cfg) for s in (6, 8, 10)] == pytest.approx([1.0, 0.5, 0.0], abs=1e-12)


def test_constant_and_linear_hand_values():
    constant = TrainerConfig(steps=10, lr_schedule="constant")
    assert [lr_factor(s, constant) for s in (1, 10)] == [1.0, 1.0]
    warm = TrainerConfig(steps=10, lr_schedule="constant", warmup_steps=4)
    assert [lr_factor(s, warm) for s in (1, 2, 4, 9)] == [0.25, 0.5, 1.0, 1.0]
    # linear to 0 at the last step, as HF's scheduler stepped once before each update
    linear = TrainerConfig(steps=10, lr_schedule="linear")
    assert [lr_factor(s, linear) for s in (1, 5, 10)] == pytest.approx([0.9, 0.5, 0.0])
    linear_warm = TrainerConfig(steps=10, lr_schedule="linear", warmup_steps=2)
    assert [lr_factor(s, linear_warm) for s in (1, 2, 3, 10)] == pytest.approx([0.5, 1.0, 0.875, 0.0])


@pytest.fixture(scope="module")
def draws(tiny_model, tiny_tokenizer, arith_task):
    """4 prompt groups × K searcher samples; rewards overwritten to 1,0,1,0 so every group carries signal."""
    cfg = SearchConfig(temperature=0.7, generations_per_prompt=K, prompts_per_batch=4, max_new_tokens=8)
    searcher = Searcher(HFSampler(copy.deepcopy(tiny_model), tiny_tokenizer), copy.deepcopy(tiny_model), tiny_tokenizer,
                        arith_task, cfg, seed=0)
    torch.manual_seed(0)
    return [Draw(g.prompt_id, g.prompt_tokens,
                 [dataclasses.replace(s, reward=float(j % 2 == 0)) for j, s in enumerate(g.samples)], online=True)
            for g in searcher.step()]


def _trainer(model, tok, micro_batch_prompts=4, lr=1e-2):
    cfg = TrainerConfig(steps=10, lr=lr, prompts_per_step=4, samples_per_prompt=K,
                        micro_batch_prompts=micro_batch_prompts)
    return Trainer(copy.deepcopy(model), OBJECTIVES["tb"].bind(TBConfig(), BaselineConfig(), max_tokens=8), cfg,
                   beta=beta_schedule(TBConfig(beta_init=0.05, beta_final=0.05)), temperature=0.7,
                   pad_id=tok.pad_token_id)


def _params(model):
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def test_step_updates_weights_and_version_and_returns_finite_metrics(tiny_model, tiny_tokenizer, draws):
    trainer = _trainer(tiny_model, tiny_tokenizer)
    before = _params(trainer.model)
    metrics = trainer.step(draws[:2])
    assert trainer.version == 1 and trainer.skipped_steps == 0
    assert math.isfinite(metrics["trainer/loss"]) and metrics["trainer/loss"] > 0
    assert math.isfinite(metrics["trainer/grad_norm"]) and metrics["trainer/skipped"] == 0.0
    assert metrics["trainer/lr"] == 1e-2 and metrics["trainer/beta"] == 0.05
    assert any(not torch.equal(before[k], v) for k, v in _params(trainer.model).items())
    assert all(p.grad is None for p in trainer.model.parameters())  # gradients are cleared
    weights = trainer.weights()
    assert weights.keys() == trainer.model.state_dict().keys()
    # the trainer's own tensors (device, dtype, storage): transports copy them, the trainer does not
    state = trainer.model.state_dict()
    assert all(w.data_ptr() == state[k].data_ptr() for k, w in weights.items())
    trainer.step(draws[2:])
    assert trainer.version == 2


def test_the_loss_is_the_full_batch_tb_loss(tiny_model, tiny_tokenizer, draws):
    trainer = _trainer(tiny_model, tiny_tokenizer, micro_batch_prompts=1)
    with torch.no_grad():
        prompts = [d.prompt_tokens for d in draws for _ in d.samples]
        responses = [s.response for d in draws for s in d.samples]
        logp, _ = response_logprobs(trainer.model, prompts, responses, 0.7, tiny_tokenizer.pad_token_id)
        expected = vargrad_tb_loss(
            logp.sum(-1), torch.tensor([s.ref_logprob_sum for d in draws for s in d.samples]),
            torch.tensor([s.reward for d in draws for s in d.samples]),
            torch.tensor([i for i, d in enumerate(draws) for _ in d.samples]), 0.05).item()
    assert trainer.step(draws)["trainer/loss"] == pytest.approx(expected, rel=1e-5)


def test_non_finite_rewards_skip_the_update(tiny_model, tiny_tokenizer, draws):
    trainer = _trainer(tiny_model, tiny_tokenizer)
    bad = Draw(draws[0].prompt_id, draws[0].prompt_tokens,
               [dataclasses.replace(s, reward=float("nan")) for s in draws[0].samples], online=True)
    before = _params(trainer.model)
    metrics = trainer.step([bad, draws[1]])
    assert metrics["trainer/skipped"] == 1.0 and trainer.skipped_steps == 1 and trainer.version == 0
    assert all(torch.equal(before[k], v) for k, v in _params(trainer.model).items())
    assert all(p.grad is None for p in trainer.model.parameters())  # nothing leaks into the next step
    assert trainer.step(draws[:2])["trainer/skipped"] == 0.0 and trainer.version == 1


def _one_step(model, tok, draws, micro_batch_prompts, sgd=False):
    trainer = _trainer(model, tok, micro_batch_prompts=micro_batch_prompts, lr=1e-2)
    if sgd:  # the LR schedule still sets param_groups[*]["lr"]; with SGD, Δθ = −lr·∇L exposes the gradient
        trainer.optimizer = torch.optim.SGD(trainer.model.parameters(), lr=1e-2)
    before = _params(trainer.model)
    metrics = trainer.step(draws)
    return metrics, {k: (v - before[k]) / -1e-2 if sgd else v for k, v in _params(trainer.model).items()}


@pytest.mark.parametrize("sgd", [False, True], ids=["adamw_params", "sgd_gradients"])
def test_gradient_accumulation_does_not_change_the_update(tiny_model, tiny_tokenizer, draws, sgd):
    full_metrics, full = _one_step(tiny_model, tiny_tokenizer, draws, micro_batch_prompts=4, sgd=sgd)
    for mb in (1, 3):  # 3: uneven micro-batches (3 + 1 prompt groups)
        metrics, other = _one_step(tiny_model, tiny_tokenizer, draws, micro_batch_prompts=mb, sgd=sgd)
        assert metrics["trainer/loss"] == pytest.approx(full_metrics["trainer/loss"], rel=1e-5)
        assert metrics["trainer/grad_norm"] == pytest.approx(full_metrics["trainer/grad_norm"], rel=1e-4)
        # AdamW's first step is ≈ lr·g/(|g| + ε): float noise in ~1e-7 gradient entries moves a parameter by up
        # to a few 1e-3·lr, so parameters are compared at 1e-2·lr. SGD exposes the gradients at tight tolerance.
        atol = 1e-5 if sgd else 1e-2 * 1e-2
        for k in full:
            torch.testing.assert_close(other[k], full[k], atol=atol, rtol=1e-4, msg=k)
    if sgd:
        assert max(v.abs().max().item() for v in full.values()) > 1e-3  # gradients are not trivially zero


def test_a_sample_without_behaviour_logprobs_is_an_error_for_ratio_objectives(tiny_model, tiny_tokenizer, draws):
    """Missing behaviour log-probs used to become 0, turning the ratio π_θ/μ into π_θ without a word."""
    stripped = [dataclasses.replace(d, samples=[dataclasses.replace(s, behaviour_logprobs=[]) for s in d.samples])
                for d in draws]
    cfg = TrainerConfig(steps=10, lr=1e-2, prompts_per_step=4, samples_per_prompt=K, micro_batch_prompts=4)
    for objective in ("dr_grpo", "tba_prime"):
        own = ResettingReference(copy.deepcopy(tiny_model), None) if OBJECTIVES[objective].owns_reference else None
        trainer = Trainer(copy.deepcopy(tiny_model), OBJECTIVES[objective].bind(TBConfig(), BaselineConfig(),
                                                                                 max_tokens=8),
                          cfg, beta=beta_schedule(TBConfig()), temperature=0.7, pad_id=tiny_tokenizer.pad_token_id,
                          reference=own)
        with pytest.raises(ValueError, match="behaviour log-probs"):
            trainer.step(stripped)
        assert trainer.version == 0
    assert _trainer(tiny_model, tiny_tokenizer).step(stripped)["trainer/skipped"] == 0.0  # TB does not read them


def test_dropout_is_off_during_updates(tiny_model, tiny_tokenizer, draws):
    """With dropout left on, log π_θ of the same batch differs call to call (noise on one side of TB's residual)."""
    model = copy.deepcopy(tiny_model)
    for m in model.modules():
        if hasattr(m, "attention_dropout"):
            m.attention_dropout = 0.5
    cfg = TrainerConfig(steps=10, lr=1e-12, prompts_per_step=4, samples_per_prompt=K, micro_batch_prompts=4)
    trainer = Trainer(model, OBJECTIVES["tb"].bind(TBConfig(), BaselineConfig(), max_tokens=8), cfg,
                      beta=beta_schedule(TBConfig()), temperature=0.7, pad_id=tiny_tokenizer.pad_token_id)
    first, second = trainer.step(draws), trainer.step(draws)
    assert first["trainer/logp_mean"] == pytest.approx(second["trainer/logp_mean"], abs=1e-5)
    assert not model.training


def test_tb_diagnostics_match_the_loss(tiny_model, tiny_tokenizer, draws):
    """residual_std² is the TB loss (δ has group mean 0), for TB and reported alike for other objectives."""
    metrics = _trainer(tiny_model, tiny_tokenizer).step(draws)
    assert metrics["trainer/residual_std"] ** 2 == pytest.approx(metrics["trainer/loss"], rel=1e-4)
    assert metrics["trainer/residual_max"] >= metrics["trainer/residual_std"] > 0
    assert math.isfinite(metrics["trainer/log_z_mean"])


def test_stale_lr_age_scales_the_step_by_the_median_sample_age(tiny_model, tiny_tokenizer, draws):
    # samples 0..N−1 versions old behind a trainer at version 20: median age a → lr·min(1, a₀/a)
    trainer = _trainer(tiny_model, tiny_tokenizer)
    trainer.version = 20
    aged = [Draw(d.prompt_id, d.prompt_tokens, [dataclasses.replace(s, version=20 - age) for s in d.samples],
                 online=True) for d, age in zip(draws, (2, 8, 8, 12), strict=True)]
    assert trainer.cfg.stale_lr_age == 4.0  # the default
    assert trainer.age_factor(aged) == pytest.approx(4.0 / 8)  # ages 2,8,8,12 (K each): median 8
    assert trainer.age_factor(aged[:1]) == 1.0  # median 2 ≤ a₀: the scheduled lr
    assert trainer.step(aged)["trainer/lr"] == pytest.approx(1e-2 * 0.5)
    trainer.cfg = dataclasses.replace(trainer.cfg, sync_every_steps=0)  # never synced: no feedback loop, no scaling
    assert trainer.age_factor(aged) == 1.0
    trainer.cfg = dataclasses.replace(trainer.cfg, sync_every_steps=1, stale_lr_age=None)  # off: the paper's lr
    assert trainer.age_factor(aged) == 1.0


def test_autocast_computes_the_forward_in_bfloat16_and_keeps_float32_weights(tiny_model, tiny_tokenizer, draws):
    """model.autocast: the log-probs come from a bfloat16 forward (they differ from float32's by its rounding, and
    are close to them), while the weights and Adam's moments stay float32 and the update happens."""
    plain, mixed = _trainer(tiny_model, tiny_tokenizer), _trainer(tiny_model, tiny_tokenizer)
    mixed.autocast = "bfloat16"
    a, b = plain.step(draws[:2]), mixed.step(draws[:2])
    assert b["trainer/logp_mean"] != a["trainer/logp_mean"]  # a float32 forward would give the very same number
    assert b["trainer/logp_mean"] == pytest.approx(a["trainer/logp_mean"], rel=0.05)
    assert mixed.version == 1 and mixed.skipped_steps == 0
    assert all(p.dtype == torch.float32 for p in mixed.model.parameters())
    assert all(v.dtype == torch.float32 for s in mixed.optimizer.state.values() for v in s.values() if v.ndim)


def _updated(model, tok, draws, objective="tb", updates=3, **overrides) -> dict[str, torch.Tensor]:
    """The weights after `updates` updates on the same draws, with trainer settings `overrides`. lr 1e-3: AdamW's
    per-element step turns float rounding in near-zero gradient entries into steps of up to lr, so a larger lr
    compares the rounding more than the update (at 1e-2, split against whole reached 6e-6 here)."""
    cfg = TrainerConfig(steps=10, lr=1e-3, prompts_per_step=4, samples_per_prompt=K, micro_batch_prompts=2,
                        max_grad_norm=1.0, **overrides)
    own = (ResettingReference(copy.deepcopy(model), 2, cfg.logprob_chunk_tokens)
           if OBJECTIVES[objective].owns_reference else None)
    trainer = Trainer(copy.deepcopy(model), OBJECTIVES[objective].bind(TBConfig(), BaselineConfig(), max_tokens=8),
                      cfg, beta=beta_schedule(TBConfig(beta_init=0.05, beta_final=0.05)), temperature=0.7,
                      pad_id=tok.pad_token_id, reference=own)
    for _ in range(updates):
        assert trainer.step(draws)["trainer/skipped"] == 0.0
    return _params(trainer.model)


def _worst(a: dict, b: dict) -> float:
    """The largest per-tensor relative difference ‖a − b‖ / ‖b‖."""
    assert a.keys() == b.keys()
    return max(((a[k] - b[k]).norm() / b[k].norm().clamp_min(1e-12)).item() for k in b)


@pytest.mark.parametrize("objective", sorted(OBJECTIVES))
def test_split_prompt_groups_give_the_unsplit_updates(tiny_model, tiny_tokenizer, draws, objective):
    """trainer.micro_batch_samples = 3 < K = 4: every group is split over forwards (3 + 1, 2 + 2, 1 + 3 samples), yet
    log Ẑ, TBA′'s group means of KL̂, RLOO's leave-one-out baselines and online DPO's pairs stay the whole group's:
    the weights after 3 updates equal the unsplit ones to 1e-5 per tensor, for every objective."""
    whole = _updated(tiny_model, tiny_tokenizer, draws, objective)
    for shared in (True, False):
        split = _updated(tiny_model, tiny_tokenizer, draws, objective, micro_batch_samples=3, shared_prompts=shared)
        assert _worst(split, whole) <= 1e-5, (shared, _worst(split, whole))
    assert _worst(whole, _params(tiny_model)) > 1e-3  # the updates did move the weights


@pytest.mark.parametrize("shared", [True, False], ids=["shared_prompts", "per_sample"])
def test_chunked_logprobs_and_activation_checkpointing_change_no_update(tiny_model, tiny_tokenizer, draws, shared):
    """The default chunked LM head (trainer.logprob_chunk_tokens), a chunk of 5 positions, and activation
    checkpointing (with shared prompts: still used) against the plain [N, R, V] path: the same weights after
    3 updates to 1e-6 per tensor."""
    plain = _updated(tiny_model, tiny_tokenizer, draws, logprob_chunk_tokens=0, shared_prompts=shared)
    for overrides in ({}, {"logprob_chunk_tokens": 5}, {"activation_checkpointing": True}):
        ours = _updated(tiny_model, tiny_tokenizer, draws, shared_prompts=shared, **overrides)
        assert _worst(ours, plain) <= 1e-6, (overrides, _worst(ours, plain))


def test_activation_checkpointing_keeps_the_shared_prompt_forward(tiny_model, tiny_tokenizer):
    cfg = TrainerConfig(activation_checkpointing=True)
    trainer = Trainer(copy.deepcopy(tiny_model), OBJECTIVES["tb"].bind(TBConfig(), BaselineConfig(), max_tokens=8),
                      cfg, beta=beta_schedule(TBConfig()), temperature=0.7, pad_id=tiny_tokenizer.pad_token_id)
    assert trainer.shared_prompts
    assert all(isinstance(m.__dict__.get("forward"), functools.partial) for m in decoder_layers(trainer.model))


def test_the_default_recipes_update_is_the_plain_one_to_float_rounding():
    """The default recipe's shape (the builtin model, 8 groups × 8 samples of 32-token responses per micro-batch:
    2048 positions, two chunks of the default 1024): the weights after 3 updates within 1e-6 per tensor of the
    plain path's — the head's gradient is summed chunk by chunk, a different rounding, nothing more."""
    from transformers import AutoModelForCausalLM

    from tba.algorithm.types import Sample
    from tba.config import load_config
    from tba.models.builtin import tiny_config
    from tba.run.build import trainer_args

    cfg = load_config(None, [])
    t, new = cfg.trainer, cfg.search.max_new_tokens
    vocab = cfg.model.tiny.vocab_size
    g = torch.Generator().manual_seed(0)
    draws = [Draw(i, torch.randint(3, vocab, (12,), generator=g).tolist(),
                  [Sample(torch.randint(3, vocab, (new,), generator=g).tolist(), [-1.0] * new, float(j % 2), 0)
                   for j in range(t.samples_per_prompt)], True) for i in range(t.prompts_per_step)]
    assert t.micro_batch_prompts * t.samples_per_prompt * new > t.logprob_chunk_tokens  # more than one chunk

    def updated(chunk):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(tiny_config(cfg.model.tiny, vocab, bos=1, eos=2, pad=0))
        args = trainer_args(cfg, None, 0)
        trainer = Trainer(model, **{**args, "cfg": dataclasses.replace(t, logprob_chunk_tokens=chunk)})
        for _ in range(3):
            trainer.step(draws)
        return _params(model)

    assert _worst(updated(t.logprob_chunk_tokens), updated(0)) <= 1e-6  # 1.1e-8 on this machine
