"""Batched sampling with a KV cache, and per-token log-probs of given responses.

Sampling is HF `generate` (KV cache, EOS stop) with top-k disabled, so the sampled distribution is exactly
softmax(logits / T) (optionally top-p filtered). Every log-prob in TBA is of that temperature-scaled
distribution — the trainer's log π_θ, the searcher's log π_ref and the behaviour log-probs — as in the
paper's code (§2.2), so the TB residual compares like with like.
"""

from __future__ import annotations

import torch
from transformers import GenerationConfig


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


@torch.no_grad()
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
) -> list[tuple[list[int], list[float]]]:
    """Return, for each prompt and then each of its samples, (response ids, behaviour log-probs).

    Responses are cut after the first EOS (which is kept). Greedy decoding, or `logprobs=False` (evaluation,
    a victim model: nobody needs them, and keeping every step's [N, V] scores costs memory), returns empty
    log-prob lists.
    """
    logprobs = logprobs and not greedy
    ids, mask = _pad(prompts, pad_id, left=True)
    config = GenerationConfig(
        do_sample=not greedy,
        temperature=temperature if not greedy else None,
        top_k=0 if not greedy else None,
        top_p=top_p if not greedy else None,
        max_new_tokens=max_new_tokens,
        num_return_sequences=num_samples,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        output_scores=logprobs,
        return_dict_in_generate=True,
    )
    out = model.generate(input_ids=ids.to(model.device), attention_mask=mask.to(model.device),
                         generation_config=config)
    new = out.sequences[:, ids.shape[1]:].cpu()  # [N·S, T]
    if logprobs:  # one step at a time: never materialise [N·S, T, V]
        tokens = out.sequences[:, ids.shape[1]:]
        logp = torch.stack([  # scores are already divided by T (and top-p filtered)
            torch.log_softmax(s.float(), -1).gather(-1, tokens[:, t, None]).squeeze(-1)
            for t, s in enumerate(out.scores)], dim=1).cpu()  # [N·S, T]
    results = []
    for i, row in enumerate(new.tolist()):
        n = row.index(eos_id) + 1 if eos_id in row else len(row)
        results.append((row[:n], logp[i, :n].tolist() if logprobs else []))
    return results


def ended_with_eos(responses: list[list[int]], eos_id: int) -> list[bool]:
    """Whether each response stopped by itself (its last token is EOS) rather than at max_new_tokens."""
    return [bool(r) and r[-1] == eos_id for r in responses]


def response_logits(model, prompts: list[list[int]], responses: list[list[int]], pad_id: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Raw logits that predict each response token, the response tokens, and the mask.

    Returns (logits [N, R, V], targets [N, R], mask [N, R]) where R is the longest response. Sequences are
    right-padded so that positions start at 0 for every row, exactly as in a single-sequence forward.
    """
    seqs = [p + r for p, r in zip(prompts, responses, strict=True)]
    ids, attn = _pad(seqs, pad_id, left=False)  # [N, L]
    device, length = model.device, ids.shape[1]
    # only positions from the earliest response start on need logits: the LM head (V ≈ 50k for real
    # tokenizers) is then applied to `keep` positions instead of L — much less time and memory
    first = min(len(p) for p in prompts) - 1
    keep = length - first
    try:
        logits = model(input_ids=ids.to(device), attention_mask=attn.to(device), logits_to_keep=keep).logits
    except TypeError:  # a model without `logits_to_keep`
        logits = model(input_ids=ids.to(device), attention_mask=attn.to(device)).logits
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


def response_logprobs(
    model, prompts: list[list[int]], responses: list[list[int]], temperature: float, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs of each response given its prompt, logits ÷ T.

    Returns (logp [N, R], mask [N, R]); padded positions hold 0.
    """
    logits, targets, mask = response_logits(model, prompts, responses, pad_id)
    logits = logits / temperature
    logp = logits.gather(-1, targets[..., None]).squeeze(-1) - torch.logsumexp(logits, -1)  # [N, R]
    return logp * mask, mask
