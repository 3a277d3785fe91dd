"""Demonstrations and logged data (tba.rollout.demonstrations, the `data` section): rows checked and named by file
and line,
tokenized, rewarded and π_ref-scored; drawn in data slots beside the searchers' samples; and a demonstration
moves the policy toward it — which it cannot do alone in its group (VarGrad's δ ≡ 0)."""

import copy
import json
from pathlib import Path

import pytest
import torch
from paths import TINY as TINY_RECIPE

from tba.algorithm.buffer import NothingYoungEnough, ReplayBuffer
from tba.algorithm.objectives import OBJECTIVES
from tba.algorithm.objectives.tb import beta_schedule
from tba.algorithm.trainer import Trainer
from tba.algorithm.types import Draw, Group, Sample
from tba.config import ConfigError, load_config
from tba.config.schema import BufferConfig, DataConfig, TBConfig, TrainerConfig
from tba.models.logprobs import response_logprobs
from tba.rollout.demonstrations import make_groups, read_rows, target_weight_warning
from tba.tasks.data import DataLoadError

TINY = TINY_RECIPE


def jsonl(path: Path, rows: list) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def groups_of(arith_task, tiny_tokenizer, tiny_model, cfg: DataConfig, max_new_tokens=40):
    rows = read_rows(cfg, arith_task, seed=0)
    ids = {p.text.strip(): p.id for p in arith_task.train}
    return make_groups(rows, cfg, task=arith_task, prompt_ids=ids, tokenizer=tiny_tokenizer, reference=tiny_model,
                       temperature=0.7, max_new_tokens=max_new_tokens)


def test_a_bad_line_stops_the_run_naming_file_and_line(tmp_path, arith_task, tiny_tokenizer, tiny_model):
    p0, p1 = arith_task.train[0], arith_task.train[1]
    good = {"prompt": p0.text, "completion": f" #### {p0.answer}"}
    cases = {
        "line 2: not valid JSON": [good, '{"prompt": "x", "completion": '],
        "line 2: prompt not among the task's train prompts": [good, {"prompt": "9+9=?", "completion": " 18"}],
        "line 1: empty completion": [{"prompt": p1.text, "completion": "  "}, good],
        "line 1: completion of": [{"prompt": p1.text, "completion": " 1" * 60}],
        "line 1: no field 'completion'": [{"prompt": p1.text, "answer": "3"}],
    }
    for why, rows in cases.items():
        path = jsonl(tmp_path / "data.jsonl", [json.dumps(r) if isinstance(r, dict) else r for r in rows])
        with pytest.raises(DataLoadError, match=f"data.jsonl {why}"):
            groups_of(arith_task, tiny_tokenizer, tiny_model, DataConfig(source=path))


def test_skipped_rows_are_counted_and_the_rest_kept(tmp_path, arith_task, tiny_tokenizer, tiny_model):
    p0, p1 = arith_task.train[0], arith_task.train[1]
    path = jsonl(tmp_path / "d.jsonl", [{"prompt": p0.text, "completion": f" #### {p0.answer}"},
                                        {"prompt": "unknown", "completion": " 1"},
                                        {"prompt": p1.text, "completion": " #### -1"},
                                        {"prompt": p0.text, "completion": f" #### {p0.answer}"}])  # a duplicate
    groups, report = groups_of(arith_task, tiny_tokenizer, tiny_model, DataConfig(source=path, bad_rows="skip"))
    assert (report.rows, report.kept, report.duplicates) == (4, 2, 1)
    assert report.skipped == {"prompt not among the task's train prompts": 1}
    assert sorted(s.reward for g in groups for s in g.samples) == [0.0, 1.0]  # the task's reward scored them
    assert all(g.source == "data" and s.behaviour_logprobs == [] and s.response[-1] == tiny_tokenizer.eos_token_id
               for g in groups for s in g.samples)
    _, filtered = groups_of(arith_task, tiny_tokenizer, tiny_model, DataConfig(source=path, bad_rows="skip",
                                                                              min_reward=1.0))
    assert (filtered.kept, filtered.below_min_reward) == (1, 1)


def test_rewards_from_a_column_and_reference_logprobs_of_the_run(tmp_path, arith_task, tiny_tokenizer, tiny_model):
    p = arith_task.train[3]
    path = jsonl(tmp_path / "d.jsonl", [{"q": p.text, "a": " #### 7", "r": 0.25}])
    cfg = DataConfig(source=path, prompt_column="q", completion_column="a", reward_column="r", name="logs")
    (group,), _ = groups_of(arith_task, tiny_tokenizer, tiny_model, cfg)
    (sample,) = group.samples
    assert group.source == sample.source == "logs" and sample.reward == 0.25
    prompt = tiny_tokenizer(p.text)["input_ids"]
    ref, _ = response_logprobs(tiny_model, [prompt], [sample.response], 0.7, tiny_tokenizer.pad_token_id)
    assert group.prompt_tokens == prompt and sample.ref_logprobs == pytest.approx(ref[0].tolist(), abs=1e-5)
    bad = jsonl(tmp_path / "bad.jsonl", [{"q": p.text, "a": " 1", "r": "high"}])
    with pytest.raises(DataLoadError, match="bad.jsonl line 1: field 'r' must be a finite number"):
        groups_of(arith_task, tiny_tokenizer, tiny_model, DataConfig(source=bad, prompt_column="q",
                                                                     completion_column="a", reward_column="r"))


class TwoTurns:
    """arith in two policy turns: the environment answers the first with " =" and ends after the second, whose
    reward is 1 when it holds the answer."""
    name = "two_turns"

    def __init__(self, task):
        self.train, self.test = task.train, task.test

    def environment(self, prompt):
        return TwoTurnsEnv(prompt)


class TwoTurnsEnv:
    def __init__(self, prompt):
        self.prompt, self.actions = prompt, []

    def step(self, action):
        self.actions.append(action)
        return " =" if len(self.actions) == 1 else None

    def get_reward(self):
        return float(self.prompt.answer in self.actions[-1])


def test_a_multi_turn_demonstration_is_played_through_its_environment(tmp_path, arith_task, tiny_tokenizer,
                                                                       tiny_model):
    task, p = TwoTurns(arith_task), arith_task.train[4]
    path = jsonl(tmp_path / "turns.jsonl", [{"prompt": p.text, "completion": [" 1", f" #### {p.answer}"]}])
    rows = read_rows(DataConfig(source=path), task, seed=0)
    (group,), report = make_groups(rows, DataConfig(source=path), task=task, tokenizer=tiny_tokenizer,
                                   prompt_ids={q.text: q.id for q in task.train}, reference=tiny_model,
                                   temperature=0.7, max_new_tokens=40)
    (sample,) = group.samples
    eos, enc = tiny_tokenizer.eos_token_id, lambda t: tiny_tokenizer(t, add_special_tokens=False)["input_ids"]
    first, observation, second = enc(" 1") + [eos], enc(" ="), enc(f" #### {p.answer}") + [eos]
    assert sample.response == first + observation + second and sample.reward == 1.0 and report.kept == 1
    assert sample.policy_mask == [1] * len(first) + [0] * len(observation) + [1] * len(second)
    ref, _ = response_logprobs(tiny_model, [group.prompt_tokens], [sample.response], 0.7, tiny_tokenizer.pad_token_id)
    expected = [lp * m for lp, m in zip(ref[0].tolist(), sample.policy_mask, strict=True)]
    assert sample.ref_logprobs == pytest.approx(expected, abs=1e-5)  # π_ref at the policy's tokens only

    cases = {"line 1: the task's environment: the demonstration has 1 turns; the environment asked for another":
             [{"prompt": p.text, "completion": " 1"}],
             r"line 2: the task's environment: the environment ended the episode \(done\) after turn 2 of the "
             "demonstration's 3": [{"prompt": p.text, "completion": [" 1", " 2"]},
                                   {"prompt": p.text, "completion": [" 1", " 2", " 3"]}],
             r"line 1: completion of \d+ tokens > search.max_new_tokens=40 \(turn 2\)":
             [{"prompt": p.text, "completion": [" 1", " 1" * 30]}],
             "line 1: field 'completion' must be a string or a list of strings": [{"prompt": p.text, "completion": 5}]}
    for why, lines in cases.items():
        cfg = DataConfig(source=jsonl(tmp_path / "bad.jsonl", lines))
        with pytest.raises(DataLoadError, match=f"bad.jsonl {why}"):
            make_groups(read_rows(cfg, task, seed=0), cfg, task=task, tokenizer=tiny_tokenizer, reference=tiny_model,
                        prompt_ids={q.text: q.id for q in task.train}, temperature=0.7, max_new_tokens=40)
    single = jsonl(tmp_path / "single.jsonl", [{"prompt": p.text, "completion": [" 1", " 2"]}])
    with pytest.raises(DataLoadError, match="line 1: a list of 2 turns, but task arith is single-turn"):
        groups_of(arith_task, tiny_tokenizer, tiny_model, DataConfig(source=single))


def test_objectives_that_need_behaviour_logprobs_refuse_data():
    for name, objective in OBJECTIVES.items():
        if objective.reads_behaviour:
            with pytest.raises(ConfigError, match=f"data.source: objective {name} weights samples by π_θ/μ"):
                load_config(None, [f"objective={name}", "data.source=task"])
        else:
            load_config(None, [f"objective={name}", "data.source=task"])


def sample(tokens, reward=0.0, version=0, source="policy"):
    return Sample(list(tokens), [0.0] * len(tokens), reward, version, source=source)


def test_data_slots_hold_half_data_half_searcher_samples_at_the_configured_share():
    buf = ReplayBuffer(BufferConfig(online_prob=1.0), seed=0, data_sources=frozenset({"demo"}), data_share=0.2)
    for pid in range(4):
        buf.add(Group(pid, [1, pid], [sample([pid, j]) for j in range(6)]))
        buf.add(Group(pid, [1, pid], [sample([9, pid], 1.0, source="demo")], source="demo"))
    buf.mark_sync(0)
    assert len(buf) == 24 and buf.data_size == 4  # data is held apart, not in the searchers' count
    draws = [d for _ in range(500) for d in buf.sample(4, 8)]
    data_slots = [d for d in draws if d.data]
    assert all(sum(s.source == "demo" for s in d.samples) == 4 for d in data_slots)  # K/2 of each
    share = sum(s.source == "demo" for d in draws for s in d.samples) / (len(draws) * 8)
    assert share == pytest.approx(0.2, abs=0.02)
    assert not any(s.source == "demo" for d in draws if not d.data for s in d.samples)


def test_the_age_cap_keeps_old_samples_of_aging_sources_out_of_draws():
    buf = ReplayBuffer(BufferConfig(online_prob=0.0, max_sample_age=3), seed=0, aging=frozenset({"policy"}))
    buf.add(Group(0, [1], [sample([1, j], version=0) for j in range(4)]))  # old
    buf.add(Group(1, [1], [sample([2, j], version=9) for j in range(4)]))  # young
    buf.add(Group(2, [1], [sample([3, j], version=0, source="fixed") for j in range(4)], source="fixed"))
    buf.mark_sync(9)
    for _ in range(50):
        draws = buf.sample(2, 2, version=10)
        assert all(s.version >= 7 or s.source == "fixed" for d in draws for s in d.samples)
    assert buf.too_old > 0  # counted (buffer/too_old)
    only_old = ReplayBuffer(BufferConfig(max_sample_age=3), seed=0, aging=frozenset({"policy"}))
    only_old.add(Group(0, [1], [sample([1, j], version=0) for j in range(3)]))
    only_old.mark_sync(0)
    with pytest.raises(NothingYoungEnough, match="max_sample_age=3"):
        only_old.sample(1, 2, version=10)


def test_a_fixed_sources_samples_sit_with_the_newest_in_their_prompts_history():
    """Ordered by version, a fixed behaviour's samples (version 0 forever) would be the oldest and the first to
    go at capacity: they sit with the policy's that arrived with them."""
    buf = ReplayBuffer(BufferConfig(capacity_per_prompt=6, online_prob=1.0), seed=0, aging=frozenset({"policy"}))
    for version in range(1, 4):
        buf.add(Group(0, [1], [sample([version, j], version=version) for j in range(3)]))
        buf.add(Group(0, [1], [sample([7, version, j], source="fixed") for j in range(3)], source="fixed"))
    items = buf.histories[0].items
    assert [s.source for s in items] == ["policy"] * 3 + ["fixed"] * 3  # the newest arrival of each, kept
    assert buf.histories[0].n_online == 6


def test_a_demonstration_moves_the_policy_toward_it_beside_searcher_samples_not_alone(tiny_model, tiny_tokenizer,
                                                                                     arith_task):
    """TB on one prompt: K/2 copies of a rewarded demonstration beside K/2 of the policy's own (unrewarded)
    samples raise log π_θ(demonstration); a group of the demonstration alone has δ ≡ 0 and moves nothing."""
    prompt = tiny_tokenizer(arith_task.train[0].text)["input_ids"]
    demo = tiny_tokenizer(f" #### {arith_task.train[0].answer}", add_special_tokens=False)["input_ids"] + [
        tiny_tokenizer.eos_token_id]

    def logp(model):
        with torch.no_grad():
            return response_logprobs(model, [prompt], [demo], 0.7, tiny_tokenizer.pad_token_id)[0].sum().item()

    def train(group: list[Sample], steps=10):
        model = copy.deepcopy(tiny_model)
        cfg = TrainerConfig(lr=1e-2, prompts_per_step=1, samples_per_prompt=4, micro_batch_prompts=1)
        trainer = Trainer(model, OBJECTIVES["tb"].bind(TBConfig(), None, max_tokens=8), cfg,
                          beta=beta_schedule(TBConfig()), temperature=0.7, pad_id=tiny_tokenizer.pad_token_id)
        for _ in range(steps):
            metrics = trainer.step([Draw(0, prompt, group, online=False, data=True)])
        return logp(model), metrics

    ref = response_logprobs(tiny_model, [prompt], [demo], 0.7, tiny_tokenizer.pad_token_id)[0][0, :len(demo)].tolist()
    demo_sample = Sample(demo, ref, 1.0, 0, [], source="data")
    torch.manual_seed(0)
    own = [Sample(r, [0.0] * len(r), 0.0, 0) for r in ([5, 6, 7], [8, 9], [4, 4, 4, 4])]
    own = [Sample(s.response, response_logprobs(tiny_model, [prompt], [s.response], 0.7, tiny_tokenizer.pad_token_id)
                  [0][0, :len(s.response)].tolist(), 0.0, 0) for s in own]
    start = logp(tiny_model)
    mixed, _ = train([demo_sample, demo_sample, own[0], own[1]])
    alone, metrics = train([demo_sample] * 4)
    assert mixed > start + 1.0, (start, mixed)
    assert alone == pytest.approx(start, abs=1e-6) and metrics["trainer/loss"] == pytest.approx(0.0, abs=1e-9)


def test_a_run_with_data_draws_it_and_says_so(tmp_path, arith_task):
    out = tmp_path / "run"
    from tba.run.train import train

    cfg = load_config(TINY, [f"output_dir={out}", f"sft.cache_dir={tmp_path / 'cache'}", "runtime=inline",
                             "mode=sync", "data.source=task", "data.bad_rows=skip", "data.share=0.5",
                             "search.max_new_tokens=40", "trainer.steps=4", "eval.every_steps=100"])
    summary = train(cfg, overwrite=True)
    assert summary["data"]["kept"] > 0 and summary["buffer_data_samples"] == summary["data"]["kept"]
    assert summary["sources"]["data"]["samples_drawn"] > 0
    with pytest.raises(ConfigError, match="data.share: at most 0.5"):
        load_config(None, ["data.source=task", "data.share=0.6"])


def test_a_beta_too_large_for_the_data_is_named_with_the_beta_that_fits():
    """π* ∝ π_ref·exp(r/β) weighs a row of reward 1 and log π_ref −25 above all unrewarded mass only below β = 0.04."""
    def group(*logps_rewards):
        return Group(0, [1], [Sample([2], [lp], r, 0, []) for lp, r in logps_rewards], source="data")

    rows = group((-25.0, 1.0), (-20.0, 1.0), (-30.0, 1.0), (-5.0, 0.0))  # bounds 0.04, 0.05, 0.0333; one unrewarded
    warning = target_weight_warning([rows], beta=0.045)
    assert warning and "2 of 3 rewarded data rows" in warning and "below 0.0333" in warning
    assert target_weight_warning([rows], beta=0.02) is None
    assert target_weight_warning([rows], beta=0.038) is None  # above 1 bound of 3: most rows are weighed up
    assert target_weight_warning([group((-5.0, 0.0))], beta=1.0) is None  # nothing rewarded: nothing to say
