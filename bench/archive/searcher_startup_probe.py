"""What a searcher process does before its first batch, timed step by step (why tba's async start-up is slower
than TRL's). Run in a fresh process, as `build_searcher` runs in a spawned searcher: imports, model
and tokenizer, the task (built and fitted to the prompt limit), the sampler.

    python -m bench.archive.searcher_startup_probe [RECIPE] [SFT_DIR]   # default: arith_hard_cpu, seed-0 warm start
"""

import sys
import time

t0 = time.perf_counter()
import torch  # noqa: E402

t1 = time.perf_counter()
from tba.models import load_model, load_tokenizer  # noqa: E402  (imports transformers

t2 = time.perf_counter()
from tba.config import load_config  # noqa: E402
from tba.run.build import build_task, sampler_spec, warm_start  # noqa: E402
from tba.runtime.worker import build_sampler  # noqa: E402
from tba.tasks.prepare import fit_prompts, prompt_limit  # noqa: E402

t3 = time.perf_counter()
print(f"import torch {t1 - t0:.2f} s, tba.models (transformers) {t2 - t1:.2f} s, samplers/tasks {t3 - t2:.2f} s")
cfg = load_config(sys.argv[1] if len(sys.argv) > 1 else "arith_hard_cpu", [])
t = time.perf_counter()
task = build_task(cfg)  # as the trainer builds it (a searcher passes its tokenizer: same prompts unless chat_template)
print(f"build_task {time.perf_counter() - t:.2f} s ({len(task.train)} train prompts)")
if len(sys.argv) > 2:
    src = sys.argv[2]
else:  # found (or trained, on a cache miss) the way every run finds it; not timed
    src = str(warm_start(cfg, task))
t = time.perf_counter()
ref, tok = load_model(src, cfg.model.dtype), load_tokenizer(src)
print(f"model + tokenizer {time.perf_counter() - t:.2f} s")
t = time.perf_counter()
budget = max(cfg.search.max_new_tokens, cfg.eval.max_new_tokens)
fit_prompts(task, tok, prompt_limit(cfg.task.max_prompt_tokens, ref, budget), cfg.task.long_prompts)
print(f"fit_prompts {time.perf_counter() - t:.2f} s")
t = time.perf_counter()
build_sampler(sampler_spec(cfg), source=src, tokenizer=tok, device=torch.device("cpu"), seed=0)
print(f"sampler {time.perf_counter() - t:.2f} s")
