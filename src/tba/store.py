"""The durable half of the replay buffer: every accepted group, on disk, before the trainer may use it.

Why SQLite in WAL mode (and not an append-only Arrow/Parquet log):
* a commit is atomic and, with `synchronous=FULL`, durable across `kill -9` and power loss — a Parquet
  file is only readable once its footer is written, so a killed writer loses the open row group;
* one file, standard library, readable while the trainer writes (WAL lets `tba buffer stats` run beside
  a live run) and queryable with any SQLite tool;
* appends are small (one transaction per `collect`, ≈ 1 per trainer step): throughput is not the limit.

Schema (the `seq` of a group is its acceptance order, 1-based; replaying groups in `seq` order through
`ReplayBuffer.add` rebuilds the in-memory buffer exactly):

    prompts(prompt_id, tokens)                      tokens: int32 little-endian bytes
    groups(seq, prompt_id, step, time)              step: trainer step at which the group was accepted
    syncs(after_seq, step)                          a weight publication (new recency window) after group seq
    samples(seq, idx, version, reward, response, ref_logprobs, behaviour_logprobs)
                                                    response int32 bytes, log-probs float32 bytes (lossless:
                                                    they were computed in float32)
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from tba.types import Group, Sample

SCHEMA = """
CREATE TABLE IF NOT EXISTS prompts(prompt_id INTEGER PRIMARY KEY, tokens BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS groups(seq INTEGER PRIMARY KEY, prompt_id INTEGER NOT NULL, step INTEGER NOT NULL,
                                  time REAL NOT NULL);
CREATE TABLE IF NOT EXISTS samples(seq INTEGER NOT NULL, idx INTEGER NOT NULL, version INTEGER NOT NULL,
                                   reward REAL NOT NULL, response BLOB NOT NULL, ref_logprobs BLOB NOT NULL,
                                   behaviour_logprobs BLOB NOT NULL, PRIMARY KEY(seq, idx));
CREATE TABLE IF NOT EXISTS syncs(after_seq INTEGER NOT NULL, step INTEGER NOT NULL);
"""
FILENAME = "buffer.sqlite"


class StoreError(RuntimeError):
    """The buffer store cannot be written or read (disk full, unwritable directory, not a tba buffer)."""


def _ints(values) -> bytes:
    return np.asarray(values, dtype="<i4").tobytes()


def _floats(values) -> bytes:
    return np.asarray(values, dtype="<f4").tobytes()


def resolve(path: str | Path) -> Path:
    """A run directory or a buffer file → the buffer file."""
    path = Path(path)
    return path / FILENAME if path.is_dir() else path


class BufferStore:
    def __init__(self, path: str | Path, readonly: bool = False):
        self.path = resolve(path)
        if readonly and not self.path.is_file():
            raise StoreError(f"no replay buffer at {self.path} (expected a run directory or a {FILENAME} file)")
        try:
            uri = f"file:{self.path}?mode=ro" if readonly else str(self.path)
            self.db = sqlite3.connect(uri, uri=readonly, timeout=30, check_same_thread=False)
            if not readonly:
                self.db.execute("PRAGMA journal_mode=WAL")
                self.db.execute("PRAGMA synchronous=FULL")  # a commit survives kill -9 and power loss
                self.db.executescript(SCHEMA)
            self.db.execute("SELECT count(*) FROM groups").fetchone()
        except sqlite3.DatabaseError as e:
            raise StoreError(f"cannot open replay buffer {self.path}: {e}") from None
        self._known_prompts: set[int] = set()

    def append(self, groups: list[Group], step: int) -> None:
        """Persist `groups` in one transaction; returns only once they are on disk."""
        if not groups:
            return
        now = time.time()
        try:
            with self.db:  # one transaction: all of these groups or none
                new = {g.prompt_id: g.prompt_tokens for g in groups if g.prompt_id not in self._known_prompts}
                self.db.executemany("INSERT OR IGNORE INTO prompts VALUES (?, ?)",
                                    [(pid, _ints(tokens)) for pid, tokens in new.items()])
                seq = self.db.execute("SELECT coalesce(max(seq), 0) FROM groups").fetchone()[0]
                rows, sample_rows = [], []
                for g in groups:
                    seq += 1
                    rows.append((seq, g.prompt_id, step, now))
                    sample_rows += [(seq, i, s.version, s.reward, _ints(s.response), _floats(s.ref_logprobs),
                                     _floats(s.behaviour_logprobs)) for i, s in enumerate(g.samples)]
                self.db.executemany("INSERT INTO groups VALUES (?, ?, ?, ?)", rows)
                self.db.executemany("INSERT INTO samples VALUES (?, ?, ?, ?, ?, ?, ?)", sample_rows)
        except sqlite3.OperationalError as e:
            raise StoreError(f"could not persist {len(groups)} groups to {self.path}: {e} "
                             "(disk full or directory not writable?); nothing was lost before this point") from None
        self._known_prompts.update(new)

    def append_sync(self, after_seq: int, step: int) -> None:
        try:
            with self.db:
                self.db.execute("INSERT INTO syncs VALUES (?, ?)", (after_seq, step))
        except sqlite3.OperationalError as e:
            raise StoreError(f"could not write to {self.path}: {e} (disk full or directory not writable?)") from None

    def sync_points(self) -> list[int]:
        return [r[0] for r in self.db.execute("SELECT after_seq FROM syncs ORDER BY rowid")]

    def num_groups(self) -> int:
        return self.db.execute("SELECT count(*) FROM groups").fetchone()[0]

    def iter_groups(self, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, int, Group]]:
        """(seq, step, group) for start < seq ≤ stop, in acceptance order."""
        stop = stop if stop is not None else 2**62
        prompts = {pid: np.frombuffer(t, "<i4").tolist() for pid, t in self.db.execute("SELECT * FROM prompts")}
        rows = self.db.execute(
            "SELECT g.seq, g.prompt_id, g.step, s.version, s.reward, s.response, s.ref_logprobs, "
            "s.behaviour_logprobs FROM groups g JOIN samples s ON s.seq = g.seq "
            "WHERE g.seq > ? AND g.seq <= ? ORDER BY g.seq, s.idx", (start, stop))
        current, samples, meta = None, [], None
        for seq, pid, step, version, reward, resp, ref, beh in rows:
            if seq != current and current is not None:
                yield meta[0], meta[2], Group(meta[1], prompts[meta[1]], samples)
                samples = []
            current, meta = seq, (seq, pid, step)
            samples.append(Sample(np.frombuffer(resp, "<i4").tolist(), np.frombuffer(ref, "<f4").tolist(), reward,
                                  version, np.frombuffer(beh, "<f4").tolist()))
        if current is not None:
            yield meta[0], meta[2], Group(meta[1], prompts[meta[1]], samples)

    def stats(self) -> dict:
        q = self.db.execute
        groups, first, last, steps = q("SELECT count(*), min(time), max(time), max(step) FROM groups").fetchone()
        samples, reward, vmin, vmax = q(
            "SELECT count(*), avg(reward), min(version), max(version) FROM samples").fetchone()
        unique = q("SELECT count(*) FROM (SELECT DISTINCT g.prompt_id, s.response FROM samples s "
                   "JOIN groups g USING(seq))").fetchone()[0]
        hist = q("SELECT round(reward, 3), count(*) FROM samples GROUP BY 1 ORDER BY 1 LIMIT 20").fetchall()
        return {
            "path": str(self.path),
            "bytes_on_disk": sum(p.stat().st_size for p in self.path.parent.glob(self.path.name + "*")),
            "prompts": q("SELECT count(*) FROM prompts").fetchone()[0],
            "groups": groups, "samples": samples, "unique_responses": unique,
            "reward_mean": reward, "reward_counts": {str(r): n for r, n in hist},
            "version_min": vmin, "version_max": vmax, "last_step": steps,
            "span_s": (last - first) if groups else 0.0,
        }

    def close(self) -> None:
        self.db.close()
