"""A searcher's rows in flight under continuous batching (search.batching=continuous), and when weights load.

The engine (tba.models.continuous.ContinuousBatch) decodes whatever it holds; this keeps it fed with the next
prompts of the searcher's walk (always a full set of slots queued, so a freed slot never waits for a prompt),
gathers each prompt's S samples as they end, and hands back whole groups — in the order they complete, which is
not the order they began.

Weights (search.weight_update): `in_flight` loads a newer published version before any decode step, the rows
in flight going on with it; `between_batches` stops admitting when one is waiting, lets the rows in flight end,
loads it, and resumes. Either way every token records the version that sampled it.

A searcher's state (its prompt cursor) is the walk position of the oldest prompt still in flight: a restarted
or resumed searcher generates again what was in flight (a prompt delivered meanwhile may come twice, none is
skipped).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sized
from dataclasses import dataclass, field
from typing import Protocol

from tba.models.continuous import Finished
from tba.tasks.base import Prompt


class Engine(Protocol):
    """A continuous batch (tba.models.continuous.ContinuousBatch; on vLLM, tba.rollout.samplers.vllm.VLLMStream)."""

    slots: int
    queue: Sized
    """Samples waiting for a slot."""
    hold: bool
    """True: admit nothing, the rows in flight drain."""

    @property
    def active(self) -> int:
        """Rows in flight."""

    def submit(self, key, prompt: list[int], num_samples: int, max_new_tokens: int, keep: bool = False) -> None:
        """Queue a prompt's samples; `keep`: remember each one's context when it ends (a multi-turn episode)."""

    def resume(self, key, index: int, tokens: list[int], max_new_tokens: int) -> None:
        """Queue the next turn of a kept sample: `tokens` follow its last turn."""

    def release(self, key, index: int) -> None:
        """Forget a kept sample."""

    def step(self, version: int) -> list[Finished]:
        """Admit, decode one token for every row, return the samples (or turns) that ended."""


class WeightSync(Protocol):
    """How a searcher reaches the trainer's newest weights mid-step (a runtime's worker implements it)."""

    def pending(self) -> bool:
        """Newer weights than the searcher's are published."""

    def load(self) -> None:
        """Load the newest published weights if they are newer than the searcher's (Searcher.load_weights)."""


@dataclass
class Open:
    """A prompt in flight: its samples so far, by index."""

    prompt: Prompt
    tokens: list[int]
    walk: int
    """Its position in the searcher's prompt walk."""
    done: dict[int, Finished] = field(default_factory=dict)


class Stream:
    def __init__(self, engine: Engine, *, num_samples: int, max_new_tokens: int, weight_update: str):
        self.engine, self.num_samples, self.max_new_tokens = engine, num_samples, max_new_tokens
        self.in_flight = weight_update == "in_flight"
        self.open: dict[int, Open] = {}
        self.serial = 0
        self.generate_s = 0.0

    def run(self, want: int, feed: Callable[[], tuple[Prompt, list[int], int]], version: Callable[[], int],
            sync: WeightSync | None) -> list[Open]:
        """Decode until `want` prompts have all their samples; `feed()` gives the next prompt (prompt, tokens, walk
        position), `version()` the searcher's policy version now."""
        done: list[Open] = []
        t0 = time.perf_counter()
        while len(done) < want:
            while len(self.engine.queue) < self.engine.slots:
                prompt, tokens, walk = feed()
                self.open[self.serial] = Open(prompt, tokens, walk)
                self.engine.submit(self.serial, tokens, self.num_samples, self.max_new_tokens)
                self.serial += 1
            if sync is not None:
                if self.in_flight:
                    sync.load()
                elif sync.pending():
                    self.engine.hold = True
                    if not self.engine.active:
                        sync.load()
                        self.engine.hold = False
            for f in self.engine.step(version()):
                o = self.open[f.key]
                o.done[f.index] = f
                if len(o.done) == self.num_samples:
                    done.append(self.open.pop(f.key))
        self.generate_s += time.perf_counter() - t0
        return done

    def oldest(self) -> int | None:
        """The walk position of the oldest prompt in flight (None: nothing is)."""
        return min((o.walk for o in self.open.values()), default=None)
