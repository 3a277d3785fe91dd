"""GPU smoke: a Rho-1B-shaped policy trained for a few async TBA steps on one GPU, per sampler backend.

The paper's GSM8K policy is Rho-1B (a TinyLlama-1.1B-shaped Llama). Here: the TinyLlama-1.1B config
(hidden 2048, 22 layers, 32 heads, 4 KV heads, MLP 5632, vocab 32000) with random weights in bf16, the
trainer and one searcher process sharing the one GPU (weights published over CUDA IPC: the
`shared` transport with a buffer on the trainer's device), the `local` runtime in async mode, a few
steps of the real loop on a toy counting task. Random weights earn no reward, so nothing here is
about learning: it measures what a user's first GPU run exercises — model load, generation tokens/s,
trainer step time, weight publication and pick-up — for each backend that imports (`hf`; `vllm` where
vLLM's CUDA build is installed).

`--workload gsm8k` keeps the model and swaps the toy batch shapes for the GSM8K recipe's
(gsm8k-rho1b.yaml): 7 prompts × 20 samples per update in micro-batches of one prompt, searcher batches of
3 prompts × 24 samples at T = 0.7 with up to 512 new tokens, sync every 2 updates, β 0.012, lr 1e-5. Random
weights rarely emit EOS, so responses run to the full 512 tokens: the recipe's worst case. Its prefill is
2 searcher batches (144 samples) instead of the recipe's 500, to keep the check short.

Memory: `max_memory_gb` is the trainer process's peak allocated by PyTorch; `gpu_used_peak_gb` is the
device-wide used memory (all processes, CUDA contexts included) sampled every 0.2 s while the run trains.

    python -m bench.perf.gpu_smoke                  # on a CUDA machine; writes bench/results/gpu_smoke/gpu_smoke.md
    python -m bench.perf.gpu_smoke --workload gsm8k --steps 20 --results bench/results/gpu_smoke/gpu_smoke_gsm8k.md
    python -m bench.perf.gpu_smoke --smoke --device cpu  # the same code path with a tiny model (CI)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from bench.lib.header import header
from bench.lib.paths import RESULTS
from tba.config import load_config
from tba.models import save_checkpoint
from tba.models.builtin import train_tokenizer
from tba.run.train import train
from tba.tasks.base import Prompt

TINYLLAMA = dict(hidden_size=2048, num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4,
                 intermediate_size=5632, vocab_size=32000, max_position_embeddings=2048)
# Batch shapes per workload (dotted config overrides); `toy` is small enough for a tiny model on a CPU.
WORKLOADS = {
    "toy": ["trainer.prompts_per_step=4", "trainer.samples_per_prompt=4", "trainer.micro_batch_prompts=2",
            "trainer.sync_every_steps=1", "trainer.lr=1e-5", "search.prompts_per_batch=8",
            "search.generations_per_prompt=8", "search.temperature=1.0", "buffer.prefill_samples=64"],
    "gsm8k": ["trainer.prompts_per_step=7", "trainer.samples_per_prompt=20", "trainer.micro_batch_prompts=1",
              "trainer.sync_every_steps=2", "trainer.lr=1e-5", "trainer.max_grad_norm=null",
              "search.prompts_per_batch=3", "search.generations_per_prompt=24", "search.temperature=0.7",
              "buffer.prefill_samples=144", "buffer.capacity_per_prompt=100", "tb.beta_init=0.012",
              "tb.beta_final=0.012"],
}
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
            intermediate_size=128, vocab_size=512, max_position_embeddings=512)


class CountTask:
    """'Count from a:' → ' a+1 a+2 …'; reward = share of the next five numbers written in order."""

    name = "count"

    def __init__(self, train_size: int = 512, test_size: int = 16):
        self.train = [Prompt(i, f"Count from {i}:", " ".join(str(i + j) for j in range(1, 6)))
                      for i in range(train_size)]
        self.test = [Prompt(i, f"Count from {1000 + i}:", " ".join(str(1000 + i + j) for j in range(1, 6)))
                     for i in range(test_size)]

    def reward(self, prompt: Prompt, completion: str) -> float:
        want, got = prompt.answer.split(), completion.split()
        return sum(a == b for a, b in zip(want, got, strict=False)) / len(want)

    def demonstrations(self, prompts: list[Prompt], seed: int) -> list[str]:
        return [" " + p.answer for p in prompts]

    def corpus(self) -> list[str]:
        return [p.text + " " + p.answer for p in self.train + self.test]


def make_task(**options) -> CountTask:
    return CountTask(**options)


def build_policy(out: Path, shape: dict, dtype: torch.dtype) -> Path:
    """A random-weight Llama of `shape` with a locally trained tokenizer, saved for the searcher to load."""
    path = out / "policy"
    if (path / "config.json").is_file():
        return path
    tokenizer = train_tokenizer(CountTask().corpus(), 256)
    config = LlamaConfig(**shape, tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    save_checkpoint(model, tokenizer, path)
    return path


class MemoryPeak:
    """Device-wide used memory (every process on the GPU, contexts included), polled in a thread."""

    def __init__(self, device: str, every_s: float = 0.2):
        self.peak, self.device, self.every_s = 0, torch.device(device), every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True) if self.device.type == "cuda" else None

    def _poll(self):
        while not self._stop.is_set():
            free, total = torch.cuda.mem_get_info(self.device)
            self.peak = max(self.peak, total - free)
            self._stop.wait(self.every_s)

    def __enter__(self):
        if self._thread:
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)

    def gb(self) -> float | None:
        return self.peak / 2**30 if self._thread else None


def run(backend: str, policy: Path, args) -> dict:
    device = args.device
    out = args.out / backend
    cfg = load_config(None, [
        f"output_dir={out}", "runtime=local", "mode=async", f"search.backend={backend}",
        f"model.policy={policy}", f"model.dtype={args.dtype}", f"model.device={device}", f"search.device={device}",
        "sft.enabled=false", f"task.name={Path(__file__).resolve()}:make_task", f"trainer.steps={args.steps}",
        *WORKLOADS[args.workload], f"search.max_new_tokens={args.max_new_tokens}",
        f"eval.every_steps={10 * args.steps}",
        f"eval.max_new_tokens={args.max_new_tokens}", "checkpoint.every_steps=null", "logging.progress=false",
        "logging.tensorboard=false", *args.overrides])
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    with MemoryPeak(device) as memory:
        summary = train(cfg,
                        overwrite=True)
    total = time.perf_counter() - t0
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    last = metrics[-1]
    tokens = last.get("searcher/tokens", float("nan"))
    gen_s = last.get("searcher/generate_s", float("nan"))  # time inside the sampler only
    return {
        "backend": backend, "workload": args.workload,
        "device": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
        "steps": summary["trainer_steps"], "total_s": total, "train_s": summary["train_wall_clock_s"],
        "step_s_median": statistics.median(m["trainer/step_s"] for m in metrics),
        "publish_s_median": statistics.median(m["sync/publish_s"] for m in metrics if "sync/publish_s" in m),
        "searcher_load_s_total": last.get("sync/searcher_load_s", float("nan")),
        "searcher_tokens": tokens, "searcher_tokens_per_s": tokens / gen_s if gen_s else float("nan"),
        "samples_received": summary["samples_received"], "trainer_busy": summary["trainer_busy_fraction"],
        "max_memory_gb": torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None,
        "gpu_used_peak_gb": memory.gb(), "trainer_step_s": [m["trainer/step_s"] for m in metrics],
    }


def table(rows: list[dict]) -> str:
    def gb(x):
        return "—" if x is None else f"{x:.1f}"

    out = ["| backend | device | steps | trainer step s (median) | publish s (median) | searcher load s (total) "
           "| sampler tokens/s | samples | trainer busy | trainer peak GB | GPU used peak GB | wall s |",
           "|---" * 12 + "|"]
    for r in rows:
        out.append(f"| {r['backend']} | {r['device']} | {r['steps']} | {r['step_s_median']:.3f} | "
                   f"{r['publish_s_median']:.3f} | {r['searcher_load_s_total']:.2f} | "
                   f"{r['searcher_tokens_per_s']:.0f} | {r['samples_received']} | {r['trainer_busy']:.0%} | "
                   f"{gb(r['max_memory_gb'])} | {gb(r['gpu_used_peak_gb'])} | {r['total_s']:.0f} |")
    return "\n".join(out)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="a tiny model instead of the 1.1B shape")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="toy", help="batch shapes (see the docstring)")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=None, help="default: 128 (toy), 512 (gsm8k)")
    p.add_argument("--backends", nargs="+", default=["hf", "vllm"])
    p.add_argument("--out", type=Path, default=Path("runs/gpu_smoke"))
    p.add_argument("--results", type=Path, default=RESULTS / "gpu_smoke" / "gpu_smoke.md")
    p.add_argument("overrides", nargs="*", help="extra dotted config overrides")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("no CUDA device here: run on a GPU machine, or pass --smoke --device cpu")
    if args.max_new_tokens is None:
        args.max_new_tokens = 512 if args.workload == "gsm8k" else 128
    if args.smoke:
        args.steps, args.max_new_tokens = min(args.steps, 3), min(args.max_new_tokens, 16)
    policy = build_policy(args.out, TINY if args.smoke else TINYLLAMA, getattr(torch, args.dtype))
    rows, skipped = [], []
    for backend in args.backends:
        if backend == "vllm" and importlib.util.find_spec("vllm") is None:
            skipped.append("vllm (not installed)")
            continue
        rows.append(run(backend, policy, args))
        print(json.dumps(rows[-1]), flush=True)
    text = table(rows)
    print(text)
    head = header(__spec__.name, f"device: {rows[0]['device'] if rows else args.device}; CUDA {torch.version.cuda}; "
                  f"Python {platform.python_version()}", f"skipped: {', '.join(skipped) or 'none'}",
                  title=f"GPU smoke: {'tiny model (smoke)' if args.smoke else 'TinyLlama-1.1B shape, random weights'}, "
                  f"{args.dtype}, {args.workload} batch shapes, trainer + 1 searcher on one device",
                  packages=("torch", "transformers", "vllm"), argv=argv)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(head + text + "\n\n```json\n" + json.dumps(rows, indent=1) + "\n```\n")


if __name__ == "__main__":
    main()
