"""Quantized searchers (`search.quantize`): generation speed, the reward of what they sample, the cost of
re-quantizing each published version, and how far their log-probs are from the full-precision policy's.

    python -m bench.perf.quantized_sampler                  # SmolLM2-135M and arith_hard_cpu's 1M model, 3 repeats
    python -m bench.perf.quantized_sampler --models smollm2 --repeats 5
    python -m bench.perf.quantized_sampler --smoke          # a tiny model, seconds (CI); the numbers mean nothing

Each model at its recipe's searcher shapes, on its recipe's task: SmolLM2-135M-Instruct on `smollm2_rg_cpu`
(reasoning-gym two-digit sums, chat template, 48 new tokens), and `arith_hard_cpu`'s builtin 1M-parameter model
from its cached SFT warm start (seed 0; trained on first use, ≈ 10 min). Variants (one sampler each over the same
full-precision model, interleaved repeat by repeat with the same seed and prompts, so that a busy machine slows
them alike; ratios are within one run):

  none                    full precision (float32): what the trainer trains
  int8                    search.quantize=int8: on a CPU torch's dynamic int8 (fbgemm), per-channel weights, the
                          MLP down projections kept in float32 (tba.rollout.quantize explains why)
  int8, every layer       the same kernels on every linear layer with torch's default (per-tensor) weights: shown
                          for int8's choice of layers
  int8_weight             search.quantize=int8_weight: torchao's weight-only int8
  torchao int8 dynamic    torchao's Int8DynamicActivationInt8WeightConfig applied directly (int8 with torchao on a
                          CPU, per-token activations; shown for the choice of kernels, not a setting)

tokens/s = response tokens returned (up to and including EOS) / wall seconds of one generate call (--prompts
prompts × --samples samples at the recipe's T; each repeat takes the next prompts). reward = the task's mean
reward of those samples: what a searcher contributes to learning. Load s = `sampler.load_weights` of the tensors
a sync publishes (re-quantizing included; `searcher/quantize_s` in a run adds up the quantizing part).
|Δ log π| = mean over sampled tokens of |the sampler's log-prob − the full-precision policy's of the same token|:
the behaviour/trainer mismatch a ratio objective sees (TB reads neither). Writes --results (default
bench/results/quantized_sampler/quantized_sampler.md).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bench.lib.header import header
from bench.lib.paths import RESULTS
from bench.lib.smoke import SMOKE_OVERRIDES
from tba.models import synced_tensors
from tba.models.logprobs import response_logprobs
from tba.rollout.quantize import _quiet_import, _torchao
from tba.rollout.samplers.hf import HFSampler
from tba.tasks.base import batch_rewards

RECIPES = {"smollm2": "smollm2_rg_cpu", "arith_hard": "arith_hard_cpu"}
VARIANTS = ("none", "int8", "int8, every layer", "int8_weight", "torchao int8 dynamic")


class CopySampler(HFSampler):
    """Generates with `quantize(copy of the model)`, made afresh at each load (the variants tba does not ship)."""

    def __init__(self, model, tokenizer, quantize):
        super().__init__(model, tokenizer)
        self._make = quantize
        self.q = quantize(model)

    @property
    def sampling(self):
        return self.q

    def load_weights(self, weights, version):
        super().load_weights(weights, version)
        self.q = self._make(self.model)


def every_layer_per_tensor(model):
    q = copy.deepcopy(model).requires_grad_(False)
    if getattr(q.config, "tie_word_embeddings", False):
        head = q.get_output_embeddings()
        head.weight = torch.nn.Parameter(head.weight.detach().clone(), requires_grad=False)
    with _quiet_import():
        return torch.ao.quantization.quantize_dynamic(q, {torch.nn.Linear}, dtype=torch.qint8)


def torchao_dynamic(model):
    ao, q = _torchao(), copy.deepcopy(model).requires_grad_(False)
    with _quiet_import():
        ao.quantize_(q, ao.Int8DynamicActivationInt8WeightConfig())
    return q


def load(name: str, smoke_dir: Path | None) -> dict:
    """The model (float32, from its recipe), its tokenizer, its task's prompts, the recipe's sampling settings and
    its whole config;
    `smoke_dir`: the default recipe shrunk to seconds, its SFT cache there."""
    from tba.config import load_config
    from tba.run.build import build_models, build_task, warm_start

    recipe = None if smoke_dir else RECIPES[name]
    cfg = load_config(recipe, [*SMOKE_OVERRIDES, f"sft.cache_dir={smoke_dir}"] if smoke_dir else [])
    task = build_task(cfg)
    if cfg.model.policy == "builtin" and cfg.sft.enabled:
        warm_start(cfg, task)
    tokenizer, model, _, _ = build_models(cfg, task)
    task = build_task(cfg, tokenizer)  # in the chat template where the recipe uses one
    return {"model": model.float().eval(), "tokenizer": tokenizer, "task": task, "prompts": task.train,
            "ids": [tokenizer(p.text)["input_ids"] for p in task.train],  # as the searcher does
            "temperature": cfg.search.temperature, "new_tokens": cfg.search.max_new_tokens,
            "source": f"{cfg.model.policy} ({recipe or 'default recipe, smoke'})", "cfg": cfg}


def samplers_for(model, tokenizer, variants) -> dict:
    made = {"none": lambda: HFSampler(model, tokenizer),
            "int8": lambda: HFSampler(copy.deepcopy(model), tokenizer, "int8"),
            "int8, every layer": lambda: CopySampler(copy.deepcopy(model), tokenizer, every_layer_per_tensor),
            "int8_weight": lambda: HFSampler(copy.deepcopy(model), tokenizer, "int8_weight"),
            "torchao int8 dynamic": lambda: CopySampler(copy.deepcopy(model), tokenizer, torchao_dynamic)}
    return {v: made[v]() for v in variants}


@torch.no_grad()
def mismatch(reference, prompts, results, temperature, pad_id) -> float:
    """Mean |log π_sampler − log π_fp| over the sampled tokens."""
    expanded = [p for p in prompts for _ in range(len(results) // len(prompts))]
    logp, mask = response_logprobs(reference, expanded, [r for r, _ in results], temperature, pad_id)
    own = torch.zeros_like(logp)
    for i, (_, lp) in enumerate(results):
        own[i, :len(lp)] = torch.tensor(lp)
    return float(((own - logp).abs() * mask).sum() / mask.sum())


def rewards(m: dict, prompts, results) -> list[float]:
    tok = m["tokenizer"]
    per = len(results) // len(prompts)
    texts = [tok.decode(r, skip_special_tokens=True) for r, _ in results]
    finished = [bool(r) and r[-1] == tok.eos_token_id for r, _ in results]
    values, _ = batch_rewards(m["task"], [p for p in prompts for _ in range(per)], texts, finished)
    return [v for v in values if v is not None]


def bench_model(name: str, args, smoke_dir) -> list[dict]:
    print(f"{name}:", flush=True)
    m = load(name, smoke_dir)
    model, tokenizer = m["model"], m["tokenizer"]
    variants = [v for v in args.variants if not (args.smoke and v == "torchao int8 dynamic")]
    samplers = samplers_for(model, tokenizer, variants)
    torch.set_num_threads(args.threads)
    kw = dict(num_samples=args.samples, temperature=m["temperature"], top_p=1.0, max_new_tokens=m["new_tokens"])
    for s in samplers.values():  # warm-up
        s.generate(m["ids"][:1], **{**kw, "max_new_tokens": 4})
    runs = {v: [] for v in samplers}
    for rep in range(args.repeats):
        at = slice(rep * args.prompts, (rep + 1) * args.prompts)
        prompts, ids = m["prompts"][at], m["ids"][at]
        for v, s in samplers.items():
            torch.manual_seed(rep)
            t0 = time.perf_counter()
            results = s.generate(ids, **kw)
            wall = time.perf_counter() - t0
            runs[v].append({"tokens_per_s": sum(len(r) for r, _ in results) / wall,
                            "rewards": rewards(m, prompts, results),
                            "dlogp": mismatch(model, ids, results, m["temperature"], tokenizer.pad_token_id)})
    weights = {k: v.clone() for k, v in synced_tensors(model).items()}  # as a sync delivers them: a copy
    loads = {v: [] for v in samplers}
    for _ in range(args.repeats):
        for v, s in samplers.items():
            t0 = time.perf_counter()
            s.load_weights(weights, 1)
            loads[v].append(time.perf_counter() - t0)
    rows = []
    for v, r in runs.items():
        tps = [x["tokens_per_s"] for x in r]
        rows.append({"model": name, "source": m["source"], "variant": v, "new_tokens": m["new_tokens"],
                     "threads": args.threads, "tokens_per_s": statistics.median(tps), "tokens_per_s_runs": tps,
                     "reward": statistics.mean(x for run in r for x in run["rewards"]),
                     "samples": sum(len(run["rewards"]) for run in r),
                     "abs_dlogp": statistics.median(x["dlogp"] for x in r), "load_s": statistics.median(loads[v]),
                     "load_s_runs": loads[v], "repeats": args.repeats})
    base = rows[0]["tokens_per_s"]
    for row in rows:
        row["vs_none"] = row["tokens_per_s"] / base
        print(json.dumps({k: x for k, x in row.items() if not k.endswith("_runs")}), flush=True)
    return rows


def table(rows: list[dict]) -> str:
    out = ["| model | variant | tokens/s (median) | × none | task reward of the samples (n) | load s per version | "
           "\\|Δ log π\\| per token |", "|---" * 7 + "|"]
    for r in rows:
        out.append(f"| {r['model']} | {r['variant']} | {r['tokens_per_s']:.0f} | {r['vs_none']:.2f} | "
                   f"{r['reward']:.3f} ({r['samples']}) | {r['load_s']:.2f} | {r['abs_dlogp']:.4f} |")
    return "\n".join(out)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--prompts", type=int, default=8, help="prompts per call (each repeat takes the next ones)")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1, help="a searcher's share of this machine's 2 cores")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="a tiny model, seconds (CI); the numbers mean nothing")
    ap.add_argument("--results", type=Path, default=RESULTS / "quantized_sampler" / "quantized_sampler.md")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in (["smoke"] if args.smoke else args.models):
            rows += bench_model(name, args, Path(tmp) / "tiny" if args.smoke else None)
    head = header(__spec__.name, f"{args.prompts} prompts × {args.samples} samples per call at the recipe's T and "
                  f"response length, {args.threads} thread(s), medians of {args.repeats} interleaved repeats",
                  packages=("torch", "transformers", "torchao"), argv=argv)
    text = head + table(rows) + "\n\n```json\n" + json.dumps(rows, indent=1) + "\n```\n"
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(text)
    print(text.split("```json")[0])


if __name__ == "__main__":
    main()
