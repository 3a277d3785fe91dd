"""Is torch.compile worth it for the trainer's forward + backward? (a lever kept only if measured faster)

The trainer step of `arith_hard_cpu` at one torch thread (what a trainer gets beside one searcher on 2 cores):
response_logprobs + backward on 64 sequences (prompt 10 tokens, responses 5-12 tokens, a fixed seed), eager vs
torch.compile(model, dynamic=True). Prints the median step of each and the compile warm-up.

    python -m bench.archive.compile_probe [SFT_DIR]     # default: arith_hard_cpu's seed-0 warm start (cached)
"""

import random
import statistics
import sys
import time

import torch

from tba.config import load_config
from tba.models import load_model
from tba.models.generation import response_logprobs
from tba.run.build import build_task, warm_start

torch.set_num_threads(1)
if len(sys.argv) > 1:
    src = sys.argv[1]
else:
    cfg = load_config("arith_hard_cpu", [])
    src = str(warm_start(cfg, build_task(cfg)))
model = load_model(src, "float32")
model.eval()
rng = random.Random(0)


def batch():
    prompts = [[1] + [rng.randint(3, 15) for _ in range(9)] for _ in range(64)]
    return prompts, [[rng.randint(3, 15) for _ in range(rng.randint(5, 12))] for _ in range(64)]


def step(m):
    logp, _ = response_logprobs(m, *batch(), 0.7, 0)
    logp.sum().backward()
    for q in model.parameters():
        q.grad = None


def median_step(m, n=30):
    times = []
    for _ in range(n):
        t = time.perf_counter()
        step(m)
        times.append(time.perf_counter() - t)
    return statistics.median(times[3:])


print(f"eager    {median_step(model):.4f} s per step")
t = time.perf_counter()
compiled = torch.compile(model, dynamic=True)
step(compiled)
step(compiled)
print(f"compile warm-up {time.perf_counter() - t:.1f} s")
print(f"compiled {median_step(compiled):.4f} s per step")
