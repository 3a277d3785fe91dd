"""summary.json and the before/after table say how far the trainer replayed ahead of its searchers and, for
multi-turn runs, why episodes ended (timeouts apart from errors: each has a different fix)."""

from __future__ import annotations

from types import SimpleNamespace

from tba.algorithm.state import Evaluation, RunState, RunTotals
from tba.run.progress import print_summary
from tba.run.summary import run_summary


def summary(**totals) -> dict:
    state = RunState(step=300, evals=[Evaluation(0, {"score": 0.25}, 0.0), Evaluation(300, {"score": 0.5}, 9.0)],
                     rewards_seen=[0.1, 0.2], received=170)
    run = SimpleNamespace(trainer=SimpleNamespace(version=300, skipped_steps=0, sharded=False),
                          task=SimpleNamespace(test=[0] * 20),
                          buffer=SimpleNamespace(groups_added=40, evicted_prompts=0, data_size=0), data=None,
                          fitted={"prompts_too_long": 0, "prompts_truncated": 0}, identity={"mode": "async"})
    return run_summary(state, run, RunTotals(0, 0, [], 0.5, 10.0, 9.0, **totals))


def table(s: dict, capsys, monkeypatch) -> str:
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps cells to the console's width: one row per line here
    print_summary(s)
    return capsys.readouterr().out


def test_a_multi_turn_summary_has_the_replay_ratio_and_episodes_by_end_reason(capsys, monkeypatch):
    s = summary(replay_ratio=28.2, episodes_ended={"done": 1200, "max_turns": 0, "timeout": 34, "error": 3})
    assert s["replay_ratio"] == 28.2 and s["episodes_ended"]["timeout"] == 34
    out = table(s, capsys, monkeypatch)
    assert "replay (draws per sample received)" in out and "28.2×" in out
    assert "1200 done, 34 timeout, 3 error" in out and "max_turns" not in out


def test_a_single_turn_summary_has_no_episode_row(capsys, monkeypatch):
    s = summary(replay_ratio=1.5)
    assert s["replay_ratio"] == 1.5 and "episodes_ended" not in s
    out = table(s, capsys, monkeypatch)
    assert "1.5×" in out and "episodes ended" not in out


def test_without_samples_received_there_is_no_replay_row(capsys, monkeypatch):
    s = summary()  # an offline run: nothing received, no ratio
    assert s["replay_ratio"] is None and "replay (draws" not in table(s, capsys, monkeypatch)
