"""Continuous batching for the HF decode loop: a fixed number of rows (slots) decode together, and a row that ends
hands its slot to the next queued sample, so a batch never waits for its longest response.

Why a timeline: every row writes its next token's keys and values at one shared cache position t, as the static
loop (tba.models.generation.generate) does, so HF's own attention, masks and RoPE work unchanged. A newcomer's
prompt is prefilled on its own (one forward for all prompts admitted together, each prompt once for its S
samples) and its keys and values are placed just left of t in the newcomer's row, the row's older positions
masked out: exactly a left-padded prompt. When t reaches the buffers' end, every row's live window is shifted
left in one copy. Prefill of newcomers runs as its own forward between decode steps, not fused into a decode
step's forward: HF's masks take one query length per forward.

Weights may change between any two steps (in-flight updates, tba.rollout.stream), and each token records the
policy version of the forward that sampled it. The keys and values already cached are kept (default), or, with
`recompute`, every row in flight re-prefills its whole context under the new weights at the first step after a
change (one forward over all of them; a parked episode's cache is rebuilt when it resumes): then every later
token is sampled from the newest policy given its prefix, as a fresh generation would be.

Multi-turn episodes (tba.rollout.episode_stream) keep their cache across turns: a sample submitted with
`keep=True` that ends a turn frees its slot, and its keys and values (prompt and every turn so far) are parked;
`resume` queues its next turn, prefilled from the parked cache with only the tokens the cache lacks (the turn's
last token and the environment's answer), so a turn costs its own tokens, not the episode's; the turns admitted
together extend their caches in one forward (`_extend`). Parked keys and values are kept across weight updates,
like a row's in flight.

Exactness: with the same prompts, every row admitted at once and no row ending early, the rows see the same
forwards, masks and uniforms (one per sampled row per step, from the global torch generator) as `generate`, and
return the same tokens (tests/models/test_continuous.py).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from tba.models.generation import CACHE, DecodeStats, _decode_attention, _forward, _pad, _sample, _SlotLayer


@dataclass
class Finished:
    """One sample that ended: EOS (kept) or its token budget."""

    key: object
    index: int
    """Its place among its prompt's samples (0 … S−1)."""
    tokens: list[int]
    logprobs: list[float]
    versions: list[int]
    """The policy version that sampled each token."""


@dataclass
class Row:
    """A sample in flight."""

    key: object
    index: int
    budget: int
    length: int
    """Prompt tokens: the row's first position is t − length at admission."""
    keep: bool = False
    """Park its cache when it ends (a multi-turn episode's turn)."""
    context: list[int] = field(default_factory=list)
    """The token ids cached at admission (`length` of them)."""
    version: int = 0
    """The weights its cache was computed with (the oldest, without recompute)."""
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)


@dataclass
class _Queued:
    """A sample waiting for a slot: a prompt's `index`-th sample, or (`resume`) the next turn of a parked one."""

    key: object
    index: int
    prompt: list[int]
    """The tokens to prefill: the prompt, or (resume) those the parked cache lacks."""
    budget: int
    keep: bool
    resume: bool = False
    context: list[int] | None = None
    """Every token id its cache will hold once prefilled (None: `prompt`)."""


@dataclass
class _Parked:
    """A kept sample between turns: its keys and values (per layer [H, L, D]) and its last sampled token, which
    the cache does not hold yet."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    last: int
    context: list[int]
    """The token ids the keys and values are of."""
    version: int


@dataclass
class _Prefill:
    """A prompt's keys and values (per layer [H, L, D]) and its last position's logits, kept until its last
    sample is admitted or the weights change."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    logits: torch.Tensor
    version: int


class ContinuousBatch:
    """Rows in flight over `slots` slots. `submit` queues a prompt's samples; each `step(version)` admits queued
    samples into free slots (when at least `refill` slots are free, or none is decoding), decodes one token for
    every row, and returns the samples that ended."""

    def __init__(self, model, slots: int, *, temperature: float, top_p: float, eos_id: int, pad_id: int,
                 refill: int | None = None, recompute: bool = False):
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0 when sampling, got {temperature}")
        self.model, self.slots, self.temperature, self.top_p = model, slots, temperature, top_p
        self.eos_id, self.pad_id = eos_id, pad_id
        self.refill = refill if refill is not None else max(1, math.ceil(slots / 8))
        self.recompute = recompute
        self.recomputed_tokens = 0
        """Context tokens re-prefilled after weight changes (recompute)."""
        self.queue: deque[_Queued] = deque()
        self.rows: list[Row | None] = [None] * slots
        self.prefills: dict[object, _Prefill] = {}
        self.parked: dict[tuple[object, int], _Parked] = {}
        self.hold = False
        """True: admit nothing (the rows in flight drain: a between-batches weight update waits for that)."""
        self.stats = DecodeStats()
        self.t = 0
        self.cache = None
        self.attn: torch.Tensor | None = None  # [slots, capacity]
        self.pos = torch.zeros(slots, dtype=torch.long)  # position id of each row's next input token
        self.next = torch.full((slots,), pad_id, dtype=torch.long)  # each row's last sampled token, fed next

    # ---- what the owner sees ----------------------------------------------------------------------------------
    def submit(self, key, prompt: list[int], num_samples: int, max_new_tokens: int, keep: bool = False) -> None:
        """Queue `num_samples` samples of `prompt`; `keep`: park each one's cache when it ends (`resume`)."""
        if not prompt:
            raise ValueError(f"prompt {key!r} is empty")
        for i in range(num_samples):
            self.queue.append(_Queued(key, i, prompt, max_new_tokens, keep))

    def resume(self, key, index: int, tokens: list[int], max_new_tokens: int) -> None:
        """Queue the next turn of a parked sample: `tokens` (the environment's answer) follow its last turn. It goes
        ahead of new prompts: an episode in flight ends sooner and its parked cache is freed."""
        if (key, index) not in self.parked:
            raise KeyError(f"sample {index} of {key!r} is not parked (submitted without keep, or released)")
        parked = self.parked[key, index]
        missing = [parked.last, *tokens]
        self.queue.appendleft(_Queued(key, index, missing, max_new_tokens, True, resume=True,
                                      context=parked.context + missing))

    def release(self, key, index: int) -> None:
        """Forget a parked sample (its episode is over)."""
        self.parked.pop((key, index), None)

    @property
    def active(self) -> int:
        return sum(r is not None for r in self.rows)

    @property
    def idle(self) -> bool:
        return not self.queue and not self.active

    @torch.no_grad()
    def step(self, version: int) -> list[Finished]:
        finished: list[Finished] = []
        if any(p.version != version for p in self.prefills.values()):
            self.prefills.clear()  # a sibling admitted after an update starts from the new weights' prefill
        if self.recompute and any(r is not None and r.version != version for r in self.rows):
            self._recompute(version)
        free = [i for i, r in enumerate(self.rows) if r is None]
        if self.queue and not self.hold and free and (len(free) >= self.refill or len(free) == self.slots):
            finished += self._admit(free, version)
        live = [i for i, r in enumerate(self.rows) if r is not None]
        if not live:
            return finished
        finished += self._decode(live, version)
        return finished

    # ---- admission -----------------------------------------------------------------------------------------------
    def _admit(self, free: list[int], version: int) -> list[Finished]:
        taken = [self.queue.popleft() for _ in range(min(len(free), len(self.queue)))]
        new = {}
        for q in taken:
            if not q.resume and q.key not in self.prefills and q.key not in new:
                new[q.key] = q.prompt
        if new:
            self._prefill(new, version)
        resumed = iter(self._resume([q for q in taken if q.resume], version))
        pres = [next(resumed) if q.resume else self.prefills[q.key] for q in taken]
        logits = torch.stack([pre.logits for pre in pres])  # [n, V]
        longest = max(pre.keys[0].shape[-2] for pre in pres)
        room = max([q.budget for q in taken] + [r.budget - len(r.tokens) for r in self.rows if r is not None])
        if self.cache is None:
            self._allocate(pres[0], longest + room)
        if self.t < longest or self.t + room > self.capacity:
            self._shift(max(longest, self._window()), need=room)
        slots = free[: len(taken)]
        for slot, q, pre in zip(slots, taken, pres, strict=True):
            n = pre.keys[0].shape[-2]
            for layer, k, v in zip(self.cache.layers, pre.keys, pre.values, strict=True):
                layer._k[slot, :, self.t - n:self.t] = k
                layer._v[slot, :, self.t - n:self.t] = v
            self.attn[slot].zero_()
            self.attn[slot, self.t - n:self.t] = 1
            self.pos[slot] = n
            self.rows[slot] = Row(q.key, q.index, q.budget, n, q.keep, q.context or q.prompt, pre.version)
        waiting = {q.key for q in self.queue if not q.resume}
        for key in {q.key for q in taken if not q.resume} - waiting:
            self.prefills.pop(key, None)  # every sample of it admitted
        self.stats.row_steps += len(taken)
        self.stats.slot_steps += len(taken)
        return self._sampled(slots, logits, version)

    def _prefill(self, prompts: dict, version: int) -> None:
        self.prefills.update(zip(prompts, self._prefill_rows(list(prompts.values()), version), strict=True))

    def _resume(self, queued: list[_Queued], version: int) -> list[_Prefill]:
        """Parked samples' next turns, admitted together: each cache extended by the tokens it lacks, all in one
        forward (`_extend`); with recompute, after a weight change, a forward over the whole context instead."""
        parked = [self.parked.pop((q.key, q.index)) for q in queued]
        stale = [self.recompute and p.version != version for p in parked]
        self.recomputed_tokens += sum(len(p.context) for p, old in zip(parked, stale, strict=True) if old)
        fresh = iter(self._prefill_rows([q.context for q, old in zip(queued, stale, strict=True) if old], version)
                     if any(stale) else ())
        extended = iter(self._extend([p for p, old in zip(parked, stale, strict=True) if not old],
                                     [q.prompt for q, old in zip(queued, stale, strict=True) if not old])
                        if not all(stale) else ())
        return [next(fresh) if old else next(extended) for old in stale]

    def _extend(self, parked: list[_Parked], tokens: list[list[int]]) -> list[_Prefill]:
        """One forward over every parked cache and the tokens it lacks. Row i holds its cache right-aligned at
        [C − cached_i, C) and its tokens right-aligned at [C + M − m_i, C + M), the gaps masked out and its own
        position ids: a turn costs its own tokens, and the resumes of one admission share a forward."""
        cached, m = [p.keys[0].shape[-2] for p in parked], [len(t) for t in tokens]
        n, c, w = len(parked), max(cached), max(cached) + max(m)
        device = parked[0].keys[0].device

        def stacked(per_row: list[torch.Tensor]) -> torch.Tensor:  # [H, cached_i, D] each → [n, H, w, D]
            buf = per_row[0].new_zeros(n, *per_row[0].shape[:-2], w, per_row[0].shape[-1])
            for i, x in enumerate(per_row):
                buf[i, :, c - cached[i]:c] = x
            return buf

        layers = [_SlotLayer(stacked([p.keys[j] for p in parked]), stacked([p.values[j] for p in parked]), c)
                  for j in range(len(parked[0].keys))]
        cache = DynamicCache()
        cache.layers = layers
        ids = torch.full((n, w - c), self.pad_id, dtype=torch.long)
        mask = torch.zeros(n, w, dtype=torch.long)
        pos = torch.zeros(n, w - c, dtype=torch.long)
        for i, t in enumerate(tokens):
            ids[i, w - c - m[i]:] = torch.tensor(t)
            mask[i, c - cached[i]:c] = 1
            mask[i, w - m[i]:] = 1
            pos[i] = cached[i]  # a gap's queries: any position (nothing reads them)
            pos[i, w - c - m[i]:] = torch.arange(cached[i], cached[i] + m[i])
        out = _forward(self.model, input_ids=ids.to(device), attention_mask=mask.to(device),
                       position_ids=pos.to(device), **{CACHE: cache})

        def kept(buf: torch.Tensor, i: int) -> torch.Tensor:
            return torch.cat([buf[i, :, c - cached[i]:c], buf[i, :, w - m[i]:]], dim=-2)

        return [_Prefill([kept(x._k, i) for x in layers], [kept(x._v, i) for x in layers], out.logits[i, -1],
                         p.version) for i, p in enumerate(parked)]

    def _prefill_rows(self, contexts: list[list[int]], version: int) -> list[_Prefill]:
        """Keys, values and last logits of each context from scratch (one left-padded forward)."""
        ids, mask = (x.to(self.model.device) for x in _pad(contexts, self.pad_id, left=True))
        pos = (mask.cumsum(-1) - 1).clamp_(min=0)
        out = _forward(self.model, input_ids=ids, attention_mask=mask, position_ids=pos)
        layers, width = getattr(out, CACHE).layers, ids.shape[1]
        if not all(type(layer) is DynamicLayer for layer in layers):
            raise ValueError(f"search.batching=continuous needs a model whose KV cache is full attention in every "
                             f"layer; {type(self.model).__name__} has {sorted({type(x).__name__ for x in layers})}")
        return [_Prefill([x.keys[i, :, width - len(c):] for x in layers],
                         [x.values[i, :, width - len(c):] for x in layers], out.logits[i, -1], version)
                for i, c in enumerate(contexts)]

    def _recompute(self, version: int) -> None:
        """Every row in flight's cache rebuilt under the weights now loaded (its positions unchanged)."""
        live = [i for i, r in enumerate(self.rows) if r is not None]
        contexts = [self.rows[i].context + self.rows[i].tokens[:-1] for i in live]
        for slot, pre, c in zip(live, self._prefill_rows(contexts, version), contexts, strict=True):
            for layer, k, v in zip(self.cache.layers, pre.keys, pre.values, strict=True):
                layer._k[slot, :, self.t - len(c):self.t] = k
                layer._v[slot, :, self.t - len(c):self.t] = v
            self.rows[slot].version = version
            self.recomputed_tokens += len(c)

    # ---- decoding ------------------------------------------------------------------------------------------------
    def _decode(self, live: list[int], version: int) -> list[Finished]:
        if self.t + 1 > self.capacity:  # not after an admission, which made room for every row's budget
            self._shift(self._window(), need=max(r.budget - len(r.tokens) for r in self.rows if r is not None))
        self.attn[:, self.t] = 1  # every slot attends to its own new position (an empty slot to nothing else)
        ids = self.next.to(self.attn.device)[:, None]
        with _decode_attention(self.model):
            out = self.model(input_ids=ids, attention_mask=self.attn[:, :self.t + 1],
                             position_ids=self.pos.to(self.attn.device)[:, None], use_cache=True,
                             **{CACHE: self.cache})
        self.t += 1
        self.pos[live] += 1
        self.stats.steps += 1
        self.stats.row_steps += self.slots
        self.stats.slot_steps += self.slots
        return self._sampled(live, out.logits[live, -1], version)

    def _sampled(self, slots: list[int], logits: torch.Tensor, version: int) -> list[Finished]:
        token, lp = _sample(logits, self.temperature, self.top_p, greedy=False)
        finished = []
        for slot, tok, p in zip(slots, token.tolist(), lp.tolist(), strict=True):
            row = self.rows[slot]
            row.tokens.append(tok)
            row.logprobs.append(p)
            row.versions.append(version)
            self.next[slot] = tok
            self.stats.tokens += 1
            if tok == self.eos_id or len(row.tokens) >= row.budget:
                finished.append(Finished(row.key, row.index, row.tokens, row.logprobs, row.versions))
                if row.keep:
                    self._park(slot, row)
                self.rows[slot] = None
                self.next[slot] = self.pad_id
                self.attn[slot].zero_()
                self.pos[slot] = 0
        return finished

    def _park(self, slot: int, row: Row) -> None:
        """Copy out a kept row's cached positions: its prefill and every token it sampled but the last."""
        n = row.length + len(row.tokens) - 1
        self.parked[row.key, row.index] = _Parked([x._k[slot, :, self.t - n:self.t].clone() for x in self.cache.layers],
                                                  [x._v[slot, :, self.t - n:self.t].clone() for x in self.cache.layers],
                                                  row.tokens[-1], row.context + row.tokens[:-1], row.version)

    # ---- the timeline ----------------------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return self.attn.shape[1]

    def _window(self) -> int:
        """Positions the rows in flight occupy, ending at t."""
        starts = [self.t - r.length - len(r.tokens) + 1 for r in self.rows if r is not None]
        return self.t - min(starts) if starts else 0

    def _allocate(self, pre: _Prefill, extent: int) -> None:
        capacity = 2 * extent
        layers = []
        for k, v in zip(pre.keys, pre.values, strict=True):
            kb = k.new_zeros(self.slots, k.shape[0], capacity, k.shape[-1])  # zeros: masked positions are read
            vb = v.new_zeros(self.slots, v.shape[0], capacity, v.shape[-1])  # (× 0), and 0 × NaN would be NaN
            layers.append(_SlotLayer(kb, vb, 0))
        self.cache = DynamicCache()
        self.cache.layers = layers
        self.attn = torch.zeros(self.slots, capacity, dtype=torch.long, device=pre.logits.device)

    def _shift(self, new_t: int, need: int = 0) -> None:
        """Move every row's live window to end at `new_t` (growing the buffers if `new_t + need` does not fit)."""
        w = self._window()
        new_t = max(new_t, w)
        if new_t + max(need, 1) > self.capacity:
            self._grow(2 * (new_t + max(need, 1)))
        for layer in self.cache.layers:
            for buf in (layer._k, layer._v):
                buf[:, :, new_t - w:new_t] = buf[:, :, self.t - w:self.t].clone()
            layer._view(new_t)
        self.attn[:, new_t - w:new_t] = self.attn[:, self.t - w:self.t].clone()
        self.attn[:, :new_t - w] = 0
        self.attn[:, new_t:] = 0
        self.t = new_t

    def _grow(self, capacity: int) -> None:
        for layer in self.cache.layers:
            for name in ("_k", "_v"):
                old = getattr(layer, name)
                new = old.new_zeros(*old.shape[:2], capacity, old.shape[-1])
                new[:, :, :old.shape[2]] = old
                setattr(layer, name, new)
            layer._view(self.t)
        attn = self.attn.new_zeros(self.slots, capacity)
        attn[:, :self.attn.shape[1]] = self.attn
        self.attn = attn
