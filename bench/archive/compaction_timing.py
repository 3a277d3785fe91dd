"""What buffer compaction costs at a checkpoint: a snapshot and a compaction, timed on a copy of a real
run's buffer.sqlite (the run directory is only read).

    python -m bench.archive.compaction_timing RUN_DIR      # e.g. a soak's run: /tmp/tba-soak-*/run
"""
import shutil
import statistics
import sys
import time
from pathlib import Path

from tba.algorithm.buffer import ReplayBuffer
from tba.config.schema import BufferConfig

src, work = Path(sys.argv[1]), Path("/tmp/compact_timing")
shutil.rmtree(work, ignore_errors=True)
work.mkdir()
for f in src.glob("buffer.sqlite*"):
    shutil.copy(f, work / f.name)
buf = ReplayBuffer(BufferConfig(capacity_per_prompt=100, max_samples=100000))
buf.open(work)
t0 = time.perf_counter()
later = buf.restore(None)
t_restore = time.perf_counter() - t0
print(f"restore (newest snapshot + {later} later groups): {t_restore:.2f} s, {len(buf)} samples, "
      f"{buf.num_prompts} prompts")
snaps, comps = [], []
marks = [buf.store.snapshot().upto]
for _ in range(5):
    t0 = time.perf_counter()
    buf.snapshot()
    snaps.append(time.perf_counter() - t0)
    marks = [marks[-1], buf.groups_added]
    t0 = time.perf_counter()
    buf.compact(marks)
    comps.append(time.perf_counter() - t0)
print(f"snapshot: median {statistics.median(snaps) * 1000:.0f} ms; compaction: median "
      f"{statistics.median(comps) * 1000:.0f} ms (5 repeats)")
