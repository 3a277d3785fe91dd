"""A small OpenEnv environment for tests/tasks/test_openenv.py, modelled on the envkit's guess server: served by
OpenEnv's own create_app (tba.tasks.openenv serves this class in a child process, which imports this file)."""

import random
import time

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


class GuessAction(Action):
    guess: str


class GuessObservation(Observation):
    feedback: str = ""
    tries: int = 0


class GuessEnv(Environment[GuessAction, GuessObservation, State]):
    """Find a number 0-7 from +/- feedback: -0.1 per wrong guess, 1 for the right one (which ends the episode),
    done after 4 guesses; the guess "hang" never answers."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state, self.secret, self.turns = State(), 0, 0

    def reset(self, seed=None, episode_id=None, **kw) -> GuessObservation:
        self.secret, self.turns = secret(seed), 0
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(feedback="Guess a number 0-7.", done=False, reward=0.0)

    def step(self, action: GuessAction, timeout_s=None, **kw) -> GuessObservation:
        self.turns += 1
        if action.guess.strip() == "hang":
            time.sleep(60)
        try:
            g = int(action.guess.strip())
        except ValueError:
            return GuessObservation(feedback="?", tries=self.turns, done=self.turns >= 4, reward=-0.1)
        if g == self.secret:
            return GuessObservation(feedback="correct", tries=self.turns, done=True, reward=1.0)
        return GuessObservation(feedback="+" if g < self.secret else "-", tries=self.turns, done=self.turns >= 4,
                                reward=-0.1)

    @property
    def state(self) -> State:
        return self._state


def secret(seed) -> int:
    return random.Random(seed).randrange(8)
