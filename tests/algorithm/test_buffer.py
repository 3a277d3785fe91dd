from collections import Counter

import pytest

from tba.algorithm.buffer import ReplayBuffer
from tba.algorithm.types import Group, Sample
from tba.config.schema import BufferConfig


def make(*, seed: int = 0, path=None, readonly: bool = False, **fields) -> ReplayBuffer:
    """A buffer with these BufferConfig fields, persisted to (or read from) `path` if given."""
    buf = ReplayBuffer(BufferConfig(**fields), seed=seed)
    if path is not None:
        buf.open(path, readonly=readonly)
    return buf


def s(tokens, reward=0.0, version=0):
    return Sample(response=list(tokens), ref_logprobs=[0.0] * len(tokens), reward=reward, version=version)


def test_exact_token_dedup_newest_wins_and_capacity_keeps_newest():
    buf = make(capacity_per_prompt=3, seed=0)
    buf.add(Group(0, [1], [s([5], 0.0, 0), s([6], 0.0, 0)]))
    buf.add(Group(0, [1], [s([5], 1.0, 1)]))  # duplicate of [5]: the newer copy replaces it
    items = buf.histories[0].items
    assert [(x.response, x.reward, x.version) for x in items] == [([6], 0.0, 0), ([5], 1.0, 1)]
    buf.add(Group(0, [1], [s([7], version=2), s([8], version=2)]))
    assert [x.response for x in buf.histories[0].items] == [[5], [7], [8]]  # oldest ([6]) evicted
    assert len(buf) == 3


def test_duplicates_inside_one_group_count_once():
    buf = make(seed=0)
    assert buf.add(Group(0, [1], [s([5]), s([5]), s([6])])) == 2
    assert buf.histories[0].n_online == 2


def test_n_online_counts_unique_items_of_the_latest_version():
    buf = make(seed=0)
    buf.add(Group(0, [1], [s([1], version=0), s([2], version=0)]))
    buf.add(Group(0, [1], [s([3], version=0)]))  # same version: accumulates
    assert buf.histories[0].n_online == 3
    buf.add(Group(0, [1], [s([4], version=2), s([5], version=2)]))  # newer version: resets
    assert buf.histories[0].n_online == 2


def test_online_draws_come_from_the_newest_items_of_refreshed_prompts():
    buf = make(online_prob=1.0, seed=0)
    buf.add(Group(0, [1], [s([i], version=0) for i in range(20)]))
    buf.mark_sync()
    buf.add(Group(1, [2], [s([i], version=0) for i in range(20)]))  # old prompt window
    buf.add(Group(1, [2], [s([100 + i], version=1) for i in range(4)]))
    for draw in buf.sample(num_prompts=10, k=4):
        assert draw.online and draw.prompt_id == 1
        assert {x.response[0] for x in draw.samples} == {100, 101, 102, 103}  # n_online ≥ K: no replacement


def test_online_with_replacement_when_fewer_than_k_new_items():
    buf = make(online_prob=1.0, seed=0)
    buf.add(Group(0, [1], [s([i], version=0) for i in range(10)]))
    buf.add(Group(0, [1], [s([50], version=1), s([51], version=1)]))
    draw = buf.sample(1, k=6)[0]
    assert {x.response[0] for x in draw.samples} <= {50, 51} and len(draw.samples) == 6


def test_right_after_sync_the_previous_window_is_used():
    buf = make(online_prob=1.0, seed=0)
    buf.add(Group(3, [1], [s([1]), s([2])]))
    buf.mark_sync()
    assert all(d.prompt_id == 3 and d.online for d in buf.sample(4, 2))


def test_prompts_are_drawn_without_replacement_until_the_pool_is_exhausted():
    buf = make(online_prob=0.0, seed=0)
    for pid in range(5):
        buf.add(Group(pid, [pid], [s([1]), s([2])]))
    first = [d.prompt_id for d in buf.sample(5, 2)]
    assert sorted(first) == [0, 1, 2, 3, 4]
    second = [d.prompt_id for d in buf.sample(10, 2)]
    assert Counter(second) == Counter({p: 2 for p in range(5)})


def test_offline_uniform_without_replacement_and_reward_softmax():
    buf = make(online_prob=0.0, offline_inverse_temperature=0.0, seed=0)
    buf.add(Group(0, [1], [s([i], reward=float(i == 0)) for i in range(8)]))
    draw = buf.sample(1, k=8)[0]
    assert sorted(x.response[0] for x in draw.samples) == list(range(8))  # all distinct
    # ι large: the rewarded item dominates; with replacement only if history < K
    peaked = make(online_prob=0.0, offline_inverse_temperature=50.0, seed=0)
    peaked.add(Group(0, [1], [s([i], reward=float(i == 0)) for i in range(8)]))
    counts = Counter(x.response[0] for _ in range(50) for x in peaked.sample(1, k=1)[0].samples)
    assert counts[0] == 50


def test_online_spread_keeps_the_one_rewarded_sample_and_offline_draws_stay_uniform():
    items = [s([i], reward=float(i == 0)) for i in range(6)]
    spread = make(online_prob=1.0, online_draw="spread", seed=0)
    spread.add(Group(0, [1], items))
    assert all(0 in {x.response[0] for x in spread.sample(1, k=4)[0].samples} for _ in range(40))
    uniform = make(online_prob=1.0, seed=0)
    uniform.add(Group(0, [1], items))
    missed = sum(0 not in {x.response[0] for x in uniform.sample(1, k=4)[0].samples} for _ in range(40))
    assert missed > 0  # the paper's uniform K of 6 leaves it out a third of the time
    offline = make(online_prob=0.0, online_draw="spread", seed=0)  # the offline rule is untouched
    offline.add(Group(0, [1], items))
    missed = sum(0 not in {x.response[0] for x in offline.sample(1, k=1)[0].samples} for _ in range(40))
    assert missed > 20


def test_mix_of_online_and_offline_follows_m():
    buf = make(online_prob=0.7, seed=1)
    for pid in range(20):
        buf.add(Group(pid, [pid], [s([1]), s([2])]))
    draws = buf.sample(4000, 1)
    assert sum(d.online for d in draws) / len(draws) == pytest.approx(0.7, abs=0.03)


def test_sampling_an_empty_buffer_is_an_error():
    with pytest.raises(RuntimeError, match="empty"):
        make().sample(1, 1)


def _feed(buf, rounds, seed=0):
    """Add groups with mixed prompts and versions, syncing now and then, sampling in between."""
    import random

    rng = random.Random(seed)
    for r in range(rounds):
        groups = [Group(rng.randrange(12), [1, 2], [s([rng.randrange(4), rng.randrange(4)], float(rng.random() < .5), r)
                                                   for _ in range(4)]) for _ in range(3)]
        buf.extend(groups, step=r)
        buf.sample(2, 3)
        if r % 3 == 2:
            buf.mark_sync(r)


def _snapshot(buf):
    return {pid: (h.latest_version, h.n_online, [(tuple(x.response), x.reward, x.version) for x in h.items])
            for pid, h in buf.histories.items()}


@pytest.mark.parametrize("max_samples", [None, 20])
def test_restore_from_store_and_state_rebuilds_the_buffer_exactly(tmp_path, max_samples):

    kw = dict(capacity_per_prompt=5, online_prob=0.7, offline_inverse_temperature=1.0, seed=3, max_samples=max_samples)
    live = make(**kw, path=tmp_path / "a.sqlite")
    _feed(live, 10)
    state = live.state_dict()  # a checkpoint here …
    late = [Group(11, [1, 2], [s([9, 9], 1.0, 10)])]
    live.extend(late, step=11)  # … and a group accepted after it, before the "crash"

    again = make(**kw, path=tmp_path / "a.sqlite")
    assert again.restore(state) == 1
    assert _snapshot(again) == _snapshot(live) and len(again) == len(live)
    assert again.evicted_prompts == live.evicted_prompts
    if max_samples:
        assert live.evicted_prompts > 0  # (prompts of the recency windows are never evicted)
    draws_a, draws_b = live.sample(4, 3), again.sample(4, 3)  # same RNG and pools: the same draws
    assert [(d.prompt_id, [x.response for x in d.samples]) for d in draws_a] == \
        [(d.prompt_id, [x.response for x in d.samples]) for d in draws_b]


def test_eviction_keeps_the_recency_windows_and_bounds_memory():
    buf = make(capacity_per_prompt=10, max_samples=6, seed=0)
    for pid in range(5):
        buf.add(Group(pid, [1], [s([pid, 1]), s([pid, 2])]))
        buf.mark_sync()
    # prompts 3 (previous window) and 4 (current) are protected; the oldest others went first
    assert list(buf.histories) == [2, 3, 4] and len(buf) == 6 and buf.evicted_prompts == 2
    assert buf.histories[2].items[0].ref_logprobs.typecode == "f"  # stored compactly as float32


def _stored_samples(store) -> int:
    return store.db.execute("SELECT count(*) FROM samples").fetchone()[0]


@pytest.mark.parametrize("max_samples", [None, 20])
def test_compaction_keeps_every_kept_checkpoint_exact_and_drops_the_rest(tmp_path, max_samples):
    """A compacted store and a full log rebuild the same buffer at each kept checkpoint (the newest, and
    the older one a damaged newest checkpoint falls back to); the compacted one holds far fewer samples."""

    kw = dict(capacity_per_prompt=5, online_prob=0.7, offline_inverse_temperature=1.0, seed=3, max_samples=max_samples)
    live = make(**kw, path=tmp_path / "compacted.sqlite")
    full = make(**kw, path=tmp_path / "full.sqlite")
    states = []
    for chunk in range(6):  # six checkpoints, two kept (checkpoint.keep = 2)
        for buf in (live, full):
            _feed(buf, 5, seed=chunk)
            buf.snapshot()
        states.append(live.state_dict())
        assert full.state_dict() == states[-1]  # the two runs are identical so far
        live.compact([s["groups_added"] for s in states[-2:]])
    for buf in (live, full):
        buf.extend([Group(11, [1, 2], [s([9, 9], 1.0, 40)])], step=40)  # accepted after the last checkpoint
    accepted = full.store.num_groups()
    assert live.store.num_groups() == accepted and live.store.stats()["groups"] == accepted
    assert _stored_samples(live.store) < _stored_samples(full.store) / 2
    for state in states[-2:]:
        a = make(**kw, path=tmp_path / "compacted.sqlite")
        b = make(**kw, path=tmp_path / "full.sqlite")
        assert a.restore(state) == b.restore(state) == accepted - state["groups_added"]
        assert _snapshot(a) == _snapshot(b) and len(a) == len(b) and a.evicted_prompts == b.evicted_prompts
        assert [(d.prompt_id, [x.response for x in d.samples]) for d in a.sample(4, 3)] == \
            [(d.prompt_id, [x.response for x in d.samples]) for d in b.sample(4, 3)]
    newest = make(**kw, path=tmp_path / "compacted.sqlite")
    newest.restore(states[-1])
    assert _snapshot(newest) == _snapshot(live)  # the run's own buffer, group 11 included
    with pytest.raises(RuntimeError, match="compacted and keeps no snapshot at or before group"):
        make(**kw, path=tmp_path / "compacted.sqlite").restore(states[0])


def test_without_a_checkpoint_state_the_newest_snapshot_and_later_groups_are_loaded(tmp_path):
    """What runtime=offline reads from a compacted source run: its final buffer, not the deleted history."""

    live = make(capacity_per_prompt=3, seed=1, path=tmp_path)
    _feed(live, 8)
    live.snapshot()
    live.compact([live.groups_added])
    live.extend([Group(2, [1, 2], [s([7, 7], 1.0, 9)])], step=9)
    offline = make(capacity_per_prompt=3, path=tmp_path, readonly=True)
    assert offline.restore(None) == 1 and offline.groups_added == live.groups_added
    assert _snapshot(offline) == _snapshot(live)


def test_a_store_without_this_versions_tables_is_refused_by_name(tmp_path):
    """No compatibility layer for stores of unreleased versions: one message naming what is missing."""
    import sqlite3

    from tba.algorithm.store import BufferStore, StoreError

    live = make(capacity_per_prompt=4, seed=2, path=tmp_path)
    _feed(live, 2)
    live.close()
    db = sqlite3.connect(tmp_path / "buffer.sqlite")
    db.executescript("DROP TABLE snapshots; DROP TABLE meta;")
    db.close()
    with pytest.raises(StoreError, match=r"buffer.sqlite is not a replay buffer this tba can read: no table meta, "
                                         r"snapshots"):
        BufferStore(tmp_path, readonly=True)


def test_the_mean_age_is_kept_incrementally_and_equals_a_walk_over_the_held_samples(tmp_path):
    """The metric used to walk every held sample at every step; the buffer now keeps the sum as it changes
    (dedup replacing, capacity trimming, eviction, restore)."""
    buf = make(capacity_per_prompt=4, max_samples=20, seed=3, path=tmp_path)
    assert buf.age_mean(5) != buf.age_mean(5)  # nan when empty
    for rounds in (3, 12):
        _feed(buf, rounds)
        held = [x.version for h in buf.histories.values() for x in h.items]
        assert buf.evicted_prompts > 0 or rounds == 3
        assert buf.age_mean(20) == pytest.approx(20 - sum(held) / len(held))
    buf.snapshot()
    restored = make(capacity_per_prompt=4, max_samples=20, seed=3, path=tmp_path)
    restored.restore(buf.state_dict())
    assert restored.age_mean(20) == pytest.approx(buf.age_mean(20))
