"""Per-token log-probs of given responses: the trainer's log π_θ, the searchers' log π_ref, evaluation's KL to π_ref.

Every log-prob is of softmax(logits / T) (tba.models.generation, which samples from the same distribution). The LM
head and its log-softmax run `chunk_tokens` response positions at a time inside the model's forward
(tba.models.lm_head), and only at positions that predict a response token: memory for the log-probs is
chunk × V, whatever the batch and the lengths. `chunk_tokens = 0` is the plain path — the head on every kept
position, [N, R, V] float32 logits, gathered — which `response_logits` still gives to callers that want the whole
distribution.

Chunking changes no number beyond float rounding: each position's logits are the same matmul row either way
(tests/models/test_logprobs.py holds them, and their gradients, to the plain path).
"""

from __future__ import annotations

import collections

import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicCache, DynamicLayer

from tba.models.generation import CACHE, _pad
from tba.models.length_buckets import length_buckets
from tba.models.lm_head import scored, token_logprobs

CHUNK_TOKENS = 1024
"""Positions per chunk of the LM head + log-softmax (trainer.logprob_chunk_tokens; the searchers' π_ref scoring and
evaluation use this). 1,024 rows keep the head's matmul as efficient as the whole batch's on a CPU or a GPU, and
cost 1024 × V × 4 bytes per float32 copy: 0.6 GB at Qwen's 152k vocabulary, against 6 GB per copy for the plain
path's micro-batch of 20 × 512 tokens."""


def _forward(model, ids: torch.Tensor, attn: torch.Tensor, keep: int):
    # use_cache=False: scoring needs no KV cache, and a cache would grow again when activation checkpointing
    # recomputes a layer in backward (trainer.activation_checkpointing)
    try:  # only the last `keep` positions need the LM head (V ≈ 50k–150k columns for real tokenizers)
        return model(input_ids=ids, attention_mask=attn, logits_to_keep=keep, use_cache=False)
    except TypeError:  # a model without `logits_to_keep`
        return model(input_ids=ids, attention_mask=attn, use_cache=False)


def response_logits(model, prompts: list[list[int]], responses: list[list[int]], pad_id: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Raw logits that predict each response token, the response tokens, and the mask: the plain path.

    Returns (logits [N, R, V], targets [N, R], mask [N, R]) where R is the longest response. Sequences are
    right-padded so that positions start at 0 for every row, exactly as in a single-sequence forward.
    """
    seqs = [p + r for p, r in zip(prompts, responses, strict=True)]
    ids, attn = _pad(seqs, pad_id, left=False)  # [N, L]
    device, length = model.device, ids.shape[1]
    first = min(len(p) for p in prompts) - 1  # logits only from the earliest response start on
    keep = length - first
    logits = _forward(model, ids.to(device), attn.to(device), keep).logits
    if logits.shape[1] != keep:  # the argument was ignored: all L positions came back
        logits = logits[:, first:]
    logits = logits.float()  # [N, keep, V]: logits[:, j] predicts token first + j + 1
    resp_len = max(len(r) for r in responses)
    # position len(prompt)-1+t predicts response[t]
    starts = torch.tensor([len(p) - 1 for p in prompts], device=device)  # [N]
    pos = (starts[:, None] + torch.arange(resp_len, device=device)[None, :]).clamp(max=length - 2)  # [N, R]
    picked = logits.gather(1, (pos - first)[..., None].expand(-1, -1, logits.shape[-1]))  # [N, R, V]
    targets = ids.to(device).gather(1, pos + 1)  # [N, R]
    lengths = torch.tensor([len(r) for r in responses], device=device)
    mask = (torch.arange(resp_len, device=device)[None, :] < lengths[:, None]).float()  # [N, R]
    return picked, targets, mask


def _mask(responses: list[list[int]], device) -> torch.Tensor:
    lengths = torch.tensor([len(r) for r in responses], device=device)
    return (torch.arange(max((len(r) for r in responses), default=0), device=device)[None, :]
            < lengths[:, None]).float()  # [N, R]


def _targets(prompts: list[list[int]], responses: list[list[int]], device):
    """(rows, t, absolute positions) of every response token [M]: position len(prompt) − 1 + t predicts response[t]."""
    rows = torch.tensor([i for i, r in enumerate(responses) for _ in r], dtype=torch.long)
    t = torch.tensor([j for r in responses for j in range(len(r))], dtype=torch.long)
    pos = torch.tensor([len(prompts[i]) - 1 for i in rows.tolist()], dtype=torch.long) + t
    return rows.to(device), t.to(device), pos.to(device)


def response_logprobs(model, prompts: list[list[int]], responses: list[list[int]], temperature: float, pad_id: int,
                      chunk_tokens: int = CHUNK_TOKENS) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs of each response given its prompt, logits ÷ T, the head `chunk_tokens` positions at a
    time (0: the plain path). Returns (logp [N, R], mask [N, R]); padded positions hold 0."""
    if chunk_tokens:
        seqs = [p + r for p, r in zip(prompts, responses, strict=True)]
        ids, attn = (x.to(model.device) for x in _pad(seqs, pad_id, left=False))  # [N, L]
        length = ids.shape[1]
        rows, t, pos = _targets(prompts, responses, ids.device)
        targets = ids[rows, pos + 1]  # [M]

        def score(hidden, head):  # hidden: the last hidden.shape[1] positions of L
            return token_logprobs(head, hidden[rows, pos - (length - hidden.shape[1])], targets, temperature,
                                  chunk_tokens)

        keep = length - (min(len(p) for p in prompts) - 1)
        logp = scored(model, lambda: _forward(model, ids, attn, keep), score)[1]  # [M]
        if logp is not None:
            mask = _mask(responses, ids.device)
            return mask.new_zeros(mask.shape).index_put((rows, t), logp), mask
    logits, targets, mask = response_logits(model, prompts, responses, pad_id)
    logits = logits / temperature
    logp = logits.gather(-1, targets[..., None]).squeeze(-1) - torch.logsumexp(logits, -1)  # [N, R]
    return logp * mask, mask


@torch.no_grad()
def reference_kl(policy, reference, prompts: list[list[int]], responses: list[list[int]], pad_id: int,
                 chunk_tokens: int = CHUNK_TOKENS) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """At every response token (temperature 1): the full-vocabulary KL(π_ref ‖ π_θ) = Σ_v π_ref(v)(log π_ref(v) −
    log π_θ(v)) and log π_ref(y_t), both [N, R] (0 at padding), and the mask [N, R]. Both heads run `chunk_tokens`
    positions at a time: π_ref's hidden states come first, then π_θ's forward scores each chunk against them."""
    if chunk_tokens:
        seqs = [p + r for p, r in zip(prompts, responses, strict=True)]
        ids, attn = _pad(seqs, pad_id, left=False)  # [N, L]
        length, keep = ids.shape[1], ids.shape[1] - (min(len(p) for p in prompts) - 1)
        ref_head = reference.get_output_embeddings()
        ref_forward = ref_head.forward if ref_head is not None else None  # the head itself, before any swap

        def picked(device):
            rows, t, pos = _targets(prompts, responses, device)
            return rows, t, pos, ids.to(device)[rows, pos + 1]

        rows, t, pos, _ = picked(reference.device)
        ref_hidden = scored(reference, lambda: _forward(reference, ids.to(reference.device), attn.to(reference.device),
                                                        keep), lambda h, _: h[rows, pos - (length - h.shape[1])])[1]
        rows, t, pos, targets = picked(policy.device)

        def score(hidden, head):
            hidden = hidden[rows, pos - (length - hidden.shape[1])]  # [M, H]
            out = []
            for s in range(0, hidden.shape[0], chunk_tokens):
                logp = torch.log_softmax(head(hidden[s:s + chunk_tokens]).float(), -1)  # [c, V]
                ref = torch.log_softmax(ref_forward(ref_hidden[s:s + chunk_tokens]).float(), -1).to(logp.device)
                out.append(torch.stack([(ref.exp() * (ref - logp)).sum(-1),
                                        ref.gather(-1, targets[s:s + chunk_tokens, None]).squeeze(-1)], -1))
            return torch.cat(out) if out else hidden.new_zeros(0, 2)

        both = scored(policy, lambda: _forward(policy, ids.to(policy.device), attn.to(policy.device), keep),
                      score)[1] if ref_hidden is not None else None  # [M, 2]
        if both is not None:
            mask = _mask(responses, policy.device)
            zeros = mask.new_zeros(mask.shape)
            return zeros.index_put((rows, t), both[:, 0]), zeros.index_put((rows, t), both[:, 1]), mask
    logits, targets, mask = response_logits(policy, prompts, responses, pad_id)
    logp = torch.log_softmax(logits, -1)  # [N, R, V]
    del logits
    ref_logp = torch.log_softmax(response_logits(reference, prompts, responses, pad_id)[0].to(logp.device), -1)
    kl = (ref_logp.exp() * (ref_logp - logp)).sum(-1)  # [N, R]
    return kl * mask, ref_logp.gather(-1, targets[..., None]).squeeze(-1) * mask, mask


@torch.no_grad()
def shared_prompt_logprobs(model, prompts: list[list[int]], responses: list[list[int]], num_samples: int,
                           temperature: float, pad_id: int, buckets: bool = True,
                           chunk_tokens: int = CHUNK_TOKENS) -> torch.Tensor:
    """`response_logprobs` of `num_samples` responses per prompt (prompt-major), each prompt run once
    (`grouped_logprobs`, without gradients).

    Why: a searcher scores every sample under π_ref, and a chat prompt is often longer than its responses, so
    scoring prompt + response per sample spent most of the forward on S copies of the same prompt. Returns logp
    [N, R] (N = len(responses)), 0 at padded positions.
    """
    return grouped_logprobs(model, prompts, responses, [num_samples] * len(prompts), temperature, pad_id, buckets,
                            chunk_tokens)[0]


def grouped_logprobs(model, prompts: list[list[int]], responses: list[list[int]], counts: list[int],
                     temperature: float, pad_id: int, buckets: bool = True,
                     chunk_tokens: int = CHUNK_TOKENS) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs (logits ÷ T) of `counts[i]` responses to prompt i (prompt-major), each prompt run once
    per length bucket: its keys and values are computed for one row and indexed out to its responses, which then
    run over them. Differentiable: the trainer takes its gradients through the shared prompt
    (trainer.shared_prompts), under activation checkpointing too (`recomputable`).

    The numbers are those of `response_logprobs`' full forward up to float rounding, and so are the gradients
    (tests/models/test_logprobs.py): attention of a response row to the prompt is the same whether the prompt's
    keys were computed in that row or copied into it. Responses of very different lengths run in separate
    forwards, each padded to its own longest (tba.models.length_buckets; buckets=False: one forward, as
    bench.perf.scoring compares). Returns (logp [N, R], mask [N, R]) as `response_logprobs` does; padded positions
    hold 0.
    """
    if sum(counts) != len(responses):
        raise ValueError(f"counts add up to {sum(counts)}, but there are {len(responses)} responses")
    runs = length_buckets([len(x) for x in responses], sum(len(x) for x in prompts) + CALL_OVERHEAD) if buckets else []
    if len(runs) < 2:
        return _grouped_logprobs(model, prompts, responses, counts, temperature, pad_id, chunk_tokens)
    owner = [i for i, c in enumerate(counts) for _ in range(c)]
    r = max(len(x) for x in responses)
    rows, logps, masks = [], [], []
    for run in runs:
        run = sorted(run, key=lambda j: (owner[j], j))  # prompt-major, as _grouped_logprobs takes them
        mine = collections.Counter(owner[j] for j in run)  # prompt → its responses in this run, prompt order
        logp, mask = _grouped_logprobs(model, [prompts[i] for i in mine], [responses[j] for j in run],
                                       list(mine.values()), temperature, pad_id, chunk_tokens)
        rows += run
        logps.append(F.pad(logp, (0, r - logp.shape[1])))
        masks.append(F.pad(mask, (0, r - mask.shape[1])))
    back = torch.empty(len(rows), dtype=torch.long)
    back[torch.tensor(rows)] = torch.arange(len(rows))
    back = back.to(logps[0].device)
    return torch.cat(logps).index_select(0, back), torch.cat(masks).index_select(0, back)


CALL_OVERHEAD = 16
"""length_buckets: the fixed cost of one more forward, in padded positions, beside its prompts' tokens."""


class _WriteOnceLayer(DynamicLayer):
    """The prompt forward's cache layer: keeps the keys and values of its first update and returns each update's
    own. A layer recomputed in backward (activation checkpointing) updates it again and must see what the first
    forward saw — the prompt alone — not the prompt appended to itself, as a `DynamicLayer` would give."""

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.dtype, self.device, self.is_initialized = key_states.dtype, key_states.device, True
            self.keys, self.values = key_states, value_states
        return key_states, value_states


class _PrefixLayer(DynamicLayer):
    """The responses' cache layer: the prompt's keys and values (one row per response), never extended — each
    update returns prompt ⧺ the update's own, the same in a recomputation as in the first forward."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        super().__init__()
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
        self.keys, self.values = keys, values

    def update(self, key_states, value_states, *args, **kwargs):
        return torch.cat([self.keys, key_states], dim=-2), torch.cat([self.values, value_states], dim=-2)


def recomputable(model) -> bool:
    """Whether the shared-prompt forward may run under activation checkpointing: the model's cache is plain
    full-attention layers (the only kind `_WriteOnceLayer` / `_PrefixLayer` stand in for; sliding windows and the
    like keep the model's own cache, which a recomputed layer would extend twice)."""
    return all(type(layer) is DynamicLayer for layer in DynamicCache(config=model.config).layers)


def _grouped_logprobs(model, prompts: list[list[int]], responses: list[list[int]], counts: list[int],
                      temperature: float, pad_id: int, chunk_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """grouped_logprobs in one forward over the prompts and one over all the responses, padded to the longest."""
    if max((len(x) for x in responses), default=0) == 0:
        empty = torch.zeros(len(responses), 0, device=model.device)
        return empty, empty
    device = model.device
    ids, mask = (x.to(device) for x in _pad(prompts, pad_id, left=True))  # [P, L]
    pos = (mask.cumsum(-1) - 1).clamp_(min=0)
    own = recomputable(model)
    cache = None
    if own:
        cache = DynamicCache()
        cache.layer_class_to_replicate = _WriteOnceLayer

    def prompts_run():
        try:  # only the last prompt position's logits are needed: the LM head on one position, not L
            return model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1,
                         **{CACHE: cache})
        except TypeError:  # a model without `logits_to_keep`
            return model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **{CACHE: cache})

    # the head as it is, through the scorer: the prompts' forward finds out (before the responses' forward extends
    # the model's own cache) whether the model transforms its logits after the head
    out, logits = scored(model, prompts_run, lambda h, head: head(h)) if chunk_tokens else (None, None)
    out = out or prompts_run()
    index = torch.repeat_interleave(torch.arange(len(prompts), device=device), torch.tensor(counts, device=device))
    cache = getattr(out, CACHE)
    if own:  # a gather, so gradients flow back to the prompt's row
        cache = DynamicCache()
        cache.layers = [_PrefixLayer(layer.keys[index], layer.values[index]) for layer in getattr(out, CACHE).layers]
    else:
        cache.batch_select_indices(index)  # [P, …] → [N, …]
    resp, resp_mask = (x.to(device) for x in _pad(responses, pad_id, left=False))  # [N, R]
    n, r = resp.shape
    first = out.logits[:, -1].float() / temperature  # [P, V]: predicts each response's token 0
    parts = [(first[index, resp[:, 0]] - torch.logsumexp(first, -1)[index])[:, None]]  # [N, 1]
    keep = _mask(responses, device)  # [N, R]
    if r > 1:
        attn = torch.cat([mask[index], resp_mask], 1)[:, :-1]  # [N, L + R − 1]
        rpos = pos[index, -1:] + 1 + torch.arange(r - 1, device=device)  # [N, R − 1]

        def run():
            return model(input_ids=resp[:, :-1], attention_mask=attn, position_ids=rpos, use_cache=True,
                         **{CACHE: cache})

        rows, t = (keep[:, 1:] > 0).nonzero(as_tuple=True)  # [M]: position t predicts token t + 1
        logp = scored(model, run, lambda h, head: token_logprobs(head, h[rows, t], resp[rows, t + 1], temperature,
                                                                chunk_tokens))[1] if logits is not None else None
        if logp is not None:
            parts.append(keep.new_zeros(n, r - 1).index_put((rows, t), logp))
        else:
            logits = run().logits.float() / temperature  # [N, R − 1, V]: predicts tokens 1 … R − 1
            parts.append(logits.gather(-1, resp[:, 1:, None]).squeeze(-1) - torch.logsumexp(logits, -1))
    return torch.cat(parts, 1) * keep, keep
