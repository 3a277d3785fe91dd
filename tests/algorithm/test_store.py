"""The durable buffer store: what goes in comes back bit-identical, in acceptance order, and survives a kill."""

import multiprocessing
import os
import signal
import sqlite3

import pytest

from tba.algorithm.store import BufferStore, StoreError
from tba.algorithm.types import Group, Sample


def group(pid, n=3, version=0, reward=1.0):
    return Group(pid, [1, pid, 7], [Sample([pid, i, 2], [-0.1 * i - 1e-7, -0.25], reward + i, version,
                                          [-0.3, -1.0 / 3]) for i in range(n)])


def test_groups_round_trip_exactly_in_order(tmp_path):
    store = BufferStore(tmp_path)
    store.append([group(3), group(5, version=1)], step=1)
    store.append([group(3, version=2, reward=0.5)], step=2)
    back = list(store.iter_groups())
    assert [(seq, step, g.prompt_id) for seq, step, g in back] == [(1, 1, 3), (2, 1, 5), (3, 2, 3)]
    g = back[2][2]
    assert g.prompt_tokens == [1, 3, 7] and [s.reward for s in g.samples] == [0.5, 1.5, 2.5]
    import numpy as np  # log-probs are float32 values: stored losslessly as float32
    assert g.samples[1].ref_logprobs == np.float32([-0.1 - 1e-7, -0.25]).tolist()
    assert [seq for seq, _, _ in store.iter_groups(1, 2)] == [2]
    assert store.num_groups() == 3
    stats = store.stats()
    assert stats["groups"] == 3 and stats["samples"] == 9 and stats["prompts"] == 2 and stats["version_max"] == 2
    assert stats["unique_responses"] == 6  # same tokens under prompt 3 twice count once


def _writer(path, ready):
    store = BufferStore(path)
    for step in range(1, 10**6):
        store.append([group(step % 50)], step)
        if step == 20:
            ready.set()


def test_committed_groups_survive_kill_9_of_the_writer(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    p = ctx.Process(target=_writer, args=(tmp_path, ready))
    p.start()
    assert ready.wait(60)
    os.kill(p.pid, signal.SIGKILL)
    p.join()
    store = BufferStore(tmp_path, readonly=True)
    seqs = [seq for seq, _, _ in store.iter_groups()]
    assert len(seqs) >= 20 and seqs == list(range(1, len(seqs) + 1))  # a prefix, no torn group
    assert all(len(g.samples) == 3 for _, _, g in store.iter_groups())


def test_clear_errors_for_missing_foreign_and_unwritable_stores(tmp_path):
    with pytest.raises(StoreError, match="no replay buffer at"):
        BufferStore(tmp_path / "nothing", readonly=True)
    (tmp_path / "junk.sqlite").write_text("not a database")
    with pytest.raises(StoreError, match="cannot open replay buffer"):
        BufferStore(tmp_path / "junk.sqlite")
    store = BufferStore(tmp_path)
    store.db.execute("PRAGMA max_page_count = 1")  # the database cannot grow: what a full disk looks like
    with pytest.raises(StoreError, match="could not persist 1 groups .*full"):
        store.append([group(1, n=200)], step=1)
    assert store.num_groups() == 0  # the failed transaction left nothing half-written
    assert isinstance(store.db, sqlite3.Connection)


def test_a_store_of_another_format_is_refused_with_what_to_do(tmp_path):
    """No migrations: a buffer.sqlite written with another schema stops the run with one error naming the way out."""
    import sqlite3

    from tba.algorithm.store import FORMAT_VERSION, StoreError

    store = BufferStore(tmp_path)
    store.append([Group(1, [5, 6], [Sample([7, 8], [-1.0, -1.0], 1.0, 0)])], step=0)
    store.close()
    assert BufferStore(tmp_path, readonly=True).num_groups() == 1  # its own format: fine
    db = sqlite3.connect(tmp_path / "buffer.sqlite")
    with db:
        db.execute("UPDATE meta SET value = ? WHERE key = 'format_version'", (FORMAT_VERSION + 1,))
    db.close()
    for readonly in (False, True):
        with pytest.raises(StoreError, match=rf"replay buffer of format {FORMAT_VERSION + 1}; this tba reads format "
                                             rf"{FORMAT_VERSION}\. Start the run over .*--overwrite"):
            BufferStore(tmp_path, readonly=readonly)
