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


def test_a_dropped_sample_is_one_line_naming_what_raised_and_its_traceback_goes_to_the_log_file():
    """An environment that raises: the warning names its method and the exception in one line; the traceback goes
    to the `tba.tracebacks` logger only (the run's errors.log), never the console's loggers."""
    import logging

    from tba.algorithm.monitor import tracebacks
    from tba.algorithm.runtime import RuntimeReport
    from tba.rollout.episodes import _Caller

    class Env:
        def step(self, action):
            raise KeyError("no such room")

    call = _Caller(5.0)
    _, (reason, error) = call(Env().step, "north")
    call.close()
    assert reason == "error" and error.splitlines()[0].endswith("<locals>.Env.step raised KeyError: 'no such room'")
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    tracebacks.addHandler(handler)
    try:
        report = RuntimeReport({"searcher/rewards_dropped": 3}, [], [], f"prompt 4: episode ended by error: {error}")
        message = monitor().dropped_samples(report)
    finally:
        tracebacks.removeHandler(handler)
    assert "\n" not in message and "Traceback" not in message
    assert message.startswith("3 samples dropped: reward raised or was not finite (total 3); last: prompt 4: episode "
                              "ended by error: ") and "Env.step raised KeyError: 'no such room'" in message
    assert message.endswith("its traceback in the run's errors.log")
    (record,) = records
    assert "Traceback" in record.getMessage() and 'raise KeyError("no such room")' in record.getMessage()
    assert not tracebacks.propagate


def test_a_reward_function_that_raises_is_named_by_the_dataset_task():
    from tba.tasks.base import TaskAdapter
    from tba.tasks.dataset import DatasetTask

    def picky(completions, **kwargs):
        raise ValueError("wants\na digit")

    task = TaskAdapter(DatasetTask([{"prompt": f"{i}?"} for i in range(12)], reward=picky))
    values, error = task.batch_rewards(task.train[:2], ["a", "b"], [True, True])
    assert values == [None, None]
    assert error.splitlines()[0] == "prompts [0, 1]: reward function picky raised ValueError: wants a digit"
    assert "Traceback" in error
