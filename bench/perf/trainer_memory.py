"""Where the trainer's resident memory goes over a long run: memory in use vs freed memory glibc keeps.

    python -m bench.perf.trainer_memory RUN_DIR [STEPS=1200] [EVERY=100]    # the default recipe, eval every 50 steps

The default recipe runs in this process with a hook after each trainer step: at step 200 (after start-up,
prefill and the first evaluations) and at the last step it calls glibc's `malloc_trim(0)`, which hands back
to the OS the freed memory the allocator was keeping; in between it only reads VmRSS every EVERY steps.
RSS after the final trim minus RSS after the first = memory still in use that the run added (compare it with
the in-memory buffer's growth, printed alongside); RSS before a trim minus after = freed memory glibc held.
Linux + glibc only. Results: bench/results/trainer_memory/trainer_memory.md.
"""

import ctypes
import gc
import sys
from pathlib import Path

from tba.algorithm import loop
from tba.cli import main as tba_main

RUN_DIR = sys.argv[1]
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 1200
EVERY = int(sys.argv[3]) if len(sys.argv) > 3 else 100
libc = ctypes.CDLL("libc.so.6")
trainer_step = loop.Loop.step
first: dict[str, float] = {}


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def step_and_measure(self):
    metrics = trainer_step(self)
    s = self.state.step
    if s >= 200 and s % EVERY == 0:
        gc.collect()
        before = rss_mb()
        first.setdefault("rss", before)
        msg = f"step {s}: RSS {before:.0f} MB ({before - first['rss']:+.0f} since step 200)"
        if s == 200 or s == STEPS:
            libc.malloc_trim(0)
            after = rss_mb()
            first.setdefault("trimmed", after)
            msg += f"; after malloc_trim {after:.0f} MB ({after - first['trimmed']:+.0f} since the trim at step 200)"
        print(f"{msg}; in-memory buffer {len(self.buffer)} samples", flush=True)
    return metrics


if __name__ == "__main__":
    loop.Loop.step = step_and_measure
    tba_main(["train", f"output_dir={RUN_DIR}", f"trainer.steps={STEPS}", "logging.progress=false", "--overwrite"])
