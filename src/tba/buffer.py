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
the trainer may sample is always on disk. At a checkpoint, `snapshot` records the in-memory state in the
store (references to stored samples) and, once the checkpoint is written, `compact` deletes the samples no
kept checkpoint can draw again. `restore` rebuilds the exact in-memory state from the checkpoint's snapshot
(or, for a store without one, by replaying every group), the checkpoint's `state_dict` (sampling RNG,
windows, pools), and then re-adds the groups accepted after that checkpoint. Memory: `max_samples` bounds
the in-memory buffer by evicting the prompt that was refreshed longest ago — without it a long run grows
by every unique completion; an evicted prompt's samples leave the store at the next compaction.
"""

from __future__ import annotations

import itertools
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


@dataclass
class StoredSample(Sample):
    """A buffered sample and where the store keeps it: group `seq`, position `idx` in that group."""

    seq: int = 0
    idx: int = 0


def _compact(s: Sample, seq: int, idx: int) -> StoredSample:
    """Log-probs as float32 arrays (what they were computed in): ~8× less memory than lists of Python floats."""
    return StoredSample(s.response, array("f", s.ref_logprobs), s.reward, s.version,
                        array("f", s.behaviour_logprobs), seq, idx)


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
        groups = [g for g in groups if g.samples]  # (searchers never send empty ones: seq = groups_added)
        first = self.store.append(groups, step) if self.store is not None else self.groups_added + 1
        for seq, g in enumerate(groups, first):
            self.add(g, seq)

    @property
    def num_prompts(self) -> int:
        return len(self.histories)

    def add(self, group: Group, seq: int | None = None) -> int:
        """Insert one searcher group (`seq`: its place in the store); returns how many unique responses it
        contributed."""
        if not group.samples:
            return 0
        seq = self.groups_added + 1 if seq is None else seq
        h = self.histories.pop(group.prompt_id, None) or PromptHistory(list(group.prompt_tokens))
        self.histories[group.prompt_id] = h  # dict order = refresh order, least recently refreshed first
        self._size -= len(h.items)
        incoming: dict[tuple[int, ...], Sample] = {}
        for s in (_compact(s, seq, i) for i, s in enumerate(group.samples)):  # later samples of the group win too
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

    def snapshot(self) -> None:
        """Record the in-memory buffer in the store, as of `groups_added` (before the checkpoint naming it)."""
        if self.store is None:
            return
        state = {"prompts": [[pid, h.latest_version, h.n_online, len(h.items)] for pid, h in self.histories.items()],
                 "refreshed": list(self._refreshed), "previous_window": list(self._previous_window),
                 "evicted_prompts": self.evicted_prompts}
        refs = [(s.seq, s.idx) for h in self.histories.values() for s in h.items]
        self.store.save_snapshot(self.groups_added, state, refs)

    def compact(self, keep: list[int]) -> int:
        """Delete from the store what the snapshots at `keep` (the kept checkpoints) cannot draw again."""
        return self.store.compact(keep) if self.store is not None else 0

    def restore(self, state: dict | None) -> int:
        """Rebuild from the store: the snapshot at (or replay up to) the checkpoint, its sampling state, then
        the later groups. Without a checkpoint state: the newest snapshot and every group after it.

        Returns the number of groups re-added after the checkpoint (accepted, but not yet trained on).
        """
        upto = state["groups_added"] if state else None
        snap = self.store.snapshot(upto)
        if snap is not None:
            self._load(snap)
        elif (self.store.first_seq() or 1) != 1:
            raise RuntimeError(f"buffer store {self.store.path} was compacted and keeps no snapshot at or before "
                               f"group {upto}: it cannot rebuild this checkpoint's buffer (a checkpoint of another "
                               "run, or one restored from elsewhere?)")
        if state:
            pending = iter(self.store.sync_points(snap.sync_rowid if snap else 0))
            nxt = next(pending, None)  # windows shape eviction: replay them where they happened
            while nxt is not None and nxt <= self.groups_added:
                self._new_window()
                nxt = next(pending, None)
            for seq, _, g in self.store.iter_groups(self.groups_added, upto):
                self.add(g, seq)
                while nxt is not None and nxt <= seq:
                    self._new_window()
                    nxt = next(pending, None)
            if self.groups_added != upto:
                raise RuntimeError(f"buffer store {self.store.path} holds {self.groups_added} groups, the "
                                   f"checkpoint expects {upto}: it belongs to another run")
            self.rng.bit_generator.state = state["rng"]
            self._refreshed = dict.fromkeys(state["refreshed"])
            self._previous_window = dict.fromkeys(state["previous_window"])
            self._online_used, self._offline_used = set(state["online_used"]), set(state["offline_used"])
            self.evicted_prompts = state["evicted_prompts"]
        later = 0
        for seq, _, g in self.store.iter_groups(self.groups_added):
            self.add(g, seq)
            later += 1
        return later

    def _load(self, snap) -> None:
        """The in-memory buffer exactly as `snapshot` recorded it."""
        samples, tokens, refs = self.store.load_samples(snap.refs), self.store.prompt_tokens(), iter(snap.refs)
        self.histories = {pid: PromptHistory(tokens[pid], [_compact(samples[r], *r) for r in itertools.islice(refs, n)],
                                             latest, n_online)
                          for pid, latest, n_online, n in snap.state["prompts"]}
        self._size, self.groups_added = len(snap.refs), snap.upto
        self._refreshed = dict.fromkeys(snap.state["refreshed"])
        self._previous_window = dict.fromkeys(snap.state["previous_window"])
        self.evicted_prompts = snap.state["evicted_prompts"]

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
