"""The replay buffer and its sampling rule (paper §1.3 and §3).

Storage: one history per prompt, oldest first. Adding a group deduplicates on the exact response tokens
(the newest copy wins and moves to the end) and keeps the newest `capacity_per_prompt` items.
`n_online` counts the unique responses from the latest policy version seen for that prompt: those are
"the newest items" that recency sampling draws from.

Sampling, per prompt slot, independently:
  with probability m (online):  a prompt refreshed since the last sync, uniformly without replacement
                                (the pool refills when exhausted); K of its n_online newest items, without
                                replacement if n_online ≥ K, else with replacement.
  otherwise (offline):          any seen prompt, uniformly without replacement (refill when exhausted);
                                K of its whole history with probabilities softmax(ι · reward), without
                                replacement unless the history holds fewer than K items.
"Refreshed since the last sync" is the set of prompts that received data after the trainer's latest
weight publication; right after a sync that set is still empty, so the previous window's set is used
(the paper's trainer likewise keeps drawing from the prompts gathered at the last sync).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tba.types import Group, Sample


@dataclass
class PromptHistory:
    prompt_tokens: list[int]
    items: list[Sample] = field(default_factory=list)
    latest_version: int = -1
    n_online: int = 0


@dataclass
class Draw:
    """K samples of one prompt, as handed to the trainer."""

    prompt_id: int
    prompt_tokens: list[int]
    samples: list[Sample]
    online: bool


class ReplayBuffer:
    def __init__(self, capacity_per_prompt: int = 100, online_prob: float = 0.95,
                 offline_inverse_temperature: float = 0.0, dedup: bool = True, seed: int = 0):
        self.capacity = capacity_per_prompt
        self.online_prob = online_prob
        self.inverse_temperature = offline_inverse_temperature
        self.dedup = dedup
        self.rng = np.random.default_rng(seed)
        self.histories: dict[int, PromptHistory] = {}
        self._refreshed: dict[int, None] = {}  # ordered set: prompts with data since the last sync
        self._previous_window: dict[int, None] = {}
        self._online_used: set[int] = set()
        self._offline_used: set[int] = set()
        self.groups_added = 0

    def __len__(self) -> int:
        return sum(len(h.items) for h in self.histories.values())

    @property
    def num_prompts(self) -> int:
        return len(self.histories)

    def add(self, group: Group) -> int:
        """Insert one searcher group; returns how many unique responses it contributed."""
        h = self.histories.setdefault(group.prompt_id, PromptHistory(list(group.prompt_tokens)))
        incoming: dict[tuple[int, ...], Sample] = {}
        for s in group.samples:  # later samples of the same group win too
            key = tuple(s.response) if self.dedup else (id(s),)
            incoming.pop(key, None)
            incoming[key] = s
        if self.dedup:
            h.items = [s for s in h.items if tuple(s.response) not in incoming]
        h.items.extend(incoming.values())
        h.items.sort(key=lambda s: s.version)  # stable: within a version, insertion order is kept
        del h.items[: max(0, len(h.items) - self.capacity)]
        version = max(s.version for s in group.samples)
        if version > h.latest_version:
            h.latest_version, h.n_online = version, len(incoming)
        elif version == h.latest_version:
            h.n_online = min(h.n_online + len(incoming), len(h.items))
        h.n_online = min(h.n_online, len(h.items))
        self._refreshed[group.prompt_id] = None
        self.groups_added += 1
        return len(incoming)

    def mark_sync(self) -> None:
        """Called when the trainer publishes new weights: a new recency window starts."""
        if self._refreshed:
            self._previous_window = self._refreshed
        self._refreshed = {}
        self._online_used = set()

    def _pick_prompt(self, candidates: list[int], used: set[int]) -> int:
        free = [p for p in candidates if p not in used]
        if not free:  # pool exhausted: refill with the prompts already used
            used.clear()
            free = candidates
        pid = free[self.rng.integers(len(free))]
        used.add(pid)
        return pid

    def _draw_items(self, items: list[Sample], k: int, probs: np.ndarray | None) -> list[Sample]:
        idx = self.rng.choice(len(items), size=k, replace=len(items) < k, p=probs)
        return [items[i] for i in idx]

    def sample(self, num_prompts: int, k: int) -> list[Draw]:
        """B = num_prompts groups of K samples each, by the paper's recency/reward rule."""
        if not self.histories:
            raise RuntimeError("cannot sample from an empty replay buffer (prefill first)")
        window = list(self._refreshed or self._previous_window)
        draws = []
        for _ in range(num_prompts):
            online = bool(window) and self.rng.random() < self.online_prob
            if online:
                pid = self._pick_prompt(window, self._online_used)
                h = self.histories[pid]
                newest = h.items[len(h.items) - max(h.n_online, 1):]
                samples = self._draw_items(newest, k, None)
            else:
                pid = self._pick_prompt(list(self.histories), self._offline_used)
                h = self.histories[pid]
                probs = None
                if self.inverse_temperature != 0.0:
                    logits = self.inverse_temperature * np.array([s.reward for s in h.items], dtype=np.float64)
                    probs = np.exp(logits - logits.max())
                    probs /= probs.sum()
                samples = self._draw_items(h.items, k, probs)
            draws.append(Draw(pid, h.prompt_tokens, samples, online))
        return draws
