"""Batched sampling with a KV cache (the per-token log-probs of given responses: tba.models.logprobs).

Every log-prob in TBA is of the temperature-scaled distribution softmax(logits / T) with top-k off (optionally
top-p filtered and renormalised) — the trainer's log π_θ, the searcher's log π_ref and the behaviour log-probs —
as in the paper's code (§2.2), so the TB residual compares like with like.

`generate` is a hand-written decode loop on the model's own forward rather than HF `generate`, because on a CPU
the time HF `generate` spends is not in the matmuls but in per-step work around them, which this loop does not
do (bench/perf/sampler.py measures both; docs/results.md, "Sampler backends"):

* grouped-query attention under a padding mask: HF's sdpa path then materialises K and V for every query head
  (`repeat_kv`, every step and layer) → SDPA's own `enable_gqa` during one-token decode steps (`_gqa_sdpa`);
* `torch.multinomial` over the whole vocabulary → inverse-CDF sampling: cumsum of the probabilities and one
  uniform per row, the same distribution;
* `DynamicCache` growing by `torch.cat` (the whole cache copied every step) → one buffer per layer, allocated
  for prompt + max_new_tokens, written one slot per step (`_SlotLayer`);
* the prompt prefilled S times (`num_return_sequences`) → prefilled once, its cache repeated S times;
  `output_scores`' [N·S, V] tensor kept for every step → the sampled token's log-prob gathered on the fly;
  finished rows decoded until the last row stops → dropped from the batch once enough of them have ended.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.cache_utils import DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_outputs import CausalLMOutputWithPast

CACHE = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
"""The KV cache's name in a model's forward and output: transformers 5.2x renamed `past_key_values` to
`cache` (the old name still works there, but prints a deprecation warning on every call); 5.17-5.19 know
only `past_key_values`."""


def _pad(seqs: list[list[int]], pad_id: int, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    length = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), length), pad_id, dtype=torch.long)  # [N, L]
    mask = torch.zeros((len(seqs), length), dtype=torch.long)  # [N, L]
    for i, s in enumerate(seqs):
        if left:
            ids[i, length - len(s):] = torch.tensor(s)
            mask[i, length - len(s):] = 1
        else:
            ids[i, : len(s)] = torch.tensor(s)
            mask[i, : len(s)] = 1
    return ids, mask


class _SlotLayer(DynamicLayer):
    """A `DynamicLayer` whose keys and values live in buffers sized for the whole generation.

    `DynamicLayer.update` is `torch.cat([cache, new])`: every step copies the whole cache of every layer
    (O(L) bytes per token; at batch 64 and 300 cached tokens that is ~15 MB per tensor, ~60 per step). Here a
    step writes one slot, and `keys`/`values` are views of the filled prefix, so the rest of transformers
    (masks, `get_seq_length`) sees an ordinary dynamic layer.
    """

    def __init__(self, k: torch.Tensor, v: torch.Tensor, filled: int):
        """Buffers [B, H, capacity, D] whose first `filled` positions hold keys and values."""
        super().__init__()
        self.dtype, self.device, self.is_initialized = k.dtype, k.device, True
        self._k, self._v = k, v
        self._view(filled)

    @classmethod
    def repeated(cls, keys: torch.Tensor, values: torch.Tensor, repeats: int, capacity: int) -> _SlotLayer:
        """A prefilled [N, H, L, D] layer as N·repeats rows with room for `capacity` positions."""
        return cls(cls._alloc(keys, repeats, capacity), cls._alloc(values, repeats, capacity), keys.shape[-2])

    @staticmethod
    def _alloc(x: torch.Tensor, repeats: int, capacity: int) -> torch.Tensor:
        b, h, n, d = x.shape
        buf = x.new_empty(b * repeats, h, capacity, d)  # row i·repeats + j = sample j of prompt i
        buf.view(b, repeats, h, capacity, d)[:, :, :, :n] = x[:, None]
        return buf

    def _view(self, n: int) -> None:
        self.keys, self.values = self._k[:, :, :n], self._v[:, :, :n]

    def update(self, key_states, value_states, *args, **kwargs):
        start = self.keys.shape[-2]
        end = start + key_states.shape[-2]
        self._k[:, :, start:end] = key_states
        self._v[:, :, start:end] = value_states
        self._view(end)
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        n = self.keys.shape[-2]
        for name, live in (("_k", self.keys), ("_v", self.values)):
            buf = getattr(self, name)
            new = buf.new_empty(len(indices), *buf.shape[1:])
            new[:, :, :n] = live.index_select(0, indices)  # only the filled prefix is copied
            setattr(self, name, new)
        self._view(n)


def _slot_cache(cache, repeats: int, capacity: int):
    """The prefilled cache of N prompts → N·repeats rows with room for `capacity` positions. Caches other than
    plain full-attention dynamic ones (sliding windows, …) are repeated as they are and keep growing by cat."""
    layers = getattr(cache, "layers", None)
    if layers and all(type(layer) is DynamicLayer and getattr(layer, "keys", None) is not None for layer in layers):
        for i, layer in enumerate(layers):
            layers[i] = _SlotLayer.repeated(layer.keys, layer.values, repeats, capacity)
    elif repeats > 1:
        cache.batch_repeat_interleave(repeats)
    return cache


@dataclass
class DecodeStats:
    """What a decode loop spent its steps on: `tokens` sampled over `row_steps` rows computed (static: the rows
    still in the batch; continuous: every slot) in `steps` forwards. 1 − tokens / row_steps is the share of row
    computations spent on finished rows, padding or empty slots."""

    steps: int = 0
    row_steps: int = 0
    tokens: int = 0
    slot_steps: int = 0
    """Steps × the batch's starting rows (static) or slots (continuous): 1 − tokens / slot_steps is the share of
    the batch's capacity that produced no token."""

    def add(self, other: DecodeStats) -> None:
        for k in ("steps", "row_steps", "tokens", "slot_steps"):
            setattr(self, k, getattr(self, k) + getattr(other, k))


_GQA = "tba_decode_sdpa"


def _gqa_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers' sdpa attention for one-token decode steps of a grouped-query model, without copying K/V.

    With a padding mask (left-padded prompts of different lengths) HF's sdpa path expands K and V to one
    copy per query head (`repeat_kv`, n_rep × the cache, every step and layer) because some GPU kernels lack
    masked GQA; SDPA's `enable_gqa` shares the KV heads instead and gives the same result.
    """
    if (query.shape[2] != 1 or dropout or key.shape[1] == query.shape[1]
            or kwargs.get("position_bias") is not None or kwargs.get("cache") is not None):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(_GQA, _gqa_sdpa)
AttentionMaskInterface.register(_GQA, sdpa_mask)  # the same boolean masks as "sdpa"


@contextlib.contextmanager
def _decode_attention(model):
    """Route a grouped-query sdpa model's attention through `_gqa_sdpa` for the decode steps only, on a CPU
    (CUDA's fast SDPA kernels take no masked GQA: there HF's copy is the better deal). The switch is the
    model config's, undone on exit; nothing else may run this model meanwhile (no runtime does)."""
    config = model.config
    kv_heads = getattr(config, "num_key_value_heads", None)
    if (model.device.type != "cpu" or config._attn_implementation != "sdpa"
            or kv_heads in (None, getattr(config, "num_attention_heads", None))):
        yield
        return
    config._attn_implementation = _GQA
    try:
        yield
    finally:
        config._attn_implementation = "sdpa"


def _forward(model, **inputs):
    """The model's output for the last position only (`logits_to_keep=1`: at prefill the LM head, V ≈ 50k
    columns, is not applied to every prompt position)."""
    try:
        return model(**inputs, use_cache=True, logits_to_keep=1)
    except TypeError:  # a model without `logits_to_keep`
        return model(**inputs, use_cache=True)


def _sample(logits: torch.Tensor, temperature: float, top_p: float, greedy: bool
            ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One token per row of `logits` [B, V] and its log-prob under the distribution it was drawn from.

    Sampling is by inverse CDF: token = first i with cumsum(p)_i > u · Σp, u ~ U[0, 1) (one uniform per row),
    exactly a draw from p — torch.multinomial is many times slower at V ≈ 50k on a CPU. With top-p < 1 the kept
    set is HF's: tokens in descending order while the mass strictly before them is < top_p (the first always
    stays), found in a growing `topk` rather than a full sort of the vocabulary; p is renormalised over it.
    """
    if greedy:
        return logits.argmax(-1), None
    z = logits.float() if temperature == 1.0 else logits.float() / temperature
    probs = torch.softmax(z, -1)  # [B, V]
    if top_p < 1.0:
        k = min(64, probs.shape[-1])
        while True:
            top, idx = probs.topk(k, -1)  # [B, k], descending
            cum = top.cumsum(-1)
            if k == probs.shape[-1] or bool((cum[:, -1] >= top_p).all()):
                break
            k = min(k * 8, probs.shape[-1])
        keep = cum - top < top_p
        keep[:, 0] = True
        probs = top * keep
    cdf = probs.cumsum(-1)  # [B, V or k]
    u = torch.rand(cdf.shape[0], 1, device=cdf.device, dtype=cdf.dtype) * cdf[:, -1:]
    pick = torch.searchsorted(cdf, u, right=True).clamp_(max=cdf.shape[-1] - 1)  # [B, 1]
    if top_p >= 1.0:
        return pick.squeeze(-1), probs.gather(-1, pick).log_().squeeze(-1)  # log softmax(z)_i
    return idx.gather(-1, pick).squeeze(-1), (probs.gather(-1, pick) / cdf[:, -1:]).log_().squeeze(-1)  # p_i / Σ kept


@torch.no_grad()  # not inference_mode: a module may cache tensors (e.g. dynamic RoPE) that training reuses
def generate(
    model,
    prompts: list[list[int]],
    *,
    num_samples: int = 1,
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_new_tokens: int = 32,
    eos_id: int,
    pad_id: int,
    greedy: bool = False,
    logprobs: bool = True,
    stats: DecodeStats | None = None,
) -> list[tuple[list[int], list[float]]]:
    """Return, for each prompt and then each of its samples, (response ids, behaviour log-probs).

    Responses are cut after the first EOS (which is kept). Greedy decoding, or `logprobs=False` (evaluation, a
    victim model: nobody needs them), returns empty log-prob lists.
    Reproducible under a fixed torch seed (one uniform per active row and step from the global generator).
    `stats`, if given, is added what the loop's steps were spent on.
    """
    if not greedy and temperature <= 0:
        raise ValueError(f"temperature must be > 0 when sampling, got {temperature}")
    s = num_samples
    logprobs = logprobs and not greedy
    if not prompts or max_new_tokens <= 0:
        return [([], []) for _ in range(len(prompts) * s)]
    device = model.device
    ids, mask = (x.to(device) for x in _pad(prompts, pad_id, left=True))  # [N, L]
    length = ids.shape[1]
    pos = (mask.cumsum(-1) - 1).clamp_(min=0)  # left padding: positions 0, 1, … from each prompt's first token
    out = _forward(model, input_ids=ids, attention_mask=mask, position_ids=pos)
    cache = _slot_cache(getattr(out, CACHE), s, length + max_new_tokens)
    logits = out.logits[:, -1].repeat_interleave(s, 0)  # [B, V], B = N·S, prompt-major
    batch = logits.shape[0]
    attn = torch.ones(batch, length + max_new_tokens, dtype=mask.dtype, device=device)
    attn[:, :length] = mask.repeat_interleave(s, 0)
    pos = pos[:, -1:].repeat_interleave(s, 0)  # [B, 1]
    tokens = torch.full((batch, max_new_tokens), pad_id, dtype=torch.long, device=device)
    logp = torch.zeros(batch, max_new_tokens, device=device)
    ended = torch.full((batch,), max_new_tokens, dtype=torch.long, device=device)  # response length per row
    rows = torch.arange(batch, device=device)  # the output row of each row still in the batch
    running = torch.ones(batch, dtype=torch.bool, device=device)
    compact = hasattr(cache, "batch_select_indices")
    with _decode_attention(model):
        for t in range(max_new_tokens):
            token, lp = _sample(logits, temperature, top_p, greedy)
            if stats is not None:
                stats.steps, stats.row_steps = stats.steps + 1, stats.row_steps + len(rows)
                stats.tokens, stats.slot_steps = stats.tokens + int(running.sum()), stats.slot_steps + batch
            tokens[rows, t] = token
            if logprobs:
                logp[rows, t] = lp
            stop = running & (token == eos_id)
            ended[rows[stop]] = t + 1
            running &= ~stop
            left = int(running.sum())
            if left == 0 or t == max_new_tokens - 1:
                break
            # drop finished rows once they are ≥ 1/8 of the batch: one copy of the live cache, then every later
            # step is that much cheaper (rows are independent; a finished row's further tokens are discarded)
            if compact and (len(rows) - left) * 8 >= len(rows):
                keep = running.nonzero().squeeze(-1)
                cache.batch_select_indices(keep)
                rows, token, pos, attn, running = rows[keep], token[keep], pos[keep], attn[keep], running[keep]
            pos = pos + 1
            out = model(input_ids=token[:, None], attention_mask=attn[:, :length + t + 1], position_ids=pos,
                        use_cache=True, **{CACHE: cache})
            logits = out.logits[:, -1]
    ended, tokens, logp = ended.tolist(), tokens.tolist(), logp.tolist() if logprobs else None
    return [(tokens[i][:n], logp[i][:n] if logprobs else []) for i, n in enumerate(ended)]


def ended_with_eos(responses: list[list[int]], eos_id: int) -> list[bool]:
    """Whether each response stopped by itself (its last token is EOS) rather than at max_new_tokens."""
    return [bool(r) and r[-1] == eos_id for r in responses]
