"""The agent task (tba.tasks.agent): rows handed to the function with only the arguments it names, its number and
the reward functions summed into the episode's reward, bad options named."""

import pytest

from tba.errors import ConfigError
from tba.tasks.agent import AgentTask
from tba.tasks.base import TaskAdapter

ROWS = [{"prompt": f"q{i}", "answer": str(i)} for i in range(20)]


def exact(completions, answer, **kwargs):
    return [float(c == a) for c, a in zip(completions, answer, strict=True)]


def test_the_function_gets_what_it_names_and_rewards_add_up():
    seen = []

    def agent(row, model):
        seen.append((row, model))
        return 0.25

    task = AgentTask(agent=agent, source=ROWS, reward=[exact], test_size=2)
    assert TaskAdapter(task).agentic and not TaskAdapter(task).missing()
    assert len(task.train) == 18 and len(task.test) == 2
    p = task.train[3]
    value = task.run_agent(p, base_url="http://x/v1", api_key="t.s", model="policy")
    assert seen == [({"prompt": "q3", "answer": "3"}, "policy")]
    assert task.score(p, value, "3") == (1.25, {"agent": 0.25, "exact": 1.0})
    assert task.score(p, None, "no") == (0.0, {"exact": 0.0})
    assert task.reward_metrics() == {"reward/agent": 0.25, "reward/exact": 0.5}
    with pytest.raises(TypeError, match="returns its reward"):
        task.score(p, "yes", "3")
    assert AgentTask(agent=agent, source=ROWS).score(p, None, "3") == (None, {})


def test_options_are_checked():
    for options, match in (({}, "task.options.agent"), ({"agent": print}, "task.options.source"),
                           ({"agent": print, "source": ROWS, "on_break": "merge"}, "on_break"),
                           ({"agent": print, "source": ROWS, "concurrency": 0}, "concurrency"),
                           ({"agent": print, "source": ROWS, "timeout_s": 0}, "timeout_s")):
        with pytest.raises(ConfigError, match=match):
            AgentTask(**options)
