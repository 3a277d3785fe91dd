"""Every knob of a run, one typed dataclass per YAML section, each field documented where it is defined.

`tba.config` reads YAML and dotted overrides into these classes and validates them; this file is only the
schema, so it reads as the reference of what can be set. The paper's symbols are given next to the fields
(S, K, B, m, k, ι, β); docs/algorithm.md maps each one to the code that uses it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TaskConfig:
    name: str = "arith"
    """A registered task (tba.tasks.TASKS: arith, reasoning_gym, enumerable, gsm8k, tldr, redteam), or your own:
    `package.module:factory` or `path/to/file.py:factory`, called as factory(**task.options) (docs/tasks.md)."""
    options: dict | None = None
    """Keyword arguments for the task's factory (reasoning_gym: dataset, options, seed, instruction, extract;
    enumerable: symbols, length, modes, seed, decay, height_step, junk_reward;
    tldr: reward models; redteam: victim, classifier; custom)."""
    source: str | None = None
    """gsm8k: hub name (default openai/gsm8k) or a local jsonl/parquet file or directory."""
    digits: int = 3
    """arith: digits per operand (two operands, addition)."""
    train_size: int | None = 20000
    """Number of train prompts (None = all the source has)."""
    test_size: int | None = 500
    """Number of held-out prompts used for evaluation (None = all)."""
    teacher_slip_prob: float = 0.6
    """arith: probability that the SFT teacher forgets a carry. Imitation then plateaus below the ceiling."""
    prompt_template: str | None = None
    """Prompt text template. arith: fields {a}, {b} (None = compact `{a}+{b}=`); gsm8k: {question}
    (None = the paper's `[MATH TASK] Problem:...`)."""
    chat_template: bool = False
    """Wrap each prompt as a user turn in the tokenizer's chat template (instruction-tuned models)."""
    max_prompt_tokens: int | None = None
    """Longest prompt in tokens. None = the model's context length minus search.max_new_tokens."""
    long_prompts: str = "skip"
    """What happens to a longer prompt: skip (dropped before training, counted) | truncate (keep its end)."""


@dataclass
class TinyModelConfig:
    """The built-in Llama-style model used when `model.policy` is `builtin`."""

    hidden_size: int = 128
    """Width of the residual stream."""
    num_layers: int = 4
    """Transformer blocks."""
    num_heads: int = 4
    """Attention heads (as many key/value heads: no grouped-query attention)."""
    intermediate_size: int = 512
    """Width of each block's SwiGLU MLP."""
    vocab_size: int = 128
    """Upper bound for the locally trained BPE tokenizer."""


@dataclass
class LoraConfig:
    """Train low-rank adapters (PEFT LoRA) instead of every weight; only the adapters are optimised,
    published to searchers and checkpointed. The reference π_ref is the base model (adapters off)."""

    enabled: bool = False
    """Train adapters instead of every weight (needs a hub, directory or GGUF policy)."""
    r: int = 32
    """Adapter rank."""
    alpha: int = 16
    """LoRA α: the adapter's update is scaled by α / r."""
    dropout: float = 0.0
    """PEFT's lora_dropout. No effect in tba's loop: the trainer keeps the policy in eval mode (dropout off,
    so log π_θ and the searchers' log-probs are of the same deterministic model)."""
    target_modules: str = "all-linear"
    """Comma-separated module names (e.g. q_proj,v_proj) or all-linear."""


@dataclass
class ModelConfig:
    policy: str = "builtin"
    """Hub name, local directory (save_pretrained layout), or `builtin` (tiny model built from a config)."""
    reference: str | None = None
    """Reference model π_ref. None = the policy's starting weights (after the SFT warm start)."""
    dtype: str = "float32"
    """float32 | bfloat16 | float16."""
    device: str = "cpu"
    """Where the trainer's policy and reference live: cpu | cuda | cuda:N | auto (cuda if available)."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """PEFT LoRA adapters (the `model.lora.*` section)."""
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    """Shape of the builtin model (used when policy is `builtin`)."""


@dataclass
class SFTConfig:
    enabled: bool = True
    """Run the SFT warm start before RL when the policy is `builtin` (cached; see `cache_dir`)."""
    steps: int = 1500
    """SFT steps of the builtin model's warm start: enough that its held-out accuracy has plateaued (a start
    still mid-curve can leave RL nothing to fix; tba.sft warns when it sees one)."""
    lr: float = 3e-3
    """Peak learning rate of the warm start (AdamW, linear warm-up then cosine decay to 10 %)."""
    batch_size: int = 64
    """Demonstrations per SFT step."""
    warmup_steps: int = 50
    """Linear warm-up steps of the SFT learning rate."""
    cache_dir: str | None = None
    """Where warm-start checkpoints are cached. None = $TBA_CACHE or ~/.cache/tba."""
    log_every_steps: int = 100
    """Held-out greedy accuracy is measured and printed every this many SFT steps (not part of the cache key)."""


@dataclass
class VLLMConfig:
    """search.backend=vllm: the vllm.LLM engine each searcher runs in its own process."""

    kv_cache_gb: float = 1.0
    """CPU only: memory for the KV cache per searcher (vLLM's kv_cache_memory_bytes; an exported
    VLLM_CPU_KVCACHE_SPACE wins)."""
    gpu_memory_utilization: float = 0.3
    """GPU only: share of the device's memory the engine may take (model + KV cache); leave room for the
    trainer and the reference model when they share the GPU."""
    enforce_eager: bool = True
    """No CUDA graphs / torch.compile: start in seconds (CPU start-up compiles otherwise); false on GPUs for
    throughput on long runs."""
    max_model_len: int | None = None
    """Longest prompt + response the engine plans for. None = task.max_prompt_tokens + search.max_new_tokens."""
    fast_cpu_env: bool = True
    """CPU, local runtime: preload tcmalloc and Intel OpenMP in vLLM searchers (tba.samplers.vllm.fast_cpu_env;
    several times the tokens/s). A preload you set wins; other runtimes: export it yourself (README)."""


@dataclass
class SearchConfig:
    backend: str = "hf"
    """The sampling engine (tba.samplers.SAMPLERS: hf, vllm) or your own `file.py:build`. Reference log-probs
    are the HF reference model's with every backend."""
    weight_transport: str = "auto"
    """How published weights reach searchers (tba.runtime.TRANSPORTS). auto = local: shared (CPU shared memory
    or CUDA IPC); ray: object_store on CPU, broadcast (NCCL) when the trainer is on a GPU."""
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    """Engine settings when backend is vllm (the `search.vllm.*` section)."""
    temperature: float = 0.7
    """T: sampling temperature; log-probs everywhere are of logits ÷ T, as in the paper."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p, renormalised;
    log-probs everywhere are of that renormalised distribution. 1.0 = off (full support)."""
    samples_per_prompt: int = 10
    """S: completions generated per prompt (S ≥ K so that dedup still leaves K unique ones)."""
    prompts_per_batch: int = 8
    """Prompts per search iteration (one generate call of prompts × S sequences)."""
    max_new_tokens: int = 32
    """Longest response in tokens; a response that reaches it without EOS is kept, cut there."""
    num_searchers: int = 1
    """N: searcher processes (local) or actors (ray). Each owns a round-robin shard of the train prompts."""
    threads: int | None = None
    """torch threads per searcher. None = an equal share of the cores (inline: all cores)."""
    ready_timeout_s: float = 300.0
    """How long a searcher may take to start (import, load models) before the run fails."""
    collect_timeout_s: float = 600.0
    """Longest wait for samples when the loop must wait (prefill; every step in sync mode)."""
    heartbeat_timeout_s: float = 300.0
    """Cap on how long a searcher that owes a batch may stay silent before it is killed and restarted like a
    crash. The limit in force is min(this, max(heartbeat_floor_s, 20 × its slowest of the last 16 batches))
    (tba.cadence); until its first batch only this cap applies: it must exceed the slowest first batch."""
    heartbeat_floor_s: float = 10.0
    """The learnt heartbeat limit is never shorter than this (scheduling jitter on a busy machine is not a hang)."""
    num_cpus: float = 1.0
    """ray: CPUs each searcher actor declares."""
    num_gpus: float = 0.0
    """ray: GPUs each searcher actor declares."""
    resources: dict | None = None
    """ray: custom resources each searcher actor requires, e.g. {searcher: 1} to pin them to tagged nodes."""
    device: str | None = None
    """Where each searcher's models live (cpu | cuda | cuda:N | auto), or a comma list that searcher i takes
    item i of (cyclically), e.g. cuda:1,cuda:2,cuda:3 beside a trainer on cuda:0. None = model.device. On
    Ray each actor sees the GPUs it declared (search.num_gpus) and `cuda` means its own."""
    max_restarts: int = 3
    """Searcher deaths or exceptions survived per run (each restarts that searcher); one more stops the run."""


@dataclass
class RayConfig:
    address: str | None = None
    """Ray cluster to join (e.g. 127.0.0.1:6379 or auto). None = start a private local Ray on 127.0.0.1."""
    num_cpus: int | None = None
    """CPUs of the private local Ray (None = all cores)."""


@dataclass
class BufferConfig:
    capacity_per_prompt: int = 100
    """Items kept per prompt (newest kept)."""
    prefill_samples: int = 160
    """P: completions generated before the first trainer step."""
    online_prob: float = 0.95
    """m: probability that a prompt slot is drawn from prompts refreshed since the last sync."""
    offline_inverse_temperature: float = 0.0
    """ι: offline draws use softmax(ι · reward) over a prompt's history (0 = uniform)."""
    dedup: bool = True
    """Exact-token dedup per prompt (newest copy wins)."""
    max_samples: int | None = 100000
    """In-memory bound: above it the least recently refreshed prompts leave memory (they stay on disk).
    None = unbounded."""
    persist: bool = True
    """Write every accepted group to RUN_DIR/buffer.sqlite before training on it (needed for --resume)."""
    compact: bool = True
    """At each checkpoint, delete from buffer.sqlite what no kept checkpoint can draw again: the file stays
    about the buffer's size. False = keep every sample ever accepted (≈ 300 MB per hour of the default)."""
    source: str | None = None
    """runtime=offline: the run directory (or buffer.sqlite) whose saved buffer is trained on."""


@dataclass
class TBConfig:
    """VarGrad Trajectory Balance; β anneals linearly (paper §2.4)."""

    beta_init: float = 0.05
    """β at step 0: the reward temperature of the target π* ∝ π_ref·exp(r/β) (smaller = greedier)."""
    beta_final: float = 0.05
    """β reached at beta_decay_end_step (linear from beta_init), kept from then on."""
    beta_decay_end_step: int | None = None
    """Step at which β reaches beta_final (T_target). None = constant beta_init."""
    beta_hard_stop_step: int | None = None
    """From this step on β = beta_final (T_stop; the paper's abrupt TL;DR stop). None = no hard stop."""
    residual_clip: float | None = None
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
    steps: int = 200
    """U: total trainer (optimizer) steps."""
    lr: float = 2e-5
    """Peak learning rate (AdamW). Raising k with TB? Lower it (README, "What this says about TB off-policy")."""
    lr_schedule: str = "constant"
    """constant | linear (to 0 at the last step) | wsd (warmup, stable, cosine decay)."""
    warmup_steps: int = 0
    """Linear warm-up steps from 0 to lr (every schedule)."""
    stable_steps: int | None = None
    """wsd: steps at peak after warmup. None = until the decay phase that ends at `steps`."""
    decay_steps: int = 0
    """wsd: cosine-decay steps."""
    prompts_per_step: int = 8
    """B: prompt groups per optimizer step."""
    samples_per_prompt: int = 8
    """K: completions per prompt group."""
    micro_batch_prompts: int = 8
    """Prompt groups per forward/backward (gradient accumulation groups by prompt, never splits one)."""
    sync_every_steps: int = 1
    """k: the trainer publishes its weights (with a version) to the searchers every k steps. 0 = never: the
    searchers sample from the starting policy (π_ref, unless model.reference says otherwise) for the whole run,
    a fixed behaviour policy."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float | None = None
    """None = no clipping (as the paper)."""
    stale_lr_age: float | None = 4.0
    """a₀: an update whose samples' median age a (policy versions behind the trainer) exceeds a₀ takes its step
    at lr·a₀/a — a delayed feedback loop stays stable only if gain × delay is bounded (TB at the recipes' lr
    fell at k = 32 without it: bench/results/tb_stale_lr_age4.md; it makes such a fall rarer, not impossible:
    tb_stale_lr_age4_unseen91011.md). None = the lr as scheduled, whatever the
    data's age (the paper). Not applied when sync_every_steps = 0 (no feedback loop)."""
    max_replay_ratio: float | None = None
    """Async: draws per sample received (B·K·updates / samples received) may not exceed this; an update that
    would pass it waits for fresh samples first. None = never wait (the paper's loop)."""


@dataclass
class CheckpointConfig:
    every_steps: int | None = 50
    """Full checkpoint (model, optimizer, RNG, buffer and searcher state) every N steps, and at exit.
    None = only at exit."""
    keep: int = 2
    """Checkpoints kept (newest first)."""


@dataclass
class EvalConfig:
    every_steps: int = 50
    """Greedy pass@1 on the held-out prompts every N trainer steps (and at start and end)."""
    max_new_tokens: int = 32
    """Longest evaluated response in tokens."""
    batch_size: int = 250
    """Sequences per generation call (prompts × samples)."""
    samples_per_prompt: int = 0
    """0 = one greedy completion per held-out prompt (pass@1). n > 0 = n completions sampled at
    eval.temperature (tasks whose metric is about the distribution, e.g. red-teaming)."""
    temperature: float = 1.0
    """Sampling temperature when samples_per_prompt > 0 (unused for greedy pass@1)."""
    top_p: float = 1.0
    """Nucleus threshold when samples_per_prompt > 0 (1.0 = off)."""
    reference_metrics: bool = False
    """Also report KL(π_ref ‖ π_θ) per token and the perplexity under π_ref (the TL;DR paper's metrics)."""


@dataclass
class LoggingConfig:
    tensorboard: bool = True
    """Write RUN_DIR/tensorboard/ (every metrics.jsonl key as a scalar)."""
    wandb: bool = False
    """Also log to Weights & Biases (pip install 'tba[wandb]'; offline unless you are logged in)."""
    wandb_project: str = "tba"
    """W&B project name."""
    progress: bool = True
    """Live progress bar (rich) on a terminal; without one, plain progress lines (see plain_every_s)."""
    plain_every_s: float = 30.0
    """Without a terminal (stderr redirected to a file, CI): one plain progress line every this many seconds."""


@dataclass
class RunConfig:
    seed: int = 0
    """Seeds the trainer, the buffer's draws and every searcher (searcher i: seed + 1000·(i + 1))."""
    output_dir: str = "runs/default"
    """The run directory: config, metrics, checkpoints, buffer.sqlite, summary.json."""
    objective: str = "tb"
    """tb (VarGrad Trajectory Balance) | dr_grpo | rloo | online_dpo | tba_prime (baselines, docs/objectives.md)."""
    runtime: str = "local"
    """inline: one process, search and training alternate | local: searcher processes (torch.multiprocessing)
    | ray: searcher actors on a Ray cluster | offline: no searchers, train on a saved buffer (buffer.source)."""
    mode: str = "async"
    """async: searchers and trainer run concurrently, nobody waits | sync: generation and training alternate
    (with k = 1 that is on-policy). The inline runtime is always sync."""
    threads: int | None = None
    """torch threads of the trainer. None = an equal share of the cores (inline: all cores)."""
    task: TaskConfig = field(default_factory=TaskConfig)
    """The `task.*` section."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The `model.*` section."""
    sft: SFTConfig = field(default_factory=SFTConfig)
    """The `sft.*` section (builtin model's warm start)."""
    search: SearchConfig = field(default_factory=SearchConfig)
    """The `search.*` section (searchers: sampling, processes, weight sync, timeouts)."""
    buffer: BufferConfig = field(default_factory=BufferConfig)
    """The `buffer.*` section (replay buffer and its sampling rule)."""
    tb: TBConfig = field(default_factory=TBConfig)
    """The `tb.*` section (β schedule, used by every objective)."""
    baselines: BaselineConfig = field(default_factory=BaselineConfig)
    """The `baselines.*` section (settings of the comparison objectives)."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """The `trainer.*` section."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """The `eval.*` section."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """The `checkpoint.*` section."""
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    """The `logging.*` section."""
    ray: RayConfig = field(default_factory=RayConfig)
    """The `ray.*` section (runtime=ray)."""
