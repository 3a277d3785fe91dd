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
    groups(seq, prompt_id, step, time, source)      step: trainer step at which the group was accepted;
                                                    source: the searcher group or data that produced it
    syncs(after_seq, step)                          a weight publication (new recency window) after group seq
    samples(seq, idx, version, reward, response, ref_logprobs, behaviour_logprobs, policy_mask, versions)
                                                    response int32 bytes, log-probs float32 bytes (lossless:
                                                    they were computed in float32); policy_mask uint8 bytes
                                                    for a multi-turn episode (1 = the policy's token), NULL
                                                    otherwise; versions int32 bytes (each token's policy
                                                    version) when weights changed mid-response, NULL otherwise
    snapshots(upto, sync_rowid, state, items)       the in-memory buffer after group `upto` (one per checkpoint):
                                                    its prompts in order and (seq, idx) references to the items
    meta(key, value)                                `groups`: groups ever accepted (the next seq is groups + 1);
                                                    `format_version`: this schema's version (FORMAT_VERSION)

A store of another format version is refused with one error that says what to do (tba keeps no migrations:
start the run over, or read it with the version that wrote it).

Why snapshots and compaction: kept whole, the log grows by every sample ever generated, without bound, although the
sampler can only ever draw what is in memory. At each checkpoint the buffer writes a snapshot (references, not
copies), and `compact` then deletes every sample that no kept snapshot references and no replay after the oldest
kept snapshot needs — evicted prompts, responses replaced by a newer copy of the same tokens, items past
`capacity_per_prompt`. Resume loads the checkpoint's snapshot and replays the groups after it, so it stays exact;
the store is bounded by the kept snapshots plus the groups accepted since the oldest of them.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tba.algorithm.types import Group, Sample
from tba.errors import UserError

SCHEMA = """
CREATE TABLE IF NOT EXISTS prompts(prompt_id INTEGER PRIMARY KEY, tokens BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS groups(seq INTEGER PRIMARY KEY, prompt_id INTEGER NOT NULL, step INTEGER NOT NULL,
                                  time REAL NOT NULL, source TEXT NOT NULL DEFAULT 'policy');
CREATE TABLE IF NOT EXISTS samples(seq INTEGER NOT NULL, idx INTEGER NOT NULL, version INTEGER NOT NULL,
                                   reward REAL NOT NULL, response BLOB NOT NULL, ref_logprobs BLOB NOT NULL,
                                   behaviour_logprobs BLOB NOT NULL, policy_mask BLOB, versions BLOB,
                                   PRIMARY KEY(seq, idx));
CREATE TABLE IF NOT EXISTS syncs(after_seq INTEGER NOT NULL, step INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS snapshots(upto INTEGER PRIMARY KEY, sync_rowid INTEGER NOT NULL, state TEXT NOT NULL,
                                     items BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""
FILENAME = "buffer.sqlite"
FORMAT_VERSION = 2
"""The schema's version, written into every store; bump it whenever the schema or a blob's encoding changes.
2: samples.versions (per-token policy versions of in-flight weight updates)."""


class StoreError(UserError, RuntimeError):
    """The buffer store cannot be written or read (disk full, unwritable directory, not a tba buffer)."""


def _ints(values) -> bytes:
    return np.asarray(values, dtype="<i4").tobytes()


def _floats(values) -> bytes:
    return np.asarray(values, dtype="<f4").tobytes()


def resolve(path: str | Path) -> Path:
    """A run directory or a buffer file → the buffer file."""
    path = Path(path)
    return path / FILENAME if path.is_dir() else path


@dataclass
class Snapshot:
    """The in-memory buffer right after group `upto` (see ReplayBuffer.snapshot for `state`)."""

    upto: int
    sync_rowid: int
    """Syncs with a larger rowid happened after the snapshot: replay applies only those."""
    state: dict
    refs: list[tuple[int, int]]
    """(seq, idx) of every item, prompt by prompt, in the buffer's order."""


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
            tables = {n for (n,) in self.db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            self.db.execute("SELECT count(*) FROM groups").fetchone()
        except sqlite3.DatabaseError as e:
            raise StoreError(f"cannot open replay buffer {self.path}: {e}") from None
        if missing := {"prompts", "groups", "samples", "syncs", "snapshots", "meta"} - tables:
            raise StoreError(f"{self.path} is not a replay buffer this tba can read: no table "
                             f"{', '.join(sorted(missing))}")
        self._check_format(readonly)
        counted = self.db.execute("SELECT value FROM meta WHERE key = 'groups'").fetchone()
        last = self.db.execute("SELECT coalesce(max(seq), 0) FROM groups").fetchone()[0]
        self.accepted = counted[0] if counted else last  # compaction may have removed the last groups' rows
        self._known_prompts: set[int] = set()

    def _check_format(self, readonly: bool) -> None:
        """A new store gets this tba's FORMAT_VERSION; an existing one must have it."""
        row = self.db.execute("SELECT value FROM meta WHERE key = 'format_version'").fetchone()
        fresh = self.db.execute("SELECT count(*) FROM groups").fetchone()[0] == 0 and self.db.execute(
            "SELECT count(*) FROM meta").fetchone()[0] == 0
        if row is None and fresh and not readonly:
            with self.db:
                self.db.execute("INSERT INTO meta VALUES ('format_version', ?)", (FORMAT_VERSION,))
            return
        found = row[0] if row is not None else 0
        if found != FORMAT_VERSION:
            run = self.path.parent
            raise StoreError(f"{self.path} is a replay buffer of format {found}; this tba reads format "
                             f"{FORMAT_VERSION}. Start the run over (`tba train --overwrite`, or another output_dir), "
                             f"or set it aside (`mv {self.path} {run / f'buffer.format{found}.sqlite'}`) "
                             "and resume without it, or read it with the tba version that wrote it")

    def append(self, groups: list[Group], step: int) -> int:
        """Persist `groups` in one transaction; returns (once they are on disk) the seq of the first one."""
        if not groups:
            return self.accepted + 1
        now, first = time.time(), self.accepted + 1
        try:
            with self.db:  # one transaction: all of these groups or none
                new = {g.prompt_id: g.prompt_tokens for g in groups if g.prompt_id not in self._known_prompts}
                self.db.executemany("INSERT OR IGNORE INTO prompts VALUES (?, ?)",
                                    [(pid, _ints(tokens)) for pid, tokens in new.items()])
                rows, sample_rows = [], []
                for seq, g in enumerate(groups, first):
                    rows.append((seq, g.prompt_id, step, now, g.source))
                    sample_rows += [(seq, i, s.version, s.reward, _ints(s.response), _floats(s.ref_logprobs),
                                     _floats(s.behaviour_logprobs), _mask(s.policy_mask),
                                     _ints(s.versions) if s.versions else None)
                                    for i, s in enumerate(g.samples)]
                self.db.executemany("INSERT INTO groups VALUES (?, ?, ?, ?, ?)", rows)
                self.db.executemany("INSERT INTO samples VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", sample_rows)
                self.db.execute("INSERT OR REPLACE INTO meta VALUES ('groups', ?)", (first + len(groups) - 1,))
        except sqlite3.OperationalError as e:
            raise StoreError(f"could not persist {len(groups)} groups to {self.path}: {e} "
                             "(disk full or directory not writable?); nothing was lost before this point") from None
        self._known_prompts.update(new)
        self.accepted += len(groups)
        return first

    def append_sync(self, after_seq: int, step: int) -> None:
        try:
            with self.db:
                self.db.execute("INSERT INTO syncs VALUES (?, ?)", (after_seq, step))
        except sqlite3.OperationalError as e:
            raise StoreError(f"could not write to {self.path}: {e} (disk full or directory not writable?)") from None

    def sync_points(self, after_rowid: int = 0) -> list[int]:
        return [r[0] for r in self.db.execute("SELECT after_seq FROM syncs WHERE rowid > ? ORDER BY rowid",
                                              (after_rowid,))]

    def num_groups(self) -> int:
        """Groups ever accepted (compaction removes samples, never the count)."""
        return self.accepted

    def first_seq(self) -> int | None:
        """The oldest group still stored (1 unless compaction removed the first ones; None if empty)."""
        return self.db.execute("SELECT min(seq) FROM groups").fetchone()[0]

    def iter_groups(self, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, int, Group]]:
        """(seq, step, group) for start < seq ≤ stop, in acceptance order (after compaction: what is kept)."""
        stop = stop if stop is not None else 2**62
        prompts = self.prompt_tokens()
        rows = self.db.execute(
            "SELECT g.seq, g.prompt_id, g.step, g.source, s.version, s.reward, s.response, s.ref_logprobs, "
            "s.behaviour_logprobs, s.policy_mask, s.versions FROM groups g JOIN samples s ON s.seq = g.seq "
            "WHERE g.seq > ? AND g.seq <= ? ORDER BY g.seq, s.idx", (start, stop))
        current, samples, meta = None, [], None
        for seq, pid, step, source, *sample, mask, versions in rows:
            if seq != current and current is not None:
                yield meta[0], meta[2], Group(meta[1], prompts[meta[1]], samples, meta[3])
                samples = []
            current, meta = seq, (seq, pid, step, source)
            samples.append(_sample(*sample, source, mask, versions))
        if current is not None:
            yield meta[0], meta[2], Group(meta[1], prompts[meta[1]], samples, meta[3])

    def prompt_tokens(self) -> dict[int, list[int]]:
        return {pid: np.frombuffer(t, "<i4").tolist() for pid, t in self.db.execute("SELECT * FROM prompts")}

    # --- snapshots and compaction -------------------------------------------------------------------------

    def save_snapshot(self, upto: int, state: dict, refs: list[tuple[int, int]]) -> None:
        """Record the in-memory buffer after group `upto` (committed before the checkpoint that needs it)."""
        try:
            with self.db:
                rowid = self.db.execute("SELECT coalesce(max(rowid), 0) FROM syncs").fetchone()[0]
                self.db.execute("INSERT OR REPLACE INTO snapshots VALUES (?, ?, ?, ?)",
                                (upto, rowid, json.dumps(state), _ints([x for ref in refs for x in ref])))
        except sqlite3.OperationalError as e:
            raise StoreError(f"could not write a buffer snapshot to {self.path}: {e} "
                             "(disk full or directory not writable?)") from None

    def snapshot(self, upto: int | None = None) -> Snapshot | None:
        """The newest snapshot taken at or before group `upto` (any, if None); None if there is none."""
        row = self.db.execute("SELECT * FROM snapshots WHERE upto <= ? ORDER BY upto DESC LIMIT 1",
                              (2**62 if upto is None else upto,)).fetchone()
        if row is None:
            return None
        flat = np.frombuffer(row[3], "<i4").reshape(-1, 2).tolist()
        return Snapshot(row[0], row[1], json.loads(row[2]), [tuple(r) for r in flat])

    def load_samples(self, refs: Iterable[tuple[int, int]]) -> dict[tuple[int, int], Sample]:
        wanted = set(refs)
        out = {}
        for lo, hi in _spans(sorted({seq for seq, _ in wanted})):
            for seq, idx, *sample in self.db.execute(
                    "SELECT s.seq, s.idx, s.version, s.reward, s.response, s.ref_logprobs, s.behaviour_logprobs, "
                    "g.source, s.policy_mask, s.versions FROM samples s JOIN groups g ON g.seq = s.seq "
                    "WHERE s.seq >= ? AND s.seq <= ?",
                    (lo, hi)):
                if (seq, idx) in wanted:
                    out[seq, idx] = _sample(*sample)
        if len(out) != len(wanted):
            raise StoreError(f"{self.path}: {len(wanted) - len(out)} samples of a snapshot are missing")
        return out

    def compact(self, keep: Iterable[int]) -> int:
        """Keep the snapshots at `keep` (the kept checkpoints' positions) and delete every sample none of them
        references, up to the oldest of them: later groups stay whole for replay. A position without a
        snapshot (a checkpoint taken while buffer.compact was off) needs the whole log: nothing is deleted then.
        Returns the number of samples deleted."""
        keep = sorted(set(keep))
        try:
            with self.db:
                have = {u for (u,) in self.db.execute("SELECT upto FROM snapshots")}
                marks = ",".join(map(str, keep)) or "-1"
                self.db.execute(f"DELETE FROM snapshots WHERE upto NOT IN ({marks})")
                if not keep or any(u not in have for u in keep):
                    return 0
                lo = keep[0]
                kept = [self.snapshot(u) for u in keep]
                self.db.execute("CREATE TEMP TABLE IF NOT EXISTS live(seq INTEGER, idx INTEGER, PRIMARY KEY(seq, idx))")
                self.db.execute("DELETE FROM live")
                self.db.executemany("INSERT OR IGNORE INTO live VALUES (?, ?)",
                                    [r for s in kept for r in s.refs if r[0] <= lo])
                deleted = self.db.execute(
                    "DELETE FROM samples WHERE seq <= ? AND NOT EXISTS "
                    "(SELECT 1 FROM live WHERE live.seq = samples.seq AND live.idx = samples.idx)", (lo,)).rowcount
                self.db.execute("DELETE FROM groups WHERE seq <= ? AND NOT EXISTS "
                                "(SELECT 1 FROM samples WHERE samples.seq = groups.seq)", (lo,))
                self.db.execute("DELETE FROM prompts WHERE prompt_id NOT IN (SELECT prompt_id FROM groups)")
                self.db.execute("DELETE FROM syncs WHERE rowid <= ?", (min(s.sync_rowid for s in kept),))
                self.db.execute("DELETE FROM live")
        except sqlite3.OperationalError as e:
            raise StoreError(f"could not compact {self.path}: {e}") from None
        self._known_prompts = {pid for (pid,) in self.db.execute("SELECT prompt_id FROM prompts")}
        self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the freed pages are reused; the WAL starts empty
        return deleted

    def stats(self) -> dict:
        q = self.db.execute
        groups, first, last, steps = q("SELECT count(*), min(time), max(time), max(step) FROM groups").fetchone()
        samples, reward, vmin, vmax = q(
            "SELECT count(*), avg(reward), min(version), max(version) FROM samples").fetchone()
        unique = q("SELECT count(*) FROM (SELECT DISTINCT g.prompt_id, s.response FROM samples s "
                   "JOIN groups g USING(seq))").fetchone()[0]
        hist = q("SELECT round(reward, 3), count(*) FROM samples GROUP BY 1 ORDER BY 1 LIMIT 20").fetchall()
        snapshots = q("SELECT count(*) FROM snapshots").fetchone()[0]
        sources = {name: {"groups": g, "samples": n, "sample_share": n / max(samples, 1), "reward_mean": r,
                          "version_min": lo, "version_max": hi}
                   for name, g, n, r, lo, hi in q(
                       "SELECT g.source, count(DISTINCT g.seq), count(*), avg(s.reward), min(s.version), "
                       "max(s.version) FROM samples s JOIN groups g ON g.seq = s.seq GROUP BY 1 ORDER BY 1")}
        return {
            "path": str(self.path),
            "bytes_on_disk": sum(p.stat().st_size for p in self.path.parent.glob(self.path.name + "*")),
            "groups": self.accepted, "groups_stored": groups,
            "prompts": q("SELECT count(*) FROM prompts").fetchone()[0], "samples": samples,
            "unique_responses": unique, "snapshots": snapshots,
            "reward_mean": reward, "reward_counts": {str(r): n for r, n in hist},
            "version_min": vmin, "version_max": vmax, "last_step": steps,
            "span_s": (last - first) if groups else 0.0, "sources": sources,
        }

    def close(self) -> None:
        self.db.close()


def _mask(policy_mask: list[int]) -> bytes | None:
    return np.asarray(policy_mask, dtype="u1").tobytes() if policy_mask else None


def _sample(version, reward, response, ref, behaviour, source, mask=None, versions=None) -> Sample:
    return Sample(np.frombuffer(response, "<i4").tolist(), np.frombuffer(ref, "<f4").tolist(), reward, version,
                  np.frombuffer(behaviour, "<f4").tolist(), source,
                  np.frombuffer(mask, "u1").tolist() if mask else [],
                  np.frombuffer(versions, "<i4").tolist() if versions else [])


def _spans(seqs: list[int], gap: int = 64) -> Iterator[tuple[int, int]]:
    """Sorted seqs → a few (lo, hi) ranges covering them, so loading a snapshot is a handful of range scans."""
    if not seqs:
        return
    lo = hi = seqs[0]
    for s in seqs[1:]:
        if s - hi > gap:
            yield lo, hi
            lo = s
        hi = s
    yield lo, hi
