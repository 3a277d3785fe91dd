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

Durability: with a `BufferStore`, `extend` writes the groups to disk before they enter memory, so a group
the trainer may sample is always on disk; `restore` rebuilds the exact in-memory state from the store and
a checkpoint's `state_dict` (sampling RNG, windows, pools) and then re-adds the groups accepted after that
checkpoint. Memory: `max_samples` bounds the in-memory buffer by evicting the prompt that was refreshed
longest ago (its data stays in the store) — without it a long run grows by every unique completion.
"""

from __future__ import annotations

import dataclasses
from array import array
from dataclasses import dataclass, field

import numpy as np

from tba.store import BufferStore
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


def _compact(s: Sample) -> Sample:
    """Log-probs as float32 arrays (what they were computed in): ~8× less memory than lists of Python floats."""
    return dataclasses.replace(s, ref_logprobs=array("f", s.ref_logprobs),
                               behaviour_logprobs=array("f", s.behaviour_logprobs))


class ReplayBuffer:
    def __init__(self, capacity_per_prompt: int = 100, online_prob: float = 0.95,
                 offline_inverse_temperature: float = 0.0, dedup: bool = True, seed: int = 0,
                 max_samples: int | None = None, store: BufferStore | None = None):
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
        self.max_samples, self.store = max_samples, store
        self.evicted_prompts = 0
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def extend(self, groups: list[Group], step: int = 0) -> None:
        """Accept `groups`: persisted first (when there is a store), then added in memory."""
        if self.store is not None:
            self.store.append(groups, step)
        for g in groups:
            self.add(g)

    @property
    def num_prompts(self) -> int:
        return len(self.histories)

    def add(self, group: Group) -> int:
        """Insert one searcher group; returns how many unique responses it contributed."""
        if not group.samples:
            return 0
        h = self.histories.pop(group.prompt_id, None) or PromptHistory(list(group.prompt_tokens))
        self.histories[group.prompt_id] = h  # dict order = refresh order, least recently refreshed first
        self._size -= len(h.items)
        incoming: dict[tuple[int, ...], Sample] = {}
        for s in map(_compact, group.samples):  # later samples of the same group win too
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
        self._size += len(h.items)
        self._refreshed[group.prompt_id] = None
        self.groups_added += 1
        self._evict()
        return len(incoming)

    def _evict(self) -> None:
        """Drop least-recently-refreshed prompts (never the current or previous window) above max_samples."""
        if self.max_samples is None:
            return
        for pid in list(self.histories):
            if self._size <= self.max_samples:
                return
            if pid in self._refreshed or pid in self._previous_window:
                continue
            self._size -= len(self.histories.pop(pid).items)
            self._offline_used.discard(pid)
            self.evicted_prompts += 1

    def state_dict(self) -> dict:
        """Sampling state for a checkpoint (JSON-able). The items themselves live in the store."""
        return {"groups_added": self.groups_added, "rng": self.rng.bit_generator.state,
                "refreshed": list(self._refreshed), "previous_window": list(self._previous_window),
                "online_used": sorted(self._online_used), "offline_used": sorted(self._offline_used),
                "evicted_prompts": self.evicted_prompts}

    def restore(self, state: dict | None) -> int:
        """Rebuild from the store: groups up to the checkpoint, its sampling state, then the later groups.

        Returns the number of groups re-added after the checkpoint (accepted, but not yet trained on).
        """
        upto = state["groups_added"] if state else 0
        syncs = self.store.sync_points()  # windows shape eviction: replay them where they happened
        pending = iter(syncs)
        nxt = next(pending, None)
        for seq, _, g in self.store.iter_groups(0, upto):
            self.add(g)
            while nxt is not None and nxt <= seq:
                self._new_window()
                nxt = next(pending, None)
        if self.groups_added != upto:
            raise RuntimeError(f"buffer store {self.store.path} holds {self.groups_added} groups, the checkpoint "
                               f"expects {upto}: it belongs to another run")
        if state:
            self.rng.bit_generator.state = state["rng"]
            self._refreshed = dict.fromkeys(state["refreshed"])
            self._previous_window = dict.fromkeys(state["previous_window"])
            self._online_used, self._offline_used = set(state["online_used"]), set(state["offline_used"])
            self.evicted_prompts = state["evicted_prompts"]
        later = 0
        for _, _, g in self.store.iter_groups(upto):
            self.add(g)
            later += 1
        return later

    def mark_sync(self, step: int = 0) -> None:
        """Called when the trainer publishes new weights: a new recency window starts."""
        if self.store is not None:
            self.store.append_sync(self.groups_added, step)
        self._new_window()

    def _new_window(self) -> None:
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
