"""Memory per trainer update at a 152k vocabulary and 1,024-token responses: the plain log-prob path ([N, R, V]
float32 logits, `trainer.logprob_chunk_tokens=0`) against the chunked LM head (tba.models.logprobs), at equal batch.

    python -m bench.perf.update_memory [--samples 4 --response 1024] [--variants plain chunked ...]
    python -m bench.perf.update_memory --smoke      # a small vocabulary, short responses (CI)

The model is Qwen2-shaped (Qwen2.5's 151,936-token vocabulary, tied embeddings, grouped-query attention), scaled
down in depth and width so that its logits, not its layers, are what an update holds. Each variant runs in a fresh
process (`--child`): it reads its resident memory (VmRSS: `before the model`), builds the model from a fixed seed
and the trainer as `tba train` makes it (tba.run.build.trainer_args: TB, AdamW, float32), and takes `--updates`
updates of one prompt group of `--samples` samples of `--prompt` + `--response` tokens (shared prompts, the
default). Measured = peak resident memory (ru_maxrss) less resident memory before the model: parameters, gradients,
AdamW's moments, activations and log-prob tensors. Two updates: the first allocates AdamW's moments after its
backward, the second runs its backward with them. Variants:

    plain          trainer.logprob_chunk_tokens=0: today's path before chunking
    chunked        the default (1,024 positions per chunk; a linear head's own backward, one chunk recomputed)
    checkpointed   the same chunks with the head wrapped in a module (as a PEFT-wrapped head is): each chunk under
                   torch.utils.checkpoint instead
    split          chunked, and trainer.micro_batch_samples=1 (one sample per forward)
    recompute      chunked, and trainer.activation_checkpointing=true

Every variant's weights after its updates are compared with plain's (per tensor, ‖Δ‖ / ‖θ‖). A last child (`exact`)
scores the same batch with gradients both ways — log-probs and every weight's gradient, chunked against plain — and
times one forward + backward of each path, alternating, in that one process (a ratio, not a speed: other sessions
share this machine's cores).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.lib.header import header
from bench.lib.paths import RESULTS

VARIANTS = ("plain", "chunked", "checkpointed", "split", "recompute")
OVERRIDES = {"plain": ["trainer.logprob_chunk_tokens=0"], "chunked": [], "checkpointed": [],
             "split": ["trainer.micro_batch_samples=1"], "recompute": ["trainer.activation_checkpointing=true"]}
SHAPE = ("vocab", "hidden", "layers", "heads", "kv_heads", "intermediate", "samples", "prompt", "response", "chunk",
         "updates", "threads")
"""What a child is told (the parent's arguments, after --smoke)."""
SMOKE = {"vocab": 2000, "hidden": 32, "intermediate": 64, "prompt": 8, "response": 24, "samples": 2, "chunk": 16,
         "updates": 1}


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def _model(args):
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                         num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                         intermediate_size=args.intermediate, max_position_embeddings=args.prompt + args.response + 8,
                         tie_word_embeddings=True)
    return AutoModelForCausalLM.from_config(config).eval()


def _draws(args, version: int = 0):
    import torch

    from tba.algorithm.types import Draw, Sample

    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(3, args.vocab, (args.prompt,), generator=g).tolist()
    samples = [Sample(torch.randint(3, args.vocab, (args.response,), generator=g).tolist(), [-1.0] * args.response,
                      float(j % 2), version, behaviour_logprobs=[-1.0] * args.response) for j in range(args.samples)]
    return [Draw(0, prompt, samples, True)]


def child(args: argparse.Namespace) -> dict:
    """One variant's updates in this process: its trainer's peak memory, and its weights (saved for the parent)."""
    import torch

    from tba.algorithm.trainer import Trainer
    from tba.config import load_config
    from tba.run.build import trainer_args

    torch.set_num_threads(args.threads)
    before = _rss()
    model = _model(args)
    if args.child == "checkpointed":
        model.lm_head = torch.nn.Sequential(model.lm_head)  # still the tied weight; no longer a plain nn.Linear
    cfg = load_config(None, ["trainer.prompts_per_step=1", f"trainer.samples_per_prompt={args.samples}",
                             "trainer.micro_batch_prompts=1", "trainer.lr=1e-5",
                             f"search.max_new_tokens={args.response}", f"trainer.logprob_chunk_tokens={args.chunk}",
                             *OVERRIDES[args.child]])
    trainer = Trainer(model, **trainer_args(cfg, None, 0))
    seconds = []
    for _ in range(args.updates):
        t0 = time.perf_counter()
        metrics = trainer.step(_draws(args, trainer.version))
        seconds.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # the process's peak resident set (kB)
    torch.save({k.replace("lm_head.0.", "lm_head."): v for k, v in model.state_dict().items()}, args.weights)
    return {"variant": args.child, "before": before, "peak": peak, "measured": peak - before,
            "params": sum(p.numel() for p in model.parameters()), "loss": metrics["trainer/loss"],
            "update_s": seconds}


def exact(args: argparse.Namespace) -> dict:
    """Log-probs and gradients of the trainer's shared-prompt forward, chunked against plain, and their times."""
    import torch

    from tba.models.lm_head import token_logprobs
    from tba.models.logprobs import grouped_logprobs

    torch.set_num_threads(args.threads)
    model = _model(args)
    d = _draws(args)[0]
    responses = [s.response for s in d.samples]
    weights = torch.linspace(-1, 1, len(responses))

    def run(chunk):
        model.zero_grad()
        t0 = time.perf_counter()
        logp = grouped_logprobs(model, [d.prompt_tokens], responses, [len(responses)], 0.7, 0, chunk_tokens=chunk)[0]
        (logp.sum(-1) * weights).sum().backward()
        elapsed = time.perf_counter() - t0
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return logp.detach(), grads, elapsed

    def relative(a, b):
        return ((a - b).norm() / b.norm()).item()

    plain, chunked = run(0), run(args.chunk)
    times = {"plain": [plain[2], run(0)[2]], "chunked": [chunked[2], run(args.chunk)[2]]}  # alternating
    head = model.lm_head
    hidden = torch.randn(args.samples * args.response, args.hidden, requires_grad=True)
    targets = torch.randint(0, args.vocab, (hidden.shape[0],))
    for _ in range(2):  # the head alone: its own backward against checkpointed chunks, alternating
        for name, fn in (("head chunked", head.forward), ("head checkpointed", lambda h: head(h))):
            t0 = time.perf_counter()
            token_logprobs(fn, hidden, targets, 0.7, args.chunk).sum().backward()
            times.setdefault(name, []).append(time.perf_counter() - t0)
    return {"variant": "exact", "logp_relative": relative(chunked[0], plain[0]),
            "logp_max_abs": (chunked[0] - plain[0]).abs().max().item(),
            "grad_relative_worst": max(relative(chunked[1][k], g) for k, g in plain[1].items()),
            "times_s": times}


def measure(args: argparse.Namespace, variant: str, weights: Path) -> dict:
    """One variant in a fresh interpreter (nothing allocated before it)."""
    src = str(Path(__file__).resolve().parents[2] / "src")
    shape = [x for k in SHAPE for x in (f"--{k.replace('_', '-')}", str(getattr(args, k)))]
    cmd = [sys.executable, "-m", "bench.perf.update_memory", *shape, "--child", variant, "--weights", str(weights)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, str(Path(src).parent)]), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"variant {variant} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def compare(rows: list[dict], files: dict[str, Path]) -> None:
    """Each row's weights against plain's: ‖Δ‖ / ‖θ_plain‖ of the whole model, and of its worst tensor (named)."""
    import torch

    if "plain" not in files:
        return
    plain = torch.load(files["plain"])
    flat = torch.cat([v.flatten() for v in plain.values()])
    for r in rows:
        if r["variant"] in files:
            ours = torch.load(files[r["variant"]])
            per = {k: ((ours[k] - v).norm() / v.norm().clamp_min(1e-12)).item() for k, v in plain.items()}
            worst = max(per, key=per.get)
            r["weights_vs_plain"] = ((torch.cat([ours[k].flatten() for k in plain]) - flat).norm() / flat.norm()).item()
            r["worst_tensor"], r["worst_tensor_vs_plain"] = worst, per[worst]
            r["worst_tensor_norm"] = plain[worst].norm().item()


def table(rows: list[dict]) -> str:
    gb = 1024**3
    plain = next((r["measured"] for r in rows if r["variant"] == "plain"), None)
    out = ["| variant | before the model (GB) | peak (GB) | trainer's peak (GB) | plain ÷ this | weights vs plain | "
           "worst tensor vs plain |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["variant"] == "exact":
            continue
        ratio = f"{plain / r['measured']:.2f}" if plain else "—"
        out.append(f"| {r['variant']} | {r['before'] / gb:.2f} | {r['peak'] / gb:.2f} | {r['measured'] / gb:.3f} | "
                   f"{ratio} | {r.get('weights_vs_plain', float('nan')):.1e} | "
                   f"{r.get('worst_tensor_vs_plain', float('nan')):.1e} ({r.get('worst_tensor', '—')}) |")
    e = next((r for r in rows if r["variant"] == "exact"), None)
    if e:
        t = {k: min(v) for k, v in e["times_s"].items()}
        out += ["", f"Chunked against plain on the same batch (float32): log-probs ‖Δ‖/‖·‖ = {e['logp_relative']:.1e} "
                f"(largest |Δ| {e['logp_max_abs']:.1e} nats), worst gradient ‖Δ‖/‖·‖ = {e['grad_relative_worst']:.1e}. "
                f"Forward + backward, best of {len(e['times_s']['plain'])} in one process: chunked ÷ plain = "
                f"{t['chunked'] / t['plain']:.2f}; the head alone, checkpointed chunks ÷ the linear head's own "
                f"backward = {t['head checkpointed'] / t['head chunked']:.2f}."]
    return "\n".join(out)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=1024)
    ap.add_argument("--samples", type=int, default=4, help="K: the prompt group's samples (the batch)")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--response", type=int, default=1024)
    ap.add_argument("--chunk", type=int, default=1024, help="trainer.logprob_chunk_tokens of the chunked variants")
    ap.add_argument("--updates", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-exact", action="store_true", help="skip the log-prob and gradient comparison")
    ap.add_argument("--results", type=Path, default=RESULTS / "update_memory" / "update_memory.md")
    ap.add_argument("--smoke", action="store_true", help="a small vocabulary, short responses (CI)")
    ap.add_argument("--child", choices=[*VARIANTS, "exact"], help=argparse.SUPPRESS)
    ap.add_argument("--weights", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.smoke:
        vars(args).update(SMOKE)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(exact(args) if args.child == "exact" else child(args)), flush=True)
        return 0
    rows, files = [], {}
    with tempfile.TemporaryDirectory(prefix="tba-update-memory-") as tmp:
        for variant in args.variants:
            files[variant] = Path(tmp) / f"{variant}.pt"
            rows.append(measure(args, variant, files[variant]))
            print(table(rows).splitlines()[-1], flush=True)
        compare(rows, files)
        if not args.no_exact:
            rows.append(measure(args, "exact", Path(tmp) / "exact.pt"))
    notes = ["each variant runs in a fresh process; trainer's peak = peak resident memory (ru_maxrss) less resident "
             "memory before the model is built; weights vs plain = ‖θ − θ_plain‖ / ‖θ_plain‖ after the updates, over "
             "the whole model and for its worst tensor",
             f"model: Qwen2-shaped, vocabulary {args.vocab}, hidden {args.hidden}, {args.layers} layers, "
             f"{args.heads} heads ({args.kv_heads} KV), tied embeddings, float32; batch: one prompt group of "
             f"{args.samples} samples, {args.prompt}-token prompt, {args.response}-token responses; {args.updates} "
             f"updates; {args.threads} threads"]
    text = header("bench.perf.update_memory", *notes, argv=argv) + table(rows) + "\n\n```json\n" + \
        json.dumps(rows, indent=1) + "\n```\n"
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(text)
    print(table(rows))
    print(f"wrote {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
