"""The sharded trainer on this machine: update time and peak memory per rank of one process (`plain`, today's
trainer), FSDP2 on one rank (`fsdp1`) and on two (`fsdp2`, gloo on CPU), and the time to gather the weights for
the searchers at several bucket sizes.

    python -m bench.perf.sharded [--hidden 1536 --layers 24] [--variants plain fsdp1 fsdp2] [--steps 4]
    python -m bench.perf.sharded --smoke          # a tiny model, one update (CI)
    python -m bench.perf.sharded --device cuda --variants plain fsdp1 --compute-dtype bfloat16   # one GPU

Each variant runs in a fresh process (`--child`): a Llama-shaped model of random weights is built and saved with a
small tokenizer, the trainer is made exactly as `tba train` makes it (the one process: tba.run.build.build_trainer,
with the π_ref a one-process run keeps; sharded: tba.run.sharded.build_sharded, N ordinary ranks driven by this
process as their controller), and it takes `--steps` updates on a fixed synthetic batch (B = 2 prompt groups ×
K = 2 samples of --prompt + --response tokens; the first update is not timed: allocations, FSDP's lazy init), then
one publication, one checkpoint and one evaluation (greedy, a few arithmetic prompts) — everything a run does, so
the transient copies of each are in the peaks. Memory: each trainer process's peak RSS (VmHWM; for a sharded trainer
each rank's) less its RSS before the model was built — on a CPU everything a process holds is in its RSS; the
controller's own peak beside; on a GPU, torch.cuda.max_memory_allocated per rank.

Two ranks on this machine's 2 cores share the cores one process had: the step time says what sharding costs in
communication here, not what a second device would buy.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.lib.header import header
from bench.lib.paths import RESULTS

VARIANTS = ("plain", "fsdp1", "fsdp2")


def _rss_gb(field: str = "VmRSS") -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def child(args: argparse.Namespace) -> dict:
    """One variant, in this process: build, train, publish, checkpoint, evaluate, measure; returns the row."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from tba.algorithm.types import Draw, Sample
    from tba.config import load_config
    from tba.models import load_model, load_tokenizer
    from tba.models.builtin import train_tokenizer
    from tba.ranks.rank import reset_peaks
    from tba.rollout.evaluate import Evaluator, SpreadEvaluator
    from tba.run import build, checkpoint
    from tba.run.searchers import task_spec
    from tba.run.sharded import RankBuild, build_sharded
    from tba.tasks.prepare import build_task

    torch.set_num_threads(args.threads)
    base = _rss_gb()
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.kv_heads or max(1, args.heads // 4),
                         intermediate_size=args.intermediate or args.hidden * 11 // 4,
                         vocab_size=args.vocab, max_position_embeddings=1024, tie_word_embeddings=True)
    source = Path(tempfile.mkdtemp(prefix="tba-sharded-"))
    world = {"plain": 1, "fsdp1": 1, "fsdp2": 2}[args.child]
    cfg = load_config(None, [f"model.policy={source}", f"model.dtype={args.dtype}", f"model.device={args.device}",
                             f"trainer.world_size={world}", "trainer.prompts_per_step=2",
                             "trainer.samples_per_prompt=2", "trainer.micro_batch_prompts=1", "trainer.lr=1e-5",
                             f"search.max_new_tokens={args.response}", f"threads={args.threads}",
                             f"task.max_prompt_tokens={args.prompt}", "task.name=arith", "task.options.digits=2",
                             "task.train_size=64", "task.test_size=8", "eval.batch_size=8", "eval.max_new_tokens=8",
                             f"trainer.fsdp.publish_bucket_mb={args.buckets[-1]:g}",
                             # the compute dtype over the masters: FSDP's param_dtype, autocast for one process
                             *([f"trainer.fsdp.param_dtype={args.compute_dtype}"] if args.compute_dtype else []),
                             *([f"model.autocast={args.compute_dtype}"] if args.compute_dtype and world == 1
                               and args.child == "plain" else [])])
    task = build_task(task_spec(cfg))
    tokenizer = train_tokenizer(task.corpus(), 128)
    model = AutoModelForCausalLM.from_config(config).to(getattr(torch, args.dtype))
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(source, safe_serialization=True)
    tokenizer.save_pretrained(source)
    tokenizer = load_tokenizer(str(source))
    ckpt = Path(tempfile.mkdtemp(prefix="tba-sharded-ckpt-"))
    if args.child == "plain":
        del model
        model = load_model(str(source), args.dtype).to(args.device)
        reference = copy.deepcopy(model).eval().requires_grad_(False)  # π_ref, as a one-process run keeps it
        trainer = build.build_trainer(cfg, model, reference, tokenizer)
        evaluator = Evaluator(model, tokenizer, task, cfg.eval)
    else:
        del model
        rank_build = RankBuild(cfg, str(source), str(source), str(source), None, tokenizer.pad_token_id)
        trainer = build_sharded(cfg, rank_build, threads=args.threads,
                                publish_dtype=args.compute_dtype or args.dtype, run_dir=ckpt)
        evaluator = SpreadEvaluator(task, cfg.eval, trainer.evaluate, trainer.world)
    g = torch.Generator().manual_seed(0)
    draws = [Draw(p, torch.randint(3, args.vocab, (args.prompt,), generator=g).tolist(),
                  [Sample(torch.randint(3, args.vocab, (args.response,), generator=g).tolist(),
                          [-1.0] * args.response, reward=float(j), version=0) for j in range(2)], online=True)
             for p in range(2)]
    phases = {}

    def phase(name: str) -> None:
        """Each trainer process's peak since the last phase, then the peaks start again (VmHWM reset)."""
        if args.child == "plain":
            here = {"rss_peak_gb": _rss_gb("VmHWM"), "rss_start_gb": base}
            reset_peaks(torch.device(args.device))
            phases[name] = [here]
        else:
            phases[name] = trainer.memory(reset=True)

    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    phase("build")
    times = []
    for _ in range(args.steps):
        t = time.perf_counter()
        trainer.step(draws)
        times.append(time.perf_counter() - t)
    phase("update")
    publish = {}
    if args.child != "plain":
        for mb in args.buckets:
            spent = []
            for _ in range(3):
                t = time.perf_counter()
                for bucket in trainer.group.stream("publish", [{"bucket_mb": mb}] * trainer.world, 600):
                    del bucket
                spent.append(time.perf_counter() - t)
            publish[f"{mb:g}"] = statistics.median(spent)
    trainer.weights()
    phase("publication")
    t = time.perf_counter()
    checkpoint.Checkpointer(ckpt, tokenizer, keep=1).save(args.steps, trainer=trainer, state={})
    save_s = time.perf_counter() - t
    phase("checkpoint")
    t = time.perf_counter()
    score = evaluator()["score"]
    eval_s = time.perf_counter() - t
    controller = (_rss_gb("VmHWM"), base)  # the plain variant's peaks were reset: its trainer's are in `phases`
    phase("evaluation")
    own = {name: [r["rss_peak_gb"] - r["rss_start_gb"] for r in ranks] for name, ranks in phases.items()}
    ranks = [max((phases[name][r] for name in phases), key=lambda m: m["rss_peak_gb"])
             for r in range(len(phases["build"]))]
    gpu = ([max(phases[name][r].get("gpu_peak_gb") or 0.0 for name in phases) for r in range(len(ranks))]
           if args.device.startswith("cuda") else None)
    if args.child == "plain" and args.device.startswith("cuda"):
        gpu = [torch.cuda.max_memory_allocated() / 2**30]
    peak = args.peak_tflops
    if peak is None and args.device.startswith("cuda") and any(n in torch.cuda.get_device_name() for n in
                                                                ("H100", "H200")):
        peak = 989.0  # dense bf16 tensor-core peak of the H100/H200 SXM
    tokens = 2 * 2 * (args.prompt + args.response)
    tokens_s = tokens / statistics.median(times[1:] or times)
    mfu = 6 * params * tokens_s / (peak * 1e12) if peak else None  # 6·N FLOPs per trained token (no attention term)
    estimate = plan_estimate(cfg, world)
    trainer.close()
    return {"variant": args.child, "params_m": params / 1e6, "world_size": world, "steps_s": times,
            "step_s": statistics.median(times[1:] or times), "tokens_per_s": tokens_s,
            "peak_rss_gb": [r["rss_peak_gb"] for r in ranks],
            "own_gb": [r["rss_peak_gb"] - r["rss_start_gb"] for r in ranks],
            "phases_own_gb": own, "plan_phases_gb": plan_phases(cfg, world),
            "controller_own_gb": None if args.child == "plain" else controller[0] - controller[1],
            "gpu_peak_gb": gpu, "publish_s": publish, "checkpoint_s": save_s, "eval_s": eval_s, "eval_score": score,
            "plan_gb": estimate, "mfu": mfu}


def plan_estimate(cfg, world: int) -> list[float]:
    """`tba plan`'s estimate of each rank's memory in GB at its peak, less its per-process term (what the baseline
    measures): the one trainer, or trainer rank r (every rank alike: none holds a whole copy outside an evaluation)."""
    from tba.run.plan import make_plan

    plan = make_plan(cfg, capacity=lambda device: None)
    names = ["trainer"] if world == 1 else [f"trainer rank {r}" for r in range(world)]
    occupants = {o.name: o for d in plan.devices for o in d.occupants}
    return [(occupants[n].bytes - sum(t.bytes for t in occupants[n].terms if t.name.startswith("process"))) / 2**30
            for n in names]


def plan_phases(cfg, world: int) -> dict[str, float]:
    """`tba plan`'s estimate of rank 0's memory in GB during each phase (what it always holds, that phase's terms;
    the per-process term left out, as in plan_estimate)."""
    from tba.run.plan import make_plan
    from tba.run.plan.ledger import PHASES

    plan = make_plan(cfg, capacity=lambda device: None)
    name = "trainer" if world == 1 else "trainer rank 0"
    terms = next(o for d in plan.devices for o in d.occupants if o.name == name).terms
    always = sum(t.bytes for t in terms if t.phase is None and not t.name.startswith("process"))
    return {p: (always + sum(t.bytes for t in terms if t.phase == p)) / 2**30 for p in PHASES}


def table(rows: list[dict], buckets: list[float]) -> str:
    out = ["| variant | ranks | params (M) | update (s), median | tokens/s | peak RSS per rank (GB) | "
           "trainer's own per rank (GB) | `tba plan` per rank (GB) | plan / own | controller's own (GB) | "
           "checkpoint (s) | evaluation (s) | update (s), each |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def each(xs, fmt=".2f"):
        return " / ".join(f"{x:{fmt}}" for x in xs) if xs else "—"

    for r in rows:
        ratio = [p / o for p, o in zip(r["plan_gb"], r["own_gb"], strict=True)] if r.get("plan_gb") else None
        controller = "—" if r["controller_own_gb"] is None else f"{r['controller_own_gb']:.2f}"
        out.append(f"| {r['variant']} | {r['world_size']} | {r['params_m']:.1f} | {r['step_s']:.2f} | "
                   f"{r['tokens_per_s']:.0f} | {each(r['peak_rss_gb'])} | {each(r['own_gb'])} | "
                   f"{each(r.get('plan_gb'))} | {each(ratio)} | {controller} | {r['checkpoint_s']:.1f} | "
                   f"{r['eval_s']:.1f} | {each(r['steps_s'])} |")
    names = ("build", "update", "publication", "checkpoint", "evaluation")
    out += ["", "Each phase's own peak per rank (GB; the peaks reset between phases), `tba plan`'s for that phase "
                "in brackets:", "", "| variant | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for r in rows:
        plan = r["plan_phases_gb"]
        out.append(f"| {r['variant']} | " + " | ".join(
            each(r["phases_own_gb"][n]) + (f" [{plan[n]:.2f}]" if n in plan else "") for n in names) + " |")
    if any(r["gpu_peak_gb"] is not None for r in rows):
        out += ["", "| variant | torch.cuda.max_memory_allocated per rank (GB) | MFU (6·N·tokens/s ÷ peak) |",
                "|---|---|---|"]
        out += [f"| {r['variant']} | {each(r['gpu_peak_gb'])} | "
                f"{'—' if r.get('mfu') is None else format(r['mfu'], '.1%')} |" for r in rows]
    sharded = [r for r in rows if r["publish_s"]]
    if sharded:
        out += ["", "Gathering the weights for the searchers (every unit unsharded, each bucket streamed by rank 0 to "
                    "the controller's host copy), median of 3, seconds:", "",
                "| variant | " + " | ".join(f"bucket {b:g} MB" for b in buckets) + " |",
                "|---|" + "---|" * len(buckets)]
        out += [f"| {r['variant']} | " + " | ".join(f"{r['publish_s'][f'{b:g}']:.3f}" for b in buckets) + " |"
                for r in sharded]
    return "\n".join(out)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    ap.add_argument("--hidden", type=int, default=1536)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=None, help="default: heads / 4")
    ap.add_argument("--intermediate", type=int, default=None, help="default: 11/4 of hidden")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--peak-tflops", type=float, default=None,
                    help="the device's dense peak for MFU (default on an H100/H200: 989 bf16 TFLOP/s)")
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--response", type=int, default=48)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--buckets", type=float, nargs="+", default=[1, 16, 64, 256])
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="the master weights'")
    ap.add_argument("--compute-dtype", default=None, choices=("float32", "bfloat16"),
                    help="forward and backward over the masters (sharded: trainer.fsdp.param_dtype; one process: "
                         "model.autocast); default: the masters' dtype")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    ap.add_argument("--results", type=Path, default=RESULTS / "sharded" / "sharded.md")
    ap.add_argument("--smoke", action="store_true", help="a tiny model, one update (CI)")
    ap.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    ap.add_argument("--json", type=Path, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        tmp = Path(tempfile.mkdtemp(prefix="tba-sharded-"))
        os.environ["TMPDIR"] = str(tmp)  # the child's model and checkpoint (GBs each) leave with it
        tempfile.tempdir = None
        try:
            row = child(args)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        args.json.write_text(json.dumps(row))
        return 0
    argv = sys.argv[1:] if argv is None else argv
    if args.smoke:
        args.hidden, args.layers, args.heads, args.vocab, args.steps, args.buckets = 32, 2, 2, 64, 1, [1.0]
    rows = []
    for variant in args.variants:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "row.json"
            cmd = [sys.executable, "-m", "bench.perf.sharded", "--child", variant, "--json", str(out),
                   "--hidden", str(args.hidden), "--layers", str(args.layers), "--heads", str(args.heads),
                   "--vocab", str(args.vocab), *(["--kv-heads", str(args.kv_heads)] if args.kv_heads else []),
                   *(["--intermediate", str(args.intermediate)] if args.intermediate else []),
                   "--prompt", str(args.prompt), "--response", str(args.response),
                   "--steps", str(args.steps), "--dtype", args.dtype, "--device", args.device, "--threads",
                   str(args.threads), "--buckets", *map(str, args.buckets),
                   *(["--compute-dtype", args.compute_dtype] if args.compute_dtype else [])]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
            if proc.returncode != 0:
                raise SystemExit(f"variant {variant} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
            rows.append(json.loads(out.read_text()))
            print(f"{variant}: update {rows[-1]['step_s']:.2f} s, peak RSS {rows[-1]['peak_rss_gb']}", flush=True)
    text = header("bench.perf.sharded", "update: one TB update of B = 2 groups × K = 2 samples "
                  f"({args.prompt} + {args.response} tokens each), the first of --steps not counted in the median; "
                  "then a publication, a checkpoint and an evaluation; peak RSS: each trainer process's VmHWM "
                  "(each rank's); trainer's own: that less the process's RSS before the model was built; "
                  "controller's own: the run's process, likewise (sharded only: it holds the host copy); "
                  "`tba plan`: its terms for the rank less its per-process term",
                  argv=argv) + table(rows, args.buckets)
    text += "\n\n```json\n" + json.dumps(rows, indent=1) + "\n```\n"
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(text)
    print(table(rows, args.buckets))
    return 0


if __name__ == "__main__":
    sys.exit(main())
