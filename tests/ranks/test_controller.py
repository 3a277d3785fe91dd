"""The sharded trainer (trainer.world_size = 2: two ordinary rank processes, FSDP2 over gloo on this CPU, driven by
a controller that holds no model) against the single-process one: the same updates from the same batches, the
weights it publishes, its checkpoint's master weights, its evaluation."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch

from tba.algorithm.trainer import Trainer
from tba.algorithm.types import Draw, Sample
from tba.config import load_config
from tba.models import apply_lora, load_model, save_checkpoint
from tba.rollout.evaluate import Evaluator, SpreadEvaluator
from tba.run.build import trainer_args
from tba.run.sharded import RankBuild, build_sharded

K, B = 2, 4
RANK_THREADS = 1


@pytest.fixture(scope="module")
def source(tmp_path_factory, tiny_model, tiny_tokenizer):
    path = tmp_path_factory.mktemp("ranks") / "init"
    save_checkpoint(tiny_model, tiny_tokenizer, path)
    return path


def batches(n: int, vocab: int, seed: int = 0) -> list[list[Draw]]:
    """n batches of B groups × K samples with fixed token ids, rewards and reference log-probs."""
    g = torch.Generator().manual_seed(seed)
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


def config(source, *overrides):
    return load_config(None, [f"model.policy={source}", "trainer.world_size=2", f"trainer.prompts_per_step={B}",
                              f"trainer.samples_per_prompt={K}", "trainer.micro_batch_prompts=1", "trainer.lr=1e-2",
                              "tb.beta_init=0.05", "tb.beta_final=0.05", "search.max_new_tokens=8", *overrides])


def sharded(cfg, start, run_dir, *, base=None, pad_id=0):
    """Two ranks building their part from `start` (the run's base model: `base`, default the start)."""
    base = str(base or start)
    build = RankBuild(cfg, str(start), base, base, None, pad_id)
    return build_sharded(cfg, build, threads=RANK_THREADS, publish_dtype=cfg.model.dtype, run_dir=run_dir)


@contextlib.contextmanager
def ranks_threads():
    """The one-process reference at the ranks' thread count (RANK_THREADS): a CPU's matmul kernels
    split their sums by thread, so another count rounds differently and Adam carries that into the weights (above
    1e-5 per tensor after 3 steps on an AMD EPYC, where equal counts differ by < 1e-6): the CPU's arithmetic, not
    the sharding's."""
    before = torch.get_num_threads()
    torch.set_num_threads(RANK_THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)).item()


SPLIT_CHUNKED = ["trainer.micro_batch_samples=1", "trainer.logprob_chunk_tokens=3"]


@pytest.mark.parametrize("objective, extra", [("tb", []), ("tba_prime", []), ("tb", SPLIT_CHUNKED)],
                         ids=["tb", "tba_prime", "tb-split-chunked"])
def test_two_ranks_update_as_one_process(source, tiny_tokenizer, tmp_path, objective, extra):
    """`extra` on both sides: each group split over forwards, the log-probs chunked 3 positions at a time (that these
    equal whole groups and the plain path in one process: tests/algorithm/test_trainer.py)."""
    cfg = config(source, f"objective={objective}", "baselines.reference_reset_steps=2", "trainer.max_grad_norm=1.0",
                 *extra)
    single = Trainer(load_model(str(source)), **trainer_args(cfg, load_model(str(source)).eval(),
                                                             tiny_tokenizer.pad_token_id))
    trainer = sharded(cfg, source, tmp_path, pad_id=tiny_tokenizer.pad_token_id)
    try:
        for draws in batches(3, len(tiny_tokenizer)):
            with ranks_threads():
                a = single.step(copy.deepcopy(draws))
            b = trainer.step(copy.deepcopy(draws))
            for key in ("trainer/loss", "trainer/grad_norm", "trainer/residual_std", "trainer/log_z_mean"):
                assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key
        assert trainer.version == single.version == 3
        mine, masters = single.model.state_dict(), trainer.masters()
        assert set(masters) == set(mine) - {"lm_head.weight"}  # a tied head once, as save_pretrained writes it
        # the masters after 3 Adam steps: the reduce-scatter sums in another order than one process does
        worst = max((relative(masters[k], mine[k]), k) for k in masters)
        assert worst[0] <= 1e-5, worst
        published = trainer.weights()  # in the forward dtype (float32 here): the master weights, exactly
        assert published.keys() == mine.keys()
        assert all(torch.equal(published[k], masters.get(k, masters["model.embed_tokens.weight"])) for k in published)
        assert all(v.device.type == "cpu" for v in published.values())  # host memory, whatever the ranks' device
    finally:
        trainer.close()


def test_two_ranks_with_different_response_lengths_run_the_same_forwards(source, tiny_tokenizer, tmp_path):
    """Rank 0's groups are long-tailed (length buckets would split them into two forwards), rank 1's are not: every
    rank must still run the same forwards, since each forward of an FSDP2 model gathers the shards."""
    cfg = config(source)
    single = Trainer(load_model(str(source)), **trainer_args(cfg, None, tiny_tokenizer.pad_token_id))
    trainer = sharded(cfg, source, tmp_path, pad_id=tiny_tokenizer.pad_token_id)
    g = torch.Generator().manual_seed(1)
    draws = []
    for p, lengths in enumerate([(2, 40), (3, 36), (6, 6), (7, 7)]):  # ranks 0 and 1 get two groups each
        samples = [Sample(torch.randint(3, len(tiny_tokenizer), (n,), generator=g).tolist(), [-1.0] * n,
                          reward=float(j), version=0) for j, n in enumerate(lengths)]
        draws.append(Draw(p, torch.randint(3, len(tiny_tokenizer), (5,), generator=g).tolist(), samples, online=True))
    try:
        with ranks_threads():
            a = single.step(copy.deepcopy(draws))
        b = trainer.step(copy.deepcopy(draws))
        assert b["trainer/loss"] == pytest.approx(a["trainer/loss"], rel=1e-5)
        assert b["trainer/grad_norm"] == pytest.approx(a["trainer/grad_norm"], rel=1e-5)
    finally:
        trainer.close()


def test_two_ranks_train_lora_adapters_as_one_process(source, tiny_tokenizer, tmp_path):
    """…and evaluate the adapted policy as one process does (each rank makes base + adapters whole)."""
    from tba.run.searchers import task_spec
    from tba.tasks.prepare import build_task

    cfg = config(source, "model.lora.enabled=true", "model.lora.r=4", "task.name=arith", "task.options.digits=2",
                 "task.test_size=8", "eval.max_new_tokens=6")
    start = apply_lora(load_model(str(source)), cfg.model.lora)  # A random, B = 0: the same start for both
    save_checkpoint(start, tiny_tokenizer, tmp_path / "start")
    single = Trainer(copy.deepcopy(start), **trainer_args(cfg, None, tiny_tokenizer.pad_token_id))
    trainer = sharded(cfg, tmp_path / "start", tmp_path, base=source, pad_id=tiny_tokenizer.pad_token_id)
    try:
        for draws in batches(3, len(tiny_tokenizer)):
            with ranks_threads():
                single.step(copy.deepcopy(draws))
            trainer.step(copy.deepcopy(draws))
        published, mine = trainer.weights(), single.weights()
        assert published.keys() == mine.keys() and all("lora" in k for k in mine)
        assert max(relative(published[k], mine[k]) for k in mine) <= 1e-5
        trainer.save_model(tmp_path / "exported")  # the adapters, as PEFT writes them, over their base
        exported = load_model(str(tmp_path / "exported"))
        assert max(relative(v, mine[k]) for k, v in exported.state_dict().items() if k in mine) <= 1e-5
        task = build_task(task_spec(cfg))
        alone = Evaluator(single.model, tiny_tokenizer, task, cfg.eval)()
        assert SpreadEvaluator(task, cfg.eval, trainer.evaluate, trainer.world)() == pytest.approx(alone)
    finally:
        trainer.close()


def test_checkpointing_and_bf16_compute(source, tiny_tokenizer, tmp_path):
    """trainer.activation_checkpointing recomputes each layer in backward: the same update to 1e-5; bf16
    compute (fsdp.param_dtype) over fp32 master weights: close to the fp32 update, not equal — and the checkpoint's
    model/ holds the fp32 masters themselves: a resume starts from them bit for bit."""
    single = Trainer(load_model(str(source)), **trainer_args(config(source), None, tiny_tokenizer.pad_token_id))
    data = batches(2, len(tiny_tokenizer))
    with ranks_threads():
        for draws in data:
            single.step(copy.deepcopy(draws))
    mine = single.model.state_dict()
    for overrides, bound in ((["trainer.activation_checkpointing=true"], 1e-5),
                             (["trainer.fsdp.param_dtype=bfloat16"], 0.2)):
        cfg = config(source, *overrides)
        trainer = sharded(cfg, source, tmp_path, pad_id=tiny_tokenizer.pad_token_id)
        try:
            for draws in data:
                trainer.step(copy.deepcopy(draws))
            masters = trainer.masters()
            assert all(v.dtype == torch.float32 for v in masters.values())
            worst = max(relative(masters[k], mine[k]) for k in masters)
            assert worst <= bound, (overrides, worst)
            if bound > 1e-5:
                assert worst > 1e-5  # bf16 forward and backward did change the update
                published = trainer.weights()  # what the trainer computes with, in the searchers' dtype (fp32 here)
                assert all(torch.equal(published[k], masters[k].to(torch.bfloat16).float()) for k in masters)
                trainer.save(tmp_path / "ckpt")
        finally:
            trainer.close()
    resumed = sharded(config(source, "trainer.fsdp.param_dtype=bfloat16"), tmp_path / "ckpt" / "model", tmp_path,
                      base=source, pad_id=tiny_tokenizer.pad_token_id)
    try:
        again = resumed.masters()
        assert again.keys() == masters.keys() and all(torch.equal(again[k], masters[k]) for k in masters)
    finally:
        resumed.close()


def test_an_evaluation_spread_over_the_ranks_scores_as_one_process(source, tiny_tokenizer, tiny_model, arith_task,
                                                                    tmp_path):
    """Each rank makes the policy whole for the moment and completes its share of the test prompts; the controller
    scores every completion with the task as one process does (greedy pass@1 here: the same number)."""
    from tba.tasks.prepare import build_task

    cfg = config(source, "task.name=arith", "task.options.digits=2", "task.test_size=12", "eval.max_new_tokens=6")
    from tba.run.searchers import task_spec

    task = build_task(task_spec(cfg))
    alone = Evaluator(load_model(str(source)), tiny_tokenizer, task, cfg.eval)()
    trainer = sharded(cfg, source, tmp_path, pad_id=tiny_tokenizer.pad_token_id)
    try:
        spread = SpreadEvaluator(task, cfg.eval, trainer.evaluate, trainer.world)()
    finally:
        trainer.close()
    assert spread == pytest.approx(alone)
