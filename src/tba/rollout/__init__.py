"""Making samples: a searcher turns prompts into scored, reference-annotated groups with a (possibly stale) policy.

    searcher.py        prompts → samples with a sampler, π_ref log-probs and the task's rewards
    stream.py          continuous batching's rows in flight, and when weights load (search.weight_update)
    samplers/          the engines a searcher generates with (hf, vllm) behind one protocol, and their registry
    episodes.py        multi-turn episodes: the policy acts, an environment answers, token-exact
    episode_stream.py  episodes under continuous batching: KV caches kept across turns, environments answering aside
    demonstrations.py  completions from elsewhere (demonstrations, logged data) made into buffer groups
    evaluate.py        held-out evaluation
    quantize.py        quantized copies of the policy for searchers (search.quantize)
"""
