"""TRL's GRPOTrainer on a tba recipe, for bench.perf.vs_trl: the same starting model, prompts, reward, batch (B
prompts × K generations per update), completion length, temperature, top-p and lr as the tba run it is compared
with, TRL's defaults otherwise (the overrides that match tba are listed in vs_trl's docstring), and the same greedy
held-out evaluation every --eval-every steps with the clock paused.

Why a module of its own: it is the one place that knows TRL's API (GRPOConfig names, callbacks, transformers'
scheduler names); the comparison, its clocks and its report live in vs_trl.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from tba.models import precision
from tba.rollout.evaluate import greedy_accuracy


def run_trl(cfg, task, sft_dir: Path, args, seed: int) -> dict:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.trl_threads)
    t_launch = time.perf_counter()  # with --startup TRL's clock starts here: model load and trainer set-up on it
    tokenizer = AutoTokenizer.from_pretrained(sft_dir)
    model = AutoModelForCausalLM.from_pretrained(sft_dir, dtype=torch.float32)
    by_text = {p.text: p for p in task.train}

    def task_reward(prompts, completions, **_):
        return [task.reward(by_text[p], c) for p, c in zip(prompts, completions, strict=True)]

    def evaluate(m) -> float:
        was = m.training
        m.eval()
        with precision.autocast("cpu", cfg.model.autocast):  # as tba's evaluation of a run with model.autocast
            acc = greedy_accuracy(m, tokenizer, task, task.test, cfg.eval.max_new_tokens, cfg.eval.batch_size)
        m.train(was)
        return acc

    class BudgetEval(TrainerCallback):
        """Evaluation every `eval_every` steps with the clock paused; stop before the budget is overrun."""

        def __init__(self):
            self.evals, self.eval_s, self.t0, self.last = [], 0.0, 0.0, 0.0

        def clock(self) -> float:
            return time.perf_counter() - self.t0 - self.eval_s

        def record(self, step, model):
            t, clock = time.perf_counter(), self.clock()
            self.evals.append((step, evaluate(model), clock))
            self.eval_s += time.perf_counter() - t
            print(f"[trl seed {seed}] step {step}: test accuracy {self.evals[-1][1]:.3f} "
                  f"({self.evals[-1][2]:.1f} s)", flush=True)

        def on_train_begin(self, args_, state, control, model=None, **kw):
            self.startup_s = time.perf_counter() - t_launch
            self.t0 = t_launch if args.startup else time.perf_counter()
            self.record(0, model)
            self.last = self.clock()

        def on_step_end(self, args_, state, control, model=None, **kw):
            now = self.clock()
            step_s, self.last = now - self.last, now
            stop = now + step_s > args.budget_s
            if stop or state.global_step % args.eval_every == 0:
                self.record(state.global_step, model)
                self.last = self.clock()
            control.should_training_stop = control.should_training_stop or stop  # keep max_steps' stop

    B, K = cfg.trainer.prompts_per_step, cfg.trainer.samples_per_prompt
    schedule = trl_schedule(cfg.trainer) if args.same_updates else {"lr_scheduler_type": "constant",
                                                                    "warmup_steps": 0}
    gconf = GRPOConfig(
        output_dir=str(args.out / f"trl-seed{seed}"), use_cpu=True, report_to="none", save_strategy="no",
        seed=seed, per_device_train_batch_size=B * K, gradient_accumulation_steps=1, num_generations=K,
        max_completion_length=cfg.search.max_new_tokens, temperature=cfg.search.temperature, top_k=0,
        top_p=cfg.search.top_p, learning_rate=cfg.trainer.lr, **schedule,
        weight_decay=0.0, max_grad_norm=0.0, beta=0.0, bf16=cfg.model.autocast == "bfloat16",
        gradient_checkpointing=False,
        logging_steps=1, max_steps=cfg.trainer.steps if args.same_updates else 10**6, disable_tqdm=True)
    cb = BudgetEval()
    trainer = GRPOTrainer(model=model, reward_funcs=task_reward, args=gconf, processing_class=tokenizer,
                          train_dataset=Dataset.from_list([{"prompt": p.text} for p in task.train]), callbacks=[cb])
    trainer.remove_callback(PrinterCallback)
    p = task.train[0].text
    ids_trl, ids_tba = trainer.processing_class(text=[p])["input_ids"][0], tokenizer(p)["input_ids"]
    print(f"prompt {p!r}: TRL ids {ids_trl} | tba ids {ids_tba} | identical: {ids_trl == ids_tba}", flush=True)
    assert ids_trl == ids_tba, "TRL and tba tokenize the prompt differently"
    trainer.train()
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    tail = rewards[-max(1, len(rewards) // 10):]
    return {"evals": cb.evals, "steps": trainer.state.global_step, "train_s": cb.clock(),
            "reward_end": sum(tail) / len(tail) if tail else float("nan"), "startup_s": cb.startup_s}


def trl_schedule(t) -> dict:
    """tba's learning-rate schedule (tba.algorithm.trainer.lr_factor) in transformers' scheduler names: linear
    warm-up, then constant, linear to 0, or stable and cosine decay to 0 (transformers' warmup_stable_decay)."""
    if t.lr_schedule == "constant":
        return {"lr_scheduler_type": "constant_with_warmup", "warmup_steps": t.warmup_steps}
    if t.lr_schedule == "linear":
        return {"lr_scheduler_type": "linear", "warmup_steps": t.warmup_steps}
    stable = t.stable_steps if t.stable_steps is not None else t.steps - t.warmup_steps - t.decay_steps
    return {"lr_scheduler_type": "warmup_stable_decay", "warmup_steps": t.warmup_steps,
            "lr_scheduler_kwargs": {"num_stable_steps": stable, "num_decay_steps": t.decay_steps}}
