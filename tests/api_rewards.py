"""Reward functions with TRL's signature, importable (so searcher processes can load them), for tests/test_api.py.
Each call's keyword arguments are recorded in CALLS."""

CALLS: list[dict] = []


def answer_in_completion(completions, answer, **kwargs):
    CALLS.append({"completions": completions, "answer": answer, **kwargs})
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [1.0 if a in t else 0.0 for t, a in zip(texts, answer, strict=True)]


def length_penalty(completions, **kwargs):
    """TRL's quickstart reward_len, scaled: prefer 4 characters."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [-abs(4 - len(t)) / 10 for t in texts]


def one_value(completions, **kwargs):
    """Broken on purpose: one value for the whole batch."""
    return [1.0]


def moods(completions, **kwargs):
    """Broken on purpose: words, not numbers."""
    return ["high"] * len(completions)
