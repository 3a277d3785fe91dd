"""RunState: the training loop's own state between steps — what a checkpoint saves besides the model,
optimizer, buffer and searcher states (which their owners save).

It round-trips through a checkpoint's `state.json` (`to_checkpoint` / `from_checkpoint`: a `loop` section
plus the two model sources). Timings and counters that span resumes (`train_s`, `wall_s`, `restarts`,
`rewards_dropped`) hold the totals up to the start of the current segment; the loop adds the current segment
when it checkpoints. `CheckpointState` is everything the loop writes to state.json, as one record.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Evaluation:
    """One held-out evaluation (tba.rollout.evaluate): after `step` updates, at `train_s` training seconds."""

    step: int
    metrics: dict[str, float]
    """Always "score"; a task may add its own (e.g. the enumerable task's exact KLs)."""
    train_s: float

    @property
    def score(self) -> float:
        return self.metrics["score"]

    def to_json(self) -> list:
        return [self.step, self.metrics, self.train_s]

    @classmethod
    def from_json(cls, row: list) -> Evaluation:
        step, metrics, train_s = row
        return cls(step, metrics, train_s)


@dataclass
class RunState:
    step: int = 0  # updates the loop has completed
    evals: list[Evaluation] = field(default_factory=list)  # every evaluation so far, the start's first
    rewards_seen: list[float] = field(default_factory=list)  # mean reward of each step's fresh samples
    received: int = 0  # samples the trainer received from searchers
    busy_s: float = 0.0  # seconds the trainer spent drawing, updating and publishing
    train_s: float = 0.0  # training seconds (evaluation excluded)
    wall_s: float = 0.0  # wall-clock seconds, start-up included
    resumed_at: list[int] = field(default_factory=list)
    restarts: int = 0  # searcher restarts
    rewards_dropped: int = 0  # samples dropped because the reward raised or was not finite
    policy_source: str | None = None  # where other processes load the starting policy from
    reference_source: str | None = None  # and the reference
    sources: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per source (searcher group, data): samples received, their reward sum, samples drawn."""

    def tally(self, source: str, *, received: int = 0, reward_sum: float = 0.0, drawn: int = 0) -> None:
        t = self.sources.setdefault(source, {"received": 0, "reward_sum": 0.0, "drawn": 0})
        t["received"] += received
        t["reward_sum"] += reward_sum
        t["drawn"] += drawn

    def to_checkpoint(self) -> dict:
        return {"policy_source": self.policy_source, "reference_source": self.reference_source,
                "loop": {"evals": [e.to_json() for e in self.evals], "rewards_seen": self.rewards_seen,
                         "received": self.received, "busy_s": self.busy_s, "train_s": self.train_s,
                         "wall_s": self.wall_s, "resumed_at": self.resumed_at, "restarts": self.restarts,
                         "rewards_dropped": self.rewards_dropped, "sources": self.sources}}

    @classmethod
    def from_checkpoint(cls, state: dict) -> RunState:
        """From a checkpoint's state (tba.run.checkpoint.load); {} (no checkpoint) gives a fresh state."""
        loop = state.get("loop", {})
        evals = [Evaluation.from_json(row) for row in loop.get("evals", [])]
        return cls(step=state.get("step", 0), evals=evals, rewards_seen=loop.get("rewards_seen", []),
                   received=loop.get("received", 0), busy_s=loop.get("busy_s", 0.0), train_s=loop.get("train_s", 0.0),
                   wall_s=loop.get("wall_s", 0.0), resumed_at=loop.get("resumed_at", []),
                   restarts=loop.get("restarts", 0), rewards_dropped=loop.get("rewards_dropped", 0),
                   sources=loop.get("sources", {}),
                   policy_source=state.get("policy_source"), reference_source=state.get("reference_source"))


@dataclass
class CheckpointState:
    """What the loop writes to a checkpoint's state.json (tba.run.checkpoint adds the RNG states and the
    optimizer's parameter groups): its own RunState and what the trainer, buffer and searchers resume from."""

    run: RunState
    version: int
    """Policy version: updates applied (the trainer's)."""
    skipped_steps: int
    """Updates skipped for a non-finite loss or gradient (the trainer's)."""
    buffer: dict
    """ReplayBuffer.state_dict(): which samples on disk the buffer held, and its counters."""
    searchers: list[dict | None]
    """Each searcher's state as of its last batch received (prompt cursor, counters, RNG)."""

    def to_json(self) -> dict:
        return {**self.run.to_checkpoint(), "version": self.version, "skipped_steps": self.skipped_steps,
                "buffer": self.buffer, "searchers": self.searchers}


@dataclass
class RunTotals:
    """A run's counters and clocks at its end, summed over its resumed segments."""

    restarts: int
    """Searcher restarts."""
    dropped: int
    """Samples dropped because their reward raised or was not finite."""
    placement: list[dict]
    """Where each searcher ran (rank, pid or Ray node, host)."""
    busy_fraction: float
    """Share of the last segment's loop time the trainer spent updating."""
    wall_clock_s: float
    train_s: float
    """Training seconds, evaluation excluded."""
    startup_s: float = 0.0
    """Seconds from the (last) segment's start to its training clock's: models built, searchers launched and
    ready, evaluation excluded. A launch-to-accuracy clock is startup_s + train_wall_clock_s."""
    replay_ratio: float | None = None
    """Samples drawn per sample received at the end: updates·B·K / samples received (None: none received, an
    offline run)."""
    episodes_ended: dict[str, int] = field(default_factory=dict)
    """Multi-turn runs: episodes by end reason, as the searchers last reported them ({} for single-turn)."""
