"""The replay warning's decision (tba.algorithm.monitor): when a trainer running ahead of its searchers is told,
how often, and what the message offers to do."""

from __future__ import annotations

from tba.algorithm.monitor import Monitor, episodes_ended, replay_threshold
from tba.algorithm.state import RunState


def monitor() -> Monitor:
    return Monitor(RunState(), 0.0, 300.0)


def test_the_replay_warning_fires_once_past_the_threshold_and_again_only_when_the_ratio_doubles():
    m = monitor()
    fired = [r for r in (1.0, 7.9, 8.0, 9.0, 15.9, 16.0, 20.0, 31.0, 32.5, 40.0)
             if m.replay_ahead(r, 8.0, received=100, drawn=int(r * 100), ended={})]
    assert fired == [8.0, 16.0, 32.5]


def test_the_replay_warning_says_what_to_do_and_counts_failed_episodes_apart():
    message = monitor().replay_ahead(28.2, 8.0, received=170, drawn=4800,
                                     ended={"done": 1200, "max_turns": 0, "timeout": 34, "error": 3})
    assert "replay ratio 28.2×" in message and "4800 draws from 170 samples" in message
    assert "trainer.max_replay_ratio" in message and "search.num_searchers" in message
    assert "of 1237 episodes: 34 timeout, 3 error" in message
    single_turn = monitor().replay_ahead(9.0, 8.0, received=10, drawn=90, ended={})
    assert "episodes" not in single_turn and "faster" in single_turn


def test_no_replay_warning_without_a_threshold():
    assert monitor().replay_ahead(1000.0, None, received=1, drawn=1000, ended={}) is None


def test_the_threshold_is_off_when_nothing_can_run_ahead_or_the_ratio_is_bounded():
    assert replay_threshold(8.0, max_replay_ratio=None, sync=False, searchers=2) == 8.0
    assert replay_threshold(None, max_replay_ratio=None, sync=False, searchers=2) is None
    assert replay_threshold(8.0, max_replay_ratio=4.0, sync=False, searchers=2) is None  # the loop waits instead
    assert replay_threshold(8.0, max_replay_ratio=None, sync=True, searchers=2) is None  # every step waits
    assert replay_threshold(8.0, max_replay_ratio=None, sync=False, searchers=0) is None  # offline: none received


def test_episodes_ended_reads_the_searchers_counters():
    stats = {"searcher/restarts": 0.0, "episode/ended_done": 12.0, "episode/ended_timeout": 3.0}
    assert episodes_ended(stats) == {"done": 12, "timeout": 3}
    assert episodes_ended({"searcher/restarts": 0.0}) == {}
