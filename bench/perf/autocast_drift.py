"""Does `model.autocast` change what the trainer learns? The same samples, N updates in float32 and under autocast.

    python -m bench.perf.autocast_drift                 # SmolLM2-135M on smollm2_rg_cpu, 20 updates, 2 threads
    python -m bench.perf.autocast_drift --smoke         # a tiny model, seconds (CI); the numbers mean nothing

Why: the trainer runs its forward and backward under autocast and the searchers score π_ref under it, so a run in
bfloat16 differs from one in float32 in two ways at once — rounding in every update, and different samples (the
sampling is rounded too, and from the first differing token on the two runs draw different data). A run shows only
their sum, and on one seed that is indistinguishable from seed noise. This script takes the second away: one float32
searcher makes every batch once, from the start weights, and trainers built from the same weights train on the
same batches — one in float32 with π_ref scored in float32, one under autocast with π_ref scored under autocast (as
in a run of each), and a third like the second but with its output projection (the logits) in float32
(float32_head), to see whether the logits' rounding is what matters. After every update:
cos(Δθ_autocast, Δθ_float32), the cosine of the two weight changes since the start, and their norm ratio. At the end
both trained models and the start model are evaluated greedily on --eval-problems held-out problems, each in float32
and under autocast, so that how a model was trained and how it was evaluated are told apart. The data stay the start
policy's throughout (off-policy for both alike): this measures the trainer's rounding, not a run.
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
import time
from pathlib import Path

import torch

from bench.lib.header import header
from bench.lib.paths import RESULTS
from bench.perf.quantized_sampler import load
from tba.algorithm.trainer import Trainer
from tba.algorithm.types import Draw
from tba.models import precision
from tba.models.logprobs import shared_prompt_logprobs
from tba.rollout.evaluate import greedy_accuracy
from tba.rollout.samplers.hf import HFSampler
from tba.rollout.searcher import Searcher
from tba.run.build import trainer_args

HEAD = "float32 head"
"""The third trainer: under autocast, with its output projection in float32 (float32_head)."""


class _Float32Linear(torch.nn.Linear):
    """A Linear that computes in float32 even under autocast (a class, not a patched method: deep copies keep it)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=x.device.type, enabled=False):
            return super().forward(x.float())


def float32_head(model):
    """`model` with its output projection (the logits) in float32 under autocast: a bfloat16 logit of size ~10–20
    is rounded by 2⁻⁴–2⁻³, and TB sums the log-probs read off them over a response."""
    head = model.get_output_embeddings()
    if type(head) is not torch.nn.Linear:
        raise TypeError(f"float32_head: the output projection is a {type(head).__name__}, not a torch.nn.Linear")
    head.__class__ = _Float32Linear
    return model


def batches(m: dict, cfg, n: int) -> list[list]:
    """n batches of groups from one float32 searcher on the start weights (prompts_per_batch × S each)."""
    searcher = Searcher(HFSampler(copy.deepcopy(m["model"]), m["tokenizer"]), m["model"], m["tokenizer"], m["task"],
                        cfg.search, seed=0)
    torch.manual_seed(0)
    return [searcher.step() for _ in range(n)]


@torch.no_grad()
def draws(m: dict, cfg, groups: list, autocast: str | None, reference) -> list[Draw]:
    """The update's B × K draws, their π_ref log-probs re-scored by `reference` in `autocast`'s precision (as its
    searcher would)."""
    t, pad = cfg.trainer, m["tokenizer"].pad_token_id
    out = []
    for g in groups[:t.prompts_per_step]:
        samples = [copy.copy(s) for s in g.samples[:t.samples_per_prompt]]
        with precision.autocast(m["model"].device, autocast):
            ref = shared_prompt_logprobs(reference, [g.prompt_tokens], [s.response for s in samples], len(samples),
                                         cfg.search.temperature, pad)
        for i, s in enumerate(samples):
            s.ref_logprobs = ref[i, :len(s.response)].tolist()
        out.append(Draw(g.prompt_id, g.prompt_tokens, samples, online=True))
    return out


def flat_change(model, start: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([(p.detach() - s).flatten().double() for p, s in zip(model.parameters(), start, strict=True)])


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(a @ b / (a.norm() * b.norm()))


def bench(name: str, args, smoke_dir) -> dict:
    m = load(name, smoke_dir)
    cfg = m["cfg"]
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    data = batches(m, cfg, args.updates)
    print(f"{args.updates} batches sampled in {time.perf_counter() - t0:.0f} s", flush=True)
    start = [p.detach().clone() for p in m["model"].parameters()]
    trainers, scoring = {}, {}  # label → its trainer; → (precision, π_ref model) its searchers would score with
    for label, precision_, head in ((None, None, False), (args.autocast, args.autocast, False),
                                    (HEAD, args.autocast, True)):
        c = copy.deepcopy(cfg)
        c.model.autocast = precision_
        model, reference = copy.deepcopy(m["model"]), m["model"]
        if head:
            model, reference = float32_head(model), float32_head(copy.deepcopy(reference))
        trainers[label] = Trainer(model, **trainer_args(c, None, m["tokenizer"].pad_token_id))
        scoring[label] = (precision_, reference)
    per_update = []
    for u, groups in enumerate(data, 1):
        losses = {a: tr.step(draws(m, cfg, groups, *scoring[a]))["trainer/loss"] for a, tr in trainers.items()}
        exact, mixed, head = (flat_change(trainers[a].model, start) for a in (None, args.autocast, HEAD))
        row = {"update": u, "cos": cosine(exact, mixed), "norm_ratio": float(mixed.norm() / exact.norm()),
               "loss_float32": losses[None], "loss_autocast": losses[args.autocast], "cos_head": cosine(exact, head),
               "loss_head": losses[HEAD]}
        per_update.append(row)
        print(json.dumps(row), flush=True)
    problems = m["task"].test[:args.eval_problems]
    evals = {}
    for label, model in (("start", m["model"]), ("float32", trainers[None].model),
                         (args.autocast, trainers[args.autocast].model), (HEAD, trainers[HEAD].model)):
        for evaluated in (None, args.autocast):
            with precision.autocast(model.device, evaluated):
                acc = greedy_accuracy(model, m["tokenizer"], m["task"], problems, cfg.eval.max_new_tokens,
                                      cfg.eval.batch_size)
            evals[f"{label}, evaluated in {evaluated or 'float32'}"] = acc
            print(f"greedy accuracy, trained: {label}, evaluated in {evaluated or 'float32'}: {acc:.3f}", flush=True)
    return {"model": name, "source": m["source"], "autocast": args.autocast, "updates": args.updates,
            "update": f"{cfg.trainer.prompts_per_step}×{cfg.trainer.samples_per_prompt}", "lr": cfg.trainer.lr,
            "eval_problems": len(problems), "eval": evals, "per_update": per_update}


def table(r: dict) -> str:
    pick = sorted({1, 2, 5, 10, r["updates"]} & {x["update"] for x in r["per_update"]})
    out = ["| update | cos(Δθ autocast, Δθ float32) | ‖Δθ autocast‖ ÷ ‖Δθ float32‖ | cos(Δθ autocast with a float32 "
           "head, Δθ float32) | loss: float32 / autocast / float32 head |", "|---|---|---|---|---|"]
    for x in r["per_update"]:
        if x["update"] in pick:
            out.append(f"| {x['update']} | {x['cos']:.4f} | {x['norm_ratio']:.3f} | {x['cos_head']:.4f} | "
                       f"{x['loss_float32']:.4g} / {x['loss_autocast']:.4g} / {x['loss_head']:.4g} |")
    out += ["", f"Greedy held-out accuracy on {r['eval_problems']} problems (rows: how the model was trained; "
            "columns: the precision of the evaluation):", "",
            f"| trained | evaluated in float32 | evaluated under {r['autocast']} autocast |", "|---|---|---|"]
    names = {"start": "start (untrained)", r["autocast"]: f"{r['autocast']} autocast",
             HEAD: f"{r['autocast']} autocast, float32 head"}
    for label in ("start", "float32", r["autocast"], HEAD):
        cells = [r["eval"][f"{label}, evaluated in {e}"] for e in ("float32", r["autocast"])]
        out.append(f"| {names.get(label, label)} | {cells[0]:.1%} | {cells[1]:.1%} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--updates", type=int, default=20)
    ap.add_argument("--autocast", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval-problems", type=int, default=500)
    ap.add_argument("--smoke", action="store_true", help="a tiny model, seconds (CI); the numbers mean nothing")
    ap.add_argument("--results", type=Path, default=RESULTS / "update_cost" / "autocast_drift.md")
    args = ap.parse_args(argv)
    if args.smoke:
        args.updates, args.eval_problems = min(args.updates, 3), min(args.eval_problems, 20)
    with tempfile.TemporaryDirectory() as tmp:
        result = bench("smoke" if args.smoke else "smollm2", args, Path(tmp) / "tiny" if args.smoke else None)
    head = header(__spec__.name, f"{result['updates']} updates of B × K = {result['update']} at lr {result['lr']:g} "
                  f"(the recipe's schedule) on the same float32 samples of the start policy; {args.threads} "
                  "thread(s)", argv=argv)
    text = head + table(result) + "\n\n```json\n" + json.dumps(result, indent=1) + "\n```\n"
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(text)
    print(text.split("```json")[0])


if __name__ == "__main__":
    main()
