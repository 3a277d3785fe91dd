"""enumerable_turns: the exact optimum over two-turn trajectories, the trajectory target and its floor, the
environment's draws, and TB reaching the optimum from its own episodes."""

import json

import pytest
import torch

from tba.config import load_config
from tba.config.schema import TinyModelConfig
from tba.models.builtin import build_tiny_model, train_tokenizer
from tba.run.train import train
from tba.tasks import TASKS
from tba.tasks.base import Scoring
from tba.tasks.enumerable_turns import EnumerableTurnsTask

QUIET = ["logging.progress=false", "logging.tensorboard=false", "threads=1", "search.threads=1"]


@pytest.fixture(scope="module")
def small():
    """2 symbols, length 1: V = 5, |Y| = 5 per turn (EOS, or one of the 4 other tokens), 5·2·5 trajectories; a
    model with large random weights, so that π_ref is far from uniform."""
    tok = train_tokenizer(EnumerableTurnsTask(symbols=2).corpus(), 128)
    model = build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64),
                             seed=0).eval()
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    return tok, model


def test_the_optimum_is_the_soft_bellman_one(small):
    """For any policy π of the product form, E_π[r]/β − KL(π‖π_ref) = log Z₁ − KL(π‖π°) (the soft-Bellman
    identity; the environment's P(o|y₁) cancels because o is drawn from it under every policy). At π = π_ref both
    sides are known from one evaluation: E_ref[r]/β + KL(π_ref‖π°) = E_π°[r]/β − KL(π°‖π_ref). The trajectory
    target π*_traj satisfies no such identity, and with a stochastic environment it is out of every policy's
    reach: the floor is positive."""
    tok, model = small
    beta = 0.3
    for stochastic in (True, False):
        task = EnumerableTurnsTask(symbols=2, length=1, stochastic=stochastic, min_prob=0.1, obs_step=0.45)
        m = task.exact_metrics(model, model, tok, Scoring(temperature=1.0, max_new_tokens=1, beta=beta))
        assert m["policy_mass"] == pytest.approx(1.0, abs=1e-6)
        lhs = m["expected_reward"] / beta + m["kl_reverse"]
        rhs = m["target_expected_reward"] / beta - m["kl_to_target"]
        assert lhs == pytest.approx(rhs, abs=1e-6)
        if stochastic:
            assert m["trajectory_target_floor"] > 1e-3
            assert m["kl_to_trajectory_target"] > m["trajectory_target_floor"]
        else:  # o a function of y₁: the two targets coincide
            assert m["trajectory_target_floor"] == pytest.approx(0, abs=1e-12)
            assert m["kl_to_trajectory_target"] == pytest.approx(m["kl_to_target"], abs=1e-9)


def test_the_environment_draws_from_its_table_and_scores_both_answers():
    task = EnumerableTurnsTask(symbols=3, length=2, seed=0, min_prob=0.3)
    probs = task.observation_probs("01")
    assert sum(probs) == pytest.approx(1) and min(probs) >= 0.1 - 1e-12
    counts = dict.fromkeys(task.alphabet, 0)
    for _ in range(3000):
        env = task.environment(task.train[0])
        counts[env.step("01")] += 1
        assert env.step(task.obs_centres[env.observation]) is None
        first = task.decay ** sum(a != b for a, b in zip("01", task.centre, strict=True))
        assert env.get_reward() == pytest.approx((first + task.obs_heights[env.observation]) / 2)
    assert all(abs(counts[o] / 3000 - p) < 0.04 for o, p in zip(task.alphabet, probs, strict=True))
    env = task.environment(task.train[0])
    env.step("0")  # too short: junk, whatever comes next
    env.step("00")
    assert env.get_reward() == -1.0
    assert "enumerable_turns" in TASKS and TASKS["enumerable_turns"].builtin_model


def run(tmp_path, *overrides):
    cfg = load_config("enumerable_turns_cpu", [f"output_dir={tmp_path}", *QUIET, *overrides])
    summary = train(cfg, overwrite=True)
    return summary, [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tb_on_episodes_reaches_the_optimum_of_a_stochastic_environment(tmp_path, seed):
    """Searchers synced every 16 updates, observations drawn at random. Measured
    (bench/results/multiturn/enumerable_turns.md, this recipe): KL(π°‖π_θ) 1.89–1.94 at the start, 0.023–0.035
    at update 200 and 0.005–0.010 at 1200 on seeds 0–2; 0.1 leaves 3× margin at 200 updates."""
    summary, metrics = run(tmp_path, f"seed={seed}", "trainer.sync_every_steps=16", "trainer.steps=200",
                           "eval.every_steps=200")
    start, end = summary["eval_start"], summary["eval_end"]
    assert start["kl_to_target"] > 1.5 and end["kl_to_target"] < 0.1, (start, end)
    assert abs(end["policy_mass"] - 1) < 1e-4 and end["trajectory_target_floor"] > 0.01
    assert metrics[-1]["episode/ended_done"] >= 200 * 64 and metrics[-1]["episode/ended_error"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["local", "ray"])
def test_episodes_run_on_the_process_runtimes(tmp_path, runtime):
    """Searcher processes (and Ray actors) build the environment from the task and send whole episodes."""
    if runtime == "ray":
        pytest.importorskip("ray")
    summary, metrics = run(tmp_path, f"runtime={runtime}", "mode=async", "trainer.steps=12", "eval.every_steps=6",
                           "checkpoint.every_steps=6")
    assert summary["eval_end"]["kl_to_target"] < summary["eval_start"]["kl_to_target"]
    assert metrics[-1]["episode/ended_done"] >= 64 and metrics[-1]["episode/turns_mean"] == 2
    from tba.algorithm.store import BufferStore

    (_, _, group), *_ = BufferStore(tmp_path, readonly=True).iter_groups()
    sample = group.samples[0]
    assert sample.policy_mask and 0 in sample.policy_mask and len(sample.policy_mask) == len(sample.response)
    assert all(lp == 0.0 for lp, m in zip(sample.ref_logprobs, sample.policy_mask, strict=True) if not m)


def test_an_episode_survives_a_checkpoint_and_resume(tmp_path):
    """Inline, checkpoint at update 4, resume to 8; then the buffer rebuilt from the store's snapshot (what a
    resume loads) draws episodes with their masks, token for token as stored."""
    from tba.algorithm.buffer import ReplayBuffer
    from tba.algorithm.store import BufferStore

    run(tmp_path, "trainer.steps=4", "eval.every_steps=100", "checkpoint.every_steps=4")
    train(load_config(tmp_path / "config.yaml", ["trainer.steps=8"]), resume=True)
    assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 8
    stored = {tuple(s.response): s.policy_mask for _, _, g in BufferStore(tmp_path, readonly=True).iter_groups()
              for s in g.samples}
    buffer = ReplayBuffer(load_config(tmp_path / "config.yaml").buffer)
    buffer.open(tmp_path, readonly=True)
    buffer.restore(None)
    (draw,) = buffer.sample(1, 8)
    assert all(0 in s.policy_mask and list(s.policy_mask) == stored[tuple(s.response)] for s in draw.samples)


@pytest.mark.slow
def test_episodes_generate_with_the_vllm_engine(tmp_path):
    """search.backend=vllm, inline: the engine generates each turn from the episode's token ids and reloads the
    published weights (the tiny model at hidden 128: a head size vLLM's CPU attention takes)."""
    pytest.importorskip("vllm")
    summary, metrics = run(tmp_path, "search.backend=vllm", "search.vllm.kv_cache_gb=0.25",
                           "model.tiny.hidden_size=128", "trainer.steps=6", "eval.every_steps=6",
                           "search.generations_per_prompt=16", "trainer.samples_per_prompt=4",
                           "buffer.prefill_samples=16")
    assert metrics[-1]["searcher/version_min"] == 6 and metrics[-1]["episode/ended_done"] >= 16 * 7
    assert summary["eval_end"]["kl_to_target"] < summary["eval_start"]["kl_to_target"]


def test_the_task_s_demonstrations_are_two_turns_played_through_the_environment(tmp_path):
    """`data.source: task` on this task: each demonstration is a pair of answers the environment scores as an
    episode (one text per turn; a single text would be one turn of a two-turn episode)."""
    task = EnumerableTurnsTask()
    demos = task.demonstrations(task.train, seed=3)
    assert demos == task.demonstrations(task.train, seed=3) and all(len(d) == 2 and all(task._valid(t) for t in d)
                                                                     for d in demos)
    summary, _ = run(tmp_path, "data.source=task", "data.share=0.25", "trainer.steps=4", "eval.every_steps=4")
    from tba.algorithm.store import BufferStore

    sources = {s.source for _, _, g in BufferStore(tmp_path, readonly=True).iter_groups() for s in g.samples}
    assert sources == {"policy", "data"}, sources
    assert summary["eval_end"]["kl_to_target"] > 0
