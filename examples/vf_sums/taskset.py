"""Two-digit sums as a verifiers v1 taskset: one turn, reward 1 when the reply's last number is the sum."""
import random
import re

import verifiers.v1 as vf


class SumsData(vf.TaskData):
    answer: str


class SumsTask(vf.Task[SumsData]):
    @vf.stop
    async def one_turn(self, trace: vf.Trace) -> bool:
        return trace.num_turns >= 1

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        numbers = re.findall(r"-?\d+", (trace.last_reply or "").replace(",", ""))
        return float(bool(numbers) and numbers[-1] == self.data.answer)


class SumsConfig(vf.TasksetConfig):
    num_tasks: int = 440
    seed: int = 0


class SumsTaskset(vf.Taskset[SumsTask, SumsConfig]):
    def load(self) -> list[SumsTask]:
        rng = random.Random(self.config.seed)
        pairs = [(rng.randint(10, 99), rng.randint(10, 99)) for _ in range(self.config.num_tasks)]
        return [SumsTask(SumsData(idx=i, prompt=f"What is {a} + {b}? Answer with one number.", answer=str(a + b)),
                         self.config.task) for i, (a, b) in enumerate(pairs)]
