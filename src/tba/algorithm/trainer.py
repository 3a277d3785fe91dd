"""Trainer: one optimizer step of an objective (TB by default) on a batch of buffer draws.

AdamW; the LR is set from the schedule at the start of each update (the paper steps its scheduler once
before each optimizer step). Gradient accumulation groups whole prompts: each micro-batch holds
`micro_batch_prompts` prompt groups, so the per-group log Ẑ is exact and the summed micro-batch losses
equal the full-batch mean; its forwards may split the groups (`micro_batch_samples`, `_accumulate`) and still
give that gradient. `version` counts the updates applied; it is the policy version that the trainer publishes
to searchers.

The objective arrives bound to its settings (a `Loss`, tba.algorithm.objectives) and β as a schedule, so the
trainer knows no objective's configuration. An objective that scores π_ref itself (TBA′) brings its own
reference model (`OwnReference`); every other one uses the searchers' π_ref log-probs stored with each sample.

Dropout is off: the policy is kept in eval mode, gradients flow all the same. TB's residual compares
log π_θ(y|x) with the searchers' log π_ref(y|x); dropout would add noise to one side only (the paper's
code disables dropout in policy and reference for the same reason).
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.nn.functional as F

from tba.algorithm.objectives import Loss
from tba.algorithm.objectives.tb import vargrad_log_z
from tba.algorithm.types import Draw
from tba.config.schema import TrainerConfig
from tba.models import precision, synced_tensors
from tba.models.logprobs import grouped_logprobs, recomputable, response_logprobs
from tba.models.recompute import recompute_layers


class OwnReference(Protocol):
    """π_ref kept by an objective that updates it (TBA′: tba.algorithm.objectives.tba_prime.ResettingReference)."""

    model: torch.nn.Module
    """Saved with every checkpoint (its state changes during the run)."""

    def logprobs(self, prompts: list[list[int]], responses: list[list[int]], temperature: float,
                 pad_id: int) -> torch.Tensor:
        """[N, R] per-token log π_ref of the responses (logits ÷ T), padding 0."""

    def updated(self, policy_state: Callable[[], dict[str, torch.Tensor]], version: int) -> None:
        """Called after every applied update, with the policy's new version and a way to read its whole state
        dict (a sharded trainer's is gathered from its ranks: every rank calls this at the same update)."""


def lr_factor(step: int, cfg: TrainerConfig) -> float:
    """Multiplier of the peak LR for update `step` (1-based)."""
    if cfg.lr_schedule == "constant":
        return min(1.0, step / cfg.warmup_steps) if cfg.warmup_steps else 1.0
    if cfg.lr_schedule == "linear":
        if cfg.warmup_steps and step <= cfg.warmup_steps:
            return step / cfg.warmup_steps
        span = max(cfg.steps - cfg.warmup_steps, 1)
        return max(0.0, 1.0 - (step - cfg.warmup_steps) / span)
    # wsd: linear warmup, constant, then cosine decay 0.5·(1 + cos(π·progress)) over decay_steps
    if cfg.warmup_steps and step <= cfg.warmup_steps:
        return step / cfg.warmup_steps
    stable = cfg.stable_steps if cfg.stable_steps is not None else cfg.steps - cfg.warmup_steps - cfg.decay_steps
    into_decay = step - cfg.warmup_steps - stable
    if into_decay <= 0 or cfg.decay_steps == 0:
        return 1.0
    return 0.5 * (1.0 + math.cos(math.pi * min(into_decay / cfg.decay_steps, 1.0)))


def age_factor(draws: list[Draw], version: int, cfg: TrainerConfig, aging: frozenset[str] | None) -> float:
    """min(1, a₀/a), a = the median age of the update's samples in policy versions (trainer.stale_lr_age).
    The median, not the mean: the few slots drawn from the whole history (1 − m) are hundreds of versions
    old in a long run and would otherwise set the step size of every update. Never-synced searchers
    (sync_every_steps = 0) are exempt: their data do not depend on the trainer's updates, so there is no
    delayed feedback loop to stabilise, only a fixed behaviour policy — and so are the samples of a fixed
    searcher group and of `data` among the others (only the `aging` sources count; None: every source)."""
    a0 = cfg.stale_lr_age
    if a0 is None or cfg.sync_every_steps == 0:
        return 1.0
    ages = sorted(version - s.version for d in draws for s in d.samples if aging is None or s.source in aging)
    median = ages[len(ages) // 2] if ages else 0
    return min(1.0, a0 / median) if median > 0 else 1.0


def _padded(rows: list[list[float]], width: int, device) -> torch.Tensor:
    out = torch.zeros(len(rows), width)  # [N, R]
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r[:width])
    return out.to(device)


def _stacked(parts: list) -> torch.Tensor | None:
    """Row blocks [n_i, R_i] → [Σn_i, max R_i], zero-padded (None stays None: no objective-owned π_ref)."""
    if parts[0] is None:
        return None
    width = max(p.shape[1] for p in parts)
    return torch.cat([F.pad(p, (0, width - p.shape[1])) for p in parts])


def _behaviour(draws: list[Draw], loss: Loss) -> list[list[float]]:
    """Each sample's behaviour log-probs. A sample without them cannot be importance-weighted: treating the
    missing values as 0 would turn the ratio π_θ/μ into π_θ, silently, so it is an error."""
    rows = []
    for d in draws:
        for s in d.samples:
            if not s.behaviour_logprobs or len(s.behaviour_logprobs) != len(s.response):
                have = len(s.behaviour_logprobs or [])
                raise ValueError(f"objective {loss.name} needs the behaviour log-probs of every response token; a "
                                 f"sample of prompt {d.prompt_id} from source {s.source!r} (policy version "
                                 f"{s.version}) has {have} for {len(s.response)} tokens. Completions from elsewhere "
                                 "(data) or a sampler that does not return them can train tb, rloo or online_dpo only")
            rows.append(s.behaviour_logprobs)
    return rows


class Trainer:
    def __init__(self, model, loss: Loss, cfg: TrainerConfig, *, beta: Callable[[int], float], temperature: float,
                 pad_id: int, reference: OwnReference | None = None, aging: frozenset[str] | None = None,
                 autocast: str | None = None):
        """`loss`: the run's objective, bound (tba.algorithm.objectives.Objective.bind); `beta`: β of update u
        (1-based); `reference`: the objective's own π_ref, if it keeps one; `aging`: the sources whose samples age
        (they load the trainer's weights; None = every source), which the age-scaled step looks at; `autocast`:
        model.autocast, the precision of the forward passes (tba.models.precision)."""
        self.model, self.loss, self.cfg, self.beta, self.autocast = model, loss, cfg, beta, autocast
        self.reference, self.aging = reference, aging
        model.eval()  # dropout off (see the module docstring)
        self.temperature, self.pad_id = temperature, pad_id
        trainable = [p for p in model.parameters() if p.requires_grad]  # LoRA: the adapters only
        # fused: one kernel over every tensor (CPU and CUDA) instead of torch's default loop of foreach kernels; a
        # sharded trainer's DTensor shards keep the default implementation
        self.optimizer = torch.optim.AdamW(trainable, lr=cfg.lr, betas=(0.9, 0.999), eps=1e-8,
                                           weight_decay=cfg.weight_decay, fused=not self.sharded or None)
        self.version = 0
        self.skipped_steps = 0
        if cfg.activation_checkpointing:
            recompute_layers(model)
        # a recomputed layer must see the shared prompt's cache as the first forward did (tba.models.logprobs)
        self.shared_prompts = cfg.shared_prompts and (not cfg.activation_checkpointing or recomputable(model))

    sharded = False
    """Whether the policy is split over several ranks (tba.ranks.rank.RankTrainer)."""

    def age_factor(self, draws: list[Draw]) -> float:
        """trainer.stale_lr_age's factor for an update on `draws` (`age_factor`)."""
        return age_factor(draws, self.version, self.cfg, self.aging)

    def weights(self) -> dict[str, torch.Tensor]:
        """What searchers load — the state dict, or a LoRA policy's adapter weights — as the trainer's own
        tensors, on its device and in its dtype (no copy): the runtime's transport copies them before the
        next update, however they travel (shared buffer, CUDA IPC, broadcast, object store)."""
        return {k: v.detach() for k, v in synced_tensors(self.model).items()}

    def step(self, draws: list[Draw]) -> dict[str, float]:
        """One update on B prompt groups. Returns metrics; a non-finite loss or gradient skips the update."""
        return self.update(draws, samples=sum(len(d.samples) for d in draws), age=self.age_factor(draws))

    def update(self, draws: list[Draw], *, samples: int, age: float) -> dict[str, float]:
        """One update on `draws`, part of a batch of `samples` samples (all of it here; one rank's share of a sharded
        trainer's, tba.ranks.rank) whose age factor is `age`."""
        t0 = time.perf_counter()
        step = self.version + 1
        beta, lr = self.beta(step), self.cfg.lr * lr_factor(step, self.cfg) * age
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        self.model.eval()
        tally = _Tally(samples=samples)
        mb = self.cfg.micro_batch_prompts
        for start in range(0, len(draws), mb):
            self._accumulate(draws[start:start + mb], beta, tally)
        tally = self.merged(tally)
        grad_norm, finite = self._apply_gradients(tally.loss)
        elapsed = time.perf_counter() - t0
        return {"trainer/loss": tally.loss, "trainer/grad_norm": grad_norm, "trainer/lr": lr, "trainer/beta": beta,
                **tally.metrics(), "trainer/tokens_per_s": tally.tokens / elapsed, "trainer/step_s": elapsed,
                "trainer/skipped": float(not finite)}

    def _accumulate(self, micro: list[Draw], beta: float, tally: _Tally) -> None:
        """Forward and backward of one micro-batch of prompt groups: its share of the loss, the TB diagnostics.

        Split into forwards of trainer.micro_batch_samples samples: every objective's loss depends on the policy
        only through the per-token log-probs (group statistics such as log Ẑ are detached), so its gradient is the
        sum over rows of ∂L/∂logp_i · ∂logp_i/∂θ. A no-grad pass scores every split; then each split's backward
        takes the micro-batch's whole loss with its own rows live and the others' values from that pass."""
        n = sum(len(d.samples) for d in micro)
        m = self.cfg.micro_batch_samples or n
        splits = [range(s, min(s + m, n)) for s in range(0, n, m)]
        if len(splits) == 1:
            logp_tok, mask, ref_tok = self._score(micro, splits[0])
        else:
            with torch.no_grad():
                parts = [self._score(micro, s) for s in splits]
            logp_tok, mask, ref_tok = (_stacked([p[k] for p in parts]) for k in range(3))
        width, device = logp_tok.shape[1], logp_tok.device
        if any(s.policy_mask for d in micro for s in d.samples):  # multi-turn: the environment's tokens are not
            # the policy's actions — log π(τ) sums the policy's tokens only, in every objective (tba.rollout.episodes)
            mask = mask * _padded([s.policy_mask or [1] * len(s.response) for d in micro for s in d.samples],
                                  width, device)
        if ref_tok is None:
            ref_tok = _padded([s.ref_logprobs for d in micro for s in d.samples], width, device)  # [N, R]
        behaviour_tok = None  # only the ratio-based objectives read the searchers' behaviour log-probs
        if self.loss.reads_behaviour:
            behaviour_tok = _padded(_behaviour(micro, self.loss), width, device)  # [N, R]
        reward = torch.tensor([s.reward for d in micro for s in d.samples], device=device)  # [N]
        group = torch.tensor([i for i, d in enumerate(micro) for _ in d.samples], device=device)  # [N]

        def loss_of(logp):
            loss = self.loss(logp=logp, mask=mask, ref_logp=ref_tok, behaviour_logp=behaviour_tok, reward=reward,
                             group=group, beta=beta)
            return loss * (n / tally.samples)

        loss = loss_of(logp_tok)
        logp = (logp_tok * mask).sum(-1).detach()  # [N] log π_θ(y|x), for metrics
        ref = (ref_tok * mask).sum(-1)  # [N]
        tally.add_tb_residuals(logp, ref, reward.to(logp.dtype), group, beta)
        if len(splits) == 1:
            self.backward(loss)
        else:
            for split in splits:
                live = self._score(micro, split, reference=False)[0]
                self.backward(loss_of(torch.cat([logp_tok[:split.start], F.pad(live, (0, width - live.shape[1])),
                                                 logp_tok[split.stop:]])))
        tally.loss += loss.item()
        tally.tokens += int(mask.sum().item()) + sum(len(d.prompt_tokens) * len(d.samples) for d in micro)
        tally.logp += logp.sum().item()
        tally.log_ratio += (logp.detach() - ref).sum().item()

    def _score(self, micro: list[Draw], rows: range, reference: bool = True):
        """(log π_θ [n, R], mask [n, R], the objective's own log π_ref [n, R] or None) of samples `rows` of the
        micro-batch (prompt-major), R their longest response."""
        flat = [(i, s) for i, d in enumerate(micro) for s in d.samples][rows.start:rows.stop]
        prompts = [micro[i].prompt_tokens for i, _ in flat]
        responses = [s.response for _, s in flat]
        chunk = self.cfg.logprob_chunk_tokens
        with precision.autocast(self.model.device, self.autocast):  # backward runs outside, as torch advises
            if self.shared_prompts:
                # length buckets choose how many forwards from this rank's lengths; a sharded trainer's ranks
                # must all run the same forwards (each gathers the shards), so they run one
                counts = collections.Counter(i for i, _ in flat)  # group → its samples here, in order
                logp_tok, mask = grouped_logprobs(self.model, [micro[i].prompt_tokens for i in counts], responses,
                                                  list(counts.values()), self.temperature, self.pad_id,
                                                  buckets=not self.sharded, chunk_tokens=chunk)
            else:
                logp_tok, mask = response_logprobs(self.model, prompts, responses, self.temperature, self.pad_id,
                                                   chunk_tokens=chunk)
            ref_tok = (self.reference.logprobs(prompts, responses, self.temperature, self.pad_id)
                       if reference and self.reference is not None else None)
        return logp_tok, mask, ref_tok

    # ---- what a rank of a sharded trainer (tba.ranks.rank.RankTrainer) does otherwise ---------------------------
    def merged(self, tally: _Tally) -> _Tally:
        """The update's sums over every process (here: this one's)."""
        return tally

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def full_state(self) -> dict[str, torch.Tensor]:
        """The policy's whole state dict."""
        return self.model.state_dict()

    def close(self) -> None:
        """Release what the trainer started (a sharded trainer: its ranks)."""

    def grad_norm(self) -> float:
        """The L2 norm of the whole gradient."""
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])).item()

    def _apply_gradients(self, loss: float) -> tuple[float, bool]:
        """Clip (if asked) and step, or skip the update when the loss or gradient is not finite; (norm, applied)."""
        grad_norm = self.grad_norm()
        finite = math.isfinite(loss) and math.isfinite(grad_norm)
        if finite:
            if self.cfg.max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
            self.optimizer.step()
            self.version += 1
            if self.reference is not None:
                self.reference.updated(self.full_state, self.version)
        else:
            self.skipped_steps += 1
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm, finite


@dataclass
class _Tally:
    """One update's sums over its micro-batches, for the metrics."""

    samples: int
    loss: float = 0.0
    tokens: int = 0
    logp: float = 0.0
    log_ratio: float = 0.0
    log_zs: list[torch.Tensor] = field(default_factory=list)
    residuals: list[torch.Tensor] = field(default_factory=list)

    def add_tb_residuals(self, logp, ref, r, group, beta: float) -> None:
        """TB diagnostics, whatever the objective: δ = log Ẑ + log π_θ − log π_ref − r/β per sequence."""
        log_z = vargrad_log_z(logp, ref, r, group, beta)
        self.log_zs.append(log_z)
        self.residuals.append(log_z + logp - ref - r / beta)

    def metrics(self) -> dict[str, float]:
        residuals = torch.cat(self.residuals)
        return {"trainer/logp_mean": self.logp / self.samples, "trainer/log_ratio_mean": self.log_ratio / self.samples,
                # log Ẑ per prompt group, and the spread of δ (its group mean is 0 by construction: std = RMS)
                "trainer/log_z_mean": torch.cat(self.log_zs).mean().item(),
                "trainer/residual_std": residuals.pow(2).mean().sqrt().item(),
                "trainer/residual_max": residuals.abs().max().item()}
