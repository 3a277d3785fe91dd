"""The replay buffer (paper §1.3 and §3): what the searchers delivered, per prompt, and where recency starts.

Storage: one history per prompt, oldest first. Adding a group deduplicates on the exact response tokens
(the newest copy wins and moves to the end) and keeps the newest `capacity_per_prompt` items.
`n_online` counts the unique responses from the latest policy version seen for that prompt: those are
"the newest items" that recency sampling draws from. The rule that draws from it is tba.algorithm.sampling.

"Refreshed since the last sync" is the set of prompts that received data after the trainer's latest
weight publication; right after a sync that set is still empty, so the previous window's set is used
(the paper's trainer likewise keeps drawing from the prompts gathered at the last sync). Completions from
elsewhere (tba.rollout.demonstrations) are kept per prompt apart from the histories and never evicted.

Durability: the buffer owns its `BufferStore` (`open`, `close`). Once open, `extend` writes the groups to
disk before they enter memory, so a group the trainer may sample is always on disk. At a checkpoint (with
`buffer.compact` on), `snapshot` records the in-memory state in the store (references to stored samples) and,
once the checkpoint is written, `compact` deletes the samples no kept checkpoint can draw again. `restore`
rebuilds the exact in-memory state from the checkpoint's snapshot (or, for a store without one, by replaying
every group), the checkpoint's `state_dict` (sampling RNG, windows, pools), and then re-adds the groups accepted
after that checkpoint. Memory: `max_samples` bounds the in-memory buffer by evicting the prompt that was
refreshed longest ago — without it a long run grows by every unique completion; an evicted prompt's samples
leave the store at the next compaction.
"""

from __future__ import annotations

import itertools
from array import array
from dataclasses import dataclass, field

import numpy as np

from tba.algorithm.sampling import NothingYoungEnough, Pools, Rule, draw_slot
from tba.algorithm.store import BufferStore
from tba.algorithm.types import Draw, Group, Sample

__all__ = ["NothingYoungEnough", "ReplayBuffer"]
from tba.config.schema import BufferConfig


@dataclass
class PromptHistory:
    prompt_tokens: list[int]
    items: list[Sample] = field(default_factory=list)
    latest_version: int = -1
    n_online: int = 0


@dataclass
class StoredSample(Sample):
    """A buffered sample and where the store keeps it: group `seq`, position `idx` in that group."""

    seq: int = 0
    idx: int = 0
    order: int = 0
    """Where it sits in its prompt's history (sorted by this, stably): its policy version for a source that
    loads the trainer's weights, else the prompt's newest version when it arrived — a fixed behaviour's sample
    is as fresh as the policy's that arrive with it, although its version stays that of its start."""

    @classmethod
    def of(cls, s: Sample, seq: int, idx: int) -> StoredSample:
        """Log-probs as float32 arrays (what they were computed in): ~8× less memory than lists of floats."""
        return cls(s.response, array("f", s.ref_logprobs), s.reward, s.version, array("f", s.behaviour_logprobs),
                   s.source, array("b", s.policy_mask), array("i", s.versions), seq=seq, idx=idx)


class ReplayBuffer:
    def __init__(self, cfg: BufferConfig | None = None, *, seed: int = 0, aging: frozenset[str] | None = None,
                 data_sources: frozenset[str] = frozenset(), data_share: float = 0.0):
        """`aging`: the sources whose samples age (they load the trainer's weights; None = every source), which
        the age cap applies to; `data_sources`: the sources that are completions from elsewhere
        (tba.rollout.demonstrations), drawn at `data_share` of the samples."""
        self.cfg = cfg = cfg or BufferConfig()
        self.rule = Rule(cfg.online_prob, cfg.offline_inverse_temperature, cfg.max_sample_age, aging, data_share,
                         cfg.online_draw)
        self.data_sources = data_sources
        self.data: dict[int, list[StoredSample]] = {}  # prompt → its data items (demonstrations): never evicted
        self._data_tokens: dict[int, list[int]] = {}
        self.too_old = 0  # samples the age cap kept out of the last draw
        self.rng = np.random.default_rng(seed)
        self.histories: dict[int, PromptHistory] = {}
        self._refreshed: dict[int, None] = {}  # ordered set: prompts with data since the last sync
        self._previous_window: dict[int, None] = {}
        self.pools = Pools()
        self.groups_added, self.evicted_prompts = 0, 0
        self.store: BufferStore | None = None
        self._size = 0
        self._version_sum = 0  # Σ version over the samples held: the mean age without walking them

    def __len__(self) -> int:
        return self._size

    def open(self, path, *, readonly: bool = False) -> BufferStore:
        """Persist to (or, readonly, read from) the store at `path` (a run directory or a buffer.sqlite)."""
        self.close()
        self.store = BufferStore(path, readonly=readonly)
        return self.store

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
            self.store = None

    def age_mean(self, version: int) -> float:
        """Mean (version − sample version) over everything held in memory; nan when empty."""
        return version - self._version_sum / self._size if self._size else float("nan")

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
        if group.source in self.data_sources:
            return self._add_data(group, seq)
        h = self.histories.pop(group.prompt_id, None) or PromptHistory(list(group.prompt_tokens))
        self.histories[group.prompt_id] = h  # dict order = refresh order, least recently refreshed first
        self._forget(h.items)
        ages = self.rule.aging is None or group.source in self.rule.aging
        version = max(s.version for s in group.samples) if ages else max(h.latest_version, 0)  # see `order`
        incoming: dict[tuple[int, ...], Sample] = {}
        for s in (StoredSample.of(s, seq, i) for i, s in enumerate(group.samples)):  # later samples win too
            s.order = s.version if ages else version
            key = tuple(s.response) if self.cfg.dedup else (id(s),)
            incoming.pop(key, None)
            incoming[key] = s
        if self.cfg.dedup:
            h.items = [s for s in h.items if tuple(s.response) not in incoming]
        h.items.extend(incoming.values())
        h.items.sort(key=lambda s: s.order)  # stable: within a version, insertion order is kept
        del h.items[: max(0, len(h.items) - self.cfg.capacity_per_prompt)]
        if version > h.latest_version:
            h.latest_version, h.n_online = version, len(incoming)
        elif version == h.latest_version:
            h.n_online = min(h.n_online + len(incoming), len(h.items))
        h.n_online = min(h.n_online, len(h.items))
        self._hold(h.items)
        self._refreshed[group.prompt_id] = None
        self.groups_added += 1
        self._evict()
        return len(incoming)

    def _add_data(self, group: Group, seq: int) -> int:
        """Completions from elsewhere: kept apart, deduplicated on their tokens, never evicted."""
        items = self.data.setdefault(group.prompt_id, [])
        self._data_tokens[group.prompt_id] = list(group.prompt_tokens)
        held = {tuple(s.response) for s in items}
        new = [StoredSample.of(s, seq, i) for i, s in enumerate(group.samples) if tuple(s.response) not in held]
        items.extend(new)
        self.groups_added += 1
        return len(new)

    @property
    def data_size(self) -> int:
        return sum(len(v) for v in self.data.values())

    def _evict(self) -> None:
        """Drop least-recently-refreshed prompts (never the current or previous window) above max_samples."""
        if self.cfg.max_samples is None:
            return
        for pid in list(self.histories):
            if self._size <= self.cfg.max_samples:
                return
            if pid in self._refreshed or pid in self._previous_window:
                continue
            self._forget(self.histories.pop(pid).items)
            self.pools.offline.discard(pid)
            self.evicted_prompts += 1

    def _hold(self, items: list[Sample]) -> None:
        self._size += len(items)
        self._version_sum += sum(s.version for s in items)

    def _forget(self, items: list[Sample]) -> None:
        self._size -= len(items)
        self._version_sum -= sum(s.version for s in items)

    def state_dict(self) -> dict:
        """Sampling state for a checkpoint (JSON-able). The items themselves live in the store."""
        return {"groups_added": self.groups_added, "rng": self.rng.bit_generator.state,
                "refreshed": list(self._refreshed), "previous_window": list(self._previous_window),
                "online_used": sorted(self.pools.online), "offline_used": sorted(self.pools.offline),
                "evicted_prompts": self.evicted_prompts}

    def snapshot(self) -> None:
        """Record the in-memory buffer in the store, as of `groups_added` (before the checkpoint naming it), when
        the store is compacted (`buffer.compact`): a compacted store can only be restored from a snapshot."""
        if self.store is None or not self.cfg.compact:
            return
        state = {"prompts": [[pid, h.latest_version, h.n_online, len(h.items)] for pid, h in self.histories.items()],
                 "refreshed": list(self._refreshed), "previous_window": list(self._previous_window),
                 "evicted_prompts": self.evicted_prompts, "data": [[pid, len(v)] for pid, v in self.data.items()]}
        refs = [(s.seq, s.idx) for h in self.histories.values() for s in h.items]
        offsets = [s.order - s.version for h in self.histories.values() for s in h.items]  # 0 but for fixed sources
        if any(offsets):
            state["order"] = offsets
        refs += [(s.seq, s.idx) for items in self.data.values() for s in items]
        self.store.save_snapshot(self.groups_added, state, refs)

    def compact(self, keep: list[int]) -> int:
        """Delete from the store what the snapshots at `keep` (the kept checkpoints) cannot draw again
        (`buffer.compact`; off: the store keeps every sample ever accepted)."""
        return self.store.compact(keep) if self.store is not None and self.cfg.compact else 0

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
            self.pools = Pools(set(state["online_used"]), set(state["offline_used"]))
            self.evicted_prompts = state["evicted_prompts"]
        later = 0
        for seq, _, g in self.store.iter_groups(self.groups_added):
            self.add(g, seq)
            later += 1
        return later

    def _load(self, snap) -> None:
        """The in-memory buffer exactly as `snapshot` recorded it."""
        samples, tokens, refs = self.store.load_samples(snap.refs), self.store.prompt_tokens(), iter(snap.refs)
        self.histories = {pid: PromptHistory(tokens[pid], [StoredSample.of(samples[r], *r)
                                                           for r in itertools.islice(refs, n)], latest, n_online)
                          for pid, latest, n_online, n in snap.state["prompts"]}
        offsets = iter(snap.state.get("order", ()))
        for h in self.histories.values():
            for s in h.items:
                s.order = s.version + next(offsets, 0)
        self._size, self._version_sum, self.groups_added = 0, 0, snap.upto
        for h in self.histories.values():
            self._hold(h.items)
        self.data = {pid: [StoredSample.of(samples[r], *r) for r in itertools.islice(refs, n)]
                     for pid, n in snap.state.get("data", [])}
        self._data_tokens = {pid: tokens[pid] for pid in self.data}
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
        self.pools.online = set()

    def sample(self, num_prompts: int, k: int, version: int | None = None) -> list[Draw]:
        """B = num_prompts groups of K samples each, by the paper's recency/reward rule (and data slots). With
        buffer.max_sample_age, `version` is the trainer's: what is older than the cap is not drawn."""
        if not self.histories:
            raise RuntimeError("cannot sample from an empty replay buffer (prefill first)")
        window = list(self._refreshed or self._previous_window)
        with_data = [pid for pid in self.data if pid in self.histories] if self.rule.data_share and self.data else []
        self.too_old, draws = 0, []
        for _ in range(num_prompts):
            draw, too_old = draw_slot(self.rng, self.rule, self.histories, window, self.data, with_data, self.pools, k,
                                      version)
            draws.append(draw)
            self.too_old += too_old
        return draws
